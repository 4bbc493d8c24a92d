// Package node runs a real Kubernetes node for tests: a kubelet and its own
// containerd, against a control plane from test/kube, on this machine.
//
// A Node owns one temporary directory (containerd's root, state and socket,
// the kubelet's root-dir, cert-dir and pod logs, configs, logs), a cgroup
// subtree named after the directory, free 127.0.0.1 ports, and the processes
// it starts; so several nodes, each of its own cluster, run side by side.
// Start imports an image tarball (test/images) into the node's containerd,
// whose pause image is one of them: nothing is pulled. Pods are expected to
// use the host network and reach services on 127.0.0.1 (the CNI network is
// loopback only).
//
// Close stops the kubelet, the containers, the shims and containerd,
// unmounts everything under the directory, removes the cgroups and the
// directory, and checks that nothing is left. A watchdog does the same if the
// test process dies first. Kill is the node's sudden death (every process
// SIGKILLed at once, nothing cleaned up), for tests of what survives a lost
// node; Close still removes everything after it. The kubelet is told not to create iptables chains
// (they are host-wide); the two host paths a kubelet and containerd create
// whatever they are told (/var/lib/kubelet/device-plugins,
// /run/containerd/s) are removed by the last node to close, if they did not
// exist before.
//
// Requirements: root; Debian's containerd, runc and containernetworking-plugins
// (hack/install-node-deps.sh); kubelet (and kube-scheduler, if asked for) in
// <repo>/bin from `make tools`; cgroup v1 hierarchies (the kubelet runs with
// cgroupfs and failCgroupV1: false). Without them Start returns an error
// wrapping ErrMissing that says how to get them.
package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/images"
	"github.com/dislock/dislock/test/kube"
)

// ErrMissing is returned (wrapped) by Start when something the node needs is
// not on this machine; the wrapping error says how to get it.
var ErrMissing = errors.New("node: missing prerequisite")

// Options configure a Node.
type Options struct {
	// Name is the node's name (and its hostname-override); it appears in the
	// directory's name too. Required, and unique per cluster.
	Name string
	// Cluster is the control plane the kubelet registers with. Required.
	Cluster *kube.Cluster
	// Images is the image tarball to import (images.Set.Tarball). Required.
	Images string
	// PauseImage is the sandbox image, which must be in Images. Default
	// images.PauseRef.
	PauseImage string
	// Scheduler also runs kube-scheduler for the cluster: test/kube starts no
	// scheduler, and a one-node cluster's scheduler only ever places pods on
	// this node.
	Scheduler bool
	// OwnAddress gives the node an IPv4 address of its own, added to the
	// host's loopback interface for the node's life: its InternalIP, the
	// kubelet's serving address, and so the address of its host-network
	// pods. Kubernetes refuses loopback addresses (127.0.0.0/8) as a
	// Service's endpoints, so a host-network pod that serves a Service (a
	// chart-installed webhook) needs a node with one. It is drawn from
	// 198.18.0.0/15 (for benchmarks, RFC 2544), which no real network
	// uses; its traffic never leaves the loopback interface. Without it
	// the node's address is 127.0.0.1.
	OwnAddress bool
	// Logf receives progress lines (t.Logf); nil = silent.
	Logf func(format string, args ...any)
}

// Program names, which are also the names of their log and pid files.
const (
	containerdBin = "containerd"
	ctrBin        = "ctr"
	runcBin       = "runc"
	kubeletBin    = "kubelet"
	schedulerBin  = "kube-scheduler"
)

const (
	// readyTimeout bounds the wait for containerd and for Node Ready (7.5 s
	// on an idle machine).
	readyTimeout = 2 * time.Minute
	pollInterval = 200 * time.Millisecond
	// stopGrace is how long the kubelet, the scheduler and containerd get to
	// exit after SIGTERM.
	stopGrace = 10 * time.Second
	// ctrTimeout bounds one ctr call.
	ctrTimeout = 2 * time.Minute
	// k8sNamespace is containerd's namespace for CRI (Kubernetes) objects.
	k8sNamespace = "k8s.io"
)

