package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/tlstest"
	"github.com/dislock/dislock/webhook"
)

// binaryWebhook is `dislock webhook` running as its own process, started
// with the flags a Deployment gives it.
type binaryWebhook struct {
	port, probePort, metricsPort int
	cmd                          *exec.Cmd
	exited                       chan error
	logs                         *harness.Buffer
}

// startBinary builds dislock and runs `dislock webhook` against the cluster
// with args added to the common flags. The test ends by sending SIGTERM and
// requiring a clean exit within the graceful-shutdown period.
func startBinary(t *testing.T, c *kube.Cluster, args ...string) *binaryWebhook {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dislock")
	build := exec.Command("go", "build", "-o", bin, "github.com/dislock/dislock")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	w := &binaryWebhook{port: tlstest.FreePort(t), probePort: tlstest.FreePort(t), metricsPort: tlstest.FreePort(t),
		exited: make(chan error, 1), logs: &harness.Buffer{}}
	w.cmd = exec.Command(bin, append([]string{"webhook",
		"--cluster-name=dc-a", "--agent-image=dislock:test", "--namespace=" + webhookNamespace,
		"--kubeconfig=" + c.Kubeconfig(), fmt.Sprintf("--port=%d", w.port),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", w.probePort),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", w.metricsPort),
	}, args...)...)
	w.cmd.Stdout, w.cmd.Stderr = w.logs, w.logs
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.exited <- w.cmd.Wait() }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dislock webhook logs:\n%s", w.logs)
		}
	})
	t.Cleanup(func() {
		_ = w.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-w.exited:
			if err != nil {
				t.Errorf("dislock webhook did not exit cleanly on SIGTERM: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = w.cmd.Process.Kill()
			t.Errorf("dislock webhook still running 30s after SIGTERM")
		}
	})
	return w
}

// stop stops the webhook with SIGTERM, as a cluster's going away would, and
// waits for it to exit; the test's end then finds it exited.
func (w *binaryWebhook) stop(t *testing.T) {
	t.Helper()
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-w.exited:
		w.exited <- err
	case <-time.After(30 * time.Second):
		t.Fatal("dislock webhook still running 30s after SIGTERM")
	}
}

