package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/images"
	"github.com/dislock/dislock/test/kube"
)

// imageSet is built once by TestMain; imageErr says why there is none.
var (
	imageSet images.Set
	imageErr error
)

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "node-test-images-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		imageSet, imageErr = images.Build(dir)
		switch {
		case imageErr == nil:
		case errors.Is(imageErr, images.ErrMissing) && !harness.InCI():
			fmt.Fprintf(os.Stderr, "%v\nnode: tests that need images will be skipped\n", imageErr)
		default:
			fmt.Fprintf(os.Stderr, "%v\n", imageErr)
			return 1
		}
		return kube.Main(m, kube.Options{Name: "node", ControllerManager: true})
	}())
}

// newNode starts a node of its own for the test on the shared cluster;
// tune, when given, changes its Options.
func newNode(t *testing.T, name string, scheduler bool, tune ...func(*Options)) (*Node, kubernetes.Interface) {
	t.Helper()
	c := kube.Need(t)
	if imageErr != nil {
		harness.Missing(t, imageErr, images.ErrMissing)
	}
	opts := Options{Name: name, Cluster: c, Images: imageSet.Tarball, Scheduler: scheduler}
	for _, f := range tune {
		f(&opts)
	}
	n := New(t, opts)
	return n, kubernetes.NewForConfigOrDie(c.RESTConfig())
}

// namespace creates a namespace and waits for its default ServiceAccount,
// without which the API server refuses pods.
func namespace(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, 30*time.Second, "the default ServiceAccount in "+name, func() error {
		_, err := cs.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// await polls cond until it returns nil, failing the test with its last
// error after timeout.
func await(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting %v for %s: %v", timeout, what, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

const sharedDir = "/shared"

// sidecarJob is a Job whose pod has a native sidecar that becomes ready
// (its exec startupProbe passes) only two seconds after it starts, and an
// app that fails unless it starts after that.
func sidecarJob(name string) *batchv1.Job {
	mount := []corev1.VolumeMount{{Name: "shared", MountPath: sharedDir}}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To(int32(0)),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				HostNetwork:   true,
				Volumes:       []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				InitContainers: []corev1.Container{{
					Name: "sidecar", Image: images.BusyboxRef, ImagePullPolicy: corev1.PullNever,
					RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
					Command:       []string{"sh", "-c", `trap 'exit 0' TERM; sleep 2; touch ` + sharedDir + `/ready; while true; do sleep 0.2; done`},
					StartupProbe: &corev1.Probe{
						ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-f", sharedDir + "/ready"}}},
						PeriodSeconds: 1, FailureThreshold: 60,
					},
					VolumeMounts: mount,
				}},
				Containers: []corev1.Container{{
					Name: "app", Image: images.BusyboxRef, ImagePullPolicy: corev1.PullNever,
					Command:      []string{"sh", "-c", `test -f ` + sharedDir + `/ready && echo "ran after the sidecar was ready" > /dev/termination-log`},
					VolumeMounts: mount,
				}},
			}},
		},
	}
}

