package wrapper

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dislock/dislock/lockagent/protocol"
)

// The test binary doubles as the wrapper (WRAPPER_TEST_MAIN=1) and as a tiny
// app (WRAPPER_TEST_CHILD), so every test runs the wrapper as a real,
// separate process: real signals, real exit codes, real reaping.
const (
	envTestMain       = "WRAPPER_TEST_MAIN"
	envTestChild      = "WRAPPER_TEST_CHILD"
	envTestSubreaper  = "WRAPPER_TEST_SUBREAPER"
	envTestReapAll    = "WRAPPER_TEST_REAP"
	envTestSharedDir  = "D" // the scripts' handle on the test's directory
	childMonoTrapMode = "monotrap"
)

func TestMain(m *testing.M) {
	// The child mode comes first: an app started by the wrapper inherits
	// WRAPPER_TEST_MAIN from it.
	if os.Getenv(envTestChild) == childMonoTrapMode {
		os.Exit(monoTrapChild(os.Args[1:]))
	}
	if os.Getenv(envTestMain) == "1" {
		if os.Getenv(envTestSubreaper) == "1" {
			// Orphans below us are re-parented to us, as they are to a
			// container's PID 1.
			if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
				fmt.Fprintln(os.Stderr, "PR_SET_CHILD_SUBREAPER:", err)
				os.Exit(99)
			}
		}
		if os.Getenv(envTestReapAll) == "1" {
			reapOrphans = true
		}
		os.Exit(Main(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// monoTrapChild is an app that records, in CLOCK_MONOTONIC ns, when SIGTERM
// reached it, then dies of it. args: ready-file term-file.
func monoTrapChild(args []string) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	if err := os.WriteFile(args[0], nil, 0o644); err != nil {
		return 98
	}
	<-sigs
	at := protocol.MonotonicNow()
	if err := os.WriteFile(args[1], []byte(strconv.FormatInt(at, 10)), 0o644); err != nil {
		return 98
	}
	signal.Reset(syscall.SIGTERM)
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {}
}

// pod is one test's shared directory: the agent's side is played by the test.
type pod struct {
	t      *testing.T
	dir    string
	shared protocol.Dir
}

func newPod(t *testing.T) *pod {
	t.Helper()
	dir := t.TempDir()
	return &pod{t: t, dir: dir, shared: protocol.Dir(dir)}
}

func (p *pod) path(name string) string { return filepath.Join(p.dir, name) }

func (p *pod) decide(dec protocol.Decision) {
	p.t.Helper()
	if err := p.shared.WriteDecision(dec); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pod) result(name string) protocol.Result {
	p.t.Helper()
	results, err := p.shared.ReadResults()
	if err != nil {
		p.t.Fatal(err)
	}
	r, ok := results[name]
	if !ok {
		p.t.Fatalf("no result %q; results: %+v", name, results)
	}
	return r
}

func (p *pod) exists(name string) bool {
	_, err := os.Stat(p.path(name))
	return err == nil
}

func (p *pod) read(name string) string {
	p.t.Helper()
	b, err := os.ReadFile(p.path(name))
	if err != nil {
		p.t.Fatal(err)
	}
	return string(b)
}

// wrapperRun is one wrapper process.
type wrapperRun struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr string
	done           chan struct{}
	code           int
}

// runScript starts the wrapper (name "app", fast polling) on /bin/sh -c
// script. The script finds the test's directory in $D.
func (p *pod) runScript(flags []string, script string, env ...string) *wrapperRun {
	p.t.Helper()
	return p.start(append(flags, "--", "/bin/sh", "-c", script), env...)
}

// start runs the wrapper with args after the default flags.
func (p *pod) start(args []string, env ...string) *wrapperRun {
	p.t.Helper()
	args = append([]string{"--shared-dir", p.dir, "--name", "app", "--poll", "20ms"}, args...)
	r := &wrapperRun{t: p.t, done: make(chan struct{})}
	r.stdout, r.stderr = p.path("wrapper.stdout"), p.path("wrapper.stderr")
	outF, err := os.Create(r.stdout)
	if err != nil {
		p.t.Fatal(err)
	}
	errF, err := os.Create(r.stderr)
	if err != nil {
		p.t.Fatal(err)
	}
	r.cmd = exec.Command(os.Args[0], args...)
	r.cmd.Env = append(os.Environ(), envTestMain+"=1", envTestSharedDir+"="+p.dir)
	r.cmd.Env = append(r.cmd.Env, env...)
	// Files, not pipes: a test never waits for a straggler holding a pipe.
	r.cmd.Stdout, r.cmd.Stderr = outF, errF
	// Should the test binary die, its wrappers (and so their apps) go too.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	outF.Close()
	errF.Close()
	go func() {
		r.cmd.Wait()
		r.code = r.cmd.ProcessState.ExitCode()
		if ws := r.cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() {
			r.code = 128 + int(ws.Signal())
		}
		close(r.done)
	}()
	p.t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			r.cmd.Process.Kill()
			<-r.done
		}
	})
	return r
}