// probe returns the status code of GET path on the health-probe port.
func (w *binaryWebhook) probe(path string) (int, error) {
	select {
	case err := <-w.exited:
		w.exited <- err
		return 0, fmt.Errorf("dislock webhook exited: %v", err)
	default:
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", w.probePort, path))
	if err != nil {
		return 0, nil // not listening yet
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

func (w *binaryWebhook) awaitReady(t *testing.T) {
	t.Helper()
	await(t, "/readyz to answer 200", func() (bool, error) {
		code, err := w.probe("/readyz")
		return code == http.StatusOK, err
	})
}

// metrics scrapes the metrics port.
func (w *binaryWebhook) metrics(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", w.metricsPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return families
}

// sample returns the value of the family's series with exactly these labels
// (a counter's value, a histogram's count), or -1 when there is none.
func sample(families map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	f := families[name]
	if f == nil {
		return -1
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if len(got) != len(labels) {
			continue
		}
		match := true
		for k, v := range labels {
			match = match && got[k] == v
		}
		if !match {
			continue
		}
		if m.GetHistogram() != nil {
			return float64(m.GetHistogram().GetSampleCount())
		}
		return m.GetCounter().GetValue()
	}
	return -1
}

// The binary with a certificate from cert-manager (a mounted Secret): it is
// ready once serving, counts what it decides in Prometheus metrics, and serves
// a renewed certificate without a restart while the API server keeps calling
// it.
func TestTheWebhookBinaryServesProbesMetricsAndARenewedCertificate(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	ctx := context.Background()
	namespace(t, cs, webhookNamespace, false)
	namespace(t, cs, "metered", true)

	ca := tlstest.NewCA(t)
	first := ca.Issue(t)
	certDir := t.TempDir()
	if err := tlstest.WriteFiles(certDir, first.Files()); err != nil {
		t.Fatal(err)
	}
	w := startBinary(t, c, "--cert-dir="+certDir)
	w.awaitReady(t)
	if code, err := w.probe("/healthz"); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz: %d %v", code, err)
	}
	registerWebhooks(t, cs, fmt.Sprintf("https://127.0.0.1:%d", w.port), ca.CertPEM)
	awaitOptedIn(t, cs, "metered")

	annotated, err := cs.BatchV1().CronJobs("metered").Create(ctx, withAnnotations(cronJob("metered", "report", "0 3 * * *"), map[string]string{contract.AnnotationMode: "schedule"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := cs.BatchV1().CronJobs("metered").Create(ctx, cronJob("metered", "plain", "0 3 * * *"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tick := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	assertInjected(t, createJob(t, cs, jobFor(annotated, tick)), "2026-12-02T03:00:00Z", "schedule")
	assertUntouched(t, createJob(t, cs, jobFor(plain, tick)))

	m := w.metrics(t)
	for _, want := range []struct {
		name   string
		labels map[string]string
	}{
		{"dislock_webhook_admissions_total", map[string]string{"webhook": "mutate-job", "result": "injected"}},
		{"dislock_webhook_admissions_total", map[string]string{"webhook": "mutate-job", "result": "not_applicable"}},
		{"dislock_webhook_admissions_total", map[string]string{"webhook": "validate-cronjob", "result": "allowed"}},
		{"dislock_webhook_admissions_total", map[string]string{"webhook": "validate-cronjob", "result": "denied"}},
		{"dislock_webhook_admission_duration_seconds", map[string]string{"webhook": "mutate-job"}},
	} {
		if got := sample(m, want.name, want.labels); got < 1 {
			t.Errorf("%s%v = %v, want at least 1", want.name, want.labels, got)
		}
	}
	if got := sample(m, "dislock_webhook_admissions_total", map[string]string{"webhook": "mutate-job", "result": "injected"}); got != 1 {
		t.Errorf("one Job was injected, the counter says %v", got)
	}

	// cert-manager renews the certificate; the kubelet swaps the mounted files.
	renewed := ca.Issue(t)
	if err := tlstest.WriteFiles(certDir, renewed.Files()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	await(t, "the renewed certificate to be served", func() (bool, error) {
		serial, err := tlstest.ServedSerial(w.port, ca.CertPEM)
		if err != nil {
			return false, err
		}
		if serial.Cmp(first.Serial) != 0 && serial.Cmp(renewed.Serial) != 0 {
			return false, fmt.Errorf("served serial %s is neither the first nor the renewed certificate", serial)
		}
		return serial.Cmp(renewed.Serial) == 0, nil
	})
	t.Logf("renewed certificate served %s after the files changed", time.Since(start).Round(time.Millisecond))
	assertInjected(t, createJob(t, cs, jobFor(annotated, tick.Add(24*time.Hour))), "2026-12-03T03:00:00Z", "schedule")
}

// With --self-signed-certs the webhook serves the certificate it wrote
// straight from its Secret: it is ready, and the API server's calls are
// admitted through it, while nothing is in its cert dir yet — in a pod the
// kubelet projects the Secret there only at its next sync of the pod, a
// minute or more later. /healthz passes throughout, so waiting never
// restarts it.
func TestTheSelfSignedWebhookServesItsCertificateBeforeTheKubeletProjectsIt(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	ctx := context.Background()
	namespace(t, cs, webhookNamespace, false)
	namespace(t, cs, "unmounted", true)
	const secretName = "dislock-webhook-cert-binary"
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: webhookNamespace, Name: secretName}}
	if _, err := cs.CoreV1().Secrets(webhookNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	begun := time.Now()
	w := startBinary(t, c, "--cert-dir="+certDir, "--self-signed-certs", "--cert-secret-name="+secretName,
		"--service-name="+webhook.DefaultServiceName, "--cert-extra-dns-name=localhost")
	registerWebhooks(t, cs, fmt.Sprintf("https://localhost:%d", w.port), nil)
	w.awaitReady(t)
	t.Logf("ready %v after the start, with an empty cert dir", time.Since(begun).Round(time.Millisecond))
	if code, err := w.probe("/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("/healthz: %d %v", code, err)
	}
	awaitOptedIn(t, cs, "unmounted")
	cj, err := cs.BatchV1().CronJobs("unmounted").Create(ctx, withAnnotations(cronJob("unmounted", "report", "0 3 * * *"), map[string]string{contract.AnnotationMode: "schedule"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a CronJob through the validating webhook: %v", err)
	}
	tick := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	assertInjected(t, createJob(t, cs, jobFor(cj, tick)), "2026-12-02T03:00:00Z", "schedule")
	if entries, err := os.ReadDir(certDir); err != nil || len(entries) != 0 {
		t.Fatalf("the cert dir holds %v (%v): the test would not show that the Secret is served", entries, err)
	}
}