func TestAJobWhosePodHasANativeSidecarRunsToCompletion(t *testing.T) {
	n, cs := newNode(t, "sidecar", true)
	ctx := context.Background()
	namespace(t, cs, "sidecar")
	begun := time.Now()
	if _, err := cs.BatchV1().Jobs("sidecar").Create(ctx, sidecarJob("with-sidecar"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, 2*time.Minute, "the Job to complete", func() error {
		job, err := cs.BatchV1().Jobs("sidecar").Get(ctx, "with-sidecar", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range job.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				continue
			}
			switch c.Type {
			case batchv1.JobComplete:
				return nil
			case batchv1.JobFailed:
				t.Fatalf("Job failed: %s: %s", c.Reason, c.Message)
			}
		}
		return fmt.Errorf("conditions %v", job.Status.Conditions)
	})
	t.Logf("Job complete %v after it was created", time.Since(begun).Round(time.Millisecond))

	pods, err := cs.CoreV1().Pods("sidecar").List(ctx, metav1.ListOptions{LabelSelector: "job-name=with-sidecar"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods of the Job: %d (%v), want 1", len(pods.Items), err)
	}
	pod := pods.Items[0]
	if pod.Spec.NodeName != n.Name() {
		t.Errorf("pod ran on %q, want the node %q (placed by the scheduler)", pod.Spec.NodeName, n.Name())
	}
	app := terminated(t, pod.Status.ContainerStatuses, "app")
	if app.ExitCode != 0 || !strings.Contains(app.Message, "after the sidecar was ready") {
		t.Errorf("app terminated with exit %d, message %q: want 0 and the line it writes once the sidecar is ready", app.ExitCode, app.Message)
	}
	sidecar := terminated(t, pod.Status.InitContainerStatuses, "sidecar")
	if sidecar.FinishedAt.Before(&app.FinishedAt) {
		t.Errorf("sidecar finished at %v, before the app (%v): the kubelet stops native sidecars after the app", sidecar.FinishedAt, app.FinishedAt)
	}
}

// terminated returns the named container's terminated state.
func terminated(t *testing.T, statuses []corev1.ContainerStatus, name string) *corev1.ContainerStateTerminated {
	t.Helper()
	for _, s := range statuses {
		if s.Name == name {
			if s.State.Terminated == nil {
				t.Fatalf("container %s is not terminated: %+v", name, s.State)
			}
			return s.State.Terminated
		}
	}
	t.Fatalf("no status for container %s in %+v", name, statuses)
	return nil
}

// runningPod creates a pod that runs until deleted, with a service-account
// token (a tmpfs mount) and an emptyDir, and waits until it runs: a node
// with everything Close must remove.
func runningPod(t *testing.T, cs kubernetes.Interface, ns, nodeName string) {
	t.Helper()
	ctx := context.Background()
	namespace(t, cs, ns)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper"},
		Spec: corev1.PodSpec{
			NodeName:    nodeName,
			HostNetwork: true,
			Volumes:     []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Containers: []corev1.Container{{
				Name: "sleep", Image: images.BusyboxRef, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"sleep", "3600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, 2*time.Minute, "the pod to run", func() error {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "sleeper", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
}

// footprint is what a node has on the host at one moment.
type footprint struct {
	pids    map[string]int // programs and shims, by name
	mounts  []string
	cgroups []string
	address string // the node's own on the loopback interface, if it has one there
}

func footprintOf(t *testing.T, n *Node) footprint {
	t.Helper()
	fp := footprint{pids: n.Pids()}
	for pid, cmdline := range processes(t) {
		if strings.Contains(cmdline, "containerd-shim") && strings.Contains(cmdline, n.Socket()) {
			fp.pids["shim "+strconv.Itoa(pid)] = pid
		}
	}
	mounts, err := os.ReadFile("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], n.Dir()+"/") {
			fp.mounts = append(fp.mounts, f[1])
		}
	}
	cgMounts, err := cgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range cgMounts {
		if _, err := os.Stat(filepath.Join(m, n.CgroupRoot())); err == nil {
			fp.cgroups = append(fp.cgroups, filepath.Join(m, n.CgroupRoot()))
		}
	}
	lo, err := exec.Command("ip", "-4", "-o", "addr", "show", "dev", "lo").CombinedOutput()
	if err != nil {
		t.Fatalf("ip addr show dev lo: %v: %s", err, lo)
	}
	if a := n.Address(); a != "127.0.0.1" && strings.Contains(string(lo), " "+a+"/32 ") {
		fp.address = a
	}
	return fp
}

// processes maps every pid to its command line.
func processes(t *testing.T) map[int]string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil {
			out[pid] = strings.ReplaceAll(string(b), "\x00", " ")
		}
	}
	return out
}

// iptablesChains lists the chains of the tables the kubelet would touch.
func iptablesChains(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, table := range []string{"filter", "nat", "mangle"} {
		out, err := exec.Command("iptables", "-w", "-t", table, "-S").CombinedOutput()
		if err != nil {
			t.Logf("iptables -t %s -S: %v: %s", table, err, out)
			continue
		}
		b.Write(out)
	}
	return b.String()
}

// assertGone checks that nothing of fp is left after Close (or the
// watchdog).
func assertGone(t *testing.T, n *Node, fp footprint) {
	t.Helper()
	for name, pid := range fp.pids {
		if alive(pid) {
			t.Errorf("%s (pid %d) is still running", name, pid)
		}
	}
	after := footprintOf(t, n)
	if len(after.mounts) > 0 {
		t.Errorf("still mounted under %s: %v", n.Dir(), after.mounts)
	}
	if len(after.cgroups) > 0 {
		t.Errorf("cgroups still there: %v", after.cgroups)
	}
	if _, err := os.Stat(n.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s still there (stat: %v)", n.Dir(), err)
	}
	if after.address != "" {
		t.Errorf("the node's address %s is still on the loopback interface", after.address)
	}
}

// absentHostPaths lists the host paths a node creates that do not exist now.
func absentHostPaths() []string {
	var out []string
	for _, p := range hostPaths {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			out = append(out, p)
		}
	}
	return out
}

