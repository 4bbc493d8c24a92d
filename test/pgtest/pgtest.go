// Package pgtest starts a private PostgreSQL server, with a PgBouncer in
// transaction-pooling mode in front of it, for integration and end-to-end
// tests.
//
// A Server owns one temporary directory (data directory, unix socket, configs,
// logs) and the processes it starts. Close stops them and removes the
// directory; if the test process dies first (panic, timeout, ^C) a small
// watchdog process does the same, so no postgres or pgbouncer outlives a test
// run.
//
// Authentication: both servers listen on 127.0.0.1 only and require
// scram-sha-256 over TCP. The application role "dislock" (password
// "dislock-secret") owns the database "dislock"; DirectDSN and BouncerDSN use
// it. SuperuserDSN connects directly as "postgres" with a fixed password; the
// harness itself bootstraps roles as "postgres" through the unix socket, which
// uses trust and is only accessible to the server's OS user and root.
// PgBouncer reads plain-text passwords from its auth_file and logs in to
// PostgreSQL with SCRAM as the connecting user. A role the auth_file does
// not list (the tenant roles dislock creates at run time) is looked up with
// auth_user/auth_query through a SECURITY DEFINER function the harness
// creates as the superuser (CreateAuthQuerySQL), so it logs in through
// PgBouncer without a reload. The application role may create roles
// (CREATEROLE), as dislock's owner role must. Its admin console (database
// "pgbouncer") accepts the superuser.
//
// AddBouncer starts more PgBouncers in front of the same PostgreSQL, one per
// simulated cluster, each of which can be stopped, restarted or paused
// (SIGSTOP: a partition as its clients see it) on its own.
//
// With Options.TLS both servers refuse unencrypted TCP clients, PgBouncer
// verifies PostgreSQL's certificate, and the DSN methods verify the
// certificate of whichever they reach against CAFile.
//
// When the tests run as root, initdb, postgres and pgbouncer run as the
// "postgres" system user, because they refuse to run as root.
package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/tlstest"
)

// Options tune a Server; the zero value is fine.
type Options struct {
	// Name appears in log lines and the temp directory's name (e.g. "crash").
	Name string
	// Logf receives harness progress lines (t.Logf); nil = silent.
	Logf func(format string, args ...any)
	// PostgresEnv is extra environment for the postgres server, e.g.
	// FakeClockEnv's, to give the database a clock other than the tests'.
	PostgresEnv []string
	// TLS makes PostgreSQL and PgBouncer require TLS over TCP, with
	// certificates from a CA the Server generates (CAFile): the DSNs it
	// returns then use sslmode=verify-full with that CA.
	TLS bool
	// Conf is appended to postgresql.conf after the harness's own settings
	// (a later line wins), e.g. shared_preload_libraries for a benchmark
	// that reads pg_stat_statements.
	Conf string
}

// Target is one way to reach the database: "direct" or "pgbouncer".
type Target struct {
	Name, DSN string
}

// Server is a running PostgreSQL with a PgBouncer in front of it. Its methods
// are safe for concurrent use.
type Server struct {
	opts Options
	bin  binaries
	acct harness.Account
	dir  string
	// pgPort and bouncerPort stay fixed across restarts.
	pgPort, bouncerPort int
	wd                  *harness.Watchdog

	mu       sync.Mutex
	closed   bool
	closeErr error
	// bouncer is the running pgbouncer, nil when stopped; bouncerExited is
	// closed once it has been reaped.
	bouncer       *exec.Cmd
	bouncerExited chan struct{}
	// extra are the bouncers AddBouncer started.
	extra []*Bouncer
}

var errClosed = errors.New("pgtest: server is closed")

// bouncerStopGrace is how long pgbouncer gets to exit after SIGTERM before it
// is killed.
const bouncerStopGrace = 10 * time.Second

// Start runs initdb in a fresh temp directory, starts postgres on a free
// 127.0.0.1 port, creates the "dislock" role and database, and starts
// pgbouncer on another free port. It returns once both accept connections
// and a query through pgbouncer succeeds. A missing program yields an error
// wrapping ErrMissingBinary that names the apt packages to install.
func Start(opts Options) (*Server, error) {
	s, err := newServer(opts)
	if err != nil {
		return nil, err
	}
	return harness.SetUp(s, s.setUp, nil)
}

