package store

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dislock/dislock/lockagent/store/internal/dsn"
)

// DefaultMaxConns bounds the pool: the agent needs one connection at a time,
// the CLI and the webhook a few.
const DefaultMaxConns = 4

// Options tune a Store.
type Options struct {
	// MaxConns caps the connection pool (DefaultMaxConns when 0).
	MaxConns int32
	// MigrationLockTimeout bounds each wait of a migration for a table
	// lock (DefaultMigrationLockTimeout when 0): every claim of every
	// namespace queues behind a waiting DDL statement.
	MigrationLockTimeout time.Duration
	// MigrationRetryFor bounds how long Migrate retries a migration whose
	// lock wait timed out (DefaultMigrationRetryFor when 0).
	MigrationRetryFor time.Duration
	// Logger receives what the Store notes on the side, such as a row a
	// listing leaves out (slog.Default() when nil).
	Logger *slog.Logger
}

// Store runs the lock statements against one database.
type Store struct {
	pool *pgxpool.Pool
	addr string // host:port for error messages; never the password
	// migrationLockTimeout and migrationRetryFor: see Options.
	migrationLockTimeout, migrationRetryFor time.Duration
	// warned holds, per connection, the WARNINGs the server sent while a
	// write ran on it, joined (see writeRow).
	warned sync.Map // *pgconn.PgConn -> string
	// logger and skippedRows: see Options.Logger and SkippedRows.
	logger      *slog.Logger
	skippedRows atomic.Int64
}

// ParseDatabaseURL turns a libpq connection string (URL or key=value) into a
// pool configuration. Unless the string sets default_query_exec_mode itself,
// statements use pgx.QueryExecModeExec: unnamed statements in one round trip,
// which PgBouncer's transaction pooling serves without prepared-statement
// support. Errors never contain the password.
func ParseDatabaseURL(databaseURL string) (*pgxpool.Config, error) {
	if strings.TrimSpace(databaseURL) == "" {
		return nil, errors.New("database URL is empty (set --database-url or DISLOCK_DATABASE_URL, e.g. postgres://user:password@host:5432/db)")
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
	s := &Store{addr: addrs(cfg.ConnConfig), migrationLockTimeout: opts.MigrationLockTimeout, migrationRetryFor: opts.MigrationRetryFor}
	if s.migrationLockTimeout <= 0 {
		s.migrationLockTimeout = DefaultMigrationLockTimeout
	}
	if s.migrationRetryFor <= 0 {
		s.migrationRetryFor = DefaultMigrationRetryFor
	}
	if s.logger = opts.Logger; s.logger == nil {
		s.logger = slog.Default()
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
	cfg.ConnConfig.DialFunc = neverCancel(keepAliveDialer.DialContext)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening database pool: %s", dsn.Scrub(databaseURL, err.Error()))
	}
	s.pool = pool
	return s, nil
}

// addrs names every host:port a (possibly multi-host) connection string
// tries, in order, for error messages.
func addrs(cfg *pgx.ConnConfig) string {
	hosts := []string{hostPort(cfg.Host, cfg.Port)}
	for _, f := range cfg.Fallbacks {
		if a := hostPort(f.Host, f.Port); a != hosts[len(hosts)-1] {
			hosts = append(hosts, a)
		}
	}
	return strings.Join(hosts, ",")
}

func hostPort(host string, port uint16) string {
	if strings.HasPrefix(host, "/") {
		host = "unix:" + host
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// noCancelNetwork is the network a connection dialled by neverCancel
// reports as its remote address's: the dial function refuses it.
const noCancelNetwork = "dislock-no-cancel"

// keepAliveDialer finds a connection whose peer went away without a word (a
// partition, a node gone) within about 25 s of silence, where pgx's
// default waits 5 minutes before its first probe: a decision's try is not
// cut short by a timeout while it waits for an answer (a herd queued in
// PgBouncer must not give up; see the agent's retry), so a dead connection
// has to end it. A pooler or server that is alive but slow answers the
// probes from its kernel and is waited for.
var keepAliveDialer = &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
	Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}}

// neverCancel wraps a dial function so that the connections it makes never
// send a cancel request. A call that runs out of time closes its connection,
// and pgx then sends PostgreSQL a cancel request for the running statement,
// dialling the connection's remote address. Cancelled while its commit waits
// for the synchronous standby, a claim is committed on the primary and
// visible to every cluster, yet a failover can lose it. Without the cancel,
// the commit keeps waiting, invisible, until the standby has it. A statement
// dislock abandons finishes on its own: every one is short.
func neverCancel(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if network == noCancelNetwork {
			return nil, errors.New("dislock never cancels a statement")
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return noCancelConn{c}, nil
	}
}

type noCancelConn struct{ net.Conn }

func (c noCancelConn) RemoteAddr() net.Addr { return noCancelAddr{c.Conn.RemoteAddr()} }

type noCancelAddr struct{ net.Addr }

func (noCancelAddr) Network() string { return noCancelNetwork }

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
// synchronous commit's wait short (neverCancel).
func (s *Store) writeRow(ctx context.Context, scan func(pgx.Row) error, query string, args ...any) error {
	if !strings.Contains(query, commitGuard) {
		panic("lock: a write without the commit guard")
	}
	conn, err := s.pool.Acquire(ctx)
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
	case unsafe != "":
		return fmt.Errorf("%w (%s)", ErrUncertainCommit, unsafe)
	case warned && (!english || strings.Contains(warning.(string), "synchronous replication")):
		return fmt.Errorf("%w (server warning: %q)", ErrUncertainCommit, warning)
	}
	return nil
}

// guardedRow scans the commit guard's columns after the caller's.
type guardedRow struct {
	pgx.Row
	guard []any
}

func (r guardedRow) Scan(dest ...any) error { return r.Row.Scan(append(dest, r.guard...)...) }

// Close releases every connection.
func (s *Store) Close() { s.pool.Close() }

// Addr is the database address (host:port) the Store talks to.
func (s *Store) Addr() string { return s.addr }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.Now(ctx)
	return err
}

// Now is the database clock: the only clock dislock's decisions use.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := s.pool.QueryRow(ctx, qNow).Scan(&now); err != nil {
		return time.Time{}, s.classify("reading database time", err)
	}
	return now.UTC(), nil
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// list runs a query whose rows end with now() and scans them with scan. A
// row that cannot be read is left out (see unreadableRow).
func list[T any](ctx context.Context, s *Store, op string, scan func(pgx.Row, *T, ...any) error, query string, args ...any) ([]T, time.Time, error) {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, time.Time{}, s.classify(op, err)
	}
	defer rows.Close()
	var out []T
	var dbTime time.Time
	for rows.Next() {
		var v T
		var unreadable *unreadableRow
		if err := scan(rows, &v, &dbTime); errors.As(err, &unreadable) {
			s.skipRow(op, unreadable)
			continue
		} else if err != nil {
			return nil, time.Time{}, s.classify(op, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, s.classify(op, err)
	}
	if dbTime.IsZero() {
		// No rows: the caller still gets the database time.
		if dbTime, err = s.Now(ctx); err != nil {
			return nil, time.Time{}, err
		}
	}
	return out, dbTime, nil
}

// utc converts every *time.Time in dest to UTC in place.
func utc(dest []any) {
	for _, d := range dest {
		if t, ok := d.(*time.Time); ok {
			*t = t.UTC()
		}
	}
}

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
