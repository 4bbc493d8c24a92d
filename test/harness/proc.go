package harness

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Watchdog is a /bin/sh script running beside an instance. Its stdin is a
// pipe whose only writer is the test process, so the script's `read -r _`
// returns only when that process is gone (panic, timeout, ^C, SIGKILL)
// without Stop having dismissed the watchdog: the script then cleans up what
// the instance's Close would have.
type Watchdog struct {
	// label and dir are StartWatchdog's.
	label, dir string
	cmd        *exec.Cmd
	// lifeline is the pipe's write end. Closing it (or losing it: *os.File
	// closes itself when collected) fires the watchdog.
	lifeline *os.File
}

// StartWatchdog starts script with $0 set to label+"-watchdog" and $1 to dir,
// in its own process group and without a parent-death signal: it must outlive
// us. Its errors start with label, the harness's name ("pgtest", "kube").
func StartWatchdog(label, script, dir string) (*Watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%s: watchdog pipe: %w", label, err)
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", script, label+"-watchdog", dir)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("%s: starting watchdog: %w", label, err)
	}
	return &Watchdog{label: label, dir: dir, cmd: cmd, lifeline: w}, nil
}

// Stop dismisses the watchdog without letting it act: Close has done its job.
func (w *Watchdog) Stop() {
	_ = w.cmd.Process.Kill()
	_ = w.cmd.Wait()
	_ = w.lifeline.Close()
}

// StopAndRemove ends an instance's Close: it dismisses the watchdog (Stop),
// removes the directory it watches and returns errs joined with the
// removal's error, if any.
func (w *Watchdog) StopAndRemove(errs ...error) error {
	w.Stop()
	if err := os.RemoveAll(w.dir); err != nil {
		errs = append(errs, fmt.Errorf("%s: removing %s: %w", w.label, w.dir, err))
	}
	return errors.Join(errs...)
}

// Pid is the watchdog's process id.
func (w *Watchdog) Pid() int { return w.cmd.Process.Pid }

// Abandon closes the lifeline, which is what the death of the test process
// looks like to the watchdog: it fires. For tests of the watchdog itself.
func (w *Watchdog) Abandon() { _ = w.lifeline.Close() }

// Addr is 127.0.0.1:port, where the harnesses' servers listen.
func Addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// Dial opens and closes a TCP connection to 127.0.0.1:port (within a
// second): nil means something accepts connections there.
func Dial(port int) error {
	c, err := net.DialTimeout("tcp", Addr(port), time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

// Alive reports whether pid is a process that has not exited. A zombie has:
// a daemon such as a postmaster is not our child and waits for init to reap
// it.
func Alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// Another process may take it before it is bound; callers pick again then.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StablePort returns a TCP port on 127.0.0.1, free a moment ago, below the
// kernel's ephemeral range (net.ipv4.ip_local_port_range), for a server the
// test stops and starts again on the same port. FreePort's ports are in
// that range: once the server stops, any outgoing connection (a pooler's
// to PostgreSQL, a pod's to the server) can be given the port as its local
// one and hold it for as long as it lives, so the restart cannot bind.
func StablePort() (int, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	from := max(1024, low-12000)
	if from >= low {
		return FreePort()
	}
	for range 100 {
		port := from + rand.IntN(low-from)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("finding a free port below %d: 100 tries failed", low)
}

// StablePorts returns n distinct StablePort ports.
func StablePorts(n int) ([]int, error) {
	var ports []int
	for len(ports) < n {
		p, err := StablePort()
		if err != nil {
			return nil, err
		}
		if !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago: each listener stays open until all are picked.
func FreePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// ChildEnv is this process's environment without the variables drop names:
// those that would configure a started component behind its flags' back.
func ChildEnv(drop func(key string) bool) []string {
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !drop(k) {
			env = append(env, kv)
		}
	}
	return env
}

// LogTail returns the last lines of a log file, at most maxLines and
// maxBytes, for error messages.
func LogTail(path string, maxLines, maxBytes int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > maxBytes {
		b = b[len(b)-maxBytes:]
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return fmt.Sprintf("--- last lines of %s ---\n%s", path, bytes.Join(lines, []byte("\n")))
}

// Closed reports whether ch is closed (a process's "exited" channel, say)
// without blocking.
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
