package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/dislock/dislock/test/images"
	"github.com/dislock/dislock/test/kube"
)

// checkTimeout bounds one `helm test` pod from creation to its end: pulling
// nothing (the image is on the node), starting, and dislock check's own
// connection attempts.
const checkTimeout = 2 * time.Minute

// `helm test` on the installed release, as docs/install.md tells a user:
// the chart's test pod runs the image's `dislock check` on the data
// centre's node with the release's database Secret (the owner's URL through
// PgBouncer) and Succeeds, its log showing the findings and never the
// password. Both data centres: each release has its own values.
func TestHelmTestPassesOnTheInstalledRelease(t *testing.T) {
	e := Need(t)
	for _, dc := range e.DCs {
		t.Run(dc.Name, func(t *testing.T) {
			ctx := context.Background()
			out, err := dc.helm(ctx, "test", ReleaseName, "--namespace", WebhookNamespace, "--timeout", checkTimeout.String())
			t.Logf("helm test:\n%s", out)
			pod, getErr := dc.Client.CoreV1().Pods(WebhookNamespace).Get(ctx, ReleaseName+"-check", metav1.GetOptions{})
			if getErr != nil {
				t.Fatalf("helm test: %v; its pod: %v", err, getErr)
			}
			log := containerLog(t, dc, pod, "check")
			t.Logf("pod %s: %s\nlog:\n%s", pod.Name, pod.Status.Phase, log)
			if err != nil {
				t.Fatalf("helm test failed: %v", err)
			}
			if pod.Status.Phase != corev1.PodSucceeded || !strings.Contains(string(out), "Succeeded") {
				t.Fatalf("helm test returned, but pod %s is %s", pod.Name, pod.Status.Phase)
			}
			if !strings.Contains(log, "primary") {
				t.Errorf("the log does not show the check's findings:\n%s", log)
			}
			owner, err := url.Parse(dc.BouncerDSN())
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(log, passwordOf(owner)) {
				t.Errorf("the check's output holds the password:\n%s", log)
			}
		})
	}
}

// The chart's test pod, rendered by `helm template` for a release whose
// database Secret holds the owner's URL with a wrong password, ends Failed
// on a real kubelet, its termination message and log naming the fix and
// never the password. Helm's own `helm test` only creates this pod and
// waits for its phase, which is what the test does, for a release of its
// own (the Secret check-wrong-password-db): the data centre's release keeps
// its Secret.
func TestTheChartsHelmTestPodNamesTheFixOfAWrongPassword(t *testing.T) {
	e := Need(t)
	dc := e.DCs[0]
	owner, err := url.Parse(dc.BouncerDSN())
	if err != nil {
		t.Fatal(err)
	}
	const wrongPassword = "not-the-Pa55word-of-e2e"
	wrong := *owner
	wrong.User = url.UserPassword(owner.User.Username(), wrongPassword)

	ctx := context.Background()
	const release = "check-wrong-password"
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: release + "-db", Namespace: WebhookNamespace},
		StringData: map[string]string{"url": wrong.String()}}
	if _, err := dc.Client.CoreV1().Secrets(WebhookNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dc.Client.CoreV1().Secrets(WebhookNamespace).Delete(ctx, secret.Name, metav1.DeleteOptions{})
	})

	pod := renderCheckPod(t, e, dc.Name, release, secret.Name)
	if _, err := dc.Client.CoreV1().Pods(WebhookNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dc.Client.CoreV1().Pods(WebhookNamespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}) })

	var got *corev1.Pod
	await(t, checkTimeout, "the helm test pod "+pod.Name+" to end", func() bool {
		p, err := dc.Client.CoreV1().Pods(WebhookNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		got = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	log := containerLog(t, dc, got, "check")
	message := ""
	if s := got.Status.ContainerStatuses; len(s) == 1 && s[0].State.Terminated != nil {
		message = s[0].State.Terminated.Message
	}
	t.Logf("pod %s: %s\nlog:\n%s", pod.Name, got.Status.Phase, log)
	if got.Status.Phase != corev1.PodFailed {
		t.Fatalf("pod %s ended %s, want Failed; termination message %q", pod.Name, got.Status.Phase, message)
	}
	// Where helm test users look: `kubectl describe pod` (the termination
	// message) and `helm test --logs`.
	for _, out := range []string{log, message} {
		if strings.Contains(out, wrongPassword) || strings.Contains(out, passwordOf(owner)) {
			t.Errorf("the check's output holds a password:\n%s", out)
		}
		if !strings.Contains(out, "password") || !strings.Contains(out, "fix") {
			t.Errorf("the output does not say the password is wrong and how to fix it:\n%s", out)
		}
	}
}

func passwordOf(u *url.URL) string {
	p, _ := u.User.Password()
	if p == "" {
		return "\x00" // no password: nothing to find
	}
	return p
}

// renderCheckPod renders the chart's `helm test` pod for release in the
// webhook's namespace with the e2e image, the database Secret given and the
// test values of every e2e release (releaseValues).
func renderCheckPod(t *testing.T, e *Env, cluster, release, secret string) *corev1.Pod {
	t.Helper()
	helm, err := kube.FindBinary("helm")
	if err != nil {
		t.Fatal(err)
	}
	repo, tag, _ := strings.Cut(images.DislockRef, ":")
	cmd := exec.Command(helm, "template", release, filepath.Join(e.root, "charts", "dislock"),
		"--namespace", WebhookNamespace, "--show-only", "templates/tests/check.yaml",
		"--set-string", "clusterName="+cluster,
		"--set-string", "database.existingSecret="+secret,
		"--set-string", "image.repository="+repo,
		"--set-string", "image.tag="+tag,
		"--set-string", "image.pullPolicy="+string(corev1.PullNever))
	cmd.Args = append(cmd.Args, testValues...)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%s: %v: %s", strings.Join(cmd.Args, " "), err, stderr)
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(out, &pod); err != nil {
		t.Fatalf("the chart's test pod: %v\n%s", err, out)
	}
	if pod.Annotations["helm.sh/hook"] != "test" {
		t.Fatalf("templates/tests/check.yaml is not a helm test hook:\n%s", out)
	}
	return &pod
}

// containerLog reads a container's log from the kubelet's pod log directory
// (the API server cannot reach a kubelet whose only address is loopback).
func containerLog(t *testing.T, dc *DC, p *corev1.Pod, container string) string {
	t.Helper()
	return nodeContainerLog(t, dc.Node.Dir(), p, container)
}

// nodeContainerLog is containerLog for a pod of the node whose directory is
// nodeDir.
func nodeContainerLog(t *testing.T, nodeDir string, p *corev1.Pod, container string) string {
	t.Helper()
	log, err := readContainerLog(nodeDir, p, container)
	if err != nil {
		t.Fatal(err)
	}
	return log
}

// readContainerLog reads the latest log file of a pod's container on the
// node whose directory is nodeDir; an error when there is none (yet).
func readContainerLog(nodeDir string, p *corev1.Pod, container string) (string, error) {
	files, _ := filepath.Glob(filepath.Join(nodeDir, "pod-logs", fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), container, "*.log"))
	if len(files) == 0 {
		return "", fmt.Errorf("no log of %s/%s container %s under %s", p.Namespace, p.Name, container, filepath.Join(nodeDir, "pod-logs"))
	}
	b, err := os.ReadFile(files[len(files)-1])
	return string(b), err
}
