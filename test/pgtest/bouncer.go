package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/dislock/dislock/test/harness"
)

// Bouncer is an extra PgBouncer (transaction pooling, same settings and
// credentials as the Server's own, TLS too, but a pool of 4 server connections) in front of the Server's PostgreSQL, on a
// port of its own. Tests that simulate several clusters give each cluster
// one, so that one cluster can lose its path to the database (Stop, Pause)
// while the others keep theirs. Its methods are safe for concurrent use and
// never wait for the Server's lock, so a bouncer fault can be injected while
// PostgreSQL restarts.
type Bouncer struct {
	s             *Server
	name          string
	port          int
	ini, log, pid string

	mu     sync.Mutex
	closed bool
	proc   *bouncerProc // nil when stopped
	paused bool
}

// bouncerProc is one pgbouncer process, our child.
type bouncerProc struct {
	cmd *exec.Cmd
	// exited is closed once the process has been reaped.
	exited chan struct{}
}

// AddBouncer starts another PgBouncer named name (a short label, unique per
// Server: it names its files) and returns once a query through it succeeds.
// Close stops it with the Server.
func (s *Server) AddBouncer(name string) (*Bouncer, error) {
	return s.addBouncer(name, "")
}

// AddSessionBouncer is AddBouncer for a PgBouncer in session pooling mode:
// each client keeps one server connection until it disconnects, and the
// next client gets that connection again. Tests of `dislock check` use it
// as the misconfiguration it must name.
func (s *Server) AddSessionBouncer(name string) (*Bouncer, error) {
	return s.addBouncer(name, "pool_mode = session\n")
}

// AddBouncerConf is AddBouncer with extraConf appended to its
// pgbouncer.ini (PgBouncer takes the last value of a setting): a load test
// raises max_client_conn and the pool sizes with it.
func (s *Server) AddBouncerConf(name, extraConf string) (*Bouncer, error) {
	return s.addBouncer(name, extraConf)
}

// addBouncer starts a bouncer whose pgbouncer.ini ends with extraConf
// (PgBouncer takes the last value of a setting).
func (s *Server) addBouncer(name, extraConf string) (*Bouncer, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	for _, o := range s.extra {
		if o.name == name {
			s.mu.Unlock()
			return nil, fmt.Errorf("pgtest: a bouncer named %q exists already", name)
		}
	}
	// Numbered: names that differ only past the label's length (a common
	// prefix and a timestamp) must not share a pid file.
	label := fmt.Sprintf("pgbouncer-%d-%s", len(s.extra), dirLabel(name))
	b := &Bouncer{s: s, name: name, ini: s.path(label + ".ini"), log: s.path(label + ".log"), pid: s.path(label + ".pid")}
	s.extra = append(s.extra, b)
	s.mu.Unlock()

	b.mu.Lock()
	defer b.mu.Unlock()
	return b, b.startOnFreePortLocked(func(port int) string {
		return bouncerConf(s.pgPort, port, extraPoolSize, s.path("pgbouncer.users"), b.pid) + s.bouncerTLSConf() + extraConf
	})
}

// startOnFreePortLocked picks a free port, writes conf(port) to b's ini file
// and starts pgbouncer there. Should another process take the port before
// pgbouncer binds it, it picks another, up to portAttempts times.
func (b *Bouncer) startOnFreePortLocked(conf func(port int) string) error {
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		b.port = port
		if err := b.s.acct.WriteFile(b.ini, conf(port), 0o644); err != nil {
			return fmt.Errorf("pgtest: writing %s: %w", b.ini, err)
		}
		err = b.startLocked()
		if err == nil || attempt == portAttempts || dial(port) != nil {
			return err
		}
		b.s.logf("port %d was taken before pgbouncer %s could bind it; picking another", port, b.name)
	}
}

// Port is the port the bouncer listens on (127.0.0.1).
func (b *Bouncer) Port() int { return b.port }

// PID is the running pgbouncer's process id.
func (b *Bouncer) PID() (int, error) { return readPID(b.pid) }

// Name is the name given to AddBouncer.
func (b *Bouncer) Name() string { return b.name }

// DSN connects through this bouncer as the application role.
func (b *Bouncer) DSN() string { return b.s.DSN(AppUser, AppPassword, b.port) }

// Start starts a stopped bouncer again on the same port and returns once a
// query through it succeeds (if postgres is up). Starting a running bouncer
// resumes it if it is paused.
func (b *Bouncer) Start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed
	}
	if b.proc.running() {
		return b.resumeLocked()
	}
	return b.startLocked()
}

// Stop stops the bouncer (SIGTERM, SIGKILL after 10 s; a paused one is
// resumed so that it can act on the SIGTERM) and returns once its port
// refuses connections: clients see "connection refused" at once.
func (b *Bouncer) Stop() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed
	}
	return b.stopLocked()
}

