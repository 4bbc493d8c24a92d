package lock

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/window"
)

// A window is missed when it has no successful run by its start plus a
// grace: no cluster ran it (every pod skipped, died, or was never created),
// or its run failed or went silent and nobody took it over. A window of a
// key is judged once its grace is over, from the schedule and time zone the
// clusters recorded (the newest view), at database time, and never again:
// a missed window stays counted. A window whose run is still alive is
// judged later. A key no cluster decided anything for over several periods
// is silent instead: its windows are not counted as missed (the CronJob was
// deleted or suspended everywhere, or dislock was removed from it).

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

// SilentKey is a key with no decision for several periods.
type SilentKey struct {
	Key          string        `json:"key"`
	LastDecided  time.Time     `json:"lastDecided"`
	Period       time.Duration `json:"period"`
	ExpectedNext time.Time     `json:"expectedNext"`
}

// MissedOptions bound the detection.
type MissedOptions struct {
	// Lookback is how far back a key never judged before is judged from
	// (it starts no earlier than the key's first decision either).
	Lookback time.Duration
	// SilentPeriods is how many periods without any decision make a key
	// silent.
	SilentPeriods int
	// MaxWindowsPerKey bounds the windows judged per key and run, and
	// MaxWindowsPerNamespace those of all keys of a namespace; the rest wait
	// for the next run.
	MaxWindowsPerKey       int
	MaxWindowsPerNamespace int
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
	MinMissedGrace                = time.Minute
	MaxDefaultMissedGrace         = time.Hour
	missedDecisionsPerWindow      = 16
)

// DefaultMissedGrace is the grace of a schedule whose view sets none: one
// period (a run should be done by the next tick), at least a minute and at
// most an hour. Longer runs set dislock.io/missed-after.
func DefaultMissedGrace(period time.Duration) time.Duration {
	return min(max(period, MinMissedGrace), MaxDefaultMissedGrace)
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

// keyToJudge is one key's state for the detection.
type keyToJudge struct {
	key                    string
	firstSeen, lastDecided time.Time
	checkedUntil           *time.Time
	// viewChanged is when the newest view last changed.
	viewChanged   time.Time
	view          View
	sched         window.Schedule
	grace, period time.Duration
	from, to      time.Time
	// judgedThrough is the newest window start judged (or passed over)
	// this run: the next checkpoint; zero when it does not move.
	judgedThrough time.Time
	expected      []time.Time
}

// DetectMissed judges every key's windows whose grace ended since the last
// run, records the missed ones (each window once, however many clusters'
// webhooks run this at the same time) and returns them with the silent
// keys. It is the owner's: tenants cannot read the tables it needs.
func (s *Store) DetectMissed(ctx context.Context, opts MissedOptions) (Detection, error) {
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
	keys, now, err := s.keysToJudge(ctx)
	if err != nil {
		return Detection{}, err
	}
	var det Detection
	var judge []*keyToJudge
	budget := map[string]int{}
	for _, k := range keys {
		sched, err := window.ParseSchedule(k.view.Schedule, k.view.TimeZone)
		if err != nil {
			det.Problems = append(det.Problems, fmt.Sprintf("%s: %v", k.key, err))
			continue
		}
		k.sched = sched
		k.period = schedulePeriod(sched, now)
		k.grace = DefaultMissedGrace(k.period)
		if k.view.MissedAfter != "" {
			if g, err := time.ParseDuration(k.view.MissedAfter); err == nil && g > 0 {
				k.grace = g
			}
		}
		det.Keys++
		k.to = now.Add(-k.grace)
		// Judging starts with the window of the key's first decision (the
		// pod that decided first decided for it), at most Lookback ago,
		// and never before the window in which the view the clusters hold
		// now was first recorded: a new schedule's earlier ticks were no
		// windows. (A view is recorded by a pod claiming at a tick of it.)
		k.from = now.Add(-opts.Lookback)
		for _, since := range []time.Time{k.firstSeen, k.viewChanged} {
			if w, err := sched.Latest(since); err == nil {
				k.from = laterOf(k.from, w.Add(-time.Second))
			}
		}
		if k.checkedUntil != nil {
			k.from = laterOf(k.from, *k.checkedUntil)
		}
		silentAfter := time.Duration(opts.SilentPeriods)*k.period + k.grace
		if now.Sub(k.lastDecided) > silentAfter {
			det.Silent = append(det.Silent, SilentKey{Key: k.key, LastDecided: k.lastDecided, Period: k.period,
				ExpectedNext: sched.Next(now)})
			// Nothing of a silent key is judged: its windows are passed
			// over, so that it starts afresh when a cluster decides for it
			// again.
			if last, err := sched.Latest(k.to); err == nil && last.After(k.from) {
				k.judgedThrough = last
			}
			judge = append(judge, k)
			continue
		}
		// Each namespace has a budget of windows per run: one namespace's
		// keys (a tenant writes statistics and views of its own at will)
		// cannot make the run of every namespace as long as they like.
		// The windows left are judged next run.
		ns, _, _ := strings.Cut(k.key, "/")
		for t := sched.Next(k.from); !t.IsZero() && !t.After(k.to) && len(k.expected) < opts.MaxWindowsPerKey && budget[ns] < opts.MaxWindowsPerNamespace; t = sched.Next(t) {
			k.expected = append(k.expected, t)
			budget[ns]++
		}
		if len(k.expected) > 0 {
			k.judgedThrough = k.expected[len(k.expected)-1]
		}
		judge = append(judge, k)
	}
	rows, err := s.windowsToJudge(ctx, judge)
	if err != nil {
		return det, err
	}
	var found []MissedWindow
	for _, k := range judge {
		for i, w := range k.expected {
			det.Windows++
			kind, pending := judgeWindow(rows[refOf(k.key, w)], now)
			if pending {
				// Judged again next time, with every later window.
				k.judgedThrough = time.Time{}
				if i > 0 {
					k.judgedThrough = k.expected[i-1]
				}
				break
			}
			if kind != "" {
				found = append(found, MissedWindow{Key: k.key, Window: w, Kind: kind})
			}
		}
	}
	if err := s.explainMissed(ctx, found); err != nil {
		return det, err
	}
	det.New, err = s.recordMissed(ctx, judge, found)
	if err != nil {
		return det, s.classify(op, err)
	}
	return det, nil
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
	state      State
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
		case r.state == StateRunning && r.aliveUntil.After(now):
			return "", true
		case r.state == StateFailed:
			kind = MissedFailed
		case r.state == StateRunning && kind == "":
			kind = MissedSilent
		}
	}
	return kind, false
}

