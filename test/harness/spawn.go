package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// spawnRequests feeds the spawner goroutine.
var (
	spawnOnce     sync.Once
	spawnRequests chan spawnRequest
)

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan<- error
}

// spawn starts cmd from the spawner's OS thread. The children get SIGKILL as
// their parent-death signal, so that they die with the test process even when
// it is killed with SIGKILL and nothing of ours runs. Linux sends that signal
// when the *thread* that forked the child exits, not the process, and Go
// retires threads freely; so every child is forked by one goroutine that
// locks its thread and never returns, which keeps that thread alive exactly
// as long as the process.
func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnRequests = make(chan spawnRequest)
		go spawner()
	})
	done := make(chan error, 1)
	spawnRequests <- spawnRequest{cmd: cmd, done: done}
	return <-done
}

func spawner() {
	runtime.LockOSThread() // never unlocked: see spawn
	for r := range spawnRequests {
		r.done <- r.cmd.Start()
	}
}

// Proc is a long-running program started by StartProc.
type Proc struct {
	// label starts errors ("kube", "hapg").
	label, name string
	cmd         *exec.Cmd
	// exited is closed once the process has been reaped.
	exited chan struct{}
	// pidFile tells the watchdog whom to kill; removed once reaped.
	pidFile, logFile string
}

// StartProc starts cmd (Path, Args, Dir, Env and, if need be,
// SysProcAttr.Credential set by the caller) as the program name: in its own
// process group, so that a ^C aimed at `go test` does not reach it before
// its owner stops it in order, with SIGKILL as its parent-death signal, with
// its output appended to dir/<name>.log after the line header, and its pid
// in dir/<name>.pid until it has been reaped. Errors start with label.
func StartProc(label, dir, name, header string, cmd *exec.Cmd) (*Proc, error) {
	logFile := filepath.Join(dir, name+".log")
	out, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: starting %s: %w", label, name, err)
	}
	fmt.Fprintln(out, header)
	// Output goes straight to the file: no copying goroutine, and nothing is
	// lost if the program dies early.
	cmd.Stdout, cmd.Stderr = out, out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid, cmd.SysProcAttr.Pdeathsig = true, syscall.SIGKILL
	err = spawn(cmd)
	out.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: starting %s: %w", label, name, err)
	}
	p := &Proc{label: label, name: name, cmd: cmd, exited: make(chan struct{}),
		pidFile: filepath.Join(dir, name+".pid"), logFile: logFile}
	_ = os.WriteFile(p.pidFile, fmt.Appendf(nil, "%d\n", cmd.Process.Pid), 0o644)
	go func() {
		_ = cmd.Wait()
		_ = os.Remove(p.pidFile)
		close(p.exited)
	}()
	return p, nil
}

// Name is the program's name, as given to StartProc.
func (p *Proc) Name() string { return p.name }

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// State describes how it ended, once it has.
func (p *Proc) State() *os.ProcessState { return p.cmd.ProcessState }

// Running reports whether p is a live process (false for nil).
func (p *Proc) Running() bool { return p != nil && !Closed(p.exited) }

// SignalGroup sends sig to p's process group (its children included), if p
// is running.
func (p *Proc) SignalGroup(sig syscall.Signal) {
	if p.Running() {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// procKillWait is how long Stop waits for a process to be reaped after
// SIGKILL.
const procKillWait = 10 * time.Second

// Stop sends sig to the group, SIGKILL after grace, and waits until p has
// been reaped. Stopping a stopped (or nil) process is a no-op.
func (p *Proc) Stop(sig syscall.Signal, grace time.Duration) error {
	if !p.Running() {
		return nil
	}
	p.SignalGroup(sig)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	p.SignalGroup(syscall.SIGKILL)
	select {
	case <-p.exited:
		return nil
	case <-time.After(procKillWait):
		return fmt.Errorf("%s: %s (pid %d) still running %v after SIGKILL", p.label, p.name, p.cmd.Process.Pid, procKillWait)
	}
}
