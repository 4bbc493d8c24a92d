package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/pause"
)

// A pause is judged by the database's promise, never by the harness's
// clock: no claim or lease grant whose check saw the pause in force starts
// a run. The check is a statement inside the grant's transaction, which
// sees what committed before its snapshot, and the snapshot lies between
// the transaction's start (now(), which the grant keeps as claimed_at or
// acquired_at) and the drawing of its fencing token (next_token(), which
// follows the check). So a grant is inside a pause, as far as anything is
// proven, when
//
//   - its transaction began after the pause committed: its grant time is
//     later than the database time read in a new statement once Set
//     returned (PauseFlip.After);
//   - its check ran before the flip that ended the pause committed: its
//     token is at most the token high water read, with the database time,
//     in a new statement before that flip was sent (PauseFlip.Before,
//     BeforeHighWater); the grant time alone does not prove it, since a
//     transaction that began before that read may take its snapshot after
//     the flip committed;
//   - the pause's until had not passed at its grant time, which is the
//     now() the check compared the until with.
//
// A re-entry (the same pod's running claim or live lease, its sidecar
// restarted) keeps its token and grant time: it is no new grant, and the
// grant log (grantLogSQL) does not record it.

// PauseFlip is one call of the owner's on the schedule's key, and what the
// runner read around it.
type PauseFlip struct {
	// Resume: pause.Resume; else pause.Set with For (0: until resumed).
	Resume bool
	For    time.Duration
	// Sent is when the first try was sent, by the harness's clock.
	Sent time.Time
	// Before and BeforeHighWater are the database time and the fencing
	// tokens' high water, read in one statement before the first try was
	// sent (zero: never read).
	Before          time.Time
	BeforeHighWater int64
	// Done: a try returned without error. Err is the last try's error
	// otherwise. FailedTries counts the tries that returned an error: each
	// may have committed, even long after.
	Done        bool
	Err         string
	FailedTries int
	// After (Set only) is the database time read in a new statement once
	// Set returned (zero: never read); Until is the pause's until as Set
	// returned it (nil: until resumed).
	After time.Time
	Until *time.Time
}

func (f PauseFlip) String() string {
	var b strings.Builder
	if f.Resume {
		b.WriteString("resume")
	} else {
		b.WriteString("pause")
		if f.For > 0 {
			fmt.Fprintf(&b, " for %s", f.For.Round(time.Millisecond))
		}
	}
	fmt.Fprintf(&b, " sent %s, before it: database time %s, token high water %d", f.Sent.Format("15:04:05.000"), dbTime(f.Before), f.BeforeHighWater)
	if f.FailedTries > 0 {
		fmt.Fprintf(&b, "; %d tries failed, the last: %s", f.FailedTries, f.Err)
	}
	switch {
	case !f.Done:
		b.WriteString("; not done")
	case !f.Resume:
		fmt.Fprintf(&b, "; after it returned: database time %s", dbTime(f.After))
		if f.Until != nil {
			fmt.Fprintf(&b, ", until %s", dbTime(*f.Until))
		}
	}
	return b.String()
}

func dbTime(t time.Time) string {
	if t.IsZero() {
		return "unread"
	}
	return t.UTC().Format("15:04:05.000000")
}

// PausedSpan is a time the key was surely paused (see the top of this
// file): from after From until whichever comes first of Until, the flip
// that followed (its Before time, and its token high water BeforeHighWater
// for the grant's token), or for ever.
type PausedSpan struct {
	From            time.Time
	Until           *time.Time
	Next            bool // a flip followed: Before and BeforeHighWater bound the span
	Before          time.Time
	BeforeHighWater int64
}

// holds reports whether a grant at grantedAt with token was checked while
// the span's pause held.
func (s PausedSpan) holds(grantedAt time.Time, token int64) bool {
	switch {
	case !grantedAt.After(s.From):
		return false
	case s.Until != nil && !grantedAt.Before(*s.Until):
		return false
	case s.Next && (!grantedAt.Before(s.Before) || token > s.BeforeHighWater):
		return false
	}
	return true
}

