package pgtest

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
)

// BouncerOptions configure StartBouncer.
type BouncerOptions struct {
	// Name appears in log lines and the temp directory's name (e.g. "dc-a").
	Name string
	// Logf receives harness progress lines (t.Logf); nil = silent.
	Logf func(format string, args ...any)
	// Host and Port locate the upstream: a PostgreSQL server, or a proxy in
	// front of several, with pgtest's application role "dislock" (password
	// "dislock-secret") and database "dislock".
	Host string
	Port int
}

// UpstreamBouncer is a Bouncer (same settings, credentials and small pool as
// AddBouncer's) in front of a database pgtest did not start, with a temp
// directory and watchdog of its own. Stop, Start, Restart, Pause and Resume
// act on it as on any Bouncer, except that Start and Restart do not wait for
// a query through it: the upstream may be down on purpose.
type UpstreamBouncer struct {
	*Bouncer
}

// StartBouncer starts a PgBouncer in front of opts.Host:opts.Port on a free
// 127.0.0.1 port and returns once a query through it succeeds (within 30 s).
// A missing program yields an error wrapping ErrMissingBinary.
func StartBouncer(opts BouncerOptions) (*UpstreamBouncer, error) {
	if opts.Host == "" || opts.Port == 0 {
		return nil, errors.New("pgtest: StartBouncer needs the upstream's Host and Port")
	}
	// A Server without a data directory: Close stops the bouncer, finds no
	// postgres to stop, and removes the directory; the Bouncer's Start sees no
	// postgres running and so does not wait for a query. The Server's
	// watchdog script finds no postmaster here and only kills the bouncer
	// and removes the directory.
	s, err := newServer(Options{Name: opts.Name, Logf: opts.Logf})
	if err != nil {
		return nil, err
	}
	u, err := s.startUpstreamBouncer(opts)
	if err != nil {
		err = fmt.Errorf("%w\n%s", err, logTail(s.path("pgbouncer.log")))
		_ = s.Close()
		return nil, err
	}
	return u, nil
}

func (s *Server) startUpstreamBouncer(opts BouncerOptions) (*UpstreamBouncer, error) {
	begun := time.Now()
	authFile := s.path("pgbouncer.users")
	if err := s.acct.WriteFile(authFile, bouncerAuthFile(), 0o600); err != nil {
		return nil, fmt.Errorf("pgtest: writing pgbouncer auth_file: %w", err)
	}
	b := &Bouncer{s: s, name: opts.Name, ini: s.path("pgbouncer.ini"), log: s.path("pgbouncer.log"), pid: s.path("pgbouncer.pid")}
	s.extra = []*Bouncer{b}
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.startOnFreePortLocked(func(port int) string {
		return upstreamBouncerConf(opts.Host, opts.Port, port, extraPoolSize, authFile, b.pid)
	})
	if err != nil {
		return nil, err
	}
	if err := s.waitQuery(b.port, b.proc.exited, b.log); err != nil {
		return nil, err
	}
	s.logf("pgbouncer (transaction pooling) on %s in front of %s, files in %s; ready in %v",
		addr(b.port), net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)), s.dir, time.Since(begun).Round(time.Millisecond))
	return &UpstreamBouncer{Bouncer: b}, nil
}

// LogTail returns the end of the bouncer's log, for a failing test's output.
func (u *UpstreamBouncer) LogTail() string { return logTail(u.log) }

// Close stops the bouncer and removes its directory; later calls return the
// first call's result.
func (u *UpstreamBouncer) Close() error { return u.s.Close() }
