package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/db"
	"github.com/dislock/dislock/lockagent/store/pause"
	"github.com/dislock/dislock/lockagent/window"
)

// A window is missed when it has no successful run by its start plus a
// grace: no cluster ran it (every pod skipped, died, or was never created),
// or its run failed or went silent and nobody took it over. A window of a
// key is judged once its grace is over, at database time, and never again:
// a missed window stays counted. A window whose run is still alive is
// judged later.
//
// Each key has a checkpoint, the newest window judged, and every window
// after it is judged in order: nothing moves the checkpoint over a window
// that was not judged. Neither the ledger nor the views are trusted to say
// which windows to leave out, since both are best-effort (a herd or a slow
// database drops ledger writes, and a view's changed_at moves on any edit
// and with every cluster that joins). Only these leave windows out:
//
//   - history before dislock: a key never judged is judged from the window
//     of its first sign of life (its first decision or its first claimed
//     window, whichever is older);
//   - the Lookback: no window older than it is judged, however far back the
//     checkpoint is;
//   - a schedule (or time zone) change: the windows before the new
//     schedule's first one are judged with the schedule the checkpoint was
//     judged with (recorded beside it, checked_with), those from it on with
//     the new one, so that no tick of the new schedule from before it is;
//   - a pause: a window that started while its key was paused everywhere
//     (lockagent/store/pause) and that nobody claimed was skipped on
//     purpose, and is judged as not missed; one that was claimed (a run
//     going when the pause began) is judged by its rows.
//
// A key with no claimed window and no decision for SilentPeriods periods
// plus the grace is silent: its CronJob was deleted or suspended
// everywhere, or lost its opt-in, or every cluster's pods are failing
// before their claim, or the database was down; the windows table cannot
// tell these apart. A silent key's windows wait, its checkpoint where it
// was: when any pod claims (or decides) again, the windows since the
// checkpoint, at most a Lookback back, are judged, so that an outage is
// reported in full once it ends. A CronJob removed or suspended and back
// within the Lookback therefore has the windows in between reported; its
// first windows after it went quiet may be reported before it turns silent.

// Kinds of missed windows.
const (
	MissedNoRun  = "no-run" // nobody ran it: every cluster skipped or erred, or no pod decided
	MissedFailed = "failed" // its run failed and nobody took it over in time
	MissedSilent = "silent" // its run's owner stopped heartbeating and nobody took it over in time
)

// MissedWindow is a window the detection found missed.
type MissedWindow struct {
	Key        string    `json:"key"`
	Window     time.Time `json:"window"`
	Kind       string    `json:"kind"`
	Reason     string    `json:"reason"`
	DetectedAt time.Time `json:"detectedAt"`
}

// SilentKey is a key with no sign of life for several periods.
type SilentKey struct {
	Key string `json:"key"`
	// LastDecided is the key's last sign of life: its newest claimed
	// window or its newest decision, whichever is later.
	LastDecided  time.Time     `json:"lastDecided"`
	Period       time.Duration `json:"period"`
	ExpectedNext time.Time     `json:"expectedNext"`
}

// MissedOptions bound the detection.
type MissedOptions struct {
	// Lookback is how far back windows are judged: those of a key never
	// judged before (it starts no earlier than the key's first decision or
	// window either), and those of a key back from silence.
	Lookback time.Duration
	// SilentPeriods is how many periods without any claimed window or
	// decision make a key silent.
	SilentPeriods int
	// MaxWindowsPerKey bounds the windows judged per key and run, and
	// MaxWindowsPerNamespace those of all keys of a namespace; the rest wait
	// for the next run.
	MaxWindowsPerKey       int
	MaxWindowsPerNamespace int
	// Now, when set and before the database's time, is the time the
	// windows are judged at: tests replay a history with it. Zero: the
	// database's time.
	Now time.Time
	// Namespace, when set, limits the detection to that namespace's keys.
	Namespace string
}