// newServer finds the programs and the account, and makes the temp
// directory with its watchdog: a Server that has started nothing yet.
func newServer(opts Options) (*Server, error) {
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	acct, err := serverAccount()
	if err != nil {
		return nil, err
	}
	// The server account must be able to traverse and write the directory;
	// the data directory inside it is initdb's and stays 0700.
	dir, err := acct.TempDir("pgtest-" + dirLabel(opts.Name) + "-")
	if err != nil {
		return nil, err
	}
	wd, err := harness.StartWatchdog("pgtest", watchdogScript, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &Server{opts: opts, bin: bin, acct: acct, dir: dir, wd: wd}, nil
}

// portAttempts bounds how often Start picks a new port because another process
// began listening on the one it picked before the server could bind it.
const portAttempts = 3

func (s *Server) setUp() error {
	begun := time.Now()
	if err := s.initdb(); err != nil {
		return err
	}
	if err := s.writeCerts(); err != nil {
		return err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		s.pgPort = port
		if err := s.configurePostgres(); err != nil {
			return err
		}
		err = s.startPostgresLocked()
		if err == nil {
			break
		}
		if attempt == portAttempts || s.postgresRunning() || dial(s.pgPort) != nil {
			return err
		}
		s.logf("port %d was taken before postgres could bind it; picking another", s.pgPort)
	}
	if _, err := s.run(s.bin.psql, "-X", "-q", "-v", "ON_ERROR_STOP=1",
		"-h", s.dir, "-p", strconv.Itoa(s.pgPort), "-U", Superuser, "-d", "postgres",
		"-c", CreateRoleSQL, "-c", CreateDatabaseSQL, "-c", CreateAuthUserSQL); err != nil {
		return fmt.Errorf("pgtest: creating role and database %q: %w", Database, err)
	}
	if _, err := s.run(s.bin.psql, "-X", "-q", "-v", "ON_ERROR_STOP=1",
		"-h", s.dir, "-p", strconv.Itoa(s.pgPort), "-U", Superuser, "-d", Database,
		"-c", CreateAuthQuerySQL); err != nil {
		return fmt.Errorf("pgtest: creating pgbouncer's auth_query function: %w", err)
	}
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		s.bouncerPort = port
		if err := s.writeBouncerConfig(); err != nil {
			return err
		}
		err = s.startBouncerLocked()
		if err == nil {
			break
		}
		if attempt == portAttempts || s.bouncerRunningLocked() || dial(s.bouncerPort) != nil {
			return err
		}
		s.logf("port %d was taken before pgbouncer could bind it; picking another", s.bouncerPort)
	}
	s.logf("postgres on %s, pgbouncer (transaction pooling) on %s, files in %s; ready in %v",
		addr(s.pgPort), addr(s.bouncerPort), s.dir, time.Since(begun).Round(time.Millisecond))
	return nil
}

// initdb creates the cluster with a superuser password and our pg_hba.conf.
func (s *Server) initdb() error {
	pwFile := s.path("superuser.pw")
	if err := s.acct.WriteFile(pwFile, SuperuserPassword+"\n", 0o600); err != nil {
		return fmt.Errorf("pgtest: writing superuser password file: %w", err)
	}
	defer os.Remove(pwFile)
	// --no-sync skips initdb's final flush of the new cluster to disk, which
	// only matters if the OS crashes (ending the test run anyway). The
	// server's own fsync stays on.
	if _, err := s.run(s.bin.initdb, "-D", s.dataDir(), "-U", Superuser, "--pwfile="+pwFile,
		"--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
		return fmt.Errorf("pgtest: initdb: %w", err)
	}
	hba := pgHBA
	if s.opts.TLS {
		hba = pgHBATLS
	}
	if err := s.acct.WriteFile(filepath.Join(s.dataDir(), "pg_hba.conf"), hba, 0o600); err != nil {
		return fmt.Errorf("pgtest: writing pg_hba.conf: %w", err)
	}
	return nil
}

