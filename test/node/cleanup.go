package node

// Cleanup: one shell script removes everything a node leaves on the host.
// Close runs it after stopping the components in order; the watchdog runs the
// same script when the test process dies without closing its nodes (panic,
// timeout, ^C, SIGKILL), so the path a crashed run takes is the one every
// Close exercises. Kill, a node's sudden death, shares its way of finding
// the node's processes.

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// cleanupScript's $1 is the node directory. As the watchdog (no $2) it first
// waits for its stdin (a pipe whose only writer is the test process) to
// close, i.e. for the test process to die, and then also removes the host
// paths the node's process created outside its directory, listed in
// $1.host-paths: beside the directory, not in it, because a Close cut short
// by a signal may already have removed the directory when the watchdog runs.
// Close runs it with $2 = "now". What it removes, and how each is found, is
// listed at scriptLib.
const cleanupScript = scriptLib + `
[ "$2" = now ] || read -r _
status=0

# The kubelet and the scheduler first, so that nothing restarts what follows.
pids=
for name in kube-scheduler kubelet; do
	pid=$(cat "$dir/$name.pid" 2>/dev/null) && kill -KILL "$pid" 2>/dev/null && pids="$pids $pid"
done
waitgone $pids

killcgroup

# Shims, and the sockets they listen on: those of live shims, and those Kill
# noted before it killed their shims.
shims=$(shims)
socks="$(shimsockets $shims) $(cat "$dir/shim-sockets" 2>/dev/null)"
for pid in $shims; do kill -KILL "$pid" 2>/dev/null; done
waitgone $shims
for s in $socks; do rm -f "$s"; done

pid=$(cat "$dir/containerd.pid" 2>/dev/null) && kill -KILL "$pid" 2>/dev/null && waitgone "$pid"

n=0
while [ -n "$(mounts)" ] && [ "$n" -lt 20 ]; do
	for m in $(mounts); do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
	n=$((n+1))
done

for m in $(cgmounts); do
	[ -d "$m$root" ] || continue
	n=0
	while [ -d "$m$root" ] && [ "$n" -lt 50 ]; do
		find "$m$root" -depth -type d -exec rmdir {} + 2>/dev/null
		[ -d "$m$root" ] && sleep 0.1
		n=$((n+1))
	done
	[ -d "$m$root" ] && { echo "cgroup $m$root still exists" >&2; status=1; }
done

# The node's address on the loopback interface (Options.Address), in either
# mode: Close and the watchdog remove it alike.
if [ -f "$dir.address" ]; then
	ip addr del "$(cat "$dir.address")/32" dev lo 2>/dev/null
	rm -f "$dir.address"
fi

if [ "$2" != now ] && [ -f "$dir.host-paths" ]; then
	while read -r p; do rm -rf "$p"; done < "$dir.host-paths"
	rm -f "$dir.host-paths"
fi

left=$(mounts)
if [ -n "$left" ]; then
	echo "still mounted, so $dir is kept: $left" >&2
	exit 1
fi
rm -rf "$dir"
exit $status
`

// killScript's $1 is the node directory. It is the node losing power: the
// kubelet, the scheduler, containerd, the shims and every container process
// get SIGKILL in one kill(1) call, and nothing is stopped in order, unmounted
// or removed. The shims' sockets can only be found through live shims, so
// they are noted in $1/shim-sockets first, for cleanupScript. A container
// process forked while the kill ran is killed by the loop after it.
const killScript = scriptLib + `
pids=
for name in kube-scheduler kubelet containerd; do
	pid=$(cat "$dir/$name.pid" 2>/dev/null) && pids="$pids $pid"
done
shims=$(shims)
shimsockets $shims >> "$dir/shim-sockets"
kill -KILL $pids $shims $(cgprocs) 2>/dev/null
killcgroup
waitgone $pids $shims
left=$(cgprocs)
for pid in $pids $shims; do alive "$pid" && left="$left $pid"; done
[ -z "$left" ] || { echo "still running after SIGKILL: $left" >&2; exit 1; }
exit 0
`

// scriptLib holds what cleanupScript and killScript share: $1 is the node
// directory.
//
// What a node leaves behind, and how each is found:
//   - kubelet, kube-scheduler and containerd: pid files in the directory;
//   - container processes: every process in the node's cgroup subtree
//     (cgroupRoot, named after the directory) in every hierarchy;
//   - containerd shims, which daemonize and so outlive containerd: the
//     processes whose command line names the node's containerd socket; their
//     sockets live in /run/containerd/s (a path containerd 1.6 hardcodes) and
//     are found through the shims' open file descriptors;
//   - mounts (the kubelet's root-dir bind mount, pod volumes, container root
//     filesystems, sandbox /dev/shm): every mount point under the directory,
//     deepest first;
//   - the cgroup subtree, deepest first, once it holds no process;
//   - the directory itself, only once nothing is mounted under it.
const scriptLib = `
dir="$1"
root="/$(basename "$dir")"

cgmounts() { awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/mounts; }
cgprocs() {
	for m in $(cgmounts); do
		[ -d "$m$root" ] && find "$m$root" -name cgroup.procs -exec cat {} + 2>/dev/null
	done
}
mounts() { awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r; }
# A zombie counts as gone: shims are reparented to init, which reaps them
# when it gets to it.
alive() {
	st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
	[ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
gone() {
	for pid in "$@"; do alive "$pid" && return 1; done
	return 0
}
waitgone() {
	n=0
	while ! gone "$@" && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n+1)); done
}
# Container processes. A process may fork while we read: repeat until none
# is left.
killcgroup() {
	n=0
	while [ -n "$(cgprocs)" ] && [ "$n" -lt 50 ]; do
		for pid in $(cgprocs); do kill -KILL "$pid" 2>/dev/null; done
		sleep 0.1
		n=$((n+1))
	done
}
# One grep over every command line: a tr per process takes seconds on a busy
# host, and Kill must be quick.
shims() {
	for f in $(grep -l -a -F -e "$dir/containerd.sock" /proc/[0-9]*/cmdline 2>/dev/null); do
		case "$(tr '\0' ' ' < "$f" 2>/dev/null)" in
		*containerd-shim*) p=${f%/cmdline}; echo "${p#/proc/}" ;;
		esac
	done
}
# The sockets in /run/containerd/s the shims $@ listen on.
shimsockets() {
	for pid in "$@"; do
		for fd in /proc/"$pid"/fd/*; do
			l=$(readlink "$fd" 2>/dev/null) || continue
			case "$l" in socket:*) ;; *) continue ;; esac
			i=${l#socket:[}
			i=${i%]}
			awk -v i="$i" '$7 == i && index($8, "/run/containerd/s/") == 1 {print $8}' /proc/net/unix
		done
	done
}
`

