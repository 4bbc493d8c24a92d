package pgtest

// Process plumbing: who the servers run as, how commands are built, the
// watchdog that cleans up after a test process that died, and the waits.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dislock/dislock/test/harness"
)

const (
	// readyTimeout bounds every wait for a server to accept or refuse
	// connections, and each pg_ctl run.
	readyTimeout = 30 * time.Second
	// commandTimeout bounds one helper command (initdb, pg_ctl, psql).
	commandTimeout = 2 * readyTimeout
	pollInterval   = 20 * time.Millisecond
	// postgresAccount is whom initdb, postgres and pgbouncer run as when the
	// tests run as root: all three refuse to run as root.
	postgresAccount = "postgres"
)

// serverAccount is whom initdb, postgres and pgbouncer run as.
func serverAccount() (harness.Account, error) {
	return harness.ServerAccount("pgtest", postgresAccount,
		"created by apt-get install -y postgresql; initdb, postgres and pgbouncer refuse to run as root")
}

// command prepares a program run as the server account in the server's
// directory, in its own process group so that a ^C aimed at `go test` does not
// hit it (the watchdog or Close stops it in order instead).
func (s *Server) command(ctx context.Context, path string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = s.dir
	cmd.Env = childEnv(s.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.acct.Cred, Setpgid: true}
	// pg_ctl leaves a daemon behind; should it ever hold our output pipe,
	// give up on the pipe rather than hang.
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run runs a command to completion; the error carries its output.
func (s *Server) run(path string, args ...string) (string, error) {
	return s.runEnv(nil, path, args...)
}

// runEnv is run with extra environment variables.
func (s *Server) runEnv(env []string, path string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := s.command(ctx, path, args...)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", filepath.Base(path), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// systemdVars would make Debian's systemd-enabled pgbouncer talk to a service
// manager (readiness notification, socket activation, journal format) if the
// tests themselves run under systemd.
var systemdVars = []string{"NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "JOURNAL_STREAM"}

// childEnv is our environment without the variables that would redirect the
// PostgreSQL tools elsewhere (PGHOST, PGDATA, ...) or involve systemd, with C
// locale messages so that logs are readable, and HOME in the server directory
// because the server account may not be able to read ours.
func childEnv(home string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "LC_") || k == "LANG" || k == "HOME" ||
			slices.Contains(systemdVars, k) {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C", "HOME="+home)
}

// watchdogScript runs beside every Server. Its stdin is a pipe whose only
// writer is the test process, so `read` returns only when that process is gone
// (panic, timeout, ^C, SIGKILL) without Close having killed the watchdog: it
// then does what Close would have, so that no postgres or pgbouncer outlives
// the tests. postgres is stopped with SIGQUIT (immediate shutdown), which also
// takes its backends down.
const watchdogScript = `
read -r _
dir="$1"
if pid=$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null); then kill -QUIT "$pid" 2>/dev/null; fi
for f in "$dir"/pgbouncer*.pid; do
	if pid=$(cat "$f" 2>/dev/null); then kill -KILL "$pid" 2>/dev/null; fi
done
n=0
while [ -e "$dir/data/postmaster.pid" ] && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n+1)); done
rm -rf "$dir"
`

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// Another process may take it before the server binds it; Start then picks
// again.
func freePort() (int, error) {
	port, err := harness.FreePort()
	if err != nil {
		return 0, fmt.Errorf("pgtest: %w", err)
	}
	return port, nil
}

// addr and dial are harness's.
var addr, dial = harness.Addr, harness.Dial

// errExited reports that the process being waited for exited.
var errExited = errors.New("process exited")

// waitAccepting polls until port accepts TCP connections. It gives up early
// when exited (may be nil) is closed.
func waitAccepting(port int, exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		err := dial(port)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errExited
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing accepted connections on %s within %v: %w", addr(port), readyTimeout, err)
		}
		time.Sleep(pollInterval)
	}
}

// waitRefusing polls until port refuses TCP connections.
func waitRefusing(port int) error {
	deadline := time.Now().Add(readyTimeout)
	for dial(port) == nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still accepts connections after %v", addr(port), readyTimeout)
		}
		time.Sleep(pollInterval)
	}
	return nil
}

// retry calls f until it succeeds, fails with errExited, or readyTimeout
// passes, returning its last error.
func retry(f func() error) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		err := f()
		if err == nil || errors.Is(err, errExited) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(pollInterval)
	}
}

// logTail returns the last lines of a log file, for error messages.
func logTail(path string) string { return harness.LogTail(path, 25, 4096) }

// PostmasterPID reads the pid of a running postmaster from the lock file in
// its data directory; ok is false when the file is absent, i.e. postgres is
// not running (or is unreadable). A postmaster killed with SIGKILL leaves
// the file behind: the pid may be gone.
func PostmasterPID(dataDir string) (pid int, ok bool) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err = strconv.Atoi(strings.TrimSpace(first))
	return pid, err == nil
}

// waitGone waits until process pid has exited (a zombie counts as exited:
// the postmaster is not our child and may wait for a reaper that never comes).
func waitGone(pid int) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		if !harness.Alive(pid) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: postmaster %d still running %s after pg_ctl stop", pid, readyTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
