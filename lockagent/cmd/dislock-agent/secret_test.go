package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/test/harness"
)

// The test binary doubles as the other processes of a pod: helperEnv picks
// what it does instead of running the tests.
const (
	helperEnv = "DISLOCK_SECRET_TEST_HELPER"
	// helperRead reads the file named by readEnv: exit 0 and the content on
	// stdout, exitDenied when the kernel refused it, 1 otherwise.
	helperRead = "read"
	readEnv    = "DISLOCK_SECRET_TEST_READ"
	exitDenied = 3
	// helperHold sleeps until killed: an ordinary process of the app's uid.
	helperHold = "hold"
)

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case helperRead:
		b, err := os.ReadFile(os.Getenv(readEnv))
		switch {
		case errors.Is(err, fs.ErrPermission):
			os.Exit(exitDenied)
		case err != nil:
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Stdout.Write(b)
		os.Exit(0)
	case helperHold:
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	code := m.Run()
	if bins.dir != "" {
		os.RemoveAll(bins.dir)
	}
	os.Exit(code)
}

// appUID is the uid the sidecar and the app share in these tests: the
// worst case, an app that runs as the sidecar's own uid (65533), which
// needs no CAP_SYS_PTRACE to read a dumpable process of the sidecar.
const appUID = 65533

// podBins holds the agent and the test binary where another uid may run
// them (go test's own directories are private to the user running it).
type podBins struct{ dir, agent, helper string }

var (
	binsOnce sync.Once
	bins     podBins
	binsErr  error
)

