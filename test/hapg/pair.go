package hapg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/pgtest"
)

// Names of a Pair's servers, for SuperuserDSN.
const (
	PairPrimary = "primary"
	PairStandby = "standby"
)

// PairOptions tune a Pair; the zero value is fine.
type PairOptions struct {
	// Name appears in log lines and the temp directory's name.
	Name string
	// Logf receives progress lines (t.Logf); nil = silent.
	Logf func(format string, args ...any)
}

// Pair is a PostgreSQL primary with one asynchronously streaming standby,
// no Patroni: the failover a test drives by hand. PauseReplication,
// KillPrimary and ResumeAndPromote, in that order, lose exactly the
// transactions committed after PauseReplication returned. Its methods are
// safe for concurrent use.
type Pair struct {
	opts PairOptions
	base
	// ports stay fixed for the Pair's life.
	primaryPort, standbyPort int

	mu       sync.Mutex
	closed   bool
	closeErr error
	// walsender is the primary's walsender that PauseReplication stopped
	// (SIGSTOP), 0 if none.
	walsender int
}

// StartAsyncPair runs initdb for a primary on a free port, creates the
// "dislock" role and database, clones a standby with pg_basebackup, starts
// it streaming (synchronous_standby_names is empty: commits do not wait for
// it) and returns once the primary's pg_stat_replication shows it streaming.
func StartAsyncPair(opts PairOptions) (*Pair, error) {
	b, err := newBase(opts.Name)
	if err != nil {
		return nil, err
	}
	p := &Pair{opts: opts, base: b}
	return harness.SetUp(p, p.setUp, (*Pair).logTails)
}