// Defaults of MissedOptions.
const (
	DefaultMissedLookback   = 24 * time.Hour
	DefaultSilentPeriods    = 3
	DefaultMaxWindowsPerKey = 1500
	// DefaultMaxWindowsPerNamespace lets a namespace of 1000 per-minute
	// CronJobs be judged as fast as it runs (about 500 windows a run every
	// 30 s) and a fresh one catch up on a day in a few minutes.
	DefaultMaxWindowsPerNamespace = 5000
	// MaxDefaultMissedGrace caps the default grace: a longer one is set
	// with dislock.io/missed-after.
	MaxDefaultMissedGrace    = time.Hour
	missedDecisionsPerWindow = 16
)

// Each of the detection's statements waits at most missedLockTimeout for a
// lock (its write takes none a tenant can hold, see qRecordMissed; its reads
// take none) and runs at most missedStatementTimeout, within the leader's
// 30 s interval, however many rows a tenant wrote.
const (
	missedLockTimeout      = 2 * time.Second
	missedStatementTimeout = 20 * time.Second
)

// missedBounds are qStatementBounds' arguments for the detection.
func missedBounds() []any {
	return []any{fmt.Sprint(missedLockTimeout.Milliseconds()), fmt.Sprint(missedStatementTimeout.Milliseconds())}
}

// DefaultMissedGrace is the grace of a schedule whose view sets none: one
// period (a run should be done by the next tick), at least the shortest
// dislock.io/missed-after (contract.MinMissedAfter) and at most
// MaxDefaultMissedGrace. Longer runs set dislock.io/missed-after.
func DefaultMissedGrace(period time.Duration) time.Duration {
	return min(max(period, contract.MinMissedAfter), MaxDefaultMissedGrace)
}

// missedGrace is the grace of a schedule of period whose view says
// missedAfter: the default when it is empty, else a value
// dislock.io/missed-after accepts. Any other value is an error naming the
// annotation: a view is the tenant's own row, and a grace it could set
// outside the bounds (or that does not parse) is no grace to judge by.
func missedGrace(missedAfter string, period time.Duration) (time.Duration, error) {
	if missedAfter == "" {
		return DefaultMissedGrace(period), nil
	}
	return contract.ParseMissedAfter(missedAfter)
}

// Detection is the result of one DetectMissed.
type Detection struct {
	// New are the windows this run found missed (another cluster's run
	// may have found some first; those are not repeated).
	New []MissedWindow
	// Silent are the keys that are silent now.
	Silent []SilentKey
	// Keys is how many keys with a schedule were looked at, Windows how
	// many windows were judged.
	Keys, Windows int
	// Problems are keys that could not be judged (a view that does not
	// parse), one line each.
	Problems []string
}

// judgedWith is what a key's windows up to its checkpoint were judged with
// (key_stats.checked_with): the schedule, its time zone and missed-after.
type judgedWith struct {
	Schedule    string `json:"schedule"`
	TimeZone    string `json:"timeZone,omitempty"`
	MissedAfter string `json:"missedAfter,omitempty"`
	// Until is set once the clusters' schedule changed: it is the new
	// schedule's first window. The windows before it are judged with this
	// schedule, those from it on with the new one.
	Until *time.Time `json:"until,omitempty"`
}

func judgedWithOf(v store.View) *judgedWith {
	return &judgedWith{Schedule: v.Schedule, TimeZone: v.TimeZone, MissedAfter: v.MissedAfter}
}

// maxJudgedWithBytes is key_stats.checked_with's bound (migration 8).
const maxJudgedWithBytes = 1024

// judgedWithFits tells whether v's judgedWith, with an Until, fits
// key_stats.checked_with. A view is the tenant's own row: one that does not
// fit (a schedule no CronJob would have) must not fail the detection's one
// write for every namespace, so its key is a problem instead.
func judgedWithFits(v store.View, now time.Time) (int, bool) {
	j := judgedWithOf(v)
	j.Until = &now
	b, err := json.Marshal(j)
	return len(b), err == nil && len(b) <= maxJudgedWithBytes
}

