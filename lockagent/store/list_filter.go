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
	// Namespace keeps the keys of one namespace ("<namespace>/...").
	Namespace string
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
		f.Key, db.NullTime(f.From), db.NullTime(f.To), f.limit(), f.Namespace)
}

// qListWindowsIn is qListWindows bounded by window start ($2 <= start < $3,
// each NULL for no bound) and namespace ($5, ” for all).
const qListWindowsIn = `SELECT ` + windowColumns + `, now() FROM dislock.windows
WHERE ($1::text = '' OR lock_key = $1::text)
  AND ($5::text = '' OR starts_with(lock_key, $5::text || '/'))
  AND ($2::timestamptz IS NULL OR window_start >= $2::timestamptz)
  AND ($3::timestamptz IS NULL OR window_start < $3::timestamptz)
ORDER BY window_start DESC, lock_key, job_index
LIMIT $4::int`
