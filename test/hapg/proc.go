package hapg

// Process plumbing: where the programs are, whom they run as, starting them
// so that they die with the test process, killing a postmaster with its
// children, the watchdog, and waits.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/pgtest"
)

// ErrMissingBinary is returned (wrapped) by Start and StartAsyncPair when a
// program is not installed or not built. The wrapping error names the
// programs and how to get them.
var ErrMissingBinary = errors.New("hapg: required binary not installed")

const (
	// readyTimeout bounds each wait of the harness itself: a process to
	// accept or refuse connections, a cluster to bootstrap.
	readyTimeout = 90 * time.Second
	// commandTimeout bounds one helper command (initdb, pg_ctl,
	// pg_basebackup).
	commandTimeout = 60 * time.Second
	// queryTimeout bounds one connection attempt plus query of a probe.
	queryTimeout = 3 * time.Second
	pollInterval = 50 * time.Millisecond
	// postgresAccount is whom Patroni and PostgreSQL run as when the tests
	// run as root: postgres refuses to run as root.
	postgresAccount = "postgres"
)

// debianPGBinGlob is where Debian's postgresql-NN packages put the server
// programs.
const debianPGBinGlob = "/usr/lib/postgresql/*/bin"

// binaries holds absolute paths of the programs the harness runs.
type binaries struct {
	// pgBin is the directory of initdb, pg_ctl, postgres, pg_basebackup and
	// pg_rewind: Patroni's bin_dir.
	pgBin                     string
	patroni, haproxy, etcd    string
	pgbouncer                 string
	initdb, pgCtl, basebackup string
}

// findBinaries looks for every program; one error names all that are missing.
// etcd is the one `make tools` builds into <repo root>/bin.
func findBinaries() (binaries, error) {
	var b binaries
	dirs, _ := filepath.Glob(debianPGBinGlob)
	slices.SortFunc(dirs, func(x, y string) int { return slices.Compare(pgVersion(y), pgVersion(x)) })
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "pg_rewind")) {
			b.pgBin = d
			break
		}
	}
	var missing, packages []string
	need := func(path *string, name, pkg string, dirs ...string) {
		for _, d := range dirs {
			if p := filepath.Join(d, name); d != "" && isExecutable(p) {
				*path = p
				return
			}
		}
		if p, err := exec.LookPath(name); err == nil {
			*path = p
			return
		}
		missing = append(missing, fmt.Sprintf("%s (apt package %s)", name, pkg))
		if !slices.Contains(packages, pkg) {
			packages = append(packages, pkg)
		}
	}
	if b.pgBin == "" {
		missing = append(missing, "initdb and pg_rewind in "+debianPGBinGlob+" (apt package postgresql)")
		packages = append(packages, "postgresql")
	} else {
		b.initdb = filepath.Join(b.pgBin, "initdb")
		b.pgCtl = filepath.Join(b.pgBin, "pg_ctl")
		b.basebackup = filepath.Join(b.pgBin, "pg_basebackup")
	}
	need(&b.patroni, "patroni", "patroni", "/usr/bin")
	need(&b.haproxy, "haproxy", "haproxy", "/usr/sbin")
	need(&b.pgbouncer, "pgbouncer", "pgbouncer", "/usr/sbin")
	var errs []error
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s not found; install with: apt-get install -y %s (or hack/install-deps.sh)",
			ErrMissingBinary, strings.Join(missing, ", "), strings.Join(packages, " ")))
	}
	etcd, err := kube.FindBinary("etcd")
	switch {
	case errors.Is(err, kube.ErrMissingBinary):
		errs = append(errs, fmt.Errorf("%w: %v", ErrMissingBinary, err))
	case err != nil:
		errs = append(errs, err)
	}
	b.etcd = etcd
	return b, errors.Join(errs...)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// pgVersion is the numeric version in ".../<version>/bin", nil if there is
// none (sorts lowest).
func pgVersion(binDir string) []int {
	var v []int
	for _, part := range strings.Split(filepath.Base(filepath.Dir(binDir)), ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return nil
		}
		v = append(v, n)
	}
	return v
}

// account is the OS user PostgreSQL and Patroni run as.
type account struct{ harness.Account }

func serverAccount() (account, error) {
	a, err := harness.ServerAccount("hapg", postgresAccount, "created by apt-get install -y postgresql")
	return account{a}, err
}

// prepareDir makes a fresh temp directory that the account can traverse and
// write.
func (a account) prepareDir(label string) (string, error) { return a.TempDir("hapg-" + label + "-") }

// childEnv is our environment without the variables that would configure
// a started program behind its config's back (PG*, PATRONI_*, ETCD_*) or
// change its messages, with HOME set to home because the account may not be
// able to read ours.
func childEnv(home string) []string {
	env := harness.ChildEnv(func(k string) bool {
		return strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "PATRONI_") || strings.HasPrefix(k, "ETCD_") ||
			strings.HasPrefix(k, "LC_") || k == "LANG" || k == "HOME" ||
			k == "NOTIFY_SOCKET" || k == "LISTEN_PID" || k == "LISTEN_FDS" || k == "JOURNAL_STREAM"
	})
	return append(env, "LC_ALL=C.UTF-8", "HOME="+home)
}