func (j *judgedWith) sameSchedule(v store.View) bool {
	return j.Schedule == v.Schedule && j.TimeZone == v.TimeZone
}

func (j *judgedWith) equal(o *judgedWith) bool {
	if j == nil || o == nil {
		return j == o
	}
	sameUntil := j.Until == nil && o.Until == nil || j.Until != nil && o.Until != nil && j.Until.Equal(*o.Until)
	return j.Schedule == o.Schedule && j.TimeZone == o.TimeZone && j.MissedAfter == o.MissedAfter && sameUntil
}

// judgeSpan is a run of windows judged with one schedule: its ticks after
// after and, when until is set, before until.
type judgeSpan struct {
	sched        window.Schedule
	grace        time.Duration
	after, until time.Time
	// complete: every window of a span with an until was listed to judge.
	complete bool
}

// keyToJudge is one key's state for the detection.
type keyToJudge struct {
	key                    string
	firstSeen, lastDecided time.Time
	checkedUntil           *time.Time
	// checkedWith is what the checkpoint was judged with; nil when the key
	// was never judged or only by a dislock before schema version 8.
	checkedWith *judgedWith
	// lastWindow is the key's newest claimed window, firstWindow (read for
	// a key never judged) its oldest within the lookback.
	lastWindow, firstWindow *time.Time
	// scheduleSince is when a cluster first recorded the newest view's
	// schedule and time zone.
	scheduleSince time.Time
	view          store.View
	sched         window.Schedule
	grace, period time.Duration
	spans         []judgeSpan
	expected      []expectedWindow
	// judgedThrough is the next checkpoint (zero: it does not move), and
	// with what it was judged with when that changes (nil: it does not).
	judgedThrough time.Time
	with          *judgedWith
}

// expectedWindow is a window to judge, from span spans[span].
type expectedWindow struct {
	start time.Time
	span  int
}