func (s PausedSpan) String() string {
	b := fmt.Sprintf("paused from %s (read after Set returned)", dbTime(s.From))
	if s.Until != nil {
		b += fmt.Sprintf(" until %s", dbTime(*s.Until))
	}
	if s.Next {
		b += fmt.Sprintf(" to the next flip (before it: %s, token high water %d)", dbTime(s.Before), s.BeforeHighWater)
	}
	return b
}

// PausedSpans are the spans flips prove the key paused: one per Set that
// returned and was followed by a read of the database time. A span ends at
// the next flip whatever it was (a Set again may shorten the pause); a
// flip whose Before was never read ends no span soundly, so the span
// before it is left out. A try of a Set for a while that failed may have
// committed, at any later time, an until as early as its flip's Before +
// For: the spans from its flip on end there.
func PausedSpans(flips []PauseFlip) []PausedSpan {
	var spans []PausedSpan
spans:
	for i, f := range flips {
		if f.Resume || !f.Done || f.After.IsZero() {
			continue
		}
		s := PausedSpan{From: f.After, Until: f.Until}
		for _, g := range flips[:i+1] {
			if g.Resume || g.For <= 0 || g.FailedTries == 0 {
				continue
			}
			if g.Before.IsZero() {
				continue spans
			}
			if end := g.Before.Add(g.For); s.Until == nil || end.Before(*s.Until) {
				s.Until = &end
			}
		}
		if i+1 < len(flips) {
			next := flips[i+1]
			if next.Before.IsZero() {
				continue
			}
			s.Next, s.Before, s.BeforeHighWater = true, next.Before, next.BeforeHighWater
		}
		spans = append(spans, s)
	}
	return spans
}

// Grant is one grant of the schedule's key: a window claimed or taken over
// (Window is its unit's key in WindowStates) or a lease acquired (Lease;
// Key is the lease's key), with its fencing token and grant time by the
// database's clock.
type Grant struct {
	Lease     bool
	Key       string
	Window    string
	Owner     string
	Token     int64
	GrantedAt time.Time
}

func (g Grant) String() string {
	what := "window " + g.Window
	if g.Lease {
		what = "lease " + g.Key
	}
	return fmt.Sprintf("%s granted to %s with token %d at %s", what, g.Owner, g.Token, dbTime(g.GrantedAt))
}

// grantLogSQL records every grant of a window or a lease in
// chaos_audit.grants, the herds' keys left out: a window's row and a
// lease's keep only their last grant, and a grant made while the key was
// paused may have been taken over since. A re-entry (token and grant time
// kept) is no grant. The triggers run as the schema's owner, whoever
// claims.
const grantLogSQL = `
CREATE SCHEMA IF NOT EXISTS chaos_audit;
CREATE TABLE IF NOT EXISTS chaos_audit.grants (
    lock_key     text        NOT NULL,
    window_start timestamptz,
    job_index    int,
    owner        text        NOT NULL,
    token        bigint      NOT NULL,
    granted_at   timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS grants_key ON chaos_audit.grants (lock_key);
CREATE OR REPLACE FUNCTION chaos_audit.window_granted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF position('-herd-' in NEW.lock_key) = 0 AND (TG_OP = 'INSERT' OR OLD.token IS DISTINCT FROM NEW.token
                                                   OR OLD.claimed_at IS DISTINCT FROM NEW.claimed_at) THEN
        INSERT INTO chaos_audit.grants VALUES (NEW.lock_key, NEW.window_start, NEW.job_index, NEW.owner, NEW.token, NEW.claimed_at);
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION chaos_audit.lease_granted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF position('-herd-' in NEW.lock_key) = 0 AND (TG_OP = 'INSERT' OR OLD.token IS DISTINCT FROM NEW.token
                                                   OR OLD.acquired_at IS DISTINCT FROM NEW.acquired_at) THEN
        INSERT INTO chaos_audit.grants VALUES (NEW.lock_key, NULL, NULL, NEW.owner, NEW.token, NEW.acquired_at);
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS chaos_window_granted ON dislock.windows;
CREATE TRIGGER chaos_window_granted AFTER INSERT OR UPDATE OF token, claimed_at ON dislock.windows
    FOR EACH ROW EXECUTE FUNCTION chaos_audit.window_granted();
DROP TRIGGER IF EXISTS chaos_lease_granted ON dislock.leases;
CREATE TRIGGER chaos_lease_granted AFTER INSERT OR UPDATE OF token, acquired_at ON dislock.leases
    FOR EACH ROW EXECUTE FUNCTION chaos_audit.lease_granted();
`

