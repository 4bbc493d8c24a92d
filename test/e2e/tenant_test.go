package e2e

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/test/images"
)

// sidecarName is the injected sidecar's container name.
const sidecarName = "dislock-agent"

// snoopScript prints, for every process the container sees, its command
// line and its environment, or that the kernel refused the environment.
// It runs in an app container of a pod that shares its process namespace,
// as an app taken over by an attacker would.
const snoopScript = `for d in /proc/[0-9]*; do
  p=${d#/proc/}
  echo "pid $p cmdline: $(busybox tr '\0' ' ' < $d/cmdline 2>/dev/null)"
  if e=$(busybox tr '\0' '\n' < $d/environ 2>/dev/null); then
    echo "$e" | while IFS= read -r l; do echo "pid $p env $l"; done
  else
    echo "pid $p environ denied"
  fi
done`

// An app container that shares the pod's process namespace sees the
// sidecar's process but not its database credential: the agent's
// environment is closed to it, whether the app runs as root (without
// CAP_SYS_PTRACE, as containers run by default), as the distroless
// "nonroot" uid 65532 that many apps use, or as the sidecar's own uid
// (where only the agent's non-dumpability stands in the way). On a real
// kubelet.
func TestAnAppSharingThePodsProcessesCannotReadTheAgentsCredential(t *testing.T) {
	e := Need(t)
	dc := e.DCs[0]
	const name = "snoop"
	cjs := suspendedEverywhere(t, e, name, "schedule", Ledger{})
	secret, err := dc.Client.CoreV1().Secrets(Namespace).Get(context.Background(), DBSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cred, err := url.Parse(string(secret.Data["url"]))
	if err != nil {
		t.Fatalf("the Secret of %s holds no URL: %v", Namespace, err)
	}
	password, _ := cred.User.Password()
	if password == "" {
		t.Fatalf("the Secret of %s holds a URL without a password", Namespace)
	}
	secrets := map[string]string{"the password": password, "the role": cred.User.Username(), "the URL": string(secret.Data["url"])}

	uids := map[string]int64{"app-root": 0, "app-nonroot": 65532, "app-agent-uid": 65533}
	tick := time.Now().UTC().Truncate(time.Minute)
	job := createTickIn(t, dc, cjs[dc.Name], tick, func(j *batchv1.Job) {
		spec := &j.Spec.Template.Spec
		spec.ShareProcessNamespace = ptr.To(true)
		spec.Containers = nil
		for c, uid := range uids {
			spec.Containers = append(spec.Containers, corev1.Container{
				Name:            c,
				Image:           images.BusyboxRef,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"sh", "-c", snoopScript},
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(uid)},
			})
		}
	})
	pod := completeJob(t, dc, job.Name)
	if msg := AgentMessage(&pod); !strings.Contains(msg, "succeeded") {
		t.Fatalf("the snooping run did not run to success: agent says %q", msg)
	}

	agentLine := regexp.MustCompile(`^pid (\d+) cmdline: dislock-agent agent\b`)
	for c, uid := range uids {
		lines, err := ContainerLog(dc.Node, pod.Name, c)
		if err != nil {
			t.Fatal(err)
		}
		var agentPID string
		readable := 0
		for _, l := range lines {
			if m := agentLine.FindStringSubmatch(l.Text); m != nil {
				agentPID = m[1]
			}
			if strings.Contains(l.Text, " env ") {
				readable++
			}
			for what, s := range secrets {
				if strings.Contains(l.Text, s) {
					t.Errorf("%s (uid %d) read %s of the namespace's database credential: %q", c, uid, what, l.Text)
				}
			}
		}
		switch {
		case agentPID == "":
			t.Errorf("%s (uid %d) did not see the agent's process, so it proves nothing; its log:\n%s", c, uid, logText(lines))
		case readable == 0:
			t.Errorf("%s (uid %d) read no environment at all, so it proves nothing; its log:\n%s", c, uid, logText(lines))
		case !hasLine(lines, fmt.Sprintf("pid %s environ denied", agentPID)):
			t.Errorf("%s (uid %d) was not refused the agent's (pid %s) environment; its log:\n%s", c, uid, agentPID, logText(lines))
		default:
			t.Logf("%s (uid %d): saw the agent as pid %s, was refused its environment, read %d variables of other processes, none with the credential",
				c, uid, agentPID, readable)
		}
	}
}