// keysToJudge reads every key's statistics with the newest view any cluster
// recorded for it, and the database time.
func (s *Store) keysToJudge(ctx context.Context) ([]*keyToJudge, time.Time, error) {
	const op = "reading the keys to judge"
	rows, err := s.pool.Query(ctx, qKeysToJudge, MaxKeysPerNamespace)
	if err != nil {
		return nil, time.Time{}, s.classify(op, err)
	}
	defer rows.Close()
	var out []*keyToJudge
	var now time.Time
	for rows.Next() {
		k := &keyToJudge{}
		var raw string
		var problems []string
		if err := rows.Scan(&k.key, &finiteTime{column: "first_seen", t: &k.firstSeen, problems: &problems},
			&finiteTime{column: "last_decided", t: &k.lastDecided, problems: &problems},
			&finiteTime{column: "checked_until", nullable: &k.checkedUntil, problems: &problems}, &raw,
			&finiteTime{column: "changed_at", t: &k.viewChanged, problems: &problems}, &now); err != nil {
			return nil, time.Time{}, s.classify(op, err)
		}
		if err := json.Unmarshal([]byte(raw), &k.view); err != nil {
			problems = append(problems, "view does not decode ("+err.Error()+")")
		}
		if len(problems) > 0 {
			s.skipRow(op, &unreadableRow{table: "key_stats", key: k.key, problems: problems})
			continue
		}
		if !strings.Contains(k.view.Mode, "schedule") {
			continue // lease mode only: no windows to miss
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, s.classify(op, err)
	}
	if now.IsZero() {
		if now, err = s.Now(ctx); err != nil {
			return nil, time.Time{}, err
		}
	}
	return out, now.UTC(), nil
}

// windowsToJudge reads the rows of every expected window, one query.
func (s *Store) windowsToJudge(ctx context.Context, keys []*keyToJudge) (map[windowRef][]windowState, error) {
	var names []string
	var froms, tos []time.Time
	for _, k := range keys {
		if len(k.expected) == 0 {
			continue
		}
		names = append(names, k.key)
		froms = append(froms, k.expected[0])
		tos = append(tos, k.expected[len(k.expected)-1])
	}
	out := map[windowRef][]windowState{}
	if len(names) == 0 {
		return out, nil
	}
	const op = "reading the windows to judge"
	rows, err := s.pool.Query(ctx, qWindowsToJudge, names, froms, tos)
	if err != nil {
		return nil, s.classify(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		var key, state string
		var start time.Time
		var st windowState
		var problems []string
		if err := rows.Scan(&key, &finiteTime{column: "window_start", t: &start, problems: &problems}, &state,
			&finiteTime{column: "alive_until", t: &st.aliveUntil, problems: &problems}); err != nil {
			return nil, s.classify(op, err)
		}
		if len(problems) > 0 {
			s.skipRow(op, &unreadableRow{table: "windows", key: key, problems: problems})
			continue
		}
		st.state = State(state)
		out[refOf(key, start)] = append(out[refOf(key, start)], st)
	}
	return out, s.classify(op, rows.Err())
}

// explainMissed sets each missed window's reason from the ledger: what every
// cluster decided for it.
func (s *Store) explainMissed(ctx context.Context, found []MissedWindow) error {
	if len(found) == 0 {
		return nil
	}
	keys := make([]string, len(found))
	starts := make([]time.Time, len(found))
	for i, m := range found {
		keys[i], starts[i] = m.Key, m.Window
	}
	const op = "reading the decisions of missed windows"
	rows, err := s.pool.Query(ctx, qMissedDecisions, keys, starts, missedDecisionsPerWindow)
	if err != nil {
		return s.classify(op, err)
	}
	defer rows.Close()
	said := map[windowRef][]string{}
	for rows.Next() {
		var key, cluster, action, reason string
		var start time.Time
		if err := rows.Scan(&key, &start, &cluster, &action, &reason); err != nil {
			return s.classify(op, err)
		}
		said[refOf(key, start)] = append(said[refOf(key, start)], fmt.Sprintf("%s %s (%s)", cluster, action, reason))
	}
	if err := rows.Err(); err != nil {
		return s.classify(op, err)
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
		m.Reason = cutReason(m.Reason)
	}
	return nil
}

// recordMissed stores the missed windows and moves every judged key's
// checkpoint, in one statement, and returns the windows that are new.
func (s *Store) recordMissed(ctx context.Context, keys []*keyToJudge, found []MissedWindow) ([]MissedWindow, error) {
	var ckKeys []string
	var ckUntil []time.Time
	for _, k := range keys {
		// Only a checkpoint that moved is written: in a steady state most
		// keys have no window whose grace ended since the last run.
		if !k.judgedThrough.IsZero() {
			ckKeys = append(ckKeys, k.key)
			ckUntil = append(ckUntil, k.judgedThrough)
		}
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
	rows, err := s.pool.Query(ctx, qRecordMissed, mKeys, mStarts, mKinds, mReasons, ckKeys, ckUntil)
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
	slices.SortFunc(out, func(a, b MissedWindow) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return a.Window.Compare(b.Window)
	})
	return out, rows.Err()
}

// MissedFilter selects missed windows. Zero fields do not filter.
type MissedFilter struct {
	Key      string
	From, To time.Time
	// DetectedAfter selects the windows detected after it (by any
	// cluster's detection).
	DetectedAfter time.Time
	// PerKey, when positive, keeps only each key's oldest PerKey windows:
	// one key's many missed windows do not crowd out another's.
	PerKey int
	Limit  int
}

// ListMissed returns the missed windows, newest first, and the database time.
func (s *Store) ListMissed(ctx context.Context, f MissedFilter) ([]MissedWindow, time.Time, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	return list(ctx, s, "listing missed windows", func(row pgx.Row, m *MissedWindow, extra ...any) error {
		var problems []string
		err := row.Scan(append([]any{&m.Key, &finiteTime{column: "window_start", t: &m.Window, problems: &problems},
			&m.Kind, &m.Reason, &finiteTime{column: "detected_at", t: &m.DetectedAt, problems: &problems}}, extra...)...)
		if err == nil && len(problems) > 0 {
			return &unreadableRow{table: "missed", key: m.Key, problems: problems}
		}
		return err
	}, qListMissed, f.Key, nullTime(f.From), nullTime(f.To), limit, nullTime(f.DetectedAfter), f.PerKey)
}