// Restart is Stop then Start: every client connection is cut.
func (b *Bouncer) Restart() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed
	}
	if err := b.stopLocked(); err != nil {
		return err
	}
	return b.startLocked()
}

// Pause freezes the bouncer (SIGSTOP). Unlike Stop this is a network
// partition as clients see it: new TCP connections still complete in the
// kernel's backlog and open ones stay open, but nothing answers, so every
// client waits for its own timeout.
func (b *Bouncer) Pause() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed
	}
	if !b.proc.running() {
		return fmt.Errorf("pgtest: pausing bouncer %s: it is not running", b.name)
	}
	if err := b.proc.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pgtest: pausing bouncer %s: %w", b.name, err)
	}
	b.paused = true
	return nil
}

// Resume undoes Pause (SIGCONT); resuming a bouncer that is not paused is a
// no-op.
func (b *Bouncer) Resume() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed
	}
	return b.resumeLocked()
}

func (b *Bouncer) resumeLocked() error {
	if !b.paused {
		return nil
	}
	b.paused = false
	if !b.proc.running() {
		return nil
	}
	if err := b.proc.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("pgtest: resuming bouncer %s: %w", b.name, err)
	}
	return nil
}

func (b *Bouncer) startLocked() error {
	p, err := b.s.spawnBouncer(b.ini, b.log)
	if err != nil {
		return err
	}
	b.proc, b.paused = p, false
	if err := waitAccepting(b.port, p.exited); err != nil {
		p.kill(b.pid)
		b.proc = nil
		return fmt.Errorf("pgtest: starting pgbouncer %s on %s: %w\n%s", b.name, addr(b.port), err, logTail(b.log))
	}
	if b.s.postgresRunning() {
		return b.s.waitQuery(b.port, p.exited, b.log)
	}
	return nil
}

func (b *Bouncer) stopLocked() error {
	if b.proc == nil {
		return nil
	}
	b.proc.kill(b.pid)
	b.proc, b.paused = nil, false
	if err := waitRefusing(b.port); err != nil {
		return fmt.Errorf("pgtest: stopping pgbouncer %s: %w", b.name, err)
	}
	return nil
}

// close is the Server's Close for this bouncer.
func (b *Bouncer) close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	err := b.stopLocked()
	b.closed = true
	return err
}

// spawnBouncer starts pgbouncer with ini in the foreground as our child, so
// that we can signal and reap it. It logs to stderr, which goes straight to
// logFile: no copying goroutine, and nothing lost if it dies before its first
// query.
func (s *Server) spawnBouncer(ini, logFile string) (*bouncerProc, error) {
	out, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgtest: starting pgbouncer: %w", err)
	}
	cmd := s.command(context.Background(), s.bin.pgbouncer, ini)
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Start()
	out.Close()
	if err != nil {
		return nil, fmt.Errorf("pgtest: starting pgbouncer: %w", err)
	}
	p := &bouncerProc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// running reports whether p is a live process (false for nil).
func (p *bouncerProc) running() bool { return p != nil && !harness.Closed(p.exited) }

// kill ends pgbouncer (SIGTERM, then SIGKILL after bouncerStopGrace) and
// reaps it. SIGCONT follows SIGTERM so that a paused bouncer acts on it.
func (p *bouncerProc) kill(pidFile string) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-p.exited:
	case <-time.After(bouncerStopGrace):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	// A killed pgbouncer leaves its pidfile; the watchdog must not act on it.
	_ = os.Remove(pidFile)
}

// waitQuery retries a query through the pgbouncer on port until it
// succeeds: accepting TCP connections does not mean that authentication and
// the upstream login work, and after a postgres restart pgbouncer may still be
// waiting out server_login_retry.
func (s *Server) waitQuery(port int, exited <-chan struct{}, logFile string) error {
	// connect_timeout: should pgbouncer have lost its port to another
	// process, that one may accept connections and never answer.
	probe := s.DSN(AppUser, AppPassword, port) + "&connect_timeout=5"
	err := retry(func() error {
		select {
		case <-exited:
			return errExited
		default:
		}
		_, err := s.run(s.bin.psql, "-X", "-q", "-A", "-t", "-d", probe, "-c", "select 1")
		return err
	})
	if err != nil {
		return fmt.Errorf("pgtest: querying through pgbouncer on %s: %w\n%s\n%s",
			addr(port), err, logTail(logFile), logTail(s.path("postgres.log")))
	}
	return nil
}

// closeBouncers stops the extra bouncers, for Close.
func (s *Server) closeBouncers(extra []*Bouncer) error {
	var errs []error
	for _, b := range extra {
		errs = append(errs, b.close())
	}
	return errors.Join(errs...)
}
