package node

// Process plumbing, shared with the e2e harness (its PgBouncers and
// webhooks): a program started in its own process group with its output in
// <dir>/<name>.log and its pid in <dir>/<name>.pid (which the watchdogs
// read), stopped with SIGTERM and then SIGKILL.

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/dislock/dislock/test/harness"
)

// Process is a started program.
type Process struct {
	name    string
	logFile string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// StartProcess starts cmd (Path, Args, Env and Dir set by the caller) in
// its own process group, so that a ^C aimed at `go test` does not reach it
// before its owner stops it in order.
func StartProcess(dir, name string, cmd *exec.Cmd) (*Process, error) {
	logFile := dir + "/" + name + ".log"
	out, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	fmt.Fprintf(out, "--- %s\n", strings.Join(cmd.Args, " "))
	cmd.Stdout, cmd.Stderr = out, out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	err = cmd.Start()
	out.Close()
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{name: name, logFile: logFile, cmd: cmd, exited: make(chan struct{})}
	pidFile := dir + "/" + name + ".pid"
	_ = os.WriteFile(pidFile, fmt.Appendf(nil, "%d\n", cmd.Process.Pid), 0o644)
	go func() {
		_ = cmd.Wait()
		_ = os.Remove(pidFile)
		close(p.exited)
	}()
	return p, nil
}

// Running reports whether the process has not exited yet.
func (p *Process) Running() bool { return p != nil && !harness.Closed(p.exited) }

// awaitExit waits up to d for the process to exit and reports whether it
// has.
func (p *Process) awaitExit(d time.Duration) bool {
	if p == nil {
		return true
	}
	select {
	case <-p.exited:
		return true
	case <-time.After(d):
		return false
	}
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// LogFile is where its output goes.
func (p *Process) LogFile() string { return p.logFile }

// State describes how it ended, once it has.
func (p *Process) State() *os.ProcessState { return p.cmd.ProcessState }

// Stop sends SIGTERM, then SIGKILL after stopGrace, and waits for the exit.
// Stopping a stopped process is a no-op.
func (p *Process) Stop() error {
	if p == nil || !p.Running() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if p.awaitExit(stopGrace) {
		return nil
	}
	_ = p.cmd.Process.Kill()
	if p.awaitExit(stopGrace) {
		return nil
	}
	return fmt.Errorf("%s (pid %d) still running %v after SIGKILL", p.name, p.Pid(), stopGrace)
}

// start runs one of the node's programs and records it.
func (n *Node) start(name string, args ...string) (*Process, error) {
	cmd := exec.Command(n.bins[name], args...)
	cmd.Dir = n.dir
	cmd.Env = childEnv()
	p, err := StartProcess(n.dir, name, cmd)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	n.mu.Lock()
	n.procs[name] = p
	n.mu.Unlock()
	return p, nil
}

// childEnv is our environment without variables that would point the
// programs elsewhere.
func childEnv() []string {
	return harness.ChildEnv(func(k string) bool {
		return k == "KUBECONFIG" || strings.HasPrefix(k, "CONTAINERD_") || k == "NOTIFY_SOCKET"
	})
}