func buildPodBins(t *testing.T) podBins {
	t.Helper()
	binsOnce.Do(func() {
		bins.dir, binsErr = os.MkdirTemp("", "dislock-agent-secret-")
		if binsErr != nil {
			return
		}
		if binsErr = os.Chmod(bins.dir, 0o755); binsErr != nil {
			return
		}
		bins.agent = filepath.Join(bins.dir, "dislock-agent")
		if out, err := exec.Command("go", "build", "-o", bins.agent, ".").CombinedOutput(); err != nil {
			binsErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		bins.helper = filepath.Join(bins.dir, "helper.test")
		binsErr = copyFile(os.Args[0], bins.helper)
	})
	if binsErr != nil {
		t.Fatal(binsErr)
	}
	return bins
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// asApp is the credential of the app's uid when the tests run as root,
// nil otherwise (then every process runs as the current user).
func asApp() *syscall.Credential {
	if os.Geteuid() != 0 {
		return nil
	}
	return &syscall.Credential{Uid: appUID, Gid: appUID}
}

// tenantDSN names a database that refuses connections, so the agent keeps
// retrying, and carries a password the test looks for everywhere.
func tenantDSN(t *testing.T) (dsn, password, hostPort string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hostPort = l.Addr().String()
	l.Close()
	password = "pw-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	return fmt.Sprintf("postgres://dislock_tenant_team_a:%s@%s/dislock?connect_timeout=1", password, hostPort), password, hostPort
}

type agentProc struct {
	cmd     *exec.Cmd
	dir     string
	log     *bytes.Buffer
	logMu   *sync.Mutex
	exited  chan struct{}
	waitErr error
}

func (a *agentProc) logText() string {
	a.logMu.Lock()
	defer a.logMu.Unlock()
	return a.log.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// startAgent runs `dislock-agent agent` as the sidecar would run, with the
// credential in its environment, as cred's user.
func startAgent(t *testing.T, b podBins, dsn string, cred *syscall.Credential, tune ...func(*syscall.SysProcAttr)) *agentProc {
	t.Helper()
	dir, err := os.MkdirTemp(b.dir, "pod-")
	if err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	a := &agentProc{dir: dir, log: &bytes.Buffer{}, logMu: &sync.Mutex{}, exited: make(chan struct{})}
	a.cmd = exec.Command(b.agent, "agent")
	a.cmd.Env = []string{
		"PATH=/usr/bin:/bin",
		contract.EnvMode + "=schedule",
		contract.EnvKey + "=team-a/report",
		contract.EnvWindow + "=2026-01-01T00:00:00Z",
		contract.EnvCluster + "=dc-a",
		contract.EnvJobName + "=report-29430720",
		contract.EnvJobUID + "=uid-1",
		contract.EnvPodName + "=report-29430720-x",
		contract.EnvSharedDir + "=" + dir,
		contract.EnvTerminationLog + "=" + filepath.Join(dir, "termination-log"),
		contract.EnvDatabaseURL + "=" + dsn,
	}
	w := lockedWriter{a.logMu, a.log}
	a.cmd.Stdout, a.cmd.Stderr = w, w
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	for _, f := range tune {
		f(a.cmd.SysProcAttr)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.waitErr = a.cmd.Wait(); close(a.exited) }()
	t.Cleanup(func() {
		a.cmd.Process.Kill()
		<-a.exited
	})
	return a
}

// awaitLog waits until the agent logged want.
func (a *agentProc) awaitLog(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(a.logText(), want) {
		select {
		case <-a.exited:
			t.Fatalf("the agent exited (%v) before logging %s:\n%s", a.waitErr, want, a.logText())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not log %s in 30s:\n%s", want, a.logText())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readAs reads path as cred's user in another process: the content, or
// whether the kernel refused it.
func readAs(t *testing.T, b podBins, cred *syscall.Credential, path string) (content string, denied bool) {
	t.Helper()
	cmd := exec.Command(b.helper)
	cmd.Env = []string{helperEnv + "=" + helperRead, readEnv + "=" + path}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), false
	case errors.As(err, &exit) && exit.ExitCode() == exitDenied:
		return "", true
	}
	t.Fatalf("reading %s: %v\n%s", path, err, stderr.String())
	return "", false
}

// A tenant's app shares the pod's PID namespace with the sidecar and runs as
// its uid: it must not find the database credential in the agent's /proc
// entry, while the agent itself goes on using it.
func TestTheAgentHidesItsDatabaseCredentialFromThePod(t *testing.T) {
	b := buildPodBins(t)
	dsn, password, hostPort := tenantDSN(t)
	app := asApp()
	a := startAgent(t, b, dsn, app)
	pid := a.cmd.Process.Pid
	environ := fmt.Sprintf("/proc/%d/environ", pid)

	// The agent logs "starting" once it runs with the credential it was
	// handed; it has reached the database when it says it cannot.
	a.awaitLog(t, `"msg":"starting"`)
	a.awaitLog(t, hostPort)
	if !strings.Contains(a.logText(), fmt.Sprintf(`"pid":%d`, pid)) {
		t.Errorf("the agent logs another pid than the one started (%d): the hand-off must keep the process:\n%s", pid, a.logText())
	}

	// (a) Its environment no longer holds the credential.
	if os.Geteuid() == 0 {
		b, err := os.ReadFile(environ)
		if err != nil {
			t.Fatalf("root reading %s: %v", environ, err)
		}
		env := string(b)
		if !strings.Contains(env, contract.EnvKey+"=team-a/report") {
			t.Fatalf("%s does not look like the agent's environment: %q", environ, env)
		}
		if strings.Contains(env, password) || strings.Contains(env, contract.EnvDatabaseURL+"=") {
			t.Errorf("%s still shows the credential: %q", environ, env)
		}
	} else {
		// Without CAP_SYS_PTRACE not even the agent's own user may read
		// it, which hides it just as well; the content itself needs root.
		if _, err := os.ReadFile(environ); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("reading %s as the agent's own user: %v, want permission denied (the agent is non-dumpable)", environ, err)
		}
		t.Logf("the content of %s is checked only as root", environ)
	}

	// (b) A process of the agent's uid cannot read it at all.
	t.Run("a process of the agent's uid is refused its environ", func(t *testing.T) {
		if app == nil {
			harness.Lacking(t, "needs root, to run the agent and the reader as uid %d", appUID)
		}
		// Without the hand-off it could: an ordinary process of the uid
		// with the credential in its environment is readable.
		hold := exec.Command(b.helper)
		hold.Env = []string{helperEnv + "=" + helperHold, contract.EnvDatabaseURL + "=" + dsn}
		hold.SysProcAttr = &syscall.SysProcAttr{Credential: app}
		if err := hold.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { hold.Process.Kill(); hold.Wait() }()
		if got, denied := readAs(t, b, app, fmt.Sprintf("/proc/%d/environ", hold.Process.Pid)); denied || !strings.Contains(got, password) {
			t.Fatalf("control: uid %d could not read the credential of an ordinary process of its own (denied %v): the check below would prove nothing", appUID, denied)
		}
		if got, denied := readAs(t, b, app, environ); !denied {
			t.Errorf("uid %d read the agent's %s: %q", appUID, environ, got)
		}
	})

	// The credential is never logged.
	if strings.Contains(a.logText(), password) {
		t.Errorf("the agent logged the password:\n%s", a.logText())
	}

	// (c) It still stops as a sidecar must: SIGTERM before a decision ends
	// it with 0 and no decision.
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the agent did not stop within 30s of SIGTERM:\n%s", a.logText())
	}
	if a.waitErr != nil {
		t.Fatalf("the agent ended with %v after SIGTERM, want exit 0:\n%s", a.waitErr, a.logText())
	}
	if _, err := os.Stat(filepath.Join(a.dir, protocol.DecisionFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a decision was written (stat: %v)", err)
	}
	if msg, _ := os.ReadFile(filepath.Join(a.dir, "termination-log")); !strings.Contains(string(msg), "stopped before a decision") {
		t.Errorf("termination message %q, want it to say it stopped before a decision", msg)
	}
}

// A SIGTERM that reaches the agent while it hands the credential over (the
// kubelet stopping a pod that just started) is never lost: the agent either
// ends with 0 or dies of the signal, and decides nothing either way. Also as
// the init of its own PID namespace (a container without a shared process
// namespace), where the kernel drops a signal whose action is the default
// one: a restarted sidecar stopped in that instant ran on, heartbeating its
// claim, until SIGKILL.
func TestAStopDuringTheCredentialHandOffIsNeverLost(t *testing.T) {
	b := buildPodBins(t)
	dsn, _, _ := tenantDSN(t)
	for _, tc := range []struct {
		name string
		tune []func(*syscall.SysProcAttr)
	}{
		{"in the pod's PID namespace", nil},
		{"as the init of its own PID namespace", []func(*syscall.SysProcAttr){func(a *syscall.SysProcAttr) { a.Cloneflags = syscall.CLONE_NEWPID }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.tune != nil && os.Geteuid() != 0 {
				harness.Lacking(t, "needs root, to start the agent in a PID namespace of its own")
			}
			stopsAreNeverLost(t, b, dsn, tc.tune...)
		})
	}
}

// awaitCaught waits until process pid has a handler for sig (SigCgt in its
// /proc status).
func awaitCaught(t *testing.T, pid int, sig syscall.Signal) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		for _, line := range strings.Split(string(b), "\n") {
			if hex, ok := strings.CutPrefix(line, "SigCgt:"); ok {
				if mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64); err == nil && mask&(1<<(uint(sig)-1)) != 0 {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never caught %v", pid, sig)
		}
		runtime.Gosched()
	}
}

func stopsAreNeverLost(t *testing.T, b podBins, dsn string, tune ...func(*syscall.SysProcAttr)) {
	outcomes := map[string]int{}
	for i := range 60 {
		a := startAgent(t, b, dsn, nil, tune...)
		if tune != nil {
			// Before the Go runtime installs its handlers, no program
			// can keep the kernel from dropping a stop sent to a
			// namespace's init: start from there.
			awaitCaught(t, a.cmd.Process.Pid, syscall.SIGTERM)
		}
		// From before the runtime starts (or its handlers are in place)
		// to after the agent's handler is installed, in 250 µs steps.
		time.Sleep(time.Duration(i) * 250 * time.Microsecond)
		if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-a.exited:
		case <-time.After(15 * time.Second):
			t.Fatalf("stop %d (after %v): the agent is still running 15s after SIGTERM:\n%s", i, time.Duration(i)*250*time.Microsecond, a.logText())
		}
		var exit *exec.ExitError
		switch {
		case a.waitErr == nil:
			outcomes["exit 0"]++
		case errors.As(a.waitErr, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGTERM:
			outcomes["killed by SIGTERM"]++
		case errors.As(a.waitErr, &exit) && exit.ExitCode() == 2:
			// The Go runtime's own end for a stop signal nobody
			// handles, where the kernel will not kill a namespace's init.
			outcomes["exit 2 (the runtime's, for a namespace's init)"]++
		default:
			t.Errorf("stop %d: the agent ended with %v:\n%s", i, a.waitErr, a.logText())
		}
		if _, err := os.Stat(filepath.Join(a.dir, protocol.DecisionFile)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("stop %d: a decision was written (stat: %v)", i, err)
		}
	}
	t.Logf("outcomes: %v", outcomes)
}
