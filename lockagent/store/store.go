package store

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store/internal/db"
	"github.com/dislock/dislock/lockagent/store/internal/dsn"
)

// DefaultMaxConns bounds the pool: the agent needs one connection at a time,
// the CLI and the webhook a few.
const DefaultMaxConns = 4

// Options tune a Store.
type Options struct {
	// MaxConns caps the connection pool (DefaultMaxConns when 0).
	MaxConns int32
	// Logger receives what the Store notes on the side, such as a row a
	// listing leaves out (slog.Default() when nil).
	Logger *slog.Logger
}

// Store runs the lock statements against one database.
type Store struct {
	// h is the pool, its address and logger, and the error mapping
	// (classify), which the owner-only packages use too (Handle).
	h db.Handle
	// warned holds, per connection, the WARNINGs the server sent while a
	// write ran on it, joined (see writeRow).
	warned sync.Map // *pgconn.PgConn -> string
	// schema10Renewals: the database had no dislock.renew (schema 10, not
	// migrated yet); Renew uses schema 10's renewals from then on (see
	// Store.Renew).
	schema10Renewals atomic.Bool
	// noPauses: the database was not migrated to schema 16 when last
	// asked, and knows no pause; claims and leases use schema 15's
	// statements meanwhile.
	noPauses lacking
	// noLeaseCall: the database was not migrated to schema 17 when last
	// asked, and has no dislock.acquire_lease; leases use schema 16's
	// statements meanwhile.
	noLeaseCall lacking
	// noGuardedCalls: the database was not migrated to schema 20 when
	// last asked, and has no dislock.claim_guarded or renew_guarded;
	// claims and renewals send the commit guard in their statements
	// meanwhile.
	noGuardedCalls lacking
}

// probeInterval (a variable for the tests) is how long a Store that found
// the database without a function this release calls keeps to the older
// statements before it tries the newer ones again: a lock gateway, or a
// webhook, lives through the migration.
var probeInterval = time.Minute

// lacking remembers, for probeInterval, that the database lacked something
// this release calls (a migration not applied yet).
type lacking struct{ until atomic.Int64 } // Unix nanoseconds

// now reports whether it was found lacking less than probeInterval ago.
func (l *lacking) now() bool { return time.Now().UnixNano() < l.until.Load() }

// found notes that the database lacks it.
func (l *lacking) found() { l.until.Store(time.Now().Add(probeInterval).UnixNano()) }

// ParseDatabaseURL turns a libpq connection string (URL or key=value) into a
// pool configuration. Unless the string sets default_query_exec_mode itself,
// statements use pgx.QueryExecModeExec: unnamed statements in one round trip,
// which PgBouncer's transaction pooling serves without prepared-statement
// support. Errors never contain the password.
func ParseDatabaseURL(databaseURL string) (*pgxpool.Config, error) {
	if strings.TrimSpace(databaseURL) == "" {
		return nil, errors.New("database URL is empty (set --database-url or " + contract.EnvDatabaseURL + ", e.g. postgres://user:password@host:5432/db)")
	}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL: %s", dsn.Scrub(databaseURL, err.Error()))
	}
	if !setsExecMode(databaseURL) {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	return cfg, nil
}

// setsExecMode reports whether the connection string chooses a query exec
// mode. pgx consumes the parameter during parsing, so look at the raw input.
func setsExecMode(databaseURL string) bool {
	const key = "default_query_exec_mode"
	if strings.HasPrefix(databaseURL, "postgres://") || strings.HasPrefix(databaseURL, "postgresql://") {
		u, err := url.Parse(databaseURL)
		return err == nil && u.Query().Has(key)
	}
	pc, err := pgconn.ParseConfig(databaseURL)
	if err != nil {
		return false
	}
	_, ok := pc.RuntimeParams[key]
	return ok
}

// Open prepares a Store. It does not connect; the first statement (or Ping)
// does, so a Store can be opened while the database is still down.
func Open(ctx context.Context, databaseURL string, opts Options) (*Store, error) {
	cfg, err := ParseDatabaseURL(databaseURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = opts.MaxConns
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	s := &Store{}
	s.h.Addr, s.h.Logger, s.h.Classify = db.Addrs(cfg.ConnConfig), opts.Logger, s.classify
	if s.h.Logger == nil {
		s.h.Logger = slog.Default()
	}
	cfg.ConnConfig.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		if n.SeverityUnlocalized == "WARNING" || n.Severity == "WARNING" {
			msg := n.Message + " " + n.Detail
			if prev, ok := s.warned.Load(c); ok {
				msg = prev.(string) + "; " + msg
			}
			s.warned.Store(c, msg)
		}
	}
	cfg.BeforeClose = func(c *pgx.Conn) { s.warned.Delete(c.PgConn()) }
	cfg.ConnConfig.DialFunc = db.Dial()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening database pool: %s", dsn.Scrub(databaseURL, err.Error()))
	}
	s.h.Pool = pool
	return s, nil
}