// configurePostgres appends our settings for s.pgPort to postgresql.conf; on
// a retry with another port the later lines win.
func (s *Server) configurePostgres() error {
	f, err := os.OpenFile(filepath.Join(s.dataDir(), "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgtest: configuring postgres: %w", err)
	}
	conf := postgresConf(s.pgPort, s.dir)
	if s.opts.TLS {
		conf += postgresTLSConf(s.dir)
	}
	conf += s.opts.Conf + "\n"
	_, err = f.WriteString(conf)
	if err := errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("pgtest: configuring postgres: %w", err)
	}
	return nil
}

func (s *Server) writeBouncerConfig() error {
	authFile := s.path("pgbouncer.users")
	if err := s.acct.WriteFile(authFile, bouncerAuthFile(), 0o600); err != nil {
		return fmt.Errorf("pgtest: writing pgbouncer auth_file: %w", err)
	}
	conf := bouncerConf(s.pgPort, s.bouncerPort, mainPoolSize, authFile, s.path("pgbouncer.pid")) + s.bouncerTLSConf()
	if err := s.acct.WriteFile(s.path("pgbouncer.ini"), conf, 0o644); err != nil {
		return fmt.Errorf("pgtest: writing pgbouncer.ini: %w", err)
	}
	return nil
}

// DirectDSN connects straight to postgres as the application role:
// postgres://dislock:dislock-secret@127.0.0.1:PORT/dislock?sslmode=disable,
// or with Options.TLS sslmode=verify-full&sslrootcert=CAFile.
func (s *Server) DirectDSN() string { return s.DSN(AppUser, AppPassword, s.pgPort) }

// BouncerDSN is DirectDSN through pgbouncer.
func (s *Server) BouncerDSN() string { return s.DSN(AppUser, AppPassword, s.bouncerPort) }

// SuperuserDSN connects straight to postgres, database "dislock", as the
// superuser "postgres" with its password over TCP (scram-sha-256).
func (s *Server) SuperuserDSN() string { return s.DSN(Superuser, SuperuserPassword, s.pgPort) }

// DSN is the package's DSN for this server: with Options.TLS it verifies
// the server's certificate against CAFile (VerifyFullDSN).
func (s *Server) DSN(user, password string, port int) string {
	if s.opts.TLS {
		return VerifyFullDSN(user, password, port, s.CAFile())
	}
	return DSN(user, password, port)
}

// CAFile is the path of the PEM file of the CA that signed PostgreSQL's and
// PgBouncer's certificates; "" without Options.TLS.
func (s *Server) CAFile() string {
	if !s.opts.TLS {
		return ""
	}
	return s.path(caFile)
}

// writeCerts generates the CA and the two servers' certificates
// (Options.TLS), owned by the servers' account.
func (s *Server) writeCerts() error {
	if !s.opts.TLS {
		return nil
	}
	ca, err := tlstest.GenerateCA("pgtest-ca")
	if err != nil {
		return fmt.Errorf("pgtest: generating the CA: %w", err)
	}
	files := map[string]string{caFile: string(ca.CertPEM)}
	for _, c := range []struct{ name, cert, key string }{
		{"pgtest-postgres", serverCertFile, serverKeyFile},
		{"pgtest-pgbouncer", bouncerCertFile, bouncerKeyFile},
	} {
		leaf, err := ca.IssueLeaf(c.name)
		if err != nil {
			return fmt.Errorf("pgtest: issuing %s's certificate: %w", c.name, err)
		}
		files[c.cert], files[c.key] = string(leaf.CertPEM), string(leaf.KeyPEM)
	}
	for name, data := range files {
		if err := s.acct.WriteFile(s.path(name), data, 0o600); err != nil {
			return fmt.Errorf("pgtest: writing %s: %w", name, err)
		}
	}
	// Clients of any account read the CA.
	return os.Chmod(s.path(caFile), 0o644)
}

// bouncerTLSConf is what a pgbouncer.ini of this server ends with:
// bouncerTLSConf with Options.TLS, nothing without.
func (s *Server) bouncerTLSConf() string {
	if !s.opts.TLS {
		return ""
	}
	return bouncerTLSConf(s.dir)
}

