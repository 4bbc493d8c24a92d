package store

import (
	"context"
	"fmt"
	"time"

	"github.com/dislock/dislock/lockagent/store/internal/db"
)

// WindowFilter selects windows for the operator's listings. Zero fields do
// not filter.
type WindowFilter struct {
	Key string
	// From and To bound the window start: From <= start < To.
	From, To time.Time
	// Limit bounds what is returned, newest window first; 0 means
	// DefaultListLimit.
	Limit int
}

// Validate lists every problem with the filter.
func (f WindowFilter) Validate() error {
	if !f.From.IsZero() && !f.To.IsZero() && !f.From.Before(f.To) {
		return fmt.Errorf("window filter: from %s is not before to %s", formatWindow(f.From), formatWindow(f.To))
	}
	return nil
}

func (f WindowFilter) limit() int {
	if f.Limit <= 0 {
		return DefaultListLimit
	}
	return f.Limit
}

// ListWindowsIn is ListWindows bounded by window start: the owners' rows,
// at most f.Limit of them, newest window first, and the database time.
func (s *Store) ListWindowsIn(ctx context.Context, f WindowFilter) ([]Window, time.Time, error) {
	if err := f.Validate(); err != nil {
		return nil, time.Time{}, err
	}
	return db.List(ctx, &s.h, "listing windows", scanWindow, qListWindowsIn,
		f.Key, db.NullTime(f.From), db.NullTime(f.To), f.limit())
}

// MaxDecisionsPerWindow bounds the decisions ListWindowDecisions returns of
// one window: a tenant can write as many rows into its own windows as it
// likes, and must not be able to bury every other key's in the listing.
const MaxDecisionsPerWindow = 256

// ListWindowDecisions returns every cluster's decisions (at most
// MaxDecisionsPerWindow each) of the f.Limit newest windows that have an
// owner's row or a decision, among them windows every cluster skipped;
// newest window first and, within a window, by completion index and in the
// order they were decided. Decisions that locked no window are not listed.
func (s *Store) ListWindowDecisions(ctx context.Context, f WindowFilter) ([]Decision, time.Time, error) {
	if err := f.Validate(); err != nil {
		return nil, time.Time{}, err
	}
	return db.List(ctx, &s.h, "listing the decisions of windows", scanDecision, qListWindowDecisions,
		f.Key, db.NullTime(f.From), db.NullTime(f.To), f.limit(), MaxDecisionsPerWindow)
}

// qListWindowsIn is qListWindows bounded by window start ($2 <= start < $3,
// each NULL for no bound).
const qListWindowsIn = `SELECT ` + windowColumns + `, now() FROM dislock.windows
WHERE ($1::text = '' OR lock_key = $1::text)
  AND ($2::timestamptz IS NULL OR window_start >= $2::timestamptz)
  AND ($3::timestamptz IS NULL OR window_start < $3::timestamptz)
ORDER BY window_start DESC, lock_key, job_index
LIMIT $4::int`

// qListWindowDecisions picks the $4 newest (key, window) pairs of key $1
// (” for all) within [$2, $3) from the owners' rows and the ledger, and
// returns at most $5 decisions of each. A window whose owner's row has no
// decision is picked but has no row here: the caller has its owner's row.
const qListWindowDecisions = `
WITH picked AS (
    SELECT lock_key, window_start FROM (
        SELECT lock_key, window_start FROM dislock.windows
        WHERE ($1::text = '' OR lock_key = $1::text)
          AND ($2::timestamptz IS NULL OR window_start >= $2::timestamptz)
          AND ($3::timestamptz IS NULL OR window_start < $3::timestamptz)
        UNION
        SELECT lock_key, window_start FROM dislock.decisions
        WHERE window_start IS NOT NULL
          AND ($1::text = '' OR lock_key = $1::text)
          AND ($2::timestamptz IS NULL OR window_start >= $2::timestamptz)
          AND ($3::timestamptz IS NULL OR window_start < $3::timestamptz)) u
    ORDER BY window_start DESC, lock_key
    LIMIT $4::int)
SELECT d.lock_key, d.window_start, d.job_index, d.cluster, d.job, d.pod, d.action, d.reason, d.token, d.decided_at, now()
FROM picked p
JOIN LATERAL (SELECT * FROM dislock.decisions
              WHERE lock_key = p.lock_key AND window_start = p.window_start
              ORDER BY job_index, decided_at
              LIMIT $5::int) d ON true
ORDER BY p.window_start DESC, p.lock_key, d.job_index, d.decided_at`
