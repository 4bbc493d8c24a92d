package e2e

// A data centre's dislock webhook: the real `dislock webhook` binary (the
// one in the image) as a host process on loopback, with a serving
// certificate for 127.0.0.1, registered with the webhook configurations the
// Helm chart renders, pointed at that loopback URL.

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/images"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/node"
	"github.com/dislock/dislock/test/tlstest"
)

// WebhookNamespace is where the chart installs the webhook; the webhook
// configurations never intercept it.
const WebhookNamespace = "dislock-system"

// webhook is one data centre's webhook process.
type webhook struct {
	p        *node.Process
	port     int
	caBundle []byte
}

// startWebhook runs `dislock webhook` for cluster and returns once its
// readiness endpoint (which includes the admission server) answers.
func startWebhook(dc, dir, dislockBin string, cluster *kube.Cluster, databaseURL string) (*webhook, error) {
	certDir := filepath.Join(dir, "webhook-certs-"+dc)
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, fmt.Errorf("e2e: %w", err)
	}
	ca, err := tlstest.WriteServingCert(certDir)
	if err != nil {
		return nil, err
	}
	ports, err := harness.FreePorts(2) // the admission and the probe port
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(dislockBin, "webhook",
		"--cluster-name="+dc,
		"--agent-image="+images.AgentRef,
		"--kubeconfig="+cluster.Kubeconfig(),
		"--namespace="+WebhookNamespace,
		"--port="+strconv.Itoa(ports[0]),
		"--cert-dir="+certDir,
		"--metrics-bind-address=0",
		"--health-probe-bind-address=127.0.0.1:"+strconv.Itoa(ports[1]),
		"--database-url="+databaseURL,
		// A test serves images from an in-process registry on loopback,
		// over plain HTTP, for the webhook to resolve entrypoints from.
		"--insecure-registry",
	)
	cmd.Env = append(os.Environ(), "KUBECONFIG=")
	p, err := node.StartProcess(dir, "webhook-"+dc, cmd)
	if err != nil {
		return nil, err
	}
	w := &webhook{p: p, port: ports[0], caBundle: ca}
	readyz := "http://127.0.0.1:" + strconv.Itoa(ports[1]) + "/readyz"
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(readyz)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return w, nil
			}
			err = fmt.Errorf("GET %s: %s", readyz, resp.Status)
		}
		if !p.Running() || time.Now().After(deadline) {
			_ = p.Stop()
			return nil, fmt.Errorf("e2e: webhook of %s not ready: %v\n%s", dc, err, harness.LogTail(p.LogFile(), 30, 6144))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// url is the webhook's address for a path, as the API server calls it.
func (w *webhook) url(path string) *string {
	u := "https://127.0.0.1:" + strconv.Itoa(w.port) + path
	return &u
}

// register renders the chart's webhook configurations for dc with bin/helm,
// points their clientConfig at the loopback URL (the chart points them at its
// Service, and there is no Service network here) and creates them.
func (w *webhook) register(ctx context.Context, dc, root string, cs kubernetes.Interface) error {
	helm, err := kube.FindBinary("helm")
	if err != nil {
		return fmt.Errorf("%w: %w", ErrMissing, err)
	}
	out, err := exec.Command(helm, "template", "dislock", filepath.Join(root, "charts", "dislock"),
		"--namespace", WebhookNamespace,
		"--set-string", "clusterName="+dc,
		"--set-string", "database.existingSecret="+DBSecretName,
	).Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		return fmt.Errorf("e2e: helm template charts/dislock: %w: %s", err, stderr)
	}
	var mutating, validating int
	for _, doc := range bytes.Split(out, []byte("\n---")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return fmt.Errorf("e2e: a document helm rendered: %w", err)
		}
		switch meta.Kind {
		case "MutatingWebhookConfiguration":
			var mwc admissionregistrationv1.MutatingWebhookConfiguration
			if err := yaml.UnmarshalStrict(doc, &mwc); err != nil {
				return fmt.Errorf("e2e: the chart's MutatingWebhookConfiguration: %w", err)
			}
			for i := range mwc.Webhooks {
				w.pointAt(&mwc.Webhooks[i].ClientConfig)
			}
			if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &mwc, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("e2e: %w", err)
			}
			mutating++
		case "ValidatingWebhookConfiguration":
			var vwc admissionregistrationv1.ValidatingWebhookConfiguration
			if err := yaml.UnmarshalStrict(doc, &vwc); err != nil {
				return fmt.Errorf("e2e: the chart's ValidatingWebhookConfiguration: %w", err)
			}
			for i := range vwc.Webhooks {
				w.pointAt(&vwc.Webhooks[i].ClientConfig)
			}
			if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &vwc, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("e2e: %w", err)
			}
			validating++
		}
	}
	if mutating != 1 || validating != 1 {
		return fmt.Errorf("e2e: the chart rendered %d mutating and %d validating webhook configurations, want one each", mutating, validating)
	}
	return nil
}

// pointAt replaces a Service reference with the loopback URL, keeping the
// path.
func (w *webhook) pointAt(cc *admissionregistrationv1.WebhookClientConfig) {
	path := ""
	if cc.Service != nil && cc.Service.Path != nil {
		path = *cc.Service.Path
	}
	cc.Service = nil
	cc.URL = w.url(path)
	cc.CABundle = w.caBundle
}