// Targets lists the ways to reach the database: direct, then pgbouncer.
func (s *Server) Targets() []Target {
	return []Target{{Name: "direct", DSN: s.DirectDSN()}, {Name: "pgbouncer", DSN: s.BouncerDSN()}}
}

// Pgbench returns the path of the pgbench matching the server, or "" if it is
// not installed.
func (s *Server) Pgbench() string { return s.bin.pgbench }

// StopPostgres runs `pg_ctl stop -m mode` ("smart", "fast" or "immediate";
// immediate is a crash: recovery runs on the next start) and returns once
// postgres has exited and its port refuses connections. Stopping a stopped
// server is a no-op.
//
// While postgres is down, direct connections are refused at once, but
// pgbouncer still accepts clients and queues their queries while it retries
// the server, for up to query_wait_timeout (PgBouncer's default, 120 s) before
// failing them: give such queries a context deadline.
func (s *Server) StopPostgres(mode string) error {
	switch mode {
	case "smart", "fast", "immediate":
	default:
		return fmt.Errorf("pgtest: StopPostgres mode %q is not a pg_ctl shutdown mode (want smart, fast or immediate)", mode)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	return s.stopPostgresLocked(mode)
}

// StartPostgres starts postgres again on the same port and data directory and
// returns once it accepts connections and, if pgbouncer is running, once a
// query through pgbouncer succeeds again. Starting a running server is a
// no-op.
func (s *Server) StartPostgres() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	if err := s.startPostgresLocked(); err != nil {
		return err
	}
	if s.bouncerRunningLocked() {
		return s.waitBouncerQueryLocked()
	}
	return nil
}

// StopBouncer stops pgbouncer (SIGTERM: immediate shutdown, SIGKILL after
// 10 s) and returns once it has exited and its port refuses connections.
// Stopping a stopped pgbouncer is a no-op.
func (s *Server) StopBouncer() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	return s.stopBouncerLocked()
}

// StartBouncer starts pgbouncer again on the same port and returns once it
// accepts connections and, if postgres is running, once a query through it
// succeeds. Starting a running pgbouncer is a no-op.
func (s *Server) StartBouncer() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	return s.startBouncerLocked()
}

// Close stops pgbouncer and then postgres (pg_ctl stop -m fast) and removes
// the temp directory. It works whatever state the servers are in, and later
// calls return the first call's result.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.closeErr
	}
	s.closed = true
	errs := []error{s.closeBouncers(s.extra), s.stopBouncerLocked()}
	if err := s.stopPostgresLocked("fast"); err != nil {
		errs = append(errs, err)
		s.killPostgres()
	}
	s.closeErr = s.wd.StopAndRemove(errs...)
	s.logf("stopped; removed %s", s.dir)
	return s.closeErr
}

func (s *Server) startPostgresLocked() error {
	if s.postgresRunning() {
		return nil
	}
	logFile := s.path("postgres.log")
	if _, err := s.runEnv(s.opts.PostgresEnv, s.bin.pgCtl, "start", "-w", "-t", strconv.Itoa(int(readyTimeout.Seconds())),
		"-D", s.dataDir(), "-l", logFile); err != nil {
		return fmt.Errorf("pgtest: starting postgres on %s: %w\n%s", addr(s.pgPort), err, logTail(logFile))
	}
	if err := waitAccepting(s.pgPort, nil); err != nil {
		return fmt.Errorf("pgtest: starting postgres: %w\n%s", err, logTail(logFile))
	}
	return nil
}

func (s *Server) stopPostgresLocked(mode string) error {
	if !s.postgresRunning() {
		return nil
	}
	pid, _ := PostmasterPID(s.dataDir())
	if _, err := s.run(s.bin.pgCtl, "stop", "-w", "-t", strconv.Itoa(int(readyTimeout.Seconds())),
		"-D", s.dataDir(), "-m", mode); err != nil {
		return fmt.Errorf("pgtest: stopping postgres (-m %s): %w\n%s", mode, err, logTail(s.path("postgres.log")))
	}
	// pg_ctl returns once the pid file is gone; the postmaster may still be
	// exiting for a moment after that.
	if pid > 0 {
		if err := waitGone(pid); err != nil {
			return err
		}
	}
	return waitRefusing(s.pgPort)
}