// ErrUncertainCommit wraps ErrUnavailable: a write committed, but maybe not
// durably enough to act on. PostgreSQL reports a commit whose wait for the
// synchronous standby was cut short (a cancel request, a pooler's
// query_timeout, pg_cancel_backend) only with a WARNING: the row is
// committed on the primary and visible there, yet a failover can lose it.
// The caller must not act on the result; it retries, and the retry is
// itself a write, so its acknowledged commit makes everything before it
// durable too.
var ErrUncertainCommit = fmt.Errorf("%w: the commit was not confirmed durable", ErrUnavailable)

// writeRow runs one lock write that returns a row and scans it. The query
// must select commitGuard's columns last, which writeRow scans itself. The result
// is ErrUncertainCommit when the guard names a reason, or when the server
// warned that the commit's wait for the synchronous standby was cut short;
// a server whose messages are not in English cannot be read, so there any
// warning counts. No row (a refusal, a lost claim) is returned as is: it
// only ever leads to a skip or a stop. dislock itself never cuts a
// synchronous commit's wait short (db.Dial).
func (s *Store) writeRow(ctx context.Context, scan func(pgx.Row) error, query string, args ...any) error {
	return s.writeRowActing(ctx, scan, func() bool { return true }, query, args...)
}

// writeRowActing is writeRow for a statement whose answer is not always a
// write the caller acts on: after the scan, acts says whether this one is
// (a claim that holds the row), and only then is its commit's durability
// judged. A refusal reads what others committed and acts on nothing of
// its own, so its commit may be relaxed (the claim's view, written on the
// side, is advice).
func (s *Store) writeRowActing(ctx context.Context, scan func(pgx.Row) error, acts func() bool, query string, args ...any) error {
	if !guarded(query) {
		panic("lock: a write without the commit guard")
	}
	conn, err := s.h.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	pc := conn.Conn().PgConn()
	s.warned.Delete(pc)
	var unsafe string
	var english bool
	err = scan(guardedRow{conn.QueryRow(ctx, query, args...), []any{&unsafe, &english}})
	warning, warned := s.warned.LoadAndDelete(pc)
	switch {
	case err != nil:
		return err
	case !acts():
		return nil
	case unsafe != "":
		return fmt.Errorf("%w (%s)", ErrUncertainCommit, unsafe)
	case warned && (!english || strings.Contains(warning.(string), "synchronous replication")):
		return fmt.Errorf("%w (server warning: %q)", ErrUncertainCommit, warning)
	}
	return nil
}

// guarded tells whether query's answer ends with the commit guard's
// columns: its own (commitGuard), or those of the one function it is a call
// of (migration 20).
func guarded(query string) bool {
	return strings.Contains(query, commitGuard) || query == qClaimGuarded || query == qRenewGuarded
}

// guardedRow scans the commit guard's columns after the caller's.
type guardedRow struct {
	pgx.Row
	guard []any
}

func (r guardedRow) Scan(dest ...any) error { return r.Row.Scan(append(dest, r.guard...)...) }

// Close releases every connection.
func (s *Store) Close() { s.h.Pool.Close() }

// Addr is the database address (host:port) the Store talks to.
func (s *Store) Addr() string { return s.h.Addr }

// Handle is the Store's pool, address, logger and error mapping, for the
// owner-only packages under lockagent/store (migrate, tenant, check,
// ledger), which run statements of their own against the Store's
// database. Its type is internal to lockagent/store: code elsewhere uses
// the Store's methods.
func (s *Store) Handle() *db.Handle { return &s.h }

// SkippedRows counts the rows this Store's listings left out because they
// could not be read (each is logged).
func (s *Store) SkippedRows() int64 { return s.h.SkippedRows() }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.Now(ctx)
	return err
}

// Now is the database clock: the only clock dislock's decisions use.
func (s *Store) Now(ctx context.Context) (time.Time, error) { return s.h.Now(ctx) }

