package e2e

// A data centre's dislock, installed as docs/install.md tells a user: `helm
// install` of charts/dislock into dislock-system, the webhook a Deployment
// of the published image on the data centre's node, reached by the API
// server through its Service with the chart's self-signed certificate.
//
// Two things differ from a cluster with a pod network, both chart values a
// user has too:
//   - webhook.hostNetwork: pods here have no network but the host's. The
//     node has an address of its own on the loopback interface
//     (node.Options.OwnAddress; Kubernetes refuses 127.0.0.0/8 as an
//     endpoint), so the webhook pod's endpoint is that address, which the
//     API server dials (--enable-aggregator-routing, test/kube). The ports
//     are the node's: different in every data centre, since all nodes share
//     the host.
//   - webhook.extraEnv: the API server is reached at 127.0.0.1, since the
//     "kubernetes" Service's ClusterIP leads nowhere without kube-proxy.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/images"
	"github.com/dislock/dislock/test/kube"
)

const (
	// ReleaseName is the Helm release of every data centre.
	ReleaseName = "dislock"
	// WebhookNamespace is where the release is installed; the webhook
	// configurations never intercept it.
	WebhookNamespace = "dislock-system"
	// webhookSelector selects the webhook's pods, of every release.
	webhookSelector = "app.kubernetes.io/component=webhook"
)

// installTimeout bounds `helm install --wait`: the webhook pod's start on a
// node whose image is already imported, its self-signed certificate, and
// its readiness.
const installTimeout = 3 * time.Minute

// releaseValues are the chart values of dc's release: the user's and the
// two of this harness (see the file's comment).
func releaseValues(dc *DC, databaseURL string) ([]string, error) {
	values, err := userValues(dc, images.DislockRef, images.AgentRef, databaseURL)
	if err != nil {
		return nil, err
	}
	env, err := apiServerEnv(dc)
	if err != nil {
		return nil, err
	}
	// The plugin's port, which releases before it do not have.
	plugin, err := harness.StablePorts(1)
	if err != nil {
		return nil, err
	}
	return append(append(values,
		"--set", "kubectlPlugin.port="+strconv.Itoa(plugin[0]),
		"--set", "webhook.hostNetwork=true",
		"--set-json", "webhook.extraEnv="+env,
		// A test serves images from an in-process registry on loopback,
		// over plain HTTP, for the webhook to resolve entrypoints from.
		"--set-json", `webhook.extraArgs=["--insecure-registry"]`,
	), testValues...), nil
}

// userValues are the values a user of any release sets (clusterName, the
// images, the owner's database URL), one replica, and ports of the node
// not used before (each release binds its own). They are below the
// ephemeral range: a rollback binds its revision's ports again, and an
// outgoing connection may have taken one meanwhile.
func userValues(dc *DC, dislockRef, agentRef, databaseURL string) ([]string, error) {
	ports, err := harness.StablePorts(3) // admission, metrics, health
	if err != nil {
		return nil, err
	}
	repo, tag, _ := strings.Cut(dislockRef, ":")
	agentRepo, agentTag, _ := strings.Cut(agentRef, ":")
	return []string{
		"--set-string", "clusterName=" + dc.Name,
		"--set-string", "image.repository=" + repo,
		"--set-string", "image.tag=" + tag,
		"--set-string", "image.pullPolicy=Never",
		"--set-string", "agent.image.repository=" + agentRepo,
		"--set-string", "agent.image.tag=" + agentTag,
		"--set-string", "database.url=" + databaseURL,
		"--set", "webhook.replicas=1",
		"--set", "webhook.port=" + strconv.Itoa(ports[0]),
		"--set", "webhook.metricsPort=" + strconv.Itoa(ports[1]),
		"--set", "webhook.healthPort=" + strconv.Itoa(ports[2]),
	}, nil
}

// apiServerEnv is the webhook container's environment that points it at
// dc's API server (webhook.extraEnv), as JSON.
func apiServerEnv(dc *DC) (string, error) {
	api, err := url.Parse(dc.Cluster.URL())
	if err != nil {
		return "", fmt.Errorf("e2e: the API server's URL: %w", err)
	}
	env, err := json.Marshal([]map[string]string{
		{"name": "KUBERNETES_SERVICE_HOST", "value": api.Hostname()},
		{"name": "KUBERNETES_SERVICE_PORT", "value": api.Port()},
	})
	return string(env), err
}