// killPostgres is Close's fallback when pg_ctl could not stop postgres:
// SIGQUIT makes the postmaster shut down immediately, taking its backends
// with it.
func (s *Server) killPostgres() {
	pid, ok := PostmasterPID(s.dataDir())
	if !ok {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGQUIT)
	_ = retry(func() error {
		if s.postgresRunning() {
			return errors.New("postgres still running")
		}
		return nil
	})
}

// postgresRunning asks pg_ctl, which also recognises a lock file left behind
// by a postmaster that was killed.
func (s *Server) postgresRunning() bool {
	_, err := s.run(s.bin.pgCtl, "status", "-D", s.dataDir())
	return err == nil
}

func (s *Server) startBouncerLocked() error {
	if s.bouncerRunningLocked() {
		return nil
	}
	logFile := s.path("pgbouncer.log")
	p, err := s.spawnBouncer(s.path("pgbouncer.ini"), logFile)
	if err != nil {
		return err
	}
	exited := p.exited
	s.bouncer, s.bouncerExited = p.cmd, p.exited

	if err := waitAccepting(s.bouncerPort, exited); err != nil {
		// Not stopBouncerLocked: if another process holds the port, waiting
		// for it to refuse connections would be in vain.
		s.killBouncerLocked()
		return fmt.Errorf("pgtest: starting pgbouncer on %s: %w\n%s", addr(s.bouncerPort), err, logTail(logFile))
	}
	if s.postgresRunning() {
		return s.waitBouncerQueryLocked()
	}
	return nil
}

func (s *Server) stopBouncerLocked() error {
	if s.bouncer == nil {
		return nil
	}
	s.killBouncerLocked()
	if err := waitRefusing(s.bouncerPort); err != nil {
		return fmt.Errorf("pgtest: stopping pgbouncer: %w", err)
	}
	return nil
}

// killBouncerLocked ends pgbouncer (SIGTERM, then SIGKILL after
// bouncerStopGrace) and reaps it.
func (s *Server) killBouncerLocked() {
	(&bouncerProc{cmd: s.bouncer, exited: s.bouncerExited}).kill(s.path("pgbouncer.pid"))
	s.bouncer, s.bouncerExited = nil, nil
}

func (s *Server) bouncerRunningLocked() bool {
	if s.bouncer == nil {
		return false
	}
	select {
	case <-s.bouncerExited:
		// It died on its own; forget it so that it can be started again.
		s.bouncer, s.bouncerExited = nil, nil
		return false
	default:
		return true
	}
}

// waitBouncerQueryLocked retries a query through pgbouncer until it succeeds:
// accepting TCP connections does not mean that authentication and the
// upstream login work, and after a postgres restart pgbouncer may still be
// waiting out server_login_retry.
func (s *Server) waitBouncerQueryLocked() error {
	return s.waitQuery(s.bouncerPort, s.bouncerExited, s.path("pgbouncer.log"))
}

// logTails returns the end of every log, for a failing test's output.
func (s *Server) logTails() string {
	var b strings.Builder
	for _, name := range []string{"postgres.log", "pgbouncer.log"} {
		b.WriteString(logTail(s.path(name)))
		b.WriteString("\n")
	}
	return b.String()
}

func (s *Server) path(name string) string { return filepath.Join(s.dir, name) }

func (s *Server) dataDir() string { return s.path("data") }

// PostmasterPID is the running postmaster's process id, from its pid file:
// benchmarks add up the CPU time of it and its children.
func (s *Server) PostmasterPID() (int, error) {
	return readPID(filepath.Join(s.dataDir(), "postmaster.pid"))
}

// readPID reads the process id on the first line of a pid file.
func readPID(file string) (int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("pgtest: reading pid file: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("pgtest: pid file %s: %w", file, err)
	}
	return pid, nil
}

func (s *Server) logf(format string, args ...any) {
	harness.Logf(s.opts.Logf, "pgtest", dirLabel(s.opts.Name), format, args...)
}

// dirLabel turns Options.Name into a short, path-safe label. The socket path
// (dir/.s.PGSQL.port) must stay under the kernel's 107-byte limit.
func dirLabel(name string) string { return harness.Label(name, "pg") }