// wait returns the wrapper's exit code.
func (r *wrapperRun) wait() int {
	r.t.Helper()
	select {
	case <-r.done:
		return r.code
	case <-time.After(30 * time.Second):
		r.cmd.Process.Kill()
		<-r.done
		r.t.Fatalf("the wrapper did not exit within 30s; its log:\n%s", r.rawLog())
		return -1
	}
}

func (r *wrapperRun) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *wrapperRun) signal(sig syscall.Signal) {
	r.t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		r.t.Fatal(err)
	}
}

func (r *wrapperRun) rawLog() string {
	b, _ := os.ReadFile(r.stderr)
	return string(b)
}

func (r *wrapperRun) output() string {
	r.t.Helper()
	b, err := os.ReadFile(r.stdout)
	if err != nil {
		r.t.Fatal(err)
	}
	return string(b)
}

// logLines parses the wrapper's JSON log lines. The container's stderr is
// shared with the command, whose own lines (a shell's "Terminated") are
// skipped.
func (r *wrapperRun) logLines() []map[string]any {
	r.t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(r.rawLog()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			lines = append(lines, m)
		}
	}
	return lines
}

// onlyJSONLogged asserts every stderr line is a JSON object: for tests whose
// command writes nothing to stderr.
func (r *wrapperRun) onlyJSONLogged() {
	r.t.Helper()
	sc := bufio.NewScanner(strings.NewReader(r.rawLog()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			r.t.Errorf("log line is not JSON: %q", sc.Text())
		}
	}
}

// logged returns the first log line whose msg starts with prefix.
func (r *wrapperRun) logged(prefix string) (map[string]any, bool) {
	r.t.Helper()
	for _, l := range r.logLines() {
		if msg, _ := l["msg"].(string); strings.HasPrefix(msg, prefix) {
			return l, true
		}
	}
	return nil, false
}

func (r *wrapperRun) mustLog(prefix string) map[string]any {
	r.t.Helper()
	l, ok := r.logged(prefix)
	if !ok {
		r.t.Fatalf("no log line starting %q; log:\n%s", prefix, r.rawLog())
	}
	return l
}

// eventually waits for cond, failing the test with what after 15s. The
// wrapper is not left running: if it exits first, the wait ends early.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// procState is one process's state letter and parent, from /proc/<pid>/stat;
// ok=false when the process does not exist (any more).
func procState(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// "pid (comm) S ppid ...": comm may hold spaces and parentheses.
	rest := string(b[bytes.LastIndexByte(b, ')')+1:])
	f := strings.Fields(rest)
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0][0], ppid, true
}

// zombieChildren lists parent's children that are zombies (<defunct>).
func zombieChildren(t *testing.T, parent int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var zombies []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, ppid, ok := procState(pid); ok && ppid == parent && state == 'Z' {
			zombies = append(zombies, pid)
		}
	}
	return zombies
}
