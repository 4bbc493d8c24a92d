// Package db holds what lockagent/store shares with its owner-only
// subpackages (migrate, tenant, check, ledger): the Handle they run their
// statements through, the dialling every connection of a Store uses, and
// the scanning of rows a listing may have to leave out. The sidecar links
// it with the store, so nothing here is the owner's alone.
package db

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Handle is a Store's database as the store and its owner-only
// subpackages use it: the pool, where it connects, the logger, and the
// mapping of driver errors onto the store's sentinels.
type Handle struct {
	Pool *pgxpool.Pool
	// Addr names every host:port the Store tries, for messages; never
	// the password.
	Addr string
	// Logger receives what the Store notes on the side, such as a row a
	// listing leaves out.
	Logger *slog.Logger
	// Classify maps a driver error onto the store's sentinels
	// (store.ErrUnavailable, store.ErrForbidden, ...) at the database
	// boundary, naming op, so that callers branch with errors.Is.
	Classify func(op string, err error) error

	skippedRows atomic.Int64
}

// QNow reads the database clock, the only clock dislock's decisions use.
const QNow = `SELECT now()`

// Now is the database clock.
func (h *Handle) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := h.Pool.QueryRow(ctx, QNow).Scan(&now); err != nil {
		return time.Time{}, h.Classify("reading database time", err)
	}
	return now.UTC(), nil
}

// SkipRow logs and counts a row a listing leaves out.
func (h *Handle) SkipRow(op string, r *UnreadableRow) {
	h.skippedRows.Add(1)
	h.Logger.Warn("left out a row that cannot be read", "op", op, "table", "dislock."+r.Table, "key", r.Key,
		"problems", r.Problems)
}

// SkippedRows counts the rows the Handle's listings left out because they
// could not be read (each is logged).
func (h *Handle) SkippedRows() int64 { return h.skippedRows.Load() }

// List runs a query whose rows end with now() and scans them with scan. A
// row that cannot be read is left out (see UnreadableRow).
func List[T any](ctx context.Context, h *Handle, op string, scan func(pgx.Row, *T, ...any) error, query string, args ...any) ([]T, time.Time, error) {
	rows, err := h.Pool.Query(ctx, query, args...)
	if err != nil {
		return nil, time.Time{}, h.Classify(op, err)
	}
	defer rows.Close()
	var out []T
	var dbTime time.Time
	for rows.Next() {
		var v T
		var unreadable *UnreadableRow
		if err := scan(rows, &v, &dbTime); errors.As(err, &unreadable) {
			h.SkipRow(op, unreadable)
			continue
		} else if err != nil {
			return nil, time.Time{}, h.Classify(op, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, h.Classify(op, err)
	}
	if dbTime.IsZero() {
		// No rows: the caller still gets the database time.
		if dbTime, err = h.Now(ctx); err != nil {
			return nil, time.Time{}, err
		}
	}
	return out, dbTime, nil
}

// Querier is what a read runs through: a pool, or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Micros is how a duration travels to SQL, where it becomes an interval
// (`$n::bigint * interval '1 microsecond'`) added to now().
func Micros(d time.Duration) int64 { return d.Microseconds() }

// NullTime is t in UTC, or NULL for the zero time.
func NullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// UTC converts every *time.Time in dest to UTC in place.
func UTC(dest []any) {
	for _, d := range dest {
		if t, ok := d.(*time.Time); ok {
			*t = t.UTC()
		}
	}
}

// UTCPtr converts *t, when there is one, to UTC in place.
func UTCPtr(t *time.Time) {
	if t != nil {
		*t = t.UTC()
	}
}

// LockTimedOut tells a lock wait cut by lock_timeout.
func LockTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" // lock_not_available
}

// Cut shortens s to at most max bytes on a rune boundary, ending it with
// an ellipsis when it cut: a long reason is kept in part rather than lost.
func Cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	const mark = "…"
	cut := max - len(mark)
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + mark
}
