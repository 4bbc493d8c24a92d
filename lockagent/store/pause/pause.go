// Package pause pauses and resumes keys everywhere: the owner's side of
// migration 16. A paused key starts no run in any cluster (its pods skip,
// saying who paused it, until when and why); a run already going is not
// stopped. Pauses are kept as history, so that a window that started
// paused is never reported missed. Only the owner role writes them (the
// webhook on a user's authorised request, `dislock pause` with the owner's
// URL); the agents read them through the calls that would start a run.
package pause

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/db"
)

// Pause is one pause of a key; times are database times in UTC.
type Pause struct {
	Key      string    `json:"key"`
	PausedAt time.Time `json:"pausedAt"`
	PausedBy string    `json:"pausedBy"`
	Reason   string    `json:"reason,omitempty"`
	// Until is when it ends by itself; nil: when resumed.
	Until *time.Time `json:"until,omitempty"`
	// ResumedAt and ResumedBy: when it ended early and who ended it (nil
	// and "" while it holds; ResumedBy is "" for a pause that ended at its
	// Until and was closed afterwards).
	ResumedAt *time.Time `json:"resumedAt,omitempty"`
	ResumedBy string     `json:"resumedBy,omitempty"`
}

// Text spells the pause as the agents' skips do.
func (p Pause) Text() string { return store.PauseText(p.PausedBy, p.Reason, p.Until) }

// Limits of what a pause records: a reason is for people, and the author is
// a Kubernetes user name or an operator's.
const (
	MaxReasonBytes = 1024
	MaxByBytes     = 512
)

// MinFor is the shortest pause that ends by itself.
const MinFor = time.Second

// Request is a pause to set.
type Request struct {
	Key    string
	By     string
	Reason string
	// For is how long it holds from now (database time), or Until when it
	// ends; neither: until resumed.
	For   time.Duration
	Until *time.Time
}

// Validate names what is wrong with r.
func (r Request) Validate() error {
	var bad []string
	if ns, name, ok := strings.Cut(r.Key, "/"); !ok || ns == "" || name == "" || strings.ContainsAny(name, "/#") {
		bad = append(bad, fmt.Sprintf("key %q is not <namespace>/<name>", r.Key))
	}
	if r.By == "" || len(r.By) > MaxByBytes {
		bad = append(bad, fmt.Sprintf("who pauses must be named in 1 to %d bytes", MaxByBytes))
	}
	if len(r.Reason) > MaxReasonBytes {
		bad = append(bad, fmt.Sprintf("the reason has %d bytes, more than %d", len(r.Reason), MaxReasonBytes))
	}
	if r.For < 0 || r.For > 0 && r.For < MinFor {
		bad = append(bad, fmt.Sprintf("the duration %s is shorter than %s", r.For, MinFor))
	}
	if r.For != 0 && r.Until != nil {
		bad = append(bad, "give a duration or an end, not both")
	}
	if len(bad) > 0 {
		return fmt.Errorf("pause: %s", strings.Join(bad, "; "))
	}
	return nil
}

// A pause whose until passed stays open until the next pause or resume of
// its key; both close it first, at its until, so that the history says
// when it really ended.
const qCloseEnded = `UPDATE dislock.pauses SET resumed_at = until
WHERE lock_key = $1::text AND resumed_at IS NULL AND until <= now()`

// qPause opens a pause, or changes the open one (who, why, until) keeping
// when it began.
// An end not after now() is refused: no row.
const qPause = `INSERT INTO dislock.pauses AS p (lock_key, paused_at, paused_by, reason, until)
SELECT $1::text, now(), $2::text, $3::text, u.until
FROM (SELECT coalesce($5::timestamptz, CASE WHEN $4::bigint > 0 THEN now() + $4::bigint * interval '1 microsecond' END) AS until) u
WHERE u.until IS NULL OR u.until > now()
ON CONFLICT (lock_key) WHERE resumed_at IS NULL DO UPDATE SET
    paused_by = EXCLUDED.paused_by, reason = EXCLUDED.reason, until = EXCLUDED.until
RETURNING ` + columns

// qResume ends key's open pause now.
const qResume = `UPDATE dislock.pauses SET resumed_at = now(), resumed_by = $2::text
WHERE lock_key = $1::text AND resumed_at IS NULL AND (until IS NULL OR until > now())
RETURNING ` + columns

// qActive lists the pauses in force of keys with prefix $1 (” for all).
const qActive = `SELECT ` + columns + ` FROM dislock.pauses
WHERE resumed_at IS NULL AND (until IS NULL OR until > now()) AND starts_with(lock_key, $1::text)
ORDER BY lock_key`

