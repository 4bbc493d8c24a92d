package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store/internal/db"
)

// State is a window's lifecycle state.
type State string

const (
	StateRunning   State = "running"
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"
	StateSkipped   State = "skipped"
)

// Window is one row of dislock.windows; times are database times in UTC.
type Window struct {
	Key   string    `json:"key"`
	Start time.Time `json:"window"`
	// Index is the completion index of an Indexed Job, NotIndexed otherwise.
	Index      int        `json:"index"`
	Owner      string     `json:"owner"`
	Cluster    string     `json:"cluster"`
	Pod        string     `json:"pod"`
	Token      int64      `json:"token"`
	State      State      `json:"state"`
	ClaimedAt  time.Time  `json:"claimedAt"`
	AliveUntil time.Time  `json:"aliveUntil"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	ExitCode   *int       `json:"exitCode,omitempty"`
}

// NotIndexed is the index of a window of a Job that is not Indexed.
const NotIndexed = -1

// ClaimOutcome says how a successful claim came about.
type ClaimOutcome string

const (
	Claimed   ClaimOutcome = "claimed"   // first claimer of the window
	Reentered ClaimOutcome = "reentered" // the same pod again (a restarted sidecar): same token
	TookOver  ClaimOutcome = "took-over" // took a failed or lapsed owner's window: new token
)

// ClaimRequest asks for one window of one key.
type ClaimRequest struct {
	Key    string
	Window time.Time
	// Index is the completion index of an Indexed Job's pod (each index is
	// its own window), NotIndexed otherwise.
	Index int
	Owner Owner
	// TTL is how long the claim stays alive without a heartbeat.
	TTL time.Duration
	// Standby allows taking over another Job's window whose owner failed or
	// whose liveness lapsed at database time. Another pod of the caller's own
	// Job may always do so.
	Standby bool
	// View, when set, is recorded in the same call as the claimer's
	// cluster's view of the key (written again only when it changed or is
	// ViewRefresh old), and Claim.Others gets the other clusters' views
	// seen within DefaultViewRecency that differ from it.
	View *View
	// MaxLate, when positive, refuses a window that started longer ago than
	// that by the database's clock, before anything is read or written:
	// ErrWindowStale, with Claim.DBTime set.
	MaxLate time.Duration
}

// Validate lists every problem with the request.
func (r ClaimRequest) Validate() error {
	var errs []error
	if r.Key == "" {
		errs = append(errs, errors.New("key is empty"))
	}
	if r.Window.IsZero() {
		errs = append(errs, errors.New("window is zero (manual runs take no window)"))
	}
	if r.Index < NotIndexed {
		errs = append(errs, fmt.Errorf("index %d is not a completion index", r.Index))
	}
	if r.TTL <= 0 {
		errs = append(errs, fmt.Errorf("ttl %s is not positive", r.TTL))
	}
	return errors.Join(r.Owner.Validate(), errors.Join(errs...))
}

// Claim is the result of ClaimWindow. On ErrWindowTaken, Window is the
// current owner's row and Outcome is empty.
type Claim struct {
	Window  Window
	Outcome ClaimOutcome
	// DBTime is now() of the statement that decided.
	DBTime time.Time
	// Others are the other clusters' recent views that differ from the
	// request's View (none when it had none).
	Others []ClusterView
	// Waited is how long the call waited after it was sent before it
	// started on the database, as far as its path can tell: a lock
	// gateway's queue (lockagent/gateway/client sets it from the
	// gateway's answer); 0 straight to the database. The grant runs from
	// no earlier than that start, so the holder's safety deadline may
	// count from it.
	Waited time.Duration `json:"-"`
}

// ViewRefresh is how old a cluster's unchanged view may grow before a claim
// writes it again: far below every reader's recency (DefaultViewRecency,
// and retention), so that the top of the hour's claims read the views
// without writing them.
const ViewRefresh = 6 * time.Hour

// ClaimWindow takes the window for the caller, re-enters the caller pod's own
// running claim, or takes over a failed or lapsed owner's claim when the
// caller is another pod of the same Job or a standby. Anything else is
// ErrWindowTaken with the owner's row in the result: the caller decides from
// it whether to wait or skip (see Waits).
func (s *Store) ClaimWindow(ctx context.Context, r ClaimRequest) (Claim, error) {
	if err := r.Validate(); err != nil {
		return Claim{}, fmt.Errorf("claim request: %w", err)
	}
	start := r.Window.UTC()
	var view *string
	if r.View != nil {
		b, err := json.Marshal(r.View)
		if err != nil {
			return Claim{}, fmt.Errorf("claim request: view: %w", err)
		}
		v := string(b)
		view = &v
	}
	var maxLate *int64
	if r.MaxLate > 0 {
		us := db.Micros(r.MaxLate)
		maxLate = &us
	}
	var c Claim
	var outcome string
	var clusters, views []string
	var seen []time.Time
	var pause pauseColumns
	args := []any{r.Key, start, r.Index, r.Owner.String(), r.Owner.Cluster, r.Owner.Pod, db.Micros(r.TTL),
		r.Owner.JobPrefix(), r.Standby, view, db.Micros(DefaultViewRecency), db.Micros(ViewRefresh), maxLate}
	claim := func(query string, dest ...any) error {
		return s.writeRowActing(ctx, func(row pgx.Row) error {
			return scanWindow(row, &c.Window, append([]any{&outcome, &c.DBTime, &clusters, &views, &seen}, dest...)...)
		}, func() bool { return claims(outcome) }, query, args...)
	}
	// The newest statement the database knows, probing again after
	// probeInterval for what it lacked: an undefined function is refused
	// before anything runs, so the next statement may try.
	var err error
	sent := false
	if !s.noGuardedCalls.now() {
		err = claim(qClaimGuarded, &pause.by, &pause.reason, &pause.until)
		if sent = !undefinedFunction(err, "dislock.claim_guarded("); !sent {
			s.noGuardedCalls.found() // not migrated to schema 20 yet
		}
	}
	if !sent && !s.noPauses.now() {
		err = claim(qClaimWindow, &pause.by, &pause.reason, &pause.until)
		if sent = !beforePauses(err); !sent {
			s.noPauses.found() // not migrated to schema 16 yet: no pause to hear of
		}
	}
	if !sent {
		err = claim(qClaimWindowSchema15)
	}
	if err != nil {
		return Claim{}, s.classify(fmt.Sprintf("claiming window %s of %s", formatWindow(start), r.Key), err)
	}
	c.Others = s.otherViews("reading the other clusters' views of "+r.Key, r.Key, clusters, views, seen)
	switch {
	case claims(outcome):
		c.Outcome = ClaimOutcome(outcome)
		return c, nil
	case outcome == "refused":
		return c, windowTaken(start, r.Key, c.Window)
	case outcome == "paused":
		c.Window = Window{}
		return c, fmt.Errorf("window %s of %s: %w", formatWindow(start), r.Key, pause.err())
	case outcome == "stale":
		c.Window = Window{}
		return c, fmt.Errorf("window %s of %s started %s ago by database time: %w", formatWindow(start), r.Key,
			c.DBTime.Sub(start).Round(time.Second), ErrWindowStale)
	}
	return Claim{}, fmt.Errorf("claiming window %s of %s: the database answered %q, which this dislock does not know", formatWindow(start), r.Key, outcome)
}

// claims tells the outcomes of dislock.claim_window that hold the row.
func claims(outcome string) bool {
	switch ClaimOutcome(outcome) {
	case Claimed, Reentered, TookOver:
		return true
	}
	return false
}

// windowTaken is the refusal of a claim on window start of key, which owner
// holds.
func windowTaken(start time.Time, key string, owner Window) error {
	return fmt.Errorf("window %s of %s: %w by %s (%s)", formatWindow(start), key, ErrWindowTaken, owner.Owner, owner.State)
}

// Heartbeat extends the liveness of the caller's running claim and returns
// the new alive_until. ErrWindowLost when the claim is no longer the caller's.
func (s *Store) Heartbeat(ctx context.Context, key string, window time.Time, index int, token int64, ttl time.Duration) (aliveUntil, dbTime time.Time, err error) {
	r, err := s.Renew(ctx, Renewal{Key: key, Window: window, Index: index, WindowToken: token, TTL: ttl})
	return r.WindowUntil, r.DBTime, err
}

// Finish records the outcome of the caller's claim (succeeded, failed or
// skipped) at database time. Recording the same outcome twice succeeds.
func (s *Store) Finish(ctx context.Context, key string, window time.Time, index int, token int64, state State, exitCode *int) (finishedAt time.Time, err error) {
	if state == StateRunning || state == "" {
		return time.Time{}, fmt.Errorf("finishing window %s of %s: state %q is not an outcome", formatWindow(window), key, state)
	}
	err = s.writeRow(ctx, func(row pgx.Row) error { return row.Scan(&finishedAt) },
		qFinishWindow, key, window.UTC(), index, token, string(state), exitCode)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, fmt.Errorf("finishing window %s of %s token %d: %w", formatWindow(window), key, token, ErrWindowLost)
	}
	if err != nil {
		return time.Time{}, s.classify(fmt.Sprintf("finishing window %s of %s", formatWindow(window), key), err)
	}
	return finishedAt.UTC(), nil
}

// GetWindow reads one window (index: NotIndexed, or a completion index);
// ErrNotFound when there is none.
func (s *Store) GetWindow(ctx context.Context, key string, window time.Time, index int) (Window, error) {
	w, _, err := s.WindowAt(ctx, key, window, index)
	return w, err
}

// WindowAt is GetWindow with the database time of the read, so that a
// waiting caller can tell whether the owner is still alive without trying
// to claim (a claim attempt draws a token and locks the row).
func (s *Store) WindowAt(ctx context.Context, key string, window time.Time, index int) (Window, time.Time, error) {
	var w Window
	var dbTime time.Time
	err := scanWindow(s.h.Pool.QueryRow(ctx, qGetWindow, key, window.UTC(), index), &w, &dbTime)
	if errors.Is(err, pgx.ErrNoRows) {
		return Window{}, time.Time{}, fmt.Errorf("window %s of %s: %w", formatWindow(window), key, ErrNotFound)
	}
	return w, dbTime, s.classify("reading window", err)
}

// ListWindows returns the newest windows first, of one key or (key "") all,
// with the database time.
func (s *Store) ListWindows(ctx context.Context, key string, limit int) ([]Window, time.Time, error) {
	return db.List(ctx, &s.h, "listing windows", scanWindow, qListWindows, key, limit)
}

// DeleteWindow removes one window (every completion index of it) so that it can be claimed again (an
// operator's decision to re-run it). ErrNotFound when there was none.
func (s *Store) DeleteWindow(ctx context.Context, key string, window time.Time) error {
	tag, err := s.h.Pool.Exec(ctx, qDeleteWindow, key, window.UTC())
	if err != nil {
		return s.classify("deleting window", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("window %s of %s: %w", formatWindow(window), key, ErrNotFound)
	}
	return nil
}

// Retention of old windows (the owner runs it: ledger.DeleteOldWindows).
const (
	// DefaultRetention is how long finished windows are kept.
	DefaultRetention = 30 * 24 * time.Hour
	// MinRetention is the shortest retention the webhook accepts: deleting
	// a window's record lets a late pod of that window claim and run it
	// again, so records must outlive every pod that could still ask.
	MinRetention = 48 * time.Hour
	// MaxClaimAge is how old (by database time) a window may be and still
	// be claimed: agents skip older windows as stale, so a window is never
	// claimed after a retention of at least MinRetention could have deleted
	// it. It is above the longest catchup (24h).
	MaxClaimAge = MinRetention - time.Hour
)

// scanWindow reads a row of windowColumns and then extra; a row holding a
// time no time.Time can hold is an *db.UnreadableRow.
func scanWindow(row pgx.Row, w *Window, extra ...any) error {
	var state string
	var problems []string
	dest := append([]any{&w.Key, &db.FiniteTime{Column: "window_start", T: &w.Start, Problems: &problems},
		&w.Index, &w.Owner, &w.Cluster, &w.Pod, &w.Token, &state,
		&db.FiniteTime{Column: "claimed_at", T: &w.ClaimedAt, Problems: &problems},
		&db.FiniteTime{Column: "alive_until", T: &w.AliveUntil, Problems: &problems},
		&db.FiniteTime{Column: "finished_at", Nullable: &w.FinishedAt, Problems: &problems},
		&w.ExitCode}, extra...)
	if err := row.Scan(dest...); err != nil {
		return err
	}
	w.State = State(state)
	db.UTC(extra)
	if len(problems) > 0 {
		return &db.UnreadableRow{Table: "windows", Key: w.Key, Problems: problems}
	}
	return nil
}

func formatWindow(t time.Time) string { return t.UTC().Format(time.RFC3339) }