func hasLine(lines []LogLine, text string) bool {
	for _, l := range lines {
		if l.Text == text {
			return true
		}
	}
	return false
}

func logText(lines []LogLine) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l.Text + "\n")
	}
	return b.String()
}

// A tenant who may exec into its pods finds in the sidecar only
// dislock-agent: no operator CLI to list or release other namespaces'
// locks, and no shell to read the environment with. On a real kubelet's
// container runtime: the API server cannot reach these test kubelets (a
// node whose only address is loopback reports none), so the test execs the
// way the kubelet does for `kubectl exec`, through containerd, into the same
// container, with its environment and its user.
func TestExecIntoTheSidecarFindsNoOperatorCLIAndNoShell(t *testing.T) {
	e := Need(t)
	dc := e.DCs[0]
	const name = "exec"
	cjs := suspendedEverywhere(t, e, name, "schedule", Ledger{})
	// The app runs until the test tells it to stop (through exec too), at
	// most two minutes.
	job := createTickIn(t, dc, cjs[dc.Name], time.Now().UTC().Truncate(time.Minute), func(j *batchv1.Job) {
		j.Spec.Template.Spec.Containers = []corev1.Container{{
			Name:            "app",
			Image:           images.BusyboxRef,
			ImagePullPolicy: corev1.PullNever,
			Command:         []string{"sh", "-c", "i=0; while [ ! -e /dev/shm/done ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done"},
		}}
	})
	ids := map[string]string{}
	await(t, jobTimeout, "the app of Job "+job.Name+" running", func() bool {
		pods, err := dc.Pods(context.Background(), job.Name)
		if err != nil || len(pods) != 1 {
			return false
		}
		for _, s := range append(pods[0].Status.InitContainerStatuses, pods[0].Status.ContainerStatuses...) {
			if s.State.Running != nil {
				ids[s.Name] = strings.TrimPrefix(s.ContainerID, "containerd://")
			}
		}
		return ids["app"] != "" && ids[sidecarName] != ""
	})
	n := 0
	run := func(container string, cmd ...string) (string, error) {
		n++
		return dc.Node.Ctr(append([]string{"tasks", "exec", "--exec-id", fmt.Sprintf("e2e-exec-%d", n), ids[container]}, cmd...)...)
	}
	// exec reaches the sidecar: the one program it holds answers.
	if out, err := run(sidecarName, "dislock-agent", "version"); err != nil || !strings.Contains(out, "dislock-agent") {
		t.Fatalf("exec into the sidecar does not work here (%v): %s", err, out)
	}
	for _, cmd := range [][]string{
		{"dislock", "leases"},
		{"dislock", "release", "--key", OtherTeam + "/report"},
		{"sh", "-c", "env"},
		{"/bin/sh"},
		{"cat", "/proc/1/environ"},
	} {
		out, err := run(sidecarName, cmd...)
		switch {
		case err == nil:
			t.Errorf("exec -c %s -- %s ran: %s", sidecarName, strings.Join(cmd, " "), out)
			continue
		case !strings.Contains(err.Error(), "executable file not found") && !strings.Contains(err.Error(), "no such file or directory"):
			t.Errorf("exec -c %s -- %s failed, but not for want of the program: %v", sidecarName, strings.Join(cmd, " "), err)
			continue
		}
		t.Logf("exec -c %s -- %s: refused: %s", sidecarName, strings.Join(cmd, " "), firstLine(err.Error()))
	}
	if out, err := run("app", "touch", "/dev/shm/done"); err != nil {
		t.Fatalf("telling the app to stop: %v: %s", err, out)
	}
	completeJob(t, dc, job.Name)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