// assertHostPathsGone checks that the host paths that did not exist before
// the node started are gone again: with no other node running, the last
// one to close removes them.
func assertHostPathsGone(t *testing.T, absentBefore []string) {
	t.Helper()
	for _, p := range absentBefore {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s did not exist before the node started and is still there after Close (stat: %v)", p, err)
		}
	}
}

func TestCloseLeavesNoProcessMountCgroupOrChainBehind(t *testing.T) {
	chainsBefore := iptablesChains(t)
	absentBefore := absentHostPaths()
	n, cs := newNode(t, "close", false, ownAddress)
	runningPod(t, cs, "close", n.Name())

	fp := footprintOf(t, n)
	if fp.address == "" {
		t.Fatalf("the node's own address %s is not on the loopback interface", n.Address())
	}
	shims := 0
	for name := range fp.pids {
		if strings.HasPrefix(name, "shim ") {
			shims++
		}
	}
	// Without these, the test would prove nothing.
	if shims == 0 || len(fp.mounts) == 0 || len(fp.cgroups) == 0 {
		t.Fatalf("a node running a pod should have shims, mounts and cgroups; found %d shims, mounts %v, cgroups %v", shims, fp.mounts, fp.cgroups)
	}
	t.Logf("before Close: %d processes (%d shims), %d mounts, cgroup in %d hierarchies", len(fp.pids), shims, len(fp.mounts), len(fp.cgroups))
	for _, p := range []string{"/var/lib/kubelet/device-plugins", "/run/containerd/s"} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("a running node should have created %s: %v", p, err)
		}
	}
	if chains := iptablesChains(t); chains != chainsBefore {
		t.Errorf("the node changed iptables:\nbefore:\n%s\nafter:\n%s", chainsBefore, chains)
	}

	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	assertGone(t, n, fp)
	if chains := iptablesChains(t); chains != chainsBefore {
		t.Errorf("iptables differ after Close:\nbefore:\n%s\nafter:\n%s", chainsBefore, chains)
	}
	// The kubelet's device-plugin socket and the shims' sockets live in
	// host paths; with no other node running, they go as well.
	assertHostPathsGone(t, absentBefore)
}

// ownAddress gives the node an address of its own (Options.OwnAddress),
// which Close and the watchdog must remove.
func ownAddress(o *Options) { o.OwnAddress = true }

// shimSocketDir is where containerd 1.6 puts its shims' sockets, whatever
// its configuration says.
const shimSocketDir = "/run/containerd/s"

// shimSockets lists the sockets in shimSocketDir.
func shimSockets(t *testing.T) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(shimSocketDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		out[filepath.Join(shimSocketDir, e.Name())] = true
	}
	return out
}

// containerPids lists the processes in the node's cgroup subtree: its
// containers' processes.
func containerPids(t *testing.T, n *Node) []int {
	t.Helper()
	mounts, err := cgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	var out []int
	for _, m := range mounts {
		_ = filepath.WalkDir(filepath.Join(m, n.CgroupRoot()), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(path)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					out = append(out, pid)
				}
			}
			return nil
		})
	}
	return out
}

