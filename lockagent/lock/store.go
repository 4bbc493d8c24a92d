package lock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultMaxConns bounds the pool: the agent needs one connection at a time,
// the CLI and the webhook a few.
const DefaultMaxConns = 4

// Options tune a Store.
type Options struct {
	// MaxConns caps the connection pool (DefaultMaxConns when 0).
	MaxConns int32
}

// Store runs the lock statements against one database.
type Store struct {
	pool *pgxpool.Pool
	addr string // host:port for error messages; never the password
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
		return nil, fmt.Errorf("invalid database URL: %s", scrubPassword(databaseURL, err.Error()))
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

// scrubPassword removes any password the connection string carries from msg.
// pgx already redacts what it recognises; this also covers strings too broken
// for its redaction to find the password.
func scrubPassword(databaseURL, msg string) string {
	var secrets []string
	if u, err := url.Parse(databaseURL); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			secrets = append(secrets, p, url.QueryEscape(p), url.PathEscape(p))
		}
	}
	if i := strings.Index(databaseURL, "://"); i >= 0 {
		rest := databaseURL[i+3:]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if colon := strings.Index(rest[:at], ":"); colon >= 0 {
				secrets = append(secrets, rest[colon+1:at])
			}
		}
	}
	for _, field := range strings.Fields(databaseURL) {
		if v, ok := strings.CutPrefix(field, "password="); ok {
			secrets = append(secrets, strings.Trim(v, "'"))
		}
	}
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return msg
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
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening database pool: %s", scrubPassword(databaseURL, err.Error()))
	}
	host := cfg.ConnConfig.Host
	if strings.HasPrefix(host, "/") {
		host = "unix:" + host
	}
	return &Store{pool: pool, addr: net.JoinHostPort(host, strconv.Itoa(int(cfg.ConnConfig.Port)))}, nil
}

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

// list runs a query whose rows end with now() and scans them with scan.
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
		if err := scan(rows, &v, &dbTime); err != nil {
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