func (p *Pair) setUp() error {
	begun := time.Now()
	ports, err := harness.FreePorts(2)
	if err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	p.primaryPort, p.standbyPort = ports[0], ports[1]
	for _, name := range []string{PairPrimary, PairStandby} {
		if err := p.acct.Mkdir(p.path(name)); err != nil {
			return fmt.Errorf("hapg: %w", err)
		}
	}

	pwFile := p.path(PairPrimary, "superuser.pw")
	if err := p.acct.WriteFile(pwFile, pgtest.SuperuserPassword+"\n", 0o600); err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	if _, err := p.acct.run(p.dir, p.bin.initdb, "-D", p.dataDir(PairPrimary), "-U", pgtest.Superuser, "--pwfile="+pwFile,
		"--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
		return fmt.Errorf("hapg: initdb: %w", err)
	}
	_ = os.Remove(pwFile)
	if err := p.acct.WriteFile(filepath.Join(p.dataDir(PairPrimary), "pg_hba.conf"), pairHBA, 0o600); err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	if err := p.appendConf(PairPrimary, pairConf(p.primaryPort, p.path(PairPrimary))); err != nil {
		return err
	}
	if err := p.pgCtlStart(PairPrimary); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := execSQL(ctx, adminDSN(p.primaryPort), pgtest.CreateRoleSQL, pgtest.CreateDatabaseSQL); err != nil {
		return fmt.Errorf("hapg: creating role and database %q: %w", pgtest.Database, err)
	}

	// -R writes standby.signal and a primary_conninfo with these
	// credentials; the copied postgresql.conf then gets the standby's port
	// and socket directory appended (later lines win).
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s application_name=%s",
		p.primaryPort, pgtest.Superuser, pgtest.SuperuserPassword, PairStandby)
	if _, err := p.acct.run(p.dir, p.bin.basebackup, "-D", p.dataDir(PairStandby), "-d", conninfo,
		"-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		return fmt.Errorf("hapg: pg_basebackup: %w", err)
	}
	if err := p.appendConf(PairStandby, pairConf(p.standbyPort, p.path(PairStandby))); err != nil {
		return err
	}
	if err := p.pgCtlStart(PairStandby); err != nil {
		return err
	}
	err = poll(ctx, func() error {
		rows, err := replicas(ctx, p.SuperuserDSN(PairPrimary))
		if err != nil {
			return err
		}
		if len(rows) != 1 || rows[0].state != "streaming" {
			return fmt.Errorf("pg_stat_replication on the primary: %v", rows)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("hapg: waiting for the standby to stream: %w", err)
	}
	p.logf("primary on %s, standby on %s streaming asynchronously, files in %s; ready in %v",
		addr(p.primaryPort), addr(p.standbyPort), p.dir, time.Since(begun).Round(time.Millisecond))
	return nil
}

// pairHBA is pgHBA with replication for the pgtest.Superuser, whom pg_basebackup
// and the standby log in as.
const pairHBA = `local all all trust
host replication postgres 127.0.0.1/32 scram-sha-256
host all all 127.0.0.1/32 scram-sha-256
`

// pairConf is appended to a Pair server's postgresql.conf.
func pairConf(port int, socketDir string) string {
	return `
# --- added by hapg ---
listen_addresses = '127.0.0.1'
port = ` + itoa(port) + `
unix_socket_directories = ` + pgConfString(socketDir) + `
unix_socket_permissions = 0700
max_connections = 100
shared_buffers = 32MB
fsync = on
synchronous_commit = on
full_page_writes = on
password_encryption = 'scram-sha-256'
wal_level = replica
max_wal_senders = 5
hot_standby = on
# Asynchronous replication: a commit waits for no standby.
synchronous_standby_names = ''
# A walreceiver that heard nothing for a while would reconnect and get a
# fresh walsender, which would send the WAL that PauseReplication holds back.
wal_receiver_timeout = 0
`
}

func (p *Pair) appendConf(name, conf string) error {
	f, err := os.OpenFile(filepath.Join(p.dataDir(name), "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("hapg: configuring %s: %w", name, err)
	}
	_, err = f.WriteString(conf)
	if err := errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("hapg: configuring %s: %w", name, err)
	}
	return nil
}

func (p *Pair) pgCtlStart(name string) error {
	logFile := p.path(name, "postgres.log")
	if _, err := p.acct.run(p.dir, p.bin.pgCtl, "start", "-w", "-t", "60", "-D", p.dataDir(name), "-l", logFile); err != nil {
		return fmt.Errorf("hapg: starting %s: %w\n%s", name, err, logTail(logFile))
	}
	return nil
}

// PrimaryDSN connects straight to the primary as the application role.
func (p *Pair) PrimaryDSN() string { return appDSN(p.primaryPort) }

// StandbyDSN connects straight to the standby as the application role:
// read-only until ResumeAndPromote.
func (p *Pair) StandbyDSN() string { return appDSN(p.standbyPort) }

// SuperuserDSN connects to PairPrimary or PairStandby as the superuser.
func (p *Pair) SuperuserDSN(name string) string {
	switch name {
	case PairPrimary:
		return superuserDSN(p.primaryPort)
	case PairStandby:
		return superuserDSN(p.standbyPort)
	}
	panic(fmt.Sprintf("hapg: no server %q in a Pair (have %q and %q)", name, PairPrimary, PairStandby))
}

// PauseReplication waits until the standby has replayed everything the
// primary had written when it was called, then stops (SIGSTOP) the
// primary's walsender: from then on the standby receives no WAL, while the
// primary goes on committing without waiting for it. It stops the sending
// side, not the standby: WAL already sent to a stopped standby would sit in
// its socket buffer and be replayed once it continued.
func (p *Pair) PauseReplication(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errClosed
	}
	if p.walsender != 0 {
		return errors.New("hapg: PauseReplication: replication is paused already")
	}
	var pid int
	var lsn string
	err := queryRow(ctx, p.SuperuserDSN(PairPrimary),
		"SELECT pid, pg_current_wal_lsn()::text FROM pg_stat_replication WHERE state = 'streaming'", &pid, &lsn)
	if err != nil {
		return fmt.Errorf("hapg: PauseReplication: finding the walsender: %w", err)
	}
	err = poll(ctx, func() error {
		var caughtUp bool
		// lsn is PostgreSQL's own rendering of a pg_lsn ("0/3000148").
		if err := queryRow(ctx, p.SuperuserDSN(PairStandby),
			"SELECT pg_last_wal_replay_lsn() >= "+pgConfString(lsn)+"::pg_lsn", &caughtUp); err != nil {
			return err
		}
		if !caughtUp {
			return fmt.Errorf("the standby has not replayed up to %s", lsn)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("hapg: PauseReplication: %w", err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("hapg: PauseReplication: stopping walsender %d: %w", pid, err)
	}
	p.walsender = pid
	// The watchdog kills it should the test process die, so that the
	// postmaster's shutdown does not wait for it.
	_ = os.WriteFile(p.path("walsender.pid"), fmt.Appendf(nil, "%d\n", pid), 0o644)
	err = waitFor(readyTimeout, func() error {
		if s := procState(pid); s != "T" {
			return fmt.Errorf("walsender %d in state %q, not stopped", pid, s)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("hapg: PauseReplication: %w", err)
	}
	p.logf("replication paused (walsender %d stopped at %s)", pid, lsn)
	return nil
}

// procState is the state letter of /proc/<pid>/stat ("" if pid is gone).
func procState(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	for i := len(b) - 1; i > 0; i-- {
		if b[i] == ')' && i+2 < len(b) {
			return string(b[i+2])
		}
	}
	return ""
}

// KillPrimary SIGKILLs the primary's postmaster and all its processes at
// once (a stopped walsender included) and returns once its port refuses
// connections.
func (p *Pair) KillPrimary() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errClosed
	}
	pid, err := killPostmaster(p.dataDir(PairPrimary), syscall.SIGKILL)
	if err == nil && pid == 0 {
		err = errors.New("it is not running")
	}
	if err != nil {
		return fmt.Errorf("hapg: KillPrimary: %w", err)
	}
	if p.walsender != 0 {
		p.walsender = 0
		_ = os.Remove(p.path("walsender.pid"))
	}
	if err := waitRefusing(p.primaryPort); err != nil {
		return fmt.Errorf("hapg: KillPrimary: %w", err)
	}
	p.logf("killed the primary (postmaster %d)", pid)
	return nil
}

// ResumeAndPromote lets a paused walsender continue (if the primary still
// runs: then the standby catches up first, as far as it gets before the
// promotion), promotes the standby (pg_ctl promote) and returns once it is
// out of recovery. After KillPrimary it is the failover to an asynchronous
// standby.
func (p *Pair) ResumeAndPromote(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errClosed
	}
	p.resumeLocked()
	if _, err := p.acct.run(p.dir, p.bin.pgCtl, "promote", "-w", "-t", "60", "-D", p.dataDir(PairStandby)); err != nil {
		return fmt.Errorf("hapg: promoting the standby: %w\n%s", err, logTail(p.path(PairStandby, "postgres.log")))
	}
	if err := poll(ctx, func() error { return isPrimary(ctx, p.SuperuserDSN(PairStandby)) }); err != nil {
		return fmt.Errorf("hapg: promoting the standby: %w\n%s", err, logTail(p.path(PairStandby, "postgres.log")))
	}
	p.logf("standby promoted")
	return nil
}

func (p *Pair) resumeLocked() {
	if p.walsender == 0 {
		return
	}
	_ = syscall.Kill(p.walsender, syscall.SIGCONT)
	p.walsender = 0
	_ = os.Remove(p.path("walsender.pid"))
}

// Close stops both servers (immediate shutdown: the data is thrown away)
// and removes the temp directory. Later calls return the first call's
// result.
func (p *Pair) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return p.closeErr
	}
	p.closed = true
	p.resumeLocked()
	var errs []error
	for _, name := range []string{PairPrimary, PairStandby} {
		if _, err := killPostmaster(p.dataDir(name), syscall.SIGQUIT); err != nil {
			errs = append(errs, fmt.Errorf("hapg: stopping the %s: %w", name, err))
		}
	}
	p.closeErr = p.wd.StopAndRemove(errs...)
	p.logf("stopped; removed %s", p.dir)
	return p.closeErr
}

func (p *Pair) logTails() string {
	return logTail(p.path(PairPrimary, "postgres.log")) + "\n" + logTail(p.path(PairStandby, "postgres.log")) + "\n"
}

func (p *Pair) path(elem ...string) string {
	return filepath.Join(append([]string{p.dir}, elem...)...)
}

func (p *Pair) dataDir(name string) string { return p.path(name, "data") }

func (p *Pair) logf(format string, args ...any) {
	harness.Logf(p.opts.Logf, "hapg-pair", label(p.opts.Name), format, args...)
}