// DetectMissed judges every key's windows whose grace ended since the last
// run, records the missed ones (each window once, however many clusters'
// webhooks run this at the same time) and returns them with the silent
// keys. It is the owner's: tenants cannot read the tables it needs.
func DetectMissed(ctx context.Context, s *store.Store, opts MissedOptions) (Detection, error) {
	h := s.Handle()
	if opts.Lookback <= 0 {
		opts.Lookback = DefaultMissedLookback
	}
	if opts.SilentPeriods <= 0 {
		opts.SilentPeriods = DefaultSilentPeriods
	}
	if opts.MaxWindowsPerKey <= 0 {
		opts.MaxWindowsPerKey = DefaultMaxWindowsPerKey
	}
	if opts.MaxWindowsPerNamespace <= 0 {
		opts.MaxWindowsPerNamespace = DefaultMaxWindowsPerNamespace
	}
	const op = "detecting missed windows"
	// The reads share one read-only transaction, bounded on the server as
	// the write is (SET LOCAL semantics: behind PgBouncer too).
	tx, err := h.Pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return Detection{}, h.Classify(op, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only: nothing to commit
	if _, err := tx.Exec(ctx, qStatementBounds, missedBounds()...); err != nil {
		return Detection{}, h.Classify(op+": bounding the statements", err)
	}
	keys, now, err := keysToJudge(ctx, h, tx, opts)
	if err != nil {
		return Detection{}, err
	}
	var det Detection
	var judge []*keyToJudge
	budget := map[string]int{}
	for _, k := range keys {
		if n, ok := judgedWithFits(k.view, now); !ok {
			det.Problems = append(det.Problems, fmt.Sprintf("%s: the view's schedule, time zone and missed-after take %d bytes, more than the %d a key's checkpoint keeps", k.key, n, maxJudgedWithBytes))
			continue
		}
		sched, err := window.ParseSchedule(k.view.Schedule, k.view.TimeZone)
		if err != nil {
			det.Problems = append(det.Problems, fmt.Sprintf("%s: %v", k.key, err))
			continue
		}
		k.sched = sched
		k.period = schedulePeriod(sched, now)
		if k.grace, err = missedGrace(k.view.MissedAfter, k.period); err != nil {
			det.Problems = append(det.Problems, fmt.Sprintf("%s: %v", k.key, err))
			continue
		}
		det.Keys++
		k.plan(now, opts.Lookback)
		judge = append(judge, k)
		lastSign := k.lastDecided
		if k.lastWindow != nil && k.lastWindow.After(lastSign) {
			lastSign = *k.lastWindow
		}
		if now.Sub(lastSign) > time.Duration(opts.SilentPeriods)*k.period+k.grace {
			// Its windows wait, judged when it is back.
			det.Silent = append(det.Silent, SilentKey{Key: k.key, LastDecided: lastSign, Period: k.period,
				ExpectedNext: sched.Next(now)})
			continue
		}
		// Each namespace has a budget of windows per run: one namespace's
		// keys (a tenant writes statistics and views of its own at will)
		// cannot make the run of every namespace as long as they like.
		// The windows left are judged next run.
		ns, _, _ := strings.Cut(k.key, "/")
		for i := range k.spans {
			sp := &k.spans[i]
			to := now.Add(-sp.grace)
			t := sp.sched.Next(sp.after)
			for ; !t.IsZero() && !t.After(to) && (sp.until.IsZero() || t.Before(sp.until)) &&
				len(k.expected) < opts.MaxWindowsPerKey && budget[ns] < opts.MaxWindowsPerNamespace; t = sp.sched.Next(t) {
				k.expected = append(k.expected, expectedWindow{start: t, span: i})
				budget[ns]++
			}
			sp.complete = !sp.until.IsZero() && (t.IsZero() || !t.Before(sp.until))
			if !sp.complete {
				break // a later span's windows come after this one's
			}
		}
	}
	rows, err := windowsToJudge(ctx, h, tx, judge)
	if err != nil {
		return det, err
	}
	paused, err := pausesOf(ctx, h, tx, judge, now)
	if err != nil {
		return det, err
	}
	var found []MissedWindow
	for _, k := range judge {
		judged := len(k.expected)
		for i, w := range k.expected {
			got := rows[refOf(k.key, w.start)]
			if len(got) == 0 && slices.ContainsFunc(paused[k.key], func(p pause.Pause) bool { return p.Covers(w.start) }) {
				continue // started paused and nobody ran it: skipped on purpose, never missed
			}
			kind, pending := judgeWindow(got, now)
			if pending {
				// Judged again next time, with every later window.
				judged = i
				if sp := &k.spans[w.span]; !sp.until.IsZero() {
					sp.complete = false
				}
				break
			}
			if kind != "" {
				found = append(found, MissedWindow{Key: k.key, Window: w.start, Kind: kind})
			}
		}
		det.Windows += judged
		k.settle(judged)
	}
	if err := explainMissed(ctx, h, tx, found); err != nil {
		return det, err
	}
	if err := tx.Rollback(ctx); err != nil {
		return det, h.Classify(op, err)
	}
	det.New, err = recordMissed(ctx, h, judge, found)
	if err != nil {
		return det, h.Classify(op, err)
	}
	return det, nil
}

// plan sets the spans of windows to judge after the key's checkpoint, and
// what to record when the checkpoint is new or a schedule change begins.
func (k *keyToJudge) plan(now time.Time, lookback time.Duration) {
	cur := judgedWithOf(k.view)
	// firstOf is the schedule's tick at or before t less a second: the
	// span from it on starts with that tick.
	firstOf := func(sched window.Schedule, t time.Time) (time.Time, bool) {
		w, err := sched.Latest(t)
		return w.Add(-time.Second), err == nil
	}
	var old window.Schedule
	var oldGrace time.Duration
	oldOK := false
	if k.checkedWith != nil {
		var err, graceErr error
		old, err = window.ParseSchedule(k.checkedWith.Schedule, k.checkedWith.TimeZone)
		if err == nil {
			oldGrace, graceErr = missedGrace(k.checkedWith.MissedAfter, schedulePeriod(old, now))
		}
		oldOK = err == nil && graceErr == nil
	}
	switch {
	case k.checkedUntil == nil:
		// Never judged: from the window of its first sign of life (the pod
		// that decided first decided for it; the first window claimed
		// may be older when the ledger lost that pod's write). The
		// checkpoint is recorded now, before a window is judged, and
		// with it the schedule: a later edit of the view cannot move it.
		// (A schedule change between the key's first sign of life and
		// this first run, one leader interval later, is not seen.)
		start := k.firstSeen
		if k.firstWindow != nil && k.firstWindow.Before(start) {
			start = *k.firstWindow
		}
		after := now.Add(-lookback)
		if w, ok := firstOf(k.sched, start); ok {
			after = laterOf(after, w)
		}
		k.spans = []judgeSpan{{sched: k.sched, grace: k.grace, after: after}}
		k.judgedThrough, k.with = after, cur
	case k.checkedWith == nil || !oldOK:
		// Judged by a dislock that did not record its schedule (or the
		// record does not parse): its rule, once. The new schedule's
		// ticks from before a cluster first recorded it were no windows.
		after := *k.checkedUntil
		if w, ok := firstOf(k.sched, k.scheduleSince); ok {
			after = laterOf(after, w)
		}
		k.spans = []judgeSpan{{sched: k.sched, grace: k.grace, after: after}}
		k.with = cur
	case k.checkedWith.Until == nil && k.checkedWith.sameSchedule(k.view):
		k.spans = []judgeSpan{{sched: k.sched, grace: k.grace, after: *k.checkedUntil}}
		if !k.checkedWith.equal(cur) {
			k.with = cur // missed-after changed: the new grace holds
		}
	default:
		// The schedule changed after the checkpoint (or is changing): the
		// windows before the new schedule's first one are judged with the
		// old schedule, and their grace.
		until := k.checkedWith.Until
		if until == nil {
			w, err := k.sched.Latest(k.scheduleSince)
			if err != nil {
				w = now
			}
			until = &w
		}
		if !until.After(*k.checkedUntil) {
			// Nothing of the old schedule is left to judge.
			k.spans = []judgeSpan{{sched: k.sched, grace: k.grace, after: *k.checkedUntil}}
			k.with = cur
			break
		}
		oldWith := *k.checkedWith
		oldWith.Until = until
		k.spans = []judgeSpan{
			{sched: old, grace: oldGrace, after: *k.checkedUntil, until: *until},
			{sched: k.sched, grace: k.grace, after: until.Add(-time.Second)},
		}
		if !k.checkedWith.equal(&oldWith) {
			k.with = &oldWith
		}
	}
	for i := range k.spans {
		k.spans[i].after = laterOf(k.spans[i].after, now.Add(-lookback))
	}
}

// settle sets the next checkpoint from the first judged windows of
// expected, and what to record beside it.
func (k *keyToJudge) settle(judged int) {
	if judged > 0 {
		k.judgedThrough = laterOf(k.judgedThrough, k.expected[judged-1].start)
	}
	if len(k.spans) == 2 && k.spans[0].complete {
		// Every window of the old schedule was judged: the new one
		// holds from its first window on.
		k.judgedThrough = laterOf(k.judgedThrough, k.spans[1].after)
		k.with = judgedWithOf(k.view)
	}
}

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// schedulePeriod is the gap between the schedule's next two activations
// after now: the period of a regular schedule.
func schedulePeriod(s window.Schedule, now time.Time) time.Duration {
	a := s.Next(now)
	b := s.Next(a)
	if a.IsZero() || b.IsZero() {
		return 24 * time.Hour
	}
	return b.Sub(a)
}

// windowRef names a window of a key. The start is in microseconds, the
// database's resolution: time.Time values of one instant need not be ==.
type windowRef struct {
	key   string
	start int64
}

func refOf(key string, start time.Time) windowRef { return windowRef{key, start.UnixMicro()} }

// windowState is what a window's rows (one per completion index) say.
type windowState struct {
	state      store.State
	aliveUntil time.Time
}

// judgeWindow returns the kind of miss a window's rows show ("" when it
// succeeded or was skipped), or pending when a run of it is still alive.
// Skipped is not missed: the window's owner found an earlier run of the key
// still holding the lease, which is what lease mode promises.
func judgeWindow(rows []windowState, now time.Time) (kind string, pending bool) {
	if len(rows) == 0 {
		return MissedNoRun, false
	}
	for _, r := range rows {
		switch {
		case r.state == store.StateRunning && r.aliveUntil.After(now):
			return "", true
		case r.state == store.StateFailed:
			kind = MissedFailed
		case r.state == store.StateRunning && kind == "":
			kind = MissedSilent
		}
	}
	return kind, false
}

// keysToJudge reads every key's statistics with the newest view any cluster
// recorded for it, and the time to judge at.
func keysToJudge(ctx context.Context, h *db.Handle, q db.Querier, opts MissedOptions) ([]*keyToJudge, time.Time, error) {
	const op = "reading the keys to judge"
	var at *time.Time
	if !opts.Now.IsZero() {
		at = &opts.Now
	}
	rows, err := q.Query(ctx, qKeysToJudge, MaxKeysPerNamespace, opts.Namespace, at, db.Micros(opts.Lookback))
	if err != nil {
		return nil, time.Time{}, h.Classify(op, err)
	}
	defer rows.Close()
	var out []*keyToJudge
	var now time.Time
	for rows.Next() {
		k := &keyToJudge{}
		var view string
		var with *string
		var problems []string
		if err := rows.Scan(&k.key, &db.FiniteTime{Column: "first_seen", T: &k.firstSeen, Problems: &problems},
			&db.FiniteTime{Column: "last_decided", T: &k.lastDecided, Problems: &problems},
			&db.FiniteTime{Column: "checked_until", Nullable: &k.checkedUntil, Problems: &problems}, &with, &view,
			&db.FiniteTime{Column: "changed_at", T: &k.scheduleSince, Problems: &problems},
			&db.FiniteTime{Column: "window_start", Nullable: &k.lastWindow, Problems: &problems},
			&db.FiniteTime{Column: "window_start", Nullable: &k.firstWindow, Problems: &problems}, &now); err != nil {
			return nil, time.Time{}, h.Classify(op, err)
		}
		if err := json.Unmarshal([]byte(view), &k.view); err != nil {
			problems = append(problems, "view does not decode ("+err.Error()+")")
		}
		if with != nil {
			// Only a tenant inserting its own key's row can make this
			// undecodable; the key is then judged as one whose
			// checkpoint's schedule is unknown.
			if err := json.Unmarshal([]byte(*with), &k.checkedWith); err != nil {
				k.checkedWith = nil
			}
		}
		if len(problems) > 0 {
			h.SkipRow(op, &db.UnreadableRow{Table: "key_stats", Key: k.key, Problems: problems})
			continue
		}
		if !strings.Contains(k.view.Mode, "schedule") {
			continue // lease mode only: no windows to miss
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, h.Classify(op, err)
	}
	if now.IsZero() {
		// Through q: the caller's transaction may hold the pool's only
		// connection.
		if err := q.QueryRow(ctx, db.QNow).Scan(&now); err != nil {
			return nil, time.Time{}, h.Classify("reading database time", err)
		}
		if !opts.Now.IsZero() && opts.Now.Before(now) {
			now = opts.Now
		}
	}
	return out, now.UTC(), nil
}

// pausesOf reads the pauses that held during the keys' expected windows,
// by key (lockagent/store/pause): a window that started while its key was
// paused everywhere is not missed.
func pausesOf(ctx context.Context, h *db.Handle, q db.Querier, keys []*keyToJudge, now time.Time) (map[string][]pause.Pause, error) {
	var names []string
	from := now
	for _, k := range keys {
		if len(k.expected) > 0 {
			names = append(names, k.key)
			if k.expected[0].start.Before(from) {
				from = k.expected[0].start
			}
		}
	}
	ps, err := pause.Overlapping(ctx, q, names, from, now)
	if err != nil {
		return nil, h.Classify("reading the pauses of the windows to judge", err)
	}
	out := map[string][]pause.Pause{}
	for _, p := range ps {
		out[p.Key] = append(out[p.Key], p)
	}
	return out, nil
}

// windowsToJudge reads the rows of every expected window, one query.
func windowsToJudge(ctx context.Context, h *db.Handle, q db.Querier, keys []*keyToJudge) (map[windowRef][]windowState, error) {
	var names []string
	var starts []time.Time
	for _, k := range keys {
		for _, w := range k.expected {
			names = append(names, k.key)
			starts = append(starts, w.start)
		}
	}
	out := map[windowRef][]windowState{}
	if len(names) == 0 {
		return out, nil
	}
	const op = "reading the windows to judge"
	rows, err := q.Query(ctx, qWindowsToJudge, names, starts)
	if err != nil {
		return nil, h.Classify(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		var key, state string
		var start time.Time
		var st windowState
		var problems []string
		if err := rows.Scan(&key, &db.FiniteTime{Column: "window_start", T: &start, Problems: &problems}, &state,
			&db.FiniteTime{Column: "alive_until", T: &st.aliveUntil, Problems: &problems}); err != nil {
			return nil, h.Classify(op, err)
		}
		if len(problems) > 0 {
			h.SkipRow(op, &db.UnreadableRow{Table: "windows", Key: key, Problems: problems})
			continue
		}
		st.state = store.State(state)
		out[refOf(key, start)] = append(out[refOf(key, start)], st)
	}
	return out, h.Classify(op, rows.Err())
}

// explainMissed sets each missed window's reason from the ledger: what every
// cluster decided for it.
func explainMissed(ctx context.Context, h *db.Handle, q db.Querier, found []MissedWindow) error {
	if len(found) == 0 {
		return nil
	}
	keys := make([]string, len(found))
	starts := make([]time.Time, len(found))
	for i, m := range found {
		keys[i], starts[i] = m.Key, m.Window
	}
	const op = "reading the decisions of missed windows"
	rows, err := q.Query(ctx, qMissedDecisions, keys, starts, missedDecisionsPerWindow)
	if err != nil {
		return h.Classify(op, err)
	}
	defer rows.Close()
	said := map[windowRef][]string{}
	for rows.Next() {
		var key, cluster, action, reason string
		var start time.Time
		if err := rows.Scan(&key, &start, &cluster, &action, &reason); err != nil {
			return h.Classify(op, err)
		}
		said[refOf(key, start)] = append(said[refOf(key, start)], fmt.Sprintf("%s %s (%s)", cluster, action, reason))
	}
	if err := rows.Err(); err != nil {
		return h.Classify(op, err)
	}
	for i := range found {
		m := &found[i]
		what := map[string]string{
			MissedNoRun:  "no cluster ran it",
			MissedFailed: "its run failed and nobody took it over in time",
			MissedSilent: "its run's owner stopped heartbeating and nobody took it over in time",
		}[m.Kind]
		if d := said[refOf(m.Key, m.Window)]; len(d) > 0 {
			m.Reason = what + ": " + strings.Join(d, "; ")
		} else {
			m.Reason = what + ": no pod of any cluster decided anything for it (no Job was created, or its pods never reached the database)"
		}
		m.Reason = db.Cut(m.Reason, store.MaxReason)
	}
	return nil
}

// recordMissed stores the missed windows and moves every judged key's
// checkpoint, in one statement, and returns the windows that are new.
func recordMissed(ctx context.Context, h *db.Handle, keys []*keyToJudge, found []MissedWindow) ([]MissedWindow, error) {
	var ckKeys []string
	var ckUntil []*time.Time
	var ckWith []*string
	for _, k := range keys {
		// Only a checkpoint that moved is written, or what it was judged
		// with when that changed: in a steady state most keys have no
		// window whose grace ended since the last run.
		if k.judgedThrough.IsZero() && k.with == nil {
			continue
		}
		ckKeys = append(ckKeys, k.key)
		var until *time.Time
		if !k.judgedThrough.IsZero() {
			until = &k.judgedThrough
		}
		ckUntil = append(ckUntil, until)
		var with *string
		if k.with != nil {
			b, err := json.Marshal(k.with)
			if err != nil {
				return nil, err
			}
			w := string(b)
			with = &w
		}
		ckWith = append(ckWith, with)
	}
	if len(ckKeys) == 0 && len(found) == 0 {
		return nil, nil
	}
	mKeys := make([]string, len(found))
	mStarts := make([]time.Time, len(found))
	mKinds := make([]string, len(found))
	mReasons := make([]string, len(found))
	for i, m := range found {
		mKeys[i], mStarts[i], mKinds[i], mReasons[i] = m.Key, m.Window, m.Kind, m.Reason
	}
	batch := &pgx.Batch{}
	batch.Queue(qStatementBounds, missedBounds()...)
	batch.Queue(qRecordMissed, mKeys, mStarts, mKinds, mReasons, ckKeys, ckUntil, ckWith)
	br := h.Pool.SendBatch(ctx, batch)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	byRef := map[windowRef]MissedWindow{}
	for _, m := range found {
		byRef[refOf(m.Key, m.Window)] = m
	}
	var out []MissedWindow
	for rows.Next() {
		var key string
		var start, at time.Time
		if err := rows.Scan(&key, &start, &at); err != nil {
			return nil, err
		}
		m := byRef[refOf(key, start)]
		m.DetectedAt = at.UTC()
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b MissedWindow) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return a.Window.Compare(b.Window)
	})
	return out, nil
}

// MissedFilter selects missed windows. Zero fields do not filter.
type MissedFilter struct {
	Key string
	// Namespace keeps the keys of one namespace ("<namespace>/...").
	Namespace string
	From, To  time.Time
	// DetectedAfter selects the windows detected after it (by any
	// cluster's detection).
	DetectedAfter time.Time
	// PerKey, when positive, keeps only each key's oldest PerKey windows:
	// one key's many missed windows do not crowd out another's.
	PerKey int
	Limit  int
}

// ListMissed returns the missed windows, newest first, and the database time.
func ListMissed(ctx context.Context, s *store.Store, f MissedFilter) ([]MissedWindow, time.Time, error) {
	h := s.Handle()
	return db.List(ctx, h, "listing missed windows", func(row pgx.Row, m *MissedWindow, extra ...any) error {
		var problems []string
		err := row.Scan(append([]any{&m.Key, &db.FiniteTime{Column: "window_start", T: &m.Window, Problems: &problems},
			&m.Kind, &m.Reason, &db.FiniteTime{Column: "detected_at", T: &m.DetectedAt, Problems: &problems}}, extra...)...)
		if err == nil && len(problems) > 0 {
			return &db.UnreadableRow{Table: "missed", Key: m.Key, Problems: problems}
		}
		return err
	}, qListMissed, f.Key, db.NullTime(f.From), db.NullTime(f.To), limitOr(f.Limit), db.NullTime(f.DetectedAfter), f.PerKey, f.Namespace)
}