// Node is a running kubelet with its containerd. Its methods are safe for
// concurrent use.
type Node struct {
	opts Options
	dir  string
	bins map[string]string
	wd   *harness.Watchdog

	kubeletPort, healthzPort int
	addr                     string // Options.OwnAddress's

	mu       sync.Mutex
	closed   bool
	closeErr error
	procs    map[string]*Process
	// hostPaths says that acquireHostPaths was called.
	hostPaths bool
}

// Start creates the node's directory and cgroup, starts containerd, imports
// the images, starts the kubelet (and the scheduler, if asked) and returns
// once the API server reports the node Ready.
func Start(opts Options) (*Node, error) {
	if opts.Name == "" || opts.Cluster == nil || opts.Images == "" {
		return nil, errors.New("node: Options.Name, Cluster and Images are required")
	}
	if opts.PauseImage == "" {
		opts.PauseImage = images.PauseRef
	}
	bins, err := findPrerequisites(opts.Scheduler)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "dislock-node-"+label(opts.Name)+"-")
	if err != nil {
		return nil, fmt.Errorf("node: creating temp dir: %w", err)
	}
	n := &Node{opts: opts, dir: dir, bins: bins, procs: map[string]*Process{}}
	// Not in our process group and not killed with us: it must outlive us.
	n.wd, err = harness.StartWatchdog("node", cleanupScript, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := n.setUp(); err != nil {
		err = fmt.Errorf("%w\n%s", err, n.LogTails())
		if cerr := n.Close(); cerr != nil {
			err = fmt.Errorf("%w\nand closing: %v", err, cerr)
		}
		return nil, err
	}
	return n, nil
}

func (n *Node) setUp() error {
	begun := time.Now()
	if err := acquireHostPaths(n.dir); err != nil {
		return err
	}
	n.hostPaths = true
	if err := createCgroupRoot(n.cgroupRoot()); err != nil {
		return err
	}
	if n.opts.OwnAddress {
		addr, err := addLoopbackAddress(n.dir)
		if err != nil {
			return err
		}
		n.addr = addr
	}
	ports, err := harness.FreePorts(2)
	if err != nil {
		return err
	}
	n.kubeletPort, n.healthzPort = ports[0], ports[1]
	if err := n.writeConfigs(); err != nil {
		return err
	}

	if _, err := n.start(containerdBin, "--config", n.path("containerd.toml")); err != nil {
		return err
	}
	if err := n.waitFor(containerdBin, func() error { _, err := n.ctr("version"); return err }); err != nil {
		return err
	}
	importBegun := time.Now()
	if _, err := n.ctr("images", "import", n.opts.Images); err != nil {
		return fmt.Errorf("node: importing %s: %w", n.opts.Images, err)
	}
	n.logf("containerd up, images imported in %v", time.Since(importBegun).Round(time.Millisecond))

	kubeconfig := n.opts.Cluster.Kubeconfig()
	if _, err := n.start(kubeletBin,
		"--config="+n.path("kubelet.json"),
		"--kubeconfig="+kubeconfig,
		"--root-dir="+n.path("kubelet"),
		"--cert-dir="+n.path("kubelet-certs"),
		"--hostname-override="+n.opts.Name,
		"--node-ip="+n.Address(),
	); err != nil {
		return err
	}
	if n.opts.Scheduler {
		// Port 0: no serving endpoint, so nothing to collide with; the
		// scheduler's readiness shows in pods getting a node.
		if _, err := n.start(schedulerBin,
			"--kubeconfig="+kubeconfig,
			"--authentication-kubeconfig="+kubeconfig,
			"--authorization-kubeconfig="+kubeconfig,
			"--leader-elect=false",
			"--secure-port=0",
		); err != nil {
			return err
		}
	}
	if err := n.waitReady(); err != nil {
		return err
	}
	n.logf("node Ready in %v (dir %s, cgroup %s)", time.Since(begun).Round(time.Millisecond), n.dir, n.cgroupRoot())
	return nil
}

