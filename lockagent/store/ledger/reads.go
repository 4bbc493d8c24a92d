package ledger

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/db"
)

// DecisionFilter selects ledger rows. Zero fields do not filter.
type DecisionFilter struct {
	Key string
	// Window selects the decisions of one window start.
	Window time.Time
	// From and To bound the window start (decision time for rows without a
	// window): From <= t < To.
	From, To time.Time
	// Limit bounds the rows returned, newest first; 0 means store.DefaultListLimit.
	Limit int
}

// ListDecisions returns ledger rows, newest window (or decision) first and,
// within a window, in the order they were decided; and the database time.
func ListDecisions(ctx context.Context, s *store.Store, f DecisionFilter) ([]store.Decision, time.Time, error) {
	return db.List(ctx, s.Handle(), "listing decisions", scanDecision, qListDecisions,
		f.Key, db.NullTime(f.Window), db.NullTime(f.From), db.NullTime(f.To), limitOr(f.Limit))
}

func scanDecision(row pgx.Row, d *store.Decision, extra ...any) error {
	var problems []string
	var window *time.Time
	var action string
	err := row.Scan(append([]any{&d.Key, &db.FiniteTime{Column: "window_start", Nullable: &window, Problems: &problems},
		&d.Index, &d.Cluster, &d.Job, &d.Pod, &action, &d.Reason, &d.Token,
		&db.FiniteTime{Column: "decided_at", T: &d.At, Problems: &problems}}, extra...)...)
	if err != nil {
		return err
	}
	d.Action = store.Action(action)
	if window != nil {
		d.Window = *window
	}
	if len(problems) > 0 {
		return &db.UnreadableRow{Table: "decisions", Key: d.Key, Problems: problems}
	}
	return nil
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
func ListWindowDecisions(ctx context.Context, s *store.Store, f store.WindowFilter) ([]store.Decision, time.Time, error) {
	h := s.Handle()
	if err := f.Validate(); err != nil {
		return nil, time.Time{}, err
	}
	return db.List(ctx, h, "listing the decisions of windows", scanDecision, qListWindowDecisions,
		f.Key, db.NullTime(f.From), db.NullTime(f.To), limitOr(f.Limit), MaxDecisionsPerWindow, f.Namespace)
}

// qListWindowDecisions picks the $4 newest (key, window) pairs of key $1
// (” for all) of namespace $6 (” for all) within [$2, $3) from the owners' rows and the ledger, and
// returns at most $5 decisions of each. A window whose owner's row has no
// decision is picked but has no row here: the caller has its owner's row.
const qListWindowDecisions = `
WITH picked AS (
    SELECT lock_key, window_start FROM (
        SELECT lock_key, window_start FROM dislock.windows
        WHERE ($1::text = '' OR lock_key = $1::text)
          AND ($6::text = '' OR starts_with(lock_key, $6::text || '/'))
          AND ($2::timestamptz IS NULL OR window_start >= $2::timestamptz)
          AND ($3::timestamptz IS NULL OR window_start < $3::timestamptz)
        UNION
        SELECT lock_key, window_start FROM dislock.decisions
        WHERE window_start IS NOT NULL
          AND ($1::text = '' OR lock_key = $1::text)
          AND ($6::text = '' OR starts_with(lock_key, $6::text || '/'))
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

// limitOr is a listing's limit: n, or store.DefaultListLimit for none.
func limitOr(n int) int {
	if n <= 0 {
		return store.DefaultListLimit
	}
	return n
}
