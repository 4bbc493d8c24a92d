package wrapper

// Process plumbing: starting the app in its own process group, forwarding
// signals to that group, reaping (as PID 1), and turning a wait status into a
// shell-style exit code. Nothing here knows about decisions or leases.

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Shell conventions for a command that could not be started.
const (
	ExitCannotExecute = 126
	ExitNotFound      = 127
)

// status is how the app ended: an exit code, or the signal that killed it.
type status struct {
	exitCode int
	signal   syscall.Signal // 0 unless the child was killed by a signal
}

// code is the wrapper's own exit code for this status: the child's exit code,
// or 128+signal as a shell reports it (137 for SIGKILL, 143 for SIGTERM).
func (s status) code() int {
	if s.signal != 0 {
		return 128 + int(s.signal)
	}
	return s.exitCode
}

// signalName is "SIGKILL" etc., or "" when the child exited normally.
func (s status) signalName() string {
	if s.signal == 0 {
		return ""
	}
	if name := unix.SignalName(s.signal); name != "" {
		return name
	}
	return fmt.Sprintf("signal %d", int(s.signal))
}

func statusOf(ws syscall.WaitStatus) status {
	if ws.Signaled() {
		return status{exitCode: -1, signal: ws.Signal()}
	}
	return status{exitCode: ws.ExitStatus()}
}

// child is the started app. Its pid is also its process group id.
type child struct {
	pid  int
	done <-chan waitResult
}

type waitResult struct {
	status status
	err    error
}

// startChild starts argv in a new process group with the given environment
// and stdio. When reapAll is set (the wrapper is PID 1 of the container),
// one loop reaps every child — orphans the app leaves behind are re-parented
// to PID 1 and would otherwise stay zombies — and recognises the app's own
// pid, so its status is observed exactly once. Otherwise cmd.Wait reaps the
// app alone.
//
// With reapAll, cmd.Wait is never called, so stdout and stderr should be
// *os.File (as they are in the binary): os/exec then hands the descriptors to
// the child and has no copying goroutines that only Wait would drain.
func startChild(argv, env []string, stdin io.Reader, stdout, stderr io.Writer, reapAll bool) (*child, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own group, so a stop reaches everything the app started.
		Setpgid: true,
		// If the wrapper itself is killed, nobody enforces the lease deadline
		// any more, so the app must not outlive it. (In a pod the wrapper is
		// PID 1 and its death ends the container anyway; this covers plain
		// hosts.)
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan waitResult, 1)
	c := &child{pid: cmd.Process.Pid, done: done}
	if reapAll {
		go func() { done <- reapUntil(c.pid) }()
	} else {
		go func() { done <- waitCmd(cmd) }()
	}
	return c, nil
}

func waitCmd(cmd *exec.Cmd) waitResult {
	err := cmd.Wait()
	if cmd.ProcessState == nil {
		return waitResult{err: fmt.Errorf("waiting for the command: %w", err)}
	}
	return waitResult{status: statusOf(cmd.ProcessState.Sys().(syscall.WaitStatus))}
}

// reapUntil reaps any child of this process until the one with pid exits,
// and returns that one's status. It is the only caller of wait in reaper
// mode, so nothing else can take the app's status from it.
func reapUntil(pid int) waitResult {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return waitResult{err: fmt.Errorf("waiting for pid %d: %w", pid, err)}
		case got == pid && (ws.Exited() || ws.Signaled()):
			return waitResult{status: statusOf(syscall.WaitStatus(ws))}
		}
		// An orphan the app left behind, now reaped; nothing to report.
	}
}

// exited reports whether the child has already ended, whether or not its
// status has been collected yet: the goroutine that reaps it may run late on
// a loaded node, and an app that finished before its lease was lost must not
// be taken for one the wrapper stopped. It leaves the status to the reaper
// (WNOWAIT), and a child already reaped (ECHILD) has ended too.
func (c *child) exited() bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, c.pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	if errors.Is(err, unix.ECHILD) {
		return true
	}
	// The kernel sets si_signo to SIGCHLD only when it found the child
	// waitable; with WNOHANG and a running child it leaves it 0.
	return err == nil && info.Signo == int32(unix.SIGCHLD)
}

// signalGroup sends sig to the child's whole process group. A group that is
// already gone is not an error: the child is exiting anyway.
func (c *child) signalGroup(sig syscall.Signal) error {
	err := unix.Kill(-c.pid, sig)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

// groupStopTimeout bounds how long the wrapper waits for its killed group
// to stop: SIGKILL takes effect within microseconds, unless a process is
// stuck in the kernel (uninterruptible I/O), which no wait cures.
const groupStopTimeout = 2 * time.Second

// awaitGroupStopped waits until no process of the child's group runs,
// polling /proc, for at most timeout; it reports whether the group stopped.
// Zombies and exiting processes count as stopped: they act no more.
func (c *child) awaitGroupStopped(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for pause := 100 * time.Microsecond; ; pause = min(2*pause, 10*time.Millisecond) {
		if !groupRuns(c.pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
	}
}

// groupRuns reports whether a process of process group pgid is neither a
// zombie nor dead, reading /proc/<pid>/stat ("pid (comm) state ppid pgrp …").
func groupRuns(pgid int) bool {
	if unix.Kill(-pgid, 0) != nil {
		return false // no member at all, not even a zombie
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false // cannot tell: kill(2) above was the best answer
	}
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		stat := string(b)
		i := strings.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(stat[i+1:])
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" || f[0] == "x" {
			continue
		}
		if pgrp, err := strconv.Atoi(f[2]); err == nil && pgrp == pgid {
			return true
		}
	}
	return false
}

// forwarded reports whether a signal the wrapper receives is passed on to the
// app. SIGCHLD is about the wrapper's own children. SIGURG is what the Go
// runtime uses to preempt goroutines, so the wrapper receives it all the
// time. SIGPIPE is raised by the kernel when the wrapper itself writes to a
// closed pipe (its log on stderr): it says nothing about the app, and the app
// gets its own SIGPIPE if it writes there too.
func forwarded(sig os.Signal) bool {
	switch sig {
	case syscall.SIGCHLD, syscall.SIGURG, syscall.SIGPIPE:
		return false
	}
	_, ok := sig.(syscall.Signal)
	return ok
}

// startErrorCode maps a failure to start the command to a shell's exit code:
// 127 when there is no such command, 126 when it exists but cannot be run
// (not executable, a directory, not an executable format, ...).
func startErrorCode(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return ExitNotFound
	}
	return ExitCannotExecute
}