func TestAKilledNodeLeavesNothingRunningAndCloseStillRemovesEverything(t *testing.T) {
	absentBefore := absentHostPaths()
	socketsBefore := shimSockets(t)
	n, cs := newNode(t, "killed", false)
	runningPod(t, cs, "killed", n.Name())
	fp := footprintOf(t, n)
	containers := containerPids(t, n)
	var sockets []string
	for s := range shimSockets(t) {
		if !socketsBefore[s] {
			sockets = append(sockets, s)
		}
	}
	// Without these, the test would prove nothing.
	if len(containers) == 0 || len(sockets) == 0 || len(fp.mounts) == 0 {
		t.Fatalf("a node running a pod should have container processes, shim sockets and mounts; found pids %v, sockets %v, mounts %v", containers, sockets, fp.mounts)
	}

	begun := time.Now()
	if err := n.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	t.Logf("Kill took %v: %d node processes and shims, %d container processes", time.Since(begun).Round(time.Millisecond), len(fp.pids), len(containers))
	for name, pid := range fp.pids {
		if alive(pid) {
			t.Errorf("%s (pid %d) still runs after Kill", name, pid)
		}
	}
	for _, pid := range containers {
		if alive(pid) {
			t.Errorf("container process %d still runs after Kill: the shims keep containers alive unless they are killed too", pid)
		}
	}
	if left := n.Pids(); len(left) > 0 {
		t.Errorf("Pids after Kill: %v, want none", left)
	}
	// A power cut cleans nothing up: what is left is Close's to remove.
	if after := footprintOf(t, n); len(after.mounts) == 0 || len(after.cgroups) == 0 {
		t.Errorf("after Kill the mounts (%v) and cgroups (%v) should still be there, as after a power cut", after.mounts, after.cgroups)
	}

	if err := n.Close(); err != nil {
		t.Fatalf("Close after Kill: %v", err)
	}
	assertGone(t, n, fp)
	for _, s := range sockets {
		if _, err := os.Stat(s); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the socket %s of a killed shim is still there after Close (stat: %v)", s, err)
		}
	}
	assertHostPathsGone(t, absentBefore)
}

func TestTheWatchdogCleansUpANodeWhoseTestProcessDied(t *testing.T) {
	n, cs := newNode(t, "abandoned", false, ownAddress)
	runningPod(t, cs, "abandoned", n.Name())
	fp := footprintOf(t, n)
	if fp.address == "" {
		t.Fatalf("the node's own address %s is not on the loopback interface", n.Address())
	}

	// What the death of the test process looks like to the watchdog.
	n.wd.Abandon()
	await(t, time.Minute, "the watchdog to remove the node's directory", func() error {
		if _, err := os.Stat(n.Dir()); err == nil {
			return errors.New("still there")
		}
		return nil
	})
	assertGone(t, n, fp)
	// Nothing is left for Close: it must not fail on what is gone.
	if err := n.Close(); err != nil {
		t.Errorf("Close after the watchdog: %v", err)
	}
}

func TestStartWithoutContainerdSaysHowToInstallIt(t *testing.T) {
	_, err := Start(Options{})
	if err == nil || !strings.Contains(err.Error(), "required") {
		t.Errorf("Start without options: %v, want an error naming the required options", err)
	}
	// An empty PATH hides containerd, ctr and runc.
	t.Setenv("PATH", t.TempDir())
	_, err = Start(Options{Name: "missing", Cluster: &kube.Cluster{}, Images: "images.tar"})
	if !errors.Is(err, ErrMissing) {
		t.Fatalf("Start without containerd: %v, want an error wrapping ErrMissing", err)
	}
	for _, want := range []string{"containerd", "runc", "hack/install-node-deps.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

// alive reports whether pid is a process that has not exited: a zombie
// (a shim killed and not yet reaped by init) has.
var alive = harness.Alive