// waitReady polls the Node object until its Ready condition is True.
func (n *Node) waitReady() error {
	cs, err := kubernetes.NewForConfig(n.opts.Cluster.RESTConfig())
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	return n.waitFor(kubeletBin, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		node, err := cs.CoreV1().Nodes().Get(ctx, n.opts.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node %s Ready=%s: %s", n.opts.Name, c.Status, c.Message)
			}
		}
		return fmt.Errorf("node %s has no Ready condition yet", n.opts.Name)
	})
}

// Name is the node's name.
func (n *Node) Name() string { return n.opts.Name }

// Dir is the node's directory, which holds the logs (<program>.log).
func (n *Node) Dir() string { return n.dir }

// Socket is containerd's socket, for ctr -a.
func (n *Node) Socket() string { return n.socket() }

// Pids returns the pid of every program still running, by name (containerd,
// kubelet, kube-scheduler).
func (n *Node) Pids() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]int{}
	for name, p := range n.procs {
		if p.Running() {
			out[name] = p.Pid()
		}
	}
	return out
}

// CgroupRoot is the cgroup (in every hierarchy) that holds the node's pods.
func (n *Node) CgroupRoot() string { return n.cgroupRoot() }

// Close stops the scheduler and the kubelet (SIGTERM), removes every
// container through containerd, stops containerd, then runs the cleanup
// script (which also kills what did not stop, unmounts, and removes the
// cgroups and the directory). Later calls return the first call's result.
func (n *Node) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return n.closeErr
	}
	n.closed = true
	begun := time.Now()
	var errs []error
	for _, name := range []string{schedulerBin, kubeletBin} {
		if err := n.procs[name].Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if p := n.procs[containerdBin]; p.Running() {
		// Deleting the containers lets their shims exit and remove their
		// sockets. Failures are left to the script, which kills harder.
		n.removeContainersLocked()
		if err := p.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := runCleanup(n.dir); err != nil {
		errs = append(errs, err)
	}
	n.wd.Stop()
	if n.hostPaths {
		if err := releaseHostPaths(); err != nil {
			errs = append(errs, err)
		}
		_ = os.Remove(hostPathsFile(n.dir))
	}
	n.closeErr = errors.Join(errs...)
	n.logf("stopped in %v; removed %s and cgroup %s", time.Since(begun).Round(time.Millisecond), n.dir, n.cgroupRoot())
	return n.closeErr
}

// Kill is the node dying at once, as in a power cut: the kubelet, the
// scheduler (if the node runs one), containerd, every shim and every
// container process get SIGKILL together; nothing is stopped in order,
// nothing recorded, unmounted or removed. The shims are killed too because
// they keep containers running without containerd. Kill returns once every
// one of those processes is gone. Close still removes everything afterwards.
func (n *Node) Kill() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return errors.New("node: Kill after Close")
	}
	begun := time.Now()
	if err := runKill(n.dir); err != nil {
		return err
	}
	// Reap our own children, so that Pids and Close see them gone.
	for name, p := range n.procs {
		if !p.awaitExit(stopGrace) {
			return fmt.Errorf("node: %s (pid %d) not reaped %v after SIGKILL", name, p.Pid(), stopGrace)
		}
	}
	n.logf("killed in %v: kubelet, containerd, shims and containers SIGKILLed", time.Since(begun).Round(time.Millisecond))
	return nil
}

// removeContainersLocked deletes every task and container in the
// Kubernetes namespace with two ctr calls: `tasks delete -f` kills a task
// that still runs.
func (n *Node) removeContainersLocked() {
	out, err := n.ctr("containers", "list", "-q")
	if err != nil {
		return
	}
	ids := strings.Fields(out)
	if len(ids) == 0 {
		return
	}
	_, _ = n.ctr(append([]string{"tasks", "delete", "-f"}, ids...)...)
	_, _ = n.ctr(append([]string{"containers", "delete"}, ids...)...)
}