// testValues are the `helm test` pod's values of every e2e release: the
// host network, as every pod here, and --allow-async-replication, since the
// e2e PostgreSQL has no standby (without it the check rightly fails).
var testValues = []string{
	"--set", "tests.hostNetwork=true",
	"--set-json", `tests.extraArgs=["--allow-async-replication"]`,
}

// installRelease runs `helm install` for dc and returns once the webhook is
// ready (--wait). logf is told the command line, the database's password
// left out.
func installRelease(ctx context.Context, dc *DC, root, databaseURL string, logf func(string, ...any)) error {
	values, err := releaseValues(dc, databaseURL)
	if err != nil {
		return err
	}
	_, err = dc.helmShown(ctx, logf, root, databaseURL, append([]string{"install", ReleaseName, filepath.Join(root, "charts", "dislock"),
		"--namespace", WebhookNamespace, "--wait", "--timeout", installTimeout.String()}, values...)...)
	return err
}

// helmShown is dc.helm that first tells logf the command line, with paths
// below root relative and the database's password left out.
func (dc *DC) helmShown(ctx context.Context, logf func(string, ...any), root, databaseURL string, args ...string) ([]byte, error) {
	shown := strings.ReplaceAll(strings.Join(args, " "), root+string(filepath.Separator), "")
	if u, err := url.Parse(databaseURL); err == nil && databaseURL != "" {
		shown = strings.ReplaceAll(shown, databaseURL, u.Redacted())
	}
	logf("%s: helm %s", dc.Name, shown)
	return dc.helm(ctx, args...)
}

// helm runs bin/helm against dc's cluster, with Helm's own files in the
// cluster's directory.
func (dc *DC) helm(ctx context.Context, args ...string) ([]byte, error) {
	return dc.tool(ctx, "helm", args, "HELM_CACHE_HOME="+filepath.Join(dc.Cluster.Dir(), "helm-cache"),
		"HELM_CONFIG_HOME="+filepath.Join(dc.Cluster.Dir(), "helm-config"), "HELM_DATA_HOME="+dc.helmDataHome())
}

// helmDataHome is where dc's helm keeps its data, plugins among them.
func (dc *DC) helmDataHome() string { return filepath.Join(dc.Cluster.Dir(), "helm-data") }

// Kubectl runs bin/kubectl against dc's cluster, as a user with the
// cluster's admin kubeconfig would, and returns its output.
func (dc *DC) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	return dc.tool(ctx, "kubectl", args)
}

// tool runs one of bin/'s client programs with dc's kubeconfig and env.
func (dc *DC) tool(ctx context.Context, name string, args []string, env ...string) ([]byte, error) {
	bin, err := kube.FindBinary(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMissing, err)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+dc.Cluster.Kubeconfig()), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("e2e: %s: %s %s: %w: %s", dc.Name, name, args[0], err, out)
	}
	return out, nil
}

// webhookRestarts says which of dc's webhook containers restarted before
// the release was ready, and why they last ended: a slow install's usual
// cause (a failed start waiting out the kubelet's back-off). Empty when
// none did.
func webhookRestarts(ctx context.Context, dc *DC) string {
	pods, err := dc.Client.CoreV1().Pods(WebhookNamespace).List(ctx, metav1.ListOptions{LabelSelector: webhookSelector})
	if err != nil {
		return fmt.Sprintf(" (listing the webhook pods: %v)", err)
	}
	var restarts []string
	for _, p := range pods.Items {
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount == 0 {
				continue
			}
			why := ""
			if t := c.LastTerminationState.Terminated; t != nil {
				why = fmt.Sprintf(", last ended with code %d: %s %s", t.ExitCode, t.Reason, strings.TrimSpace(t.Message))
			}
			restarts = append(restarts, fmt.Sprintf("%s/%s restarted %d times%s", p.Name, c.Name, c.RestartCount, why))
		}
	}
	if len(restarts) == 0 {
		return ""
	}
	return " (" + strings.Join(restarts, "; ") + ")"
}