// run runs a helper command as the account to completion; the error carries
// its output.
func (a account) run(dir, path string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = dir
	cmd.Env = childEnv(dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: a.Cred, Setpgid: true}
	// pg_ctl leaves the postmaster behind; should it ever hold our output
	// pipe, give up on the pipe rather than hang.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", filepath.Base(path), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// proc is one long-running program the harness started: etcd, HAProxy or a
// Patroni.
type proc = harness.Proc

// startProc starts path in dir, as cred (nil: as us), in its own process
// group, with its output appended to dir/<name>.log; it dies with the test
// process.
func startProc(dir, name string, cred *syscall.Credential, path string, args ...string) (*proc, error) {
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Env = childEnv(dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	header := fmt.Sprintf("--- hapg %s: %s %s", time.Now().Format(time.TimeOnly), path, strings.Join(args, " "))
	return harness.StartProc("hapg", dir, name, header, cmd)
}

// postmasterPID reads the pid of the postmaster from its lock file; ok is
// false when there is none or it names no live postgres process (a
// postmaster killed with SIGKILL leaves the file behind).
func postmasterPID(dataDir string) (pid int, ok bool) {
	pid, ok = pgtest.PostmasterPID(dataDir)
	if !ok || pid <= 0 || !alive(pid) {
		return 0, false
	}
	comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	if err != nil || !strings.HasPrefix(string(comm), "postgres") {
		return 0, false
	}
	return pid, true
}

// postgresProcs lists the live processes of the PostgreSQL in dataDir: the
// postmaster and everything it forked, all of which run in the data
// directory. The working directory finds them even once the postmaster is
// gone and they have been reparented; and each backend is a process group of
// its own, so a group signal would not reach them.
func postgresProcs(dataDir string) []int {
	if real, err := filepath.EvalSymlinks(dataDir); err == nil {
		dataDir = real
	}
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && cwd == dataDir && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killPostmaster stops the PostgreSQL in dataDir and waits until none of its
// processes is left. With SIGKILL every process dies at once (a lost
// machine: no backend or walsender outlives the postmaster for a moment);
// with SIGQUIT (immediate shutdown) the postmaster takes its children down
// itself, and whatever remains after a while is killed. It returns the
// postmaster's pid, 0 if none ran.
func killPostmaster(dataDir string, sig syscall.Signal) (int, error) {
	pid, ok := postmasterPID(dataDir)
	if sig == syscall.SIGKILL {
		sweep(dataDir, pid)
	} else if ok {
		_ = syscall.Kill(pid, sig)
		// A stopped process (PauseReplication's walsender) acts on the
		// postmaster's signal only once continued.
		for _, p := range postgresProcs(dataDir) {
			_ = syscall.Kill(p, syscall.SIGCONT)
		}
	}
	gone := func() error {
		if ok && alive(pid) {
			return fmt.Errorf("postmaster %d still running", pid)
		}
		if left := postgresProcs(dataDir); len(left) > 0 {
			return fmt.Errorf("postgres processes %v still running", left)
		}
		return nil
	}
	if sig != syscall.SIGKILL && waitFor(10*time.Second, gone) == nil {
		return pid, nil
	}
	err := waitFor(readyTimeout, func() error {
		sweep(dataDir, pid)
		return gone()
	})
	if !ok {
		pid = 0
	}
	return pid, err
}

// sweep SIGKILLs postmaster (if > 0) and every process running in dataDir.
func sweep(dataDir string, postmaster int) {
	if postmaster > 0 {
		_ = syscall.Kill(postmaster, syscall.SIGKILL)
	}
	for _, p := range postgresProcs(dataDir) {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}

// watchdogScript runs beside every Cluster and Pair. Its stdin is a pipe
// whose only writer is the test process, so `read` returns only when that
// process is gone without Close having dismissed the watchdog. The programs
// the harness started die with the test process already (parent-death
// signal); the postmasters, which Patroni and pg_ctl start in sessions of
// their own, do not: they get SIGQUIT (immediate shutdown, backends
// included). The *.pid files also name a walsender stopped by
// PauseReplication, which would hold up its postmaster's shutdown.
const watchdogScript = `
read -r _
dir="$1"
for f in "$dir"/*.pid "$dir"/*/*.pid; do
	[ -e "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null
done
for f in "$dir"/*/data/postmaster.pid; do
	[ -e "$f" ] && kill -QUIT "$(head -n 1 "$f")" 2>/dev/null
done
n=0
while [ "$n" -lt 100 ]; do
	alive=
	for f in "$dir"/*/data/postmaster.pid; do
		[ -e "$f" ] && kill -0 "$(head -n 1 "$f")" 2>/dev/null && alive=1
	done
	[ -z "$alive" ] && break
	sleep 0.1
	n=$((n+1))
done
rm -rf "$dir"
`

// addr, dial and alive are harness's.
var addr, dial, alive = harness.Addr, harness.Dial, harness.Alive

// waitFor polls f until it succeeds or timeout passes, returning its last
// error.
func waitFor(timeout time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return poll(ctx, f)
}

// poll calls f until it succeeds or ctx ends; the error then wraps f's last
// error.
func poll(ctx context.Context, f func() error) error {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// waitRefusing polls until port refuses TCP connections.
func waitRefusing(port int) error {
	return waitFor(readyTimeout, func() error {
		if dial(port) == nil {
			return fmt.Errorf("%s still accepts connections", addr(port))
		}
		return nil
	})
}

// logTail returns the last lines of a log file, for error messages.
func logTail(path string) string { return harness.LogTail(path, 30, 4096) }

// patroniLogTail is logTail without the line Patroni writes every loop_wait
// when nothing changes ("no action. I am (pg-a), a secondary, ..."), which
// would crowd out what happened.
func patroniLogTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const window = 256 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		_, _ = f.Seek(fi.Size()-window, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	var kept []string
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if !strings.Contains(line, "INFO: no action. ") {
			kept = append(kept, line)
		}
	}
	if len(kept) > 30 {
		kept = kept[len(kept)-30:]
	}
	return fmt.Sprintf("--- last lines of %s (without \"no action\") ---\n%s", path, strings.Join(kept, "\n"))
}