// Ctr runs `ctr -a <socket> -n k8s.io args...` against the node's containerd
// and returns its output.
func (n *Node) Ctr(args ...string) (string, error) { return n.ctr(args...) }

func (n *Node) ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ctrTimeout)
	defer cancel()
	full := append([]string{"-a", n.socket(), "-n", k8sNamespace}, args...)
	out, err := exec.CommandContext(ctx, n.bins[ctrBin], full...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// LogTails returns the end of the containerd, kubelet and scheduler logs,
// for a failing test's output.
func (n *Node) LogTails() string {
	var b strings.Builder
	for _, name := range []string{containerdBin, kubeletBin, schedulerBin} {
		if _, err := os.Stat(n.path(name + ".log")); err != nil {
			continue
		}
		b.WriteString(harness.LogTail(n.path(name+".log"), 40, 8192))
		b.WriteString("\n")
	}
	return b.String()
}

// cgroupRoot is named after the directory, which is unique; the cleanup
// script derives it the same way.
func (n *Node) cgroupRoot() string { return "/" + filepath.Base(n.dir) }

func (n *Node) socket() string { return n.path("containerd.sock") }

func (n *Node) path(elem ...string) string {
	return filepath.Join(append([]string{n.dir}, elem...)...)
}

func (n *Node) logf(format string, args ...any) {
	if n.opts.Logf != nil {
		n.opts.Logf("node[%s]: "+format, append([]any{n.opts.Name}, args...)...)
	}
}

// findPrerequisites checks everything Start needs and names every missing
// piece in one error.
func findPrerequisites(scheduler bool) (map[string]string, error) {
	bins := map[string]string{}
	var problems []string
	if os.Geteuid() != 0 {
		problems = append(problems, "the kubelet and containerd need root: run the tests as root")
	}
	var debian []string
	for _, name := range []string{containerdBin, ctrBin, runcBin} {
		p, err := exec.LookPath(name)
		if err != nil {
			debian = append(debian, name)
			continue
		}
		bins[name] = p
	}
	if _, err := os.Stat(filepath.Join(cniBinDir, "loopback")); err != nil {
		debian = append(debian, "CNI plugins ("+cniBinDir+")")
	}
	if len(debian) > 0 {
		problems = append(problems, fmt.Sprintf("%s not found: install Debian's containerd, runc and "+
			"containernetworking-plugins with hack/install-node-deps.sh", strings.Join(debian, ", ")))
	}
	names := []string{kubeletBin}
	if scheduler {
		names = append(names, schedulerBin)
	}
	var kubeErr error
	for _, name := range names {
		p, err := kube.FindBinary(name)
		if err != nil {
			kubeErr = err
			continue
		}
		bins[name] = p
	}
	if kubeErr != nil {
		problems = append(problems, kubeErr.Error())
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrMissing, strings.Join(problems, "; "))
	}
	return bins, nil
}

// label turns a node name into a short, path-safe label.
func label(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if b.Len() >= 20 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		default:
			b.WriteRune('-')
		}
	}
	return b.String()
}

// errExited reports that a program exited while being waited for.
var errExited = errors.New("exited")

// waitFor polls probe until it succeeds, the named program exits, or
// readyTimeout passes.
func (n *Node) waitFor(name string, probe func() error) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		err := probe()
		if err == nil {
			return nil
		}
		n.mu.Lock()
		p := n.procs[name]
		n.mu.Unlock()
		if p != nil && !p.Running() {
			return fmt.Errorf("node: %s %w (%v) while waiting: %v", name, errExited, p.State(), err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node: %s not ready within %v: %w", name, readyTimeout, err)
		}
		time.Sleep(pollInterval)
	}
}

// Address is the node's IPv4 address: its own (Options.OwnAddress), or
// 127.0.0.1.
func (n *Node) Address() string {
	if n.addr != "" {
		return n.addr
	}
	return "127.0.0.1"
}