// runCleanup runs cleanupScript for dir at once (Close's path).
func runCleanup(dir string) error {
	out, err := exec.Command("/bin/sh", "-c", cleanupScript, "node-cleanup", dir, "now").CombinedOutput()
	if err != nil {
		return fmt.Errorf("node: cleaning up %s: %w: %s", dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// runKill runs killScript for dir.
func runKill(dir string) error {
	out, err := exec.Command("/bin/sh", "-c", killScript, "node-kill", dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("node: killing %s: %w: %s", dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// hostPaths are the paths outside a node's directory that a kubelet or
// containerd creates whatever it is told: the kubelet's device-plugin socket
// directory is a constant in the kubelet, and containerd 1.6 puts its shims'
// sockets in /run/containerd/s. They are shared by every node of a test
// process; the last node to close removes the ones that did not exist before
// the first started.
var hostPaths = []string{"/var/lib/kubelet", "/run/containerd"}

// hostPathUse counts running nodes and remembers which host paths they
// created.
var hostPathUse struct {
	sync.Mutex
	nodes   int
	created []string
}

// acquireHostPaths is called before a node starts; it records in
// hostPathsFile(dir) the host paths that do not exist yet, for the watchdog.
func acquireHostPaths(dir string) error {
	hostPathUse.Lock()
	defer hostPathUse.Unlock()
	if hostPathUse.nodes == 0 {
		hostPathUse.created = nil
		for _, p := range hostPaths {
			if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
				hostPathUse.created = append(hostPathUse.created, p)
			}
		}
	}
	hostPathUse.nodes++
	var b strings.Builder
	for _, p := range hostPathUse.created {
		b.WriteString(p + "\n")
	}
	if err := os.WriteFile(hostPathsFile(dir), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	return nil
}

// hostPathsFile is where a node's watchdog finds the host paths to remove.
func hostPathsFile(dir string) string { return dir + ".host-paths" }

// releaseHostPaths is called after a node stopped; the last one removes the
// host paths the nodes created.
func releaseHostPaths() error {
	hostPathUse.Lock()
	defer hostPathUse.Unlock()
	hostPathUse.nodes--
	if hostPathUse.nodes > 0 {
		return nil
	}
	var errs []error
	for _, p := range hostPathUse.created {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("node: removing %s: %w", p, err))
		}
	}
	hostPathUse.created = nil
	return errors.Join(errs...)
}

// cgroupMounts lists the mount points of the cgroup v1 hierarchies (the
// kubelet creates its subtree in each) from /proc/mounts.
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[2] == "cgroup" {
			out = append(out, fields[1])
		}
	}
	return out, sc.Err()
}

// createCgroupRoot creates the node's cgroup in every v1 hierarchy: the
// kubelet refuses a cgroupRoot that does not exist. A new cpuset cgroup has
// no CPUs and no memory nodes until given its parent's.
func createCgroupRoot(root string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	if len(mounts) == 0 {
		return fmt.Errorf("node: no cgroup v1 hierarchy is mounted; this harness drives the kubelet with cgroupfs on cgroup v1")
	}
	for _, m := range mounts {
		d := filepath.Join(m, root)
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("node: creating cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(m, f))
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			if err != nil {
				return fmt.Errorf("node: %w", err)
			}
			if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
				return fmt.Errorf("node: %w", err)
			}
		}
	}
	return nil
}

// addLoopbackAddress draws an address from 198.18.0.0/15 that no other
// node on the host holds, notes it beside dir for the cleanup script (which
// removes it), and adds it to the host's loopback interface.
func addLoopbackAddress(dir string) (string, error) {
	var lastErr error
	for range 20 {
		n := 1 + rand.IntN(1<<17-2) // neither the range's first nor its last
		address := fmt.Sprintf("198.%d.%d.%d", 18+n>>16, n>>8&0xff, n&0xff)
		if err := os.WriteFile(dir+".address", []byte(address), 0o644); err != nil {
			return "", fmt.Errorf("node: %w", err)
		}
		out, err := exec.Command("ip", "addr", "add", address+"/32", "dev", "lo").CombinedOutput()
		if err == nil {
			return address, nil
		}
		_ = os.Remove(dir + ".address") // another node's, or none: not ours to remove
		lastErr = fmt.Errorf("node: adding %s to the loopback interface: %w: %s", address, err, out)
		if !strings.Contains(string(out), "File exists") {
			break
		}
	}
	return "", lastErr
}