// qOverlapping lists the pauses of keys $1 that held at any time in
// [$2, $3): missed-window detection leaves out the windows that started
// while one held.
const qOverlapping = `SELECT ` + columns + ` FROM dislock.pauses
WHERE lock_key = ANY($1::text[]) AND paused_at < $3::timestamptz
  AND coalesce(resumed_at, until, 'infinity') > $2::timestamptz
ORDER BY lock_key, paused_at`

const columns = `lock_key, paused_at, paused_by, reason, until, resumed_at, coalesce(resumed_by, ''), now()`

// Set pauses r.Key everywhere, or changes its pause in force (who, why,
// until) keeping when it began. It returns the pause in force.
func Set(ctx context.Context, s *store.Store, r Request) (Pause, error) {
	if err := r.Validate(); err != nil {
		return Pause{}, err
	}
	h := s.Handle()
	var p Pause
	err := pgx.BeginFunc(ctx, h.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qCloseEnded, r.Key); err != nil {
			return err
		}
		var err error
		var now time.Time
		p, _, err = scan(tx.QueryRow(ctx, qPause, r.Key, r.By, r.Reason, db.Micros(r.For), r.Until))
		if errors.Is(err, pgx.ErrNoRows) {
			if err := tx.QueryRow(ctx, db.QNow).Scan(&now); err != nil {
				return err
			}
			return fmt.Errorf("pause: the end %s is not after the database's now, %s", r.Until.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
		}
		return err
	})
	if err != nil {
		return Pause{}, h.Classify("pausing "+r.Key, err)
	}
	return p, nil
}

// Resume ends key's pause now. ok is false when none was in force.
func Resume(ctx context.Context, s *store.Store, key, by string) (p Pause, ok bool, err error) {
	if by == "" || len(by) > MaxByBytes {
		return Pause{}, false, fmt.Errorf("resume: who resumes must be named in 1 to %d bytes", MaxByBytes)
	}
	h := s.Handle()
	err = pgx.BeginFunc(ctx, h.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qCloseEnded, key); err != nil {
			return err
		}
		p, _, err = scan(tx.QueryRow(ctx, qResume, key, by))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // nothing in force; an ended pause was closed
		}
		ok = err == nil
		return err
	})
	if err != nil {
		return Pause{}, false, h.Classify("resuming "+key, err)
	}
	return p, ok, nil
}

// Active lists the pauses in force of the keys with prefix ("" for every
// key; "ns/" for a namespace's), and the database time they were read at.
func Active(ctx context.Context, s *store.Store, prefix string) ([]Pause, time.Time, error) {
	return list(ctx, s, "listing the pauses in force", qActive, prefix)
}

// Overlapping lists the pauses of keys that held at any time from from to
// to.
func Overlapping(ctx context.Context, q db.Querier, keys []string, from, to time.Time) ([]Pause, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, qOverlapping, keys, from, to)
	if err != nil {
		return nil, err
	}
	out, _, err := collect(rows)
	return out, err
}

func list(ctx context.Context, s *store.Store, op, query string, args ...any) ([]Pause, time.Time, error) {
	h := s.Handle()
	rows, err := h.Pool.Query(ctx, query, args...)
	if err != nil {
		return nil, time.Time{}, h.Classify(op, err)
	}
	out, now, err := collect(rows)
	if err != nil {
		return nil, time.Time{}, h.Classify(op, err)
	}
	if now.IsZero() {
		if err := h.Pool.QueryRow(ctx, db.QNow).Scan(&now); err != nil {
			return nil, time.Time{}, h.Classify("reading database time", err)
		}
	}
	return out, now.UTC(), nil
}

func collect(rows pgx.Rows) ([]Pause, time.Time, error) {
	defer rows.Close()
	var out []Pause
	var now time.Time
	for rows.Next() {
		p, at, err := scan(rows)
		if err != nil {
			return nil, time.Time{}, err
		}
		out, now = append(out, p), at
	}
	return out, now, rows.Err()
}

// Covers reports whether p held at t.
func (p Pause) Covers(t time.Time) bool {
	end := p.ResumedAt
	if end == nil {
		end = p.Until
	}
	return !t.Before(p.PausedAt) && (end == nil || t.Before(*end))
}

func scan(row pgx.Row) (Pause, time.Time, error) {
	var p Pause
	var now time.Time
	if err := row.Scan(&p.Key, &p.PausedAt, &p.PausedBy, &p.Reason, &p.Until, &p.ResumedAt, &p.ResumedBy, &now); err != nil {
		return Pause{}, time.Time{}, err
	}
	p.PausedAt = p.PausedAt.UTC()
	for _, t := range []**time.Time{&p.Until, &p.ResumedAt} {
		if *t != nil {
			u := (*t).UTC()
			*t = &u
		}
	}
	return p, now.UTC(), nil
}