// InstallGrantLog installs the grant log in the database at dsn (the
// schema's owner's).
func InstallGrantLog(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, grantLogSQL); err != nil {
		return fmt.Errorf("installing the grant log: %w", err)
	}
	return nil
}

// readGrants reads the key's grants from the grant log.
func readGrants(ctx context.Context, conn *pgx.Conn, key string) ([]Grant, error) {
	rows, err := conn.Query(ctx, `SELECT lock_key, window_start, coalesce(job_index, -1), owner, token, granted_at
		FROM chaos_audit.grants WHERE lock_key = $1 OR starts_with(lock_key, $1 || '#') ORDER BY granted_at, token`, key)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Grant, error) {
		var g Grant
		var window *time.Time
		var index int
		if err := row.Scan(&g.Key, &window, &index, &g.Owner, &g.Token, &g.GrantedAt); err != nil {
			return g, err
		}
		if window == nil {
			g.Lease = true
		} else {
			g.Window = unitKey(window.UTC().Format(time.RFC3339), index)
		}
		return g, nil
	})
}

// leaseGrant is a lease row's last grant, from its JSON.
func leaseGrant(line string) (Grant, bool) {
	var l struct {
		LockKey    string    `json:"lock_key"`
		Owner      string    `json:"owner"`
		Token      int64     `json:"token"`
		AcquiredAt time.Time `json:"acquired_at"`
	}
	if json.Unmarshal([]byte(line), &l) != nil || l.Token == 0 {
		return Grant{}, false
	}
	return Grant{Lease: true, Key: l.LockKey, Owner: l.Owner, Token: l.Token, GrantedAt: l.AcquiredAt}, true
}

// pauseBy is who pauses the schedules' keys.
const pauseBy = "chaos-owner"

// pauseKey carries out a PauseKey fault: pause the key at once, again at
// Again, and resume it at For (or let it end by itself there), recording
// every flip's bracket.
func (r *run) pauseKey(f Fault) {
	s := r.w.Settings
	ctx, cancel := context.WithTimeout(context.Background(), f.For+4*s.TTL+time.Minute)
	defer cancel()
	st, err := store.Open(ctx, r.w.PG.DirectDSN(), store.Options{MaxConns: 2})
	if err != nil {
		r.missed(f, "opening the owner's store: "+err.Error())
		return
	}
	defer st.Close()
	o := &ownerConn{dsn: r.w.PG.DirectDSN()}
	defer o.close()

	first := setRequest(f, f.For, 0)
	r.fault(f.Kind, "", "", "the owner pauses %s everywhere (%s)", r.key, first)
	r.flip(ctx, st, o, first)
	if f.Again > 0 {
		r.sleepUntil(f.At + f.Again)
		again := setRequest(f, f.For-f.Again, 1)
		r.event(Event{Kind: "pause-key-again", Detail: "the owner pauses " + r.key + " again while it is paused (" + again.String() + ")"})
		r.flip(ctx, st, o, again)
	}
	r.sleepUntil(f.At + f.For)
	if f.Variant == PauseFor {
		r.event(Event{Kind: "pause-key-ended", Detail: "the pause of " + r.key + " ends by itself about now"})
		return
	}
	r.event(Event{Kind: "pause-key-resume", Detail: "the owner resumes " + r.key})
	r.flip(ctx, st, o, flipRequest{resume: true})
}

