package pgtest

// Process plumbing: who the servers run as, how commands are built, the
// watchdog that cleans up after a test process that died, and the waits.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
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

// account is the OS user the servers run as.
type account struct {
	// cred is nil when the servers run as the current user.
	cred     *syscall.Credential
	uid, gid int
}

func serverAccount() (account, error) {
	if os.Geteuid() != 0 {
		return account{}, nil
	}
	u, err := user.Lookup(postgresAccount)
	if err != nil {
		return account{}, fmt.Errorf("pgtest: running as root needs the %q system user "+
			"(created by apt-get install -y postgresql), because initdb, postgres and pgbouncer refuse to run as root: %w",
			postgresAccount, err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return account{}, fmt.Errorf("pgtest: uid %q of user %q: %w", u.Uid, postgresAccount, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return account{}, fmt.Errorf("pgtest: gid %q of user %q: %w", u.Gid, postgresAccount, err)
	}
	return account{cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid: uid, gid: gid}, nil
}

// chown hands path to the server account (a no-op when that is us).
func (a account) chown(path string) error {
	if a.cred == nil {
		return nil
	}
	return os.Chown(path, a.uid, a.gid)
}

// writeFile creates path with data and perm, owned by the server account.
func (a account) writeFile(path, data string, perm os.FileMode) error {
	if err := os.WriteFile(path, []byte(data), perm); err != nil {
		return err
	}
	return a.chown(path)
}

// checkSearchable reports an ancestor of dir that the server account could not
// traverse: root can, so without this check initdb fails with a bare EACCES.
func (a account) checkSearchable(dir string) error {
	if a.cred == nil {
		return nil
	}
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("pgtest: directory %s (mode %v) is not searchable by user %q; "+
				"set TMPDIR to a world-searchable directory such as /tmp", d, fi.Mode().Perm(), postgresAccount)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// command prepares a program run as the server account in the server's
// directory, in its own process group so that a ^C aimed at `go test` does not
// hit it (the watchdog or Close stops it in order instead).
func (s *Server) command(ctx context.Context, path string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = s.dir
	cmd.Env = childEnv(s.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.acct.cred, Setpgid: true}
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

func dial(port int) error {
	c, err := net.DialTimeout("tcp", addr(port), time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

func addr(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

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

// postmasterPID reads the pid of a running postmaster from its lock file; ok is
// false when the file is absent, i.e. postgres is not running.
func postmasterPID(dataDir string) (pid int, ok bool) {
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
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			return nil
		}
		if _, rest, _ := strings.Cut(string(b), ") "); strings.HasPrefix(rest, "Z") || strings.HasPrefix(rest, "X") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: postmaster %d still running %s after pg_ctl stop", pid, readyTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