// WithRootCA makes a connection string verify the server's certificate
// against the CA in the PEM file caFile: sslrootcert=caFile unless the string
// names a root certificate itself, and sslmode=verify-full unless it sets a
// mode (a CA given means verify; a string that chose its mode keeps it). A
// URL stays a URL, a key=value string stays key=value. An empty caFile leaves
// the string as it is. Errors never contain the password.
func WithRootCA(databaseURL, caFile string) (string, error) {
	if caFile == "" {
		return databaseURL, nil
	}
	if _, err := ParseDatabaseURL(databaseURL); err != nil {
		return "", err
	}
	out, err := setRootCA(databaseURL, caFile, false)
	if err != nil {
		return "", err
	}
	// A mode the string chose that verifies nothing (disable, allow,
	// prefer: pgx then skips the certificate, or falls back to plain text)
	// would leave the CA silently unused: refuse it rather than let the
	// operator believe the server is verified.
	cfg, err := ParseDatabaseURL(out)
	if err != nil {
		return "", err
	}
	if !verifiesServer(cfg.ConnConfig.TLSConfig) || slices.ContainsFunc(cfg.ConnConfig.Fallbacks, func(f *pgconn.FallbackConfig) bool {
		return !verifiesServer(f.TLSConfig)
	}) {
		return "", fmt.Errorf("database URL: its sslmode (%s) does not verify the server's certificate, so the CA %s would go unused: "+
			"set sslmode=verify-full (or leave sslmode out) when a database CA is given", urlSSLMode(databaseURL), caFile)
	}
	return out, nil
}

// verifiesServer tells a TLS configuration that checks the server's
// certificate: pgx's verify-ca and require-with-a-root-certificate skip Go's
// own check for a callback of theirs.
func verifiesServer(c *tls.Config) bool {
	return c != nil && (!c.InsecureSkipVerify || c.VerifyPeerCertificate != nil)
}

// urlSSLMode names the sslmode a connection string sets, for messages.
func urlSSLMode(databaseURL string) string {
	if _, rest, ok := dsn.CutURLScheme(databaseURL); ok {
		if _, query, ok := strings.Cut(rest, "?"); ok {
			if v, err := url.ParseQuery(query); err == nil && v.Has("sslmode") {
				return "sslmode=" + v.Get("sslmode")
			}
		}
		return "sslmode unset"
	}
	// The last value of a keyword is the one pgx uses; a broken string is
	// read as far as it goes.
	mode := "sslmode unset"
	pairs, _ := dsn.Parse(databaseURL)
	for _, p := range pairs {
		if p.Key == "sslmode" {
			mode = "sslmode=" + p.Value
		}
	}
	return mode
}

// ReplaceRootCA is WithRootCA for a connection string handed to someone who
// reads the CA from another path: sslrootcert=caFile whatever the string
// named before, sslmode=verify-full unless it sets a mode. The webhook
// writes the sidecars' URL with it, naming where the sidecar mounts the CA;
// the owner's sslrootcert is a path in the webhook's pod. The result is not
// parsed here: pgx reads the root certificate file while parsing, and the
// file exists only where the string is used.
func ReplaceRootCA(databaseURL, caFile string) (string, error) {
	if caFile == "" {
		return "", errors.New("replacing the database URL's sslrootcert: no CA file path")
	}
	return setRootCA(databaseURL, caFile, true)
}

// setRootCA adds sslmode and sslrootcert to a connection string; replace
// drops an sslrootcert it names first.
func setRootCA(databaseURL, caFile string, replace bool) (string, error) {
	if scheme, rest, ok := dsn.CutURLScheme(databaseURL); ok {
		base, query, _ := strings.Cut(rest, "?")
		var kept []string
		has := map[string]bool{}
		if query != "" {
			for _, pair := range strings.Split(query, "&") {
				rawKey, _, _ := strings.Cut(pair, "=")
				key, err := url.QueryUnescape(rawKey)
				if err != nil {
					return "", fmt.Errorf("database URL: query parameter %q: %s", rawKey, dsn.Scrub(databaseURL, err.Error()))
				}
				if replace && key == "sslrootcert" {
					continue
				}
				has[key] = true
				kept = append(kept, pair)
			}
		}
		if !has["sslmode"] {
			kept = append(kept, "sslmode=verify-full")
		}
		if !has["sslrootcert"] {
			// %20, not '+', for a space: pgx reads '+' in a value literally.
			kept = append(kept, "sslrootcert="+strings.ReplaceAll(url.QueryEscape(caFile), "+", "%20"))
		}
		return scheme + base + "?" + strings.Join(kept, "&"), nil
	}
	// In a key=value string the last value of a keyword wins, as libpq and
	// pgx read it: a default goes in front, where the string's own value
	// overrides it, and a replacement goes at the end.
	s := strings.TrimSpace(databaseURL)
	root := "sslrootcert=" + dsn.Quote(caFile)
	if replace {
		s += " " + root
	} else {
		s = root + " " + s
	}
	return "sslmode=verify-full " + s, nil
}