// flipRequest is one flip to make.
type flipRequest struct {
	resume bool
	req    pause.Request
}

func (q flipRequest) String() string {
	if q.resume {
		return "resume"
	}
	if q.req.For > 0 {
		return "for " + q.req.For.Round(time.Millisecond).String()
	}
	return "until resumed"
}

// setRequest is the n-th Set of PauseKey fault f, holding for forLeft
// when its variant ends by itself.
func setRequest(f Fault, forLeft time.Duration, n int) flipRequest {
	q := flipRequest{req: pause.Request{By: pauseBy, Reason: fmt.Sprintf("fault schedule, set %d", n+1)}}
	if f.Variant == PauseFor {
		q.req.For = max(forLeft, time.Millisecond)
	}
	return q
}

func (r *run) sleepUntil(offset time.Duration) {
	time.Sleep(time.Until(r.start.Add(offset)))
}

// flipTries bounds how long one flip is retried while the database is
// unavailable (another fault, or another schedule, restarted it).
const flipTries = 20 * time.Second

// flip makes one flip and records it with its bracket.
func (r *run) flip(ctx context.Context, st *store.Store, o *ownerConn, q flipRequest) {
	f := PauseFlip{Resume: q.resume, For: q.req.For}
	q.req.Key = r.key
	for limit := time.Now().Add(flipTries); time.Now().Before(limit) && ctx.Err() == nil; {
		var err error
		if f.Before, f.BeforeHighWater, err = o.read(ctx); err == nil {
			break
		}
		f.Before = time.Time{}
		time.Sleep(100 * time.Millisecond)
	}
	f.Sent = time.Now()
	for limit := time.Now().Add(flipTries); time.Now().Before(limit) && ctx.Err() == nil; {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var err error
		if q.resume {
			_, _, err = pause.Resume(callCtx, st, r.key, pauseBy)
		} else {
			var p pause.Pause
			if p, err = pause.Set(callCtx, st, q.req); err == nil {
				f.Until = p.Until
			}
		}
		cancel()
		if err == nil {
			f.Done, f.Err = true, ""
			break
		}
		f.Err = err.Error()
		f.FailedTries++
		time.Sleep(100 * time.Millisecond)
	}
	if f.Done && !q.resume {
		for limit := time.Now().Add(flipTries); time.Now().Before(limit) && ctx.Err() == nil; {
			var err error
			if f.After, _, err = o.read(ctx); err == nil {
				break
			}
			f.After = time.Time{}
			time.Sleep(100 * time.Millisecond)
		}
	}
	r.mu.Lock()
	r.flips = append(r.flips, f)
	r.mu.Unlock()
	kind := "pause-key-flipped"
	if !f.Done {
		kind = "error"
	}
	r.event(Event{Kind: kind, Detail: f.String()})
}

// ownerConn reads the database's time and the tokens' high water, each
// read a statement of its own, reconnecting after an error.
type ownerConn struct {
	dsn  string
	conn *pgx.Conn
}

func (o *ownerConn) read(ctx context.Context) (time.Time, int64, error) {
	if o.conn == nil {
		connCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := pgx.Connect(connCtx, o.dsn)
		cancel()
		if err != nil {
			return time.Time{}, 0, err
		}
		o.conn = c
	}
	readCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var now time.Time
	var high int64
	err := o.conn.QueryRow(readCtx, `SELECT now(), dislock.token_high_water()`).Scan(&now, &high)
	if err != nil {
		o.close()
		return time.Time{}, 0, err
	}
	return now.UTC(), high, nil
}

func (o *ownerConn) close() {
	if o.conn != nil {
		o.conn.Close(context.Background())
		o.conn = nil
	}
}
