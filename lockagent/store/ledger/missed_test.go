package ledger_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/ledger"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"
)

var (
	missedSeed  = flag.Uint64("missed.seed", 0, "first seed of TestMissedDetectionReportsEveryWindowThatRanNowhereOnce (0: from the clock)")
	missedSeeds = flag.Int("missed.seeds", 30, "how many seeds (one key each) TestMissedDetectionReportsEveryWindowThatRanNowhereOnce replays")
)

// replay writes the history of keys of a namespace of its own into the
// database at past times, as the clusters' pods would have written it, and
// runs the detection as of past times (MissedOptions.Now): a test moves time
// forward without sleeping. Statements are queued and sent before each
// detection.
type replay struct {
	t   testing.TB
	own *store.Store
	raw *pgx.Conn
	ns  string
	// t0 is a minute in the past; minute(i) is i minutes after it.
	t0     time.Time
	batch  *pgx.Batch
	opts   ledger.MissedOptions
	found  []ledger.MissedWindow
	silent []ledger.SilentKey // of the last detection
}

func newReplay(t testing.TB, team string, back time.Duration) *replay {
	t.Helper()
	ctx := context.Background()
	dsn := pgtest.Need(t).DirectDSN()
	r := &replay{t: t, own: storetest.Open(t, dsn, 4), raw: storetest.RawConn(t, dsn), ns: storetest.Namespace(t, team), batch: &pgx.Batch{}}
	now, err := r.own.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.t0 = now.UTC().Truncate(time.Minute).Add(-back)
	r.opts.Namespace = r.ns
	t.Cleanup(func() {
		for _, table := range []string{"decisions", "decision_counts", "key_stats", "missed", "windows", "window_units", "views"} {
			if _, err := r.raw.Exec(context.Background(), `DELETE FROM dislock.`+table+` WHERE starts_with(lock_key, $1::text)`, r.ns+"/"); err != nil {
				t.Logf("cleaning %s of %s: %v", table, r.ns, err)
			}
		}
	})
	return r
}

func (r *replay) key(name string) string { return r.ns + "/" + name }

func (r *replay) minute(i float64) time.Time {
	return r.t0.Add(time.Duration(i * float64(time.Minute)))
}

// view records cluster's view of key at at, as a pod does before it claims:
// changed_at moves only when the content differs.
func (r *replay) view(key, cluster string, v store.View, at time.Time) {
	b, err := json.Marshal(v)
	if err != nil {
		r.t.Fatal(err)
	}
	r.batch.Queue(`INSERT INTO dislock.views AS v (lock_key, cluster, view, seen_at, changed_at)
VALUES ($1::text, $2::text, $3::jsonb, $4::timestamptz, $4::timestamptz)
ON CONFLICT (lock_key, cluster) DO UPDATE SET view = EXCLUDED.view, seen_at = EXCLUDED.seen_at,
    changed_at = CASE WHEN v.view = EXCLUDED.view THEN v.changed_at ELSE EXCLUDED.changed_at END`, key, cluster, string(b), at)
}

// row writes the window's row as its owner left it at the time: claimed at
// claimedAt, alive until aliveUntil (running), or ended then.
func (r *replay) row(key string, w time.Time, cluster string, state store.State, claimedAt, aliveUntil time.Time) {
	r.batch.Queue(`INSERT INTO dislock.windows AS w (lock_key, window_start, job_index, owner, cluster, pod, token, state, claimed_at, alive_until, finished_at, exit_code)
VALUES ($1::text, $2::timestamptz, -1, $3::text || '/ns/job/uid/pod', $3::text, 'pod', 1, $4::text, $5::timestamptz, $6::timestamptz,
        CASE WHEN $4::text IN ('succeeded', 'failed') THEN $6::timestamptz END,
        CASE $4::text WHEN 'succeeded' THEN 0 WHEN 'failed' THEN 1 END)
ON CONFLICT (lock_key, window_start, job_index) DO UPDATE SET owner = EXCLUDED.owner, cluster = EXCLUDED.cluster,
    state = EXCLUDED.state, alive_until = EXCLUDED.alive_until, finished_at = EXCLUDED.finished_at, exit_code = EXCLUDED.exit_code`,
		key, w, cluster, string(state), claimedAt, aliveUntil)
}

// decided writes a pod's ledger row and the key's statistics at at.
func (r *replay) decided(key string, w time.Time, cluster string, action store.Action, at time.Time) {
	r.batch.Queue(`WITH d AS (
    INSERT INTO dislock.decisions (lock_key, window_start, job_index, cluster, job, pod, action, reason, decided_at)
    VALUES ($1::text, $2::timestamptz, -1, $3::text, 'job', 'pod-' || $3::text, $4::text, 'replayed', $5::timestamptz))
INSERT INTO dislock.key_stats AS k (lock_key, first_seen, last_decided) VALUES ($1::text, $5::timestamptz, $5::timestamptz)
ON CONFLICT (lock_key) DO UPDATE SET first_seen = least(k.first_seen, EXCLUDED.first_seen),
    last_decided = greatest(k.last_decided, EXCLUDED.last_decided)`, key, w, cluster, string(action), at)
}

// ran replays window i of key run to success by the first of clusters,
// every one of which recorded its view v first (one second apart, in
// order), with the ledger's rows.
func (r *replay) ran(key string, v store.View, i float64, clusters ...string) {
	w := r.minute(i)
	for j, c := range clusters {
		r.view(key, c, v, w.Add(time.Duration(3+j)*time.Second))
	}
	c := clusters[0]
	r.row(key, w, c, store.StateSucceeded, w.Add(5*time.Second), w.Add(15*time.Second))
	r.decided(key, w, c, store.ActionRun, w.Add(5*time.Second))
	r.decided(key, w, c, store.ActionSucceeded, w.Add(15*time.Second))
}

func (r *replay) flush() {
	r.t.Helper()
	if r.batch.Len() == 0 {
		return
	}
	b := r.batch
	r.batch = &pgx.Batch{}
	if err := r.raw.SendBatch(context.Background(), b).Close(); err != nil {
		r.t.Fatalf("replaying the history: %v", err)
	}
}

// detect runs the detection of the namespace as of at.
func (r *replay) detect(at time.Time) ledger.Detection {
	r.t.Helper()
	r.flush()
	opts := r.opts
	opts.Now = at
	det, err := ledger.DetectMissed(context.Background(), r.own, opts)
	if err != nil {
		r.t.Fatalf("detection as of %s: %v", at.Format(time.TimeOnly), err)
	}
	r.found = append(r.found, det.New...)
	r.silent = det.Silent
	return det
}

// reported lists the windows of key found missed, as "minute kind", in the
// order found, and checks that the table holds exactly those.
func (r *replay) reported(key string) []string {
	r.t.Helper()
	var out []string
	for _, m := range r.found {
		if m.Key == key {
			out = append(out, r.label(m.Window)+" "+m.Kind)
		}
	}
	rows, err := r.raw.Query(context.Background(), `SELECT window_start, kind FROM dislock.missed WHERE lock_key = $1 ORDER BY window_start`, key)
	if err != nil {
		r.t.Fatal(err)
	}
	var stored []string
	for rows.Next() {
		var w time.Time
		var kind string
		if err := rows.Scan(&w, &kind); err != nil {
			r.t.Fatal(err)
		}
		stored = append(stored, r.label(w)+" "+kind)
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	slices.Sort(stored)
	if sorted := slices.Sorted(slices.Values(out)); !slices.Equal(slices.Compact(sorted), stored) {
		r.t.Errorf("%s: the detections reported %q, dislock.missed holds %q", key, out, stored)
	}
	return out
}

// label names a window by its minute after t0, e.g. "m12".
func (r *replay) label(w time.Time) string {
	d := w.Sub(r.t0)
	if d%time.Minute == 0 {
		return fmt.Sprintf("m%d", d/time.Minute)
	}
	return fmt.Sprintf("m%.2f", d.Minutes())
}

func (r *replay) labels(kind string, minutes ...int) []string {
	var out []string
	for _, i := range minutes {
		out = append(out, r.label(r.minute(float64(i)))+" "+kind)
	}
	return out
}

func span(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func (r *replay) isSilent(key string) bool {
	return slices.ContainsFunc(r.silent, func(s ledger.SilentKey) bool { return s.Key == key })
}

var everyMinute = store.View{Schedule: "* * * * *", Mode: "schedule", LeaseTTL: "30s"}

// A key whose pods reach the database nowhere for longer than three periods
// and the grace (every cluster's pods failing before their claim, or the
// database down) is silent while that lasts, and its windows wait: once its
// pods claim again, every window of the outage is reported missed, once.
func TestAnOutageLongerThanThreePeriodsReportsEveryMissedWindow(t *testing.T) {
	r := newReplay(t, "outage", 40*time.Minute)
	key := r.key("report")
	for i := range 10 {
		r.ran(key, everyMinute, float64(i), "dc-a")
	}
	r.detect(r.minute(10.5))
	// Minutes 10 to 17: no row, no decision, no view anywhere.
	for _, at := range []float64{12.5, 15.5, 17.5} {
		r.detect(r.minute(at))
	}
	if !r.isSilent(key) {
		t.Errorf("%s has had no window for eight minutes: it should be silent", key)
	}
	for i := 18; i < 26; i++ {
		r.ran(key, everyMinute, float64(i), "dc-a")
		if i == 20 {
			r.detect(r.minute(20.5))
		}
	}
	r.detect(r.minute(26.5))
	if got, want := r.reported(key), r.labels(ledger.MissedNoRun, span(10, 17)...); !slices.Equal(got, want) {
		t.Errorf("an outage of minutes 10 to 17 of %s: reported %q, want each of %q once", key, got, want)
	}
}

// The ledger is best-effort: a herd or a slow database drops its writes. A
// key whose windows are claimed every minute is not silent for want of
// ledger rows, and its window that ran nowhere is found.
func TestAKeyWhoseLedgerWritesAreLostIsNotSilent(t *testing.T) {
	r := newReplay(t, "starved", 40*time.Minute)
	key := r.key("report")
	for i := range 3 {
		r.ran(key, everyMinute, float64(i), "dc-a")
	}
	r.detect(r.minute(3.5))
	// From minute 3 on every ledger write is lost; the claims go on,
	// except minute 12's, which no cluster made.
	for i := 3; i < 20; i++ {
		if i == 12 {
			continue
		}
		w := r.minute(float64(i))
		r.view(key, "dc-a", everyMinute, w.Add(3*time.Second))
		r.row(key, w, "dc-a", store.StateSucceeded, w.Add(5*time.Second), w.Add(15*time.Second))
	}
	r.detect(r.minute(20.5))
	if r.isSilent(key) {
		t.Errorf("%s claimed a window every minute but is silent: silence was read from the ledger", key)
	}
	if got, want := r.reported(key), r.labels(ledger.MissedNoRun, 12); !slices.Equal(got, want) {
		t.Errorf("%s with its ledger writes lost: reported %q, want %q", key, got, want)
	}
}

// A cluster that starts running a CronJob records its first view, with the
// same content as the others' and a new changed_at; the windows still in
// their grace then (here missed-after 5m) are judged all the same.
func TestANewClustersFirstViewDoesNotSkipWindowsInTheirGrace(t *testing.T) {
	r := newReplay(t, "joins", 40*time.Minute)
	key := r.key("report")
	v := everyMinute
	v.MissedAfter = "5m"
	for i := 0; i <= 10; i++ {
		if i != 8 { // minute 8 ran nowhere
			r.ran(key, v, float64(i), "dc-a")
		}
		if i == 5 {
			r.detect(r.minute(5.5))
		}
	}
	r.detect(r.minute(10.5))
	// From minute 11 on, dc-b's pods record their view after dc-a's: the
	// newest view is dc-b's, changed at 11.
	for i := 11; i <= 20; i++ {
		r.ran(key, v, float64(i), "dc-a", "dc-b")
		if i == 11 || i == 15 {
			r.detect(r.minute(float64(i) + 0.5))
		}
	}
	r.detect(r.minute(20.5))
	if got, want := r.reported(key), r.labels(ledger.MissedNoRun, 8); !slices.Equal(got, want) {
		t.Errorf("dc-b joined at minute 11 while minute 8 was in its grace: reported %q, want %q", got, want)
	}
}

// An edit of a view that leaves the schedule alone (the lease TTL here, or
// catchup) does not skip the windows still in their grace.
func TestAViewEditDoesNotSkipWindowsInTheirGrace(t *testing.T) {
	r := newReplay(t, "edit", 40*time.Minute)
	key := r.key("report")
	v := everyMinute
	v.MissedAfter = "5m"
	edited := v
	edited.LeaseTTL = "1m"
	for i := 0; i <= 20; i++ {
		switch {
		case i == 8: // ran nowhere
		case i < 11:
			r.ran(key, v, float64(i), "dc-a")
		default:
			r.ran(key, edited, float64(i), "dc-a")
		}
		if i == 5 || i == 10 || i == 11 || i == 15 {
			r.detect(r.minute(float64(i) + 0.5))
		}
	}
	r.detect(r.minute(20.5))
	if got, want := r.reported(key), r.labels(ledger.MissedNoRun, 8); !slices.Equal(got, want) {
		t.Errorf("the lease TTL was edited at minute 11 while minute 8 was in its grace: reported %q, want %q", got, want)
	}
}

// A schedule change judges the windows before it with the old schedule and
// those from its first window on with the new one: the old schedule's
// window still in its grace at the change is found missed, and no tick of
// the new schedule from before the change is.
func TestAScheduleChangeJudgesTheWindowsBeforeItWithTheOldSchedule(t *testing.T) {
	r := newReplay(t, "reschedule", 100*time.Minute)
	r.t0 = r.t0.Truncate(time.Hour) // minute 0 is a tick of both schedules
	key := r.key("report")
	every10 := store.View{Schedule: "*/10 * * * *", Mode: "schedule", LeaseTTL: "30s"}
	every15 := every10
	every15.Schedule = "*/15 * * * *"
	ran := map[int]store.View{0: every10, 10: every10, 20: every10, 30: every10, 45: every15, 60: every15, 75: every15}
	// Minute 40 (*/10) ran nowhere; from minute 45 on the CronJob is */15.
	for m := 0; m <= 85; m++ {
		if v, ok := ran[m]; ok {
			r.ran(key, v, float64(m), "dc-a")
		}
		if m%5 == 0 {
			r.detect(r.minute(float64(m) + 0.5))
		}
	}
	if got, want := r.reported(key), r.labels(ledger.MissedNoRun, 40); !slices.Equal(got, want) {
		t.Errorf("*/10 until minute 40, */15 from 45: reported %q, want %q", got, want)
	}
}

// A key back from silence (its CronJob removed or suspended everywhere, then
// back) has its windows judged from its checkpoint, at most a Lookback
// back: an outage and a removal look alike from the database, so the
// windows of the last Lookback before its return are reported missed.
func TestAKeyBackFromSilenceIsJudgedAtMostALookbackBack(t *testing.T) {
	r := newReplay(t, "back", 90*time.Minute)
	r.opts.Lookback = 30 * time.Minute
	key := r.key("report")
	for i := range 10 {
		r.ran(key, everyMinute, float64(i), "dc-a")
		r.detect(r.minute(float64(i) + 0.5))
	}
	// Removed after minute 9: silent from 13:15 on (three periods and the
	// one-minute grace after its last decision at 9:15).
	for i := 10; i < 70; i++ {
		r.detect(r.minute(float64(i) + 0.5))
	}
	if !r.isSilent(key) {
		t.Errorf("%s has had no window for an hour: it should be silent", key)
	}
	for i := 70; i < 76; i++ {
		r.ran(key, everyMinute, float64(i), "dc-a")
		r.detect(r.minute(float64(i) + 0.5))
	}
	want := append(r.labels(ledger.MissedNoRun, 10, 11), r.labels(ledger.MissedNoRun, span(41, 69)...)...)
	if got := r.reported(key); !slices.Equal(got, want) {
		t.Errorf("%s removed after minute 9, back at 70, Lookback 30m: reported %q, want %q", key, got, want)
	}
}

// The detection's write takes no lock a tenant can hold for long (it skips
// statistics rows locked by others, and dislock.missed is the owner's), and
// a lock it does meet is waited for at most missedLockTimeout: here an
// owner's session holding dislock.missed. The leader's run fails within
// seconds rather than hanging, and the next run records the window.
func TestTheDetectionsWriteDoesNotWaitLongForALock(t *testing.T) {
	r := newReplay(t, "locked", 10*time.Minute)
	key := r.key("report")
	for i := range 5 {
		if i != 2 {
			r.ran(key, everyMinute, float64(i), "dc-a")
		}
	}
	r.flush()
	ctx := context.Background()
	tx, err := r.raw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `LOCK TABLE dislock.missed IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	opts := r.opts
	opts.Now = r.minute(4.5)
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	_, err = ledger.DetectMissed(dctx, r.own, opts)
	cancel()
	if took := time.Since(start); err == nil || took > 10*time.Second {
		t.Fatalf("the detection's write behind a table lock: err %v after %s, want an error within seconds", err, took.Round(time.Millisecond))
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r.detect(r.minute(4.5))
	if got, want := r.reported(key), r.labels(ledger.MissedNoRun, 2); !slices.Equal(got, want) {
		t.Errorf("after the lock was released: reported %q, want %q", got, want)
	}
}

// The detection records every key's checkpoint and missed windows in one
// statement (qRecordMissed) that UPDATEs the key_stats rows of every
// namespace. A tenant holding a row lock on its OWN key_stats row (it has
// UPDATE on some of its columns: an open transaction, or one slow
// statement) makes that statement wait: the detection of every namespace
// times out (Compute then stores no snapshot at all). The statement is not
// cancelled (db.Dial): its backend stays, holding the locks of the rows
// it already updated — other namespaces' rows — so their agents' ledger
// writes (which upsert the same rows) wait too, and each leaves one more
// orphan backend of that namespace's role when it times out.
func TestATenantLockingItsOwnStatisticsStallsNoOtherNamespace(t *testing.T) {
	r := newHostileTenants(t)
	ctx := context.Background()
	seq := storetest.Seq()
	hostile := fmt.Sprintf("m-hostile-%d", seq)
	r.forget(t, hostile)
	hs, hraw := r.tenant(t, hostile)
	type victimNS struct {
		ns, key string
		s       *store.Store
	}
	var victims []victimNS
	for _, p := range []string{"a", "d", "g", "p", "t", "z"} {
		v := victimNS{ns: fmt.Sprintf("%s-victim-%d", p, seq)}
		v.key = v.ns + "/report"
		r.forget(t, v.ns)
		v.s, _ = r.tenant(t, v.ns)
		victims = append(victims, v)
	}
	hkeys := []string{hostile + "/x"}
	// A checkpoint is written only when a window passed its grace since
	// the last run. Every key is per minute with a missed-after (a legal
	// value, 1m..24h) that ends the grace of a window 2 s from now, so the
	// second detection below has a checkpoint to write for each. (A
	// tenant gets this on every run by giving keys of its own graces 15 s
	// apart; its victims need no such thing: with many keys, some window
	// passes its grace every run.)
	now, err := r.own.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := now.Truncate(time.Minute).Add(-time.Minute)
	grace := now.Sub(w) + 2*time.Second
	view := store.View{Schedule: "* * * * *", Mode: "schedule", LeaseTTL: "30s", MissedAfter: grace.String()}
	seen := func(s *store.Store, key string) {
		t.Helper()
		if _, err := s.RecordView(ctx, key, "dc-a", view, store.DefaultViewRecency); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordDecision(ctx, store.Decision{Key: key, Cluster: "dc-a", Job: "j", Pod: "p", Action: store.ActionRun}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.raw.Exec(ctx, `UPDATE dislock.key_stats SET first_seen = now() - interval '1 hour' WHERE lock_key = $1`, key); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range victims {
		seen(v.s, v.key)
	}
	for _, k := range hkeys {
		seen(hs, k)
	}
	if _, err := ledger.DetectMissed(ctx, r.own, ledger.MissedOptions{}); err != nil {
		t.Fatalf("baseline detection: %v", err)
	}
	storetest.AwaitDBPast(t, r.own, w.Add(grace).Add(100*time.Millisecond))

	// The tenant rewrites its own row (as its agents' ledger writes do
	// all the time) until its current version sits after the others in
	// the heap, which the detection's UPDATE scans in order.
	for i := 0; i < 400; i++ {
		var ctid string
		if err := hraw.QueryRow(ctx, `UPDATE dislock.key_stats SET duration_buckets = array_fill(0::bigint, ARRAY[32])
			WHERE lock_key = $1 RETURNING ctid::text`, hkeys[0]).Scan(&ctid); err != nil {
			t.Fatal(err)
		}
		var later bool
		if err := r.raw.QueryRow(ctx, `SELECT $1::tid > max(ctid) FILTER (WHERE lock_key <> $2) FROM dislock.key_stats WHERE starts_with(lock_key, $3)
			OR lock_key = ANY($4)`, ctid, hkeys[0], hostile+"/", func() []string {
			var ks []string
			for _, v := range victims {
				ks = append(ks, v.key)
			}
			return ks
		}()).Scan(&later); err == nil && later {
			break
		}
	}
	if rows, err := r.raw.Query(ctx, `SELECT ctid::text || ' ' || lock_key FROM dislock.key_stats ORDER BY ctid`); err == nil {
		order, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		t.Logf("heap order: %v", order)
	}
	tx, err := hraw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if tag, err := tx.Exec(ctx, `UPDATE dislock.key_stats SET last_decided = last_decided WHERE lock_key = ANY($1)`, hkeys); err != nil || tag.RowsAffected() != int64(len(hkeys)) {
		t.Fatalf("the tenant locking its own rows: %v, %v", tag, err)
	}

	// The webhook's leader runs the detection with a deadline of one
	// ledger interval (30 s); 5 s shows the same.
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	start := time.Now()
	_, derr := ledger.DetectMissed(dctx, r.own, ledger.MissedOptions{})
	cancel()
	if derr != nil {
		t.Errorf("while namespace %s holds a lock on its own key_stats rows, the owner's detection of every namespace fails after %s: %v",
			hostile, time.Since(start).Round(time.Millisecond), derr)
	}

	var vkeys []string
	for _, v := range victims {
		vkeys = append(vkeys, v.key)
	}
	if tx2, err := r.raw.Begin(ctx); err == nil {
		rows, err := tx2.Query(ctx, `SELECT lock_key FROM dislock.key_stats WHERE lock_key = ANY($1) FOR UPDATE SKIP LOCKED`, vkeys)
		if err == nil {
			free, _ := pgx.CollectRows(rows, pgx.RowTo[string])
			t.Logf("victim rows not locked by the orphaned detection: %v of %v", free, vkeys)
		}
		tx2.Rollback(ctx)
	}
	// Each victim's agent writes a decision to the ledger with the agent's
	// call timeout (at most 5 s; 2 s here).
	for _, v := range victims {
		vctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		start = time.Now()
		verr := v.s.RecordDecision(vctx, store.Decision{Key: v.key, Cluster: "dc-a", Job: "j", Pod: "p2", Action: store.ActionSkip, Reason: "x"})
		cancel()
		if verr != nil {
			t.Errorf("namespace %s's ledger write waits on the owner's orphaned detection statement (itself waiting on namespace %s's lock) and fails after %s: %v",
				v.ns, hostile, time.Since(start).Round(time.Millisecond), verr)
		}
	}
	// The victim's pods keep deciding while this lasts: every ledger write
	// that times out leaves one more backend of the victim's role waiting
	// on the orphaned detection. At the role's connection limit, the
	// victim's claims and heartbeats cannot connect.
	v := victims[0]
	vcred := storetest.Provision(t, r.own, v.ns)
	roleBackends := func() (n int) {
		r.raw.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, vcred.Role).Scan(&n)
		return n
	}
	// Ten pods of the victim namespace, each writing its few ledger rows
	// with the agent's call timeout (1 s here).
	var wg sync.WaitGroup
	for p := 0; p < 10; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ps := storetest.TenantStore(t, r.dsn, vcred)
			for i := 0; i < 8; i++ {
				wctx, cancel := context.WithTimeout(ctx, time.Second)
				ps.RecordDecision(wctx, store.Decision{Key: v.key, Cluster: "dc-a", Job: "j", Pod: fmt.Sprintf("p-%d-%d", p, i), Action: store.ActionWait, Reason: "x"})
				cancel()
			}
		}()
	}
	wg.Wait()
	t.Logf("sessions of %s's role %s after 80 ledger writes of 10 pods timed out: %d (its connection limit: %d)", v.ns, vcred.Role, roleBackends(), tenant.ConnectionLimit)
	fresh := storetest.TenantStore(t, r.dsn, vcred) // a pod starting now
	_, cerr := fresh.ClaimWindow(ctx, store.ClaimRequest{Key: v.key, Window: w.Add(time.Hour), Index: store.NotIndexed,
		Owner: store.Owner{Cluster: "dc-a", Namespace: v.ns, Job: "j", JobUID: "u", Pod: "p"}, TTL: storetest.TTL})
	_, cerr2 := v.s.ClaimWindow(ctx, store.ClaimRequest{Key: v.key, Window: w.Add(2 * time.Hour), Index: store.NotIndexed,
		Owner: store.Owner{Cluster: "dc-a", Namespace: v.ns, Job: "j2", JobUID: "u2", Pod: "p"}, TTL: storetest.TTL})
	if cerr != nil || cerr2 != nil {
		t.Errorf("after %d of namespace %s's ledger writes timed out behind the orphaned detection, its claims fail: %v / %v",
			tenant.ConnectionLimit, v.ns, cerr, cerr2)
	}
	if rows, err := r.raw.Query(ctx, `SELECT l.locktype || ' ' || coalesce(l.relation::regclass::text, '') || ' ' || l.mode || ' tuple ' || coalesce(l.page::text,'') || ',' || coalesce(l.tuple::text,'') || ' xid ' || coalesce(l.transactionid::text, '')
		FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE NOT l.granted AND a.datname = current_database()`); err == nil {
		locks, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		t.Logf("locks waited for: %v", locks)
	}
	var waiting []string
	rows, err := r.raw.Query(ctx, `SELECT usename::text, left(regexp_replace(query, '\s+', ' ', 'g'), 50) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND datname = current_database()`)
	if err == nil {
		for rows.Next() {
			var u, q string
			if rows.Scan(&u, &q) == nil {
				waiting = append(waiting, u+": "+q)
			}
		}
		rows.Close()
	}
	t.Logf("backends waiting on a lock while the tenant holds its rows (their clients gave up): %d\n  %s", len(waiting), strings.Join(waiting, "\n  "))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// Let the orphans finish before the next test.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		r.raw.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n)
		if n == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// What became of one window of a replayed key.
type outcome int

const (
	succeeded   outcome = iota // one cluster ran it
	leaseHeld                  // skipped: an earlier run held the key's lease (not missed)
	longRun                    // still running when its grace ended, then succeeded
	takenOver                  // its run failed; another cluster's standby took it over and succeeded
	runFailed                  // its run failed and nobody took it over: missed, failed
	ownerLapsed                // its owner stopped heartbeating and nobody took it over: missed, silent
	staleSkips                 // every cluster's pod skipped it as stale: missed, no-run
	down                       // no cluster's pod reached the database: missed, no-run
)

var outcomeNames = map[outcome]string{succeeded: "succeeded", leaseHeld: "lease-held", longRun: "long-run", takenOver: "taken-over",
	runFailed: "failed", ownerLapsed: "lapsed", staleSkips: "stale-skips", down: "down"}

// missedKind is the kind of miss an outcome is, or "" when the window ran.
func (o outcome) missedKind() string {
	switch o {
	case runFailed:
		return ledger.MissedFailed
	case ownerLapsed:
		return ledger.MissedSilent
	case staleSkips, down:
		return ledger.MissedNoRun
	}
	return ""
}

// replayEvent is one statement of a replayed history, at its time.
type replayEvent struct {
	at    time.Time
	queue func()
}

// seededHistory is a per-minute key's history generated from a seed:
// windows that ran (some long, some taken over, some skipped for a held
// lease), runs that failed or lapsed, windows every cluster skipped,
// outages of 1 to 10 periods (no row, no ledger, no view), clusters that
// join (a first view with the others' content), edited views (lease TTL,
// catchup), and ledger writes lost one by one and for minutes on end.
type seededHistory struct {
	seed     uint64
	key      string
	view     store.View
	outcomes []outcome
	events   []replayEvent
	notes    []string // joins, edits, lost ledger stretches, for the failure report
}

const (
	historyMinutes = 150
	// The last minutes run normally, so that by the last detection (at
	// the end of the history) every window that did not is judged: the
	// longest grace is 5m, and the longest run lasts its grace and 2.5m
	// more.
	historyTail = 12
)

func newSeededHistory(r *replay, seed uint64) *seededHistory {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	h := &seededHistory{seed: seed, key: r.key(fmt.Sprintf("job-%d", seed)), view: everyMinute}
	h.view.MissedAfter = []string{"", "2m", "5m"}[rng.IntN(3)]
	grace := ledger.DefaultMissedGrace(time.Minute)
	if h.view.MissedAfter != "" {
		grace, _ = time.ParseDuration(h.view.MissedAfter)
	}
	h.outcomes = make([]outcome, historyMinutes)
	for i := 0; i < historyMinutes; {
		last := i >= historyMinutes-historyTail
		switch p := rng.Float64(); {
		case i < 3 || last:
			h.outcomes[i] = succeeded
		case p < 0.04:
			for n := 1 + rng.IntN(10); n > 0 && i < historyMinutes-historyTail; n-- {
				h.outcomes[i] = down
				i++
			}
			continue
		case p < 0.80:
			h.outcomes[i] = succeeded
		case p < 0.83:
			h.outcomes[i] = leaseHeld
		case p < 0.86:
			h.outcomes[i] = longRun
		case p < 0.89:
			h.outcomes[i] = takenOver
		case p < 0.92:
			h.outcomes[i] = runFailed
		case p < 0.96:
			h.outcomes[i] = ownerLapsed
		default:
			h.outcomes[i] = staleSkips
		}
		i++
	}

	clusters := []string{"dc-a"}
	views := map[string]store.View{"dc-a": h.view}
	starvedUntil := -1
	at := func(m int, after time.Duration, f func()) {
		h.events = append(h.events, replayEvent{at: r.minute(float64(m)).Add(after), queue: f})
	}
	for m, o := range h.outcomes {
		if o == down {
			continue
		}
		if m >= 3 && m < historyMinutes-historyTail {
			switch p := rng.Float64(); {
			case p < 0.03 && len(clusters) < 4:
				c := fmt.Sprintf("dc-%c", 'a'+len(clusters))
				clusters = append(clusters, c)
				views[c] = views["dc-a"]
				h.notes = append(h.notes, fmt.Sprintf("m%d %s joins", m, c))
			case p < 0.06:
				c := clusters[rng.IntN(len(clusters))]
				v := views[c]
				v.LeaseTTL = []string{"30s", "45s", "1m"}[rng.IntN(3)]
				v.Catchup = []string{"", "5m", "30m"}[rng.IntN(3)]
				views[c] = v
				h.notes = append(h.notes, fmt.Sprintf("m%d %s's view edited", m, c))
			case p < 0.09:
				starvedUntil = m + 5 + rng.IntN(20)
				h.notes = append(h.notes, fmt.Sprintf("m%d..m%d ledger lost", m, starvedUntil))
			}
		}
		w := r.minute(float64(m))
		decide := func(after time.Duration, c string, a store.Action) {
			if m <= starvedUntil || rng.Float64() < 0.2 {
				return
			}
			at(m, after, func() { r.decided(h.key, w, c, a, w.Add(after)) })
		}
		// Each cluster's pod records its view a few seconds after the
		// tick, in a random order; the first to claim owns the window.
		order := slices.Clone(clusters)
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for j, c := range order {
			v, after := views[c], time.Duration(2+j)*time.Second
			at(m, after, func() { r.view(h.key, c, v, w.Add(after)) })
		}
		first, claim := order[0], 2*time.Second+time.Duration(len(order))*time.Second
		row := func(after time.Duration, c string, s store.State, alive time.Duration) {
			at(m, after, func() { r.row(h.key, w, c, s, w.Add(claim), w.Add(after+alive)) })
		}
		switch o {
		case staleSkips:
			for _, c := range order {
				decide(claim, c, store.ActionSkip)
			}
			continue
		case leaseHeld:
			row(claim, first, store.StateSkipped, 0)
			decide(claim, first, store.ActionSkip)
			continue
		}
		runFor := time.Duration(5+rng.IntN(20)) * time.Second
		switch o {
		case longRun: // heartbeats keep it alive past its grace
			runFor = grace + time.Duration(30+rng.IntN(120))*time.Second
		case ownerLapsed:
			runFor = 30 * time.Second
		}
		row(claim, first, store.StateRunning, runFor+30*time.Second)
		decide(claim, first, store.ActionRun)
		end := claim + runFor
		switch o {
		case succeeded, longRun:
			row(end, first, store.StateSucceeded, 0)
			decide(end, first, store.ActionSucceeded)
		case runFailed:
			row(end, first, store.StateFailed, 0)
			decide(end, first, store.ActionFailed)
		case takenOver:
			row(end, first, store.StateFailed, 0)
			decide(end, first, store.ActionFailed)
			standby := order[len(order)-1]
			row(end+10*time.Second, standby, store.StateRunning, 40*time.Second)
			decide(end+10*time.Second, standby, store.ActionTakeover)
			row(end+20*time.Second, standby, store.StateSucceeded, 0)
			decide(end+20*time.Second, standby, store.ActionSucceeded)
		}
	}
	slices.SortStableFunc(h.events, func(a, b replayEvent) int { return a.at.Compare(b.at) })
	return h
}

func earlierOf(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// want lists the windows that ran nowhere with their kinds.
func (h *seededHistory) want(r *replay) []string {
	var out []string
	for m, o := range h.outcomes {
		if k := o.missedKind(); k != "" {
			out = append(out, r.label(r.minute(float64(m)))+" "+k)
		}
	}
	return out
}

// The rule of docs/windows.md, searched rather than replayed: every window
// that ran nowhere is reported exactly once, and no window that ran is,
// whatever outages, joining clusters, edited views, lost ledger writes and
// pauses of the detection came between. Each seed makes one key's history
// (per minute, 150 minutes); one detection run judges them all, at times
// generated from the first seed. Reproduce a failure with
// -missed.seed=<first seed> -missed.seeds=<count>.
func TestMissedDetectionReportsEveryWindowThatRanNowhereOnce(t *testing.T) {
	first := *missedSeed
	if first == 0 {
		first = uint64(time.Now().UnixNano()%1_000_000_000) + 1
	}
	n := *missedSeeds
	t.Logf("seeds %d..%d (-missed.seed=%d -missed.seeds=%d)", first, first+uint64(n)-1, first, n)
	start := time.Now()
	r := newReplay(t, "seeded", historyMinutes*time.Minute)
	var hs []*seededHistory
	var events []replayEvent
	for i := range n {
		h := newSeededHistory(r, first+uint64(i))
		hs = append(hs, h)
		events = append(events, h.events...)
	}
	slices.SortStableFunc(events, func(a, b replayEvent) int { return a.at.Compare(b.at) })

	// The detection runs about every 30 s and pauses for minutes now and
	// then (the leader changes, the database is down); it runs last at
	// the end of the history.
	rng := rand.New(rand.NewPCG(first, 1))
	end := r.minute(historyMinutes - 0.5)
	detections := 0
	for at := r.minute(0.5); ; {
		at = earlierOf(at, end)
		for len(events) > 0 && !events[0].at.After(at) {
			events[0].queue()
			events = events[1:]
		}
		r.detect(at)
		detections++
		if at.Equal(end) {
			break
		}
		step := time.Duration(20+rng.IntN(20)) * time.Second
		if rng.Float64() < 0.04 {
			step += time.Duration(1+rng.IntN(9)) * time.Minute
		}
		at = at.Add(step)
	}
	for _, h := range hs {
		want := h.want(r)
		got := r.reported(h.key)
		if slices.Equal(got, want) {
			continue
		}
		var missing, extra []string
		for _, w := range want {
			if !slices.Contains(got, w) {
				missing = append(missing, w)
			}
		}
		for i, g := range got {
			if !slices.Contains(want, g) || slices.Contains(got[:i], g) {
				extra = append(extra, g)
			}
		}
		var timeline []string
		for m, o := range h.outcomes {
			if o != succeeded {
				timeline = append(timeline, fmt.Sprintf("m%d %s", m, outcomeNames[o]))
			}
		}
		t.Errorf("seed %d (first seed %d), key %s, missed-after %q: not reported %q; reported wrongly or twice %q\n  windows that did not simply succeed: %s\n  events: %s",
			h.seed, first, h.key, h.view.MissedAfter, missing, extra, strings.Join(timeline, ", "), strings.Join(h.notes, ", "))
	}
	t.Logf("%d keys, %d detections, %s", n, detections, time.Since(start).Round(time.Millisecond))
}

// A tenant's view is its own row: one whose schedule no CronJob would have
// (valid cron, but longer than a key's checkpoint keeps) once failed the
// detection's one write for every namespace, every run. Its key is a
// problem now, and the other namespaces' windows are judged.
func TestOneTenantsOversizedViewDoesNotStopEveryNamespacesDetection(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Need(t).DirectDSN()
	r := newReplay(t, "victim", 10*time.Minute)
	key := r.key("report")
	for i := range 5 {
		if i != 2 {
			r.ran(key, everyMinute, float64(i), "dc-a")
		}
	}
	r.flush()
	evil := storetest.Namespace(t, "evil")
	asTenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, storetest.Provision(t, r.own, evil)))
	v, err := json.Marshal(store.View{Schedule: strings.Repeat("0,", 600) + "0 * * * *", Mode: "schedule", LeaseTTL: "30s"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := asTenant.Exec(ctx, `INSERT INTO dislock.views (lock_key, cluster, view, seen_at, changed_at) VALUES ($1, 'dc-a', $2::jsonb, now(), now())`, evil+"/job", string(v)); err != nil {
		t.Fatal(err)
	}
	if _, err := asTenant.Exec(ctx, `INSERT INTO dislock.key_stats (lock_key, first_seen, last_decided) VALUES ($1, now(), now())`, evil+"/job"); err != nil {
		t.Fatal(err)
	}
	det, err := ledger.DetectMissed(ctx, r.own, ledger.MissedOptions{Now: r.minute(4.5)}) // every namespace, as the leader does
	if err != nil {
		t.Fatalf("the leader's detection: %v", err)
	}
	var n int
	if err := r.raw.QueryRow(ctx, `SELECT count(*) FROM dislock.missed WHERE lock_key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || !slices.ContainsFunc(det.Problems, func(p string) bool { return strings.HasPrefix(p, evil+"/job: ") }) {
		t.Fatalf("the victim's window m2 recorded %d times (want 1); problems %q (want the tenant's key named)", n, det.Problems)
	}
}

// What one namespace's rows cost the detection of every namespace: a
// tenant writes key_stats rows for MaxKeysPerNamespace keys of its own, first
// seen a day ago (INSERT lets it set first_seen; last_decided in the future
// keeps them from ever being silent), and one view each with the schedule
// "* * * * *". The next detection judges MaxKeysPerNamespace × 1440 windows,
// finds them all missed, and explains and inserts them in one statement,
// within the leader's 30 s budget shared with the rest of Compute.
func TestOneNamespaceCannotSetTheSizeOfEveryDetection(t *testing.T) {
	r := newHostileTenants(t)
	ctx := context.Background()
	hostile := storetest.Namespace(t, "hostile")
	r.forget(t, hostile)
	_, hraw := r.tenant(t, hostile)
	keys := envInt("DISLOCK_TEST_FLOODED_KEYS", 200)
	if _, err := hraw.Exec(ctx, `INSERT INTO dislock.key_stats (lock_key, first_seen, last_decided)
		SELECT $1::text || '/k' || i, now() - interval '24 hours', now() + interval '10 years' FROM generate_series(1, $2::int) i`, hostile, keys); err != nil {
		t.Fatalf("the tenant writing its own statistics: %v", err)
	}
	if _, err := hraw.Exec(ctx, `INSERT INTO dislock.views (lock_key, cluster, view, seen_at)
		SELECT $1::text || '/k' || i, 'dc-a', '{"schedule":"* * * * *","mode":"schedule"}'::jsonb, now() FROM generate_series(1, $2::int) i`, hostile, keys); err != nil {
		t.Fatalf("the tenant writing its own views: %v", err)
	}
	// Where views record when they changed (changed_at), the tenant dates
	// its own views back too (it may update that column).
	hraw.Exec(ctx, `UPDATE dislock.views SET changed_at = now() - interval '24 hours' WHERE starts_with(lock_key, $1::text)`, hostile+"/")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second) // DefaultLedgerInterval: Compute's whole budget
	defer cancel()
	start := time.Now()
	det, err := ledger.DetectMissed(dctx, r.own, ledger.MissedOptions{})
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	t.Logf("%d keys of one namespace: detection took %s, judged %d windows, %d new missed, %d MiB allocated (peak heap %d MiB), err %v",
		keys, took.Round(time.Millisecond), det.Windows, len(det.New), (after.TotalAlloc-before.TotalAlloc)>>20, after.HeapSys>>20, err)
	if err != nil {
		t.Errorf("%d keys of one tenant make the detection of every namespace fail: %v", keys, err)
	}
	if det.Windows > 10*ledger.MaxKeysPerNamespace {
		t.Errorf("one namespace made one detection judge %d windows and record %d missed ones (scales as keys × MaxWindowsPerKey, up to %d × %d per namespace per run)",
			det.Windows, len(det.New), ledger.MaxKeysPerNamespace, ledger.DefaultMaxWindowsPerKey)
	}
}

// A key's windows are judged from sched.Next(first_seen), and first_seen
// is the database time of the key's first decision, which comes after the
// window's start (the pod starts after the tick). So the window whose pod
// created the key's statistics is never judged: if its run failed and
// nobody took over, the miss is never found. Retention makes that window
// recur: it deletes key_stats of a key nothing decided for within the
// retention (30 days by default), which is every monthly (31-day months) or
// yearly CronJob; its next window re-creates the row, with a new first_seen,
// and is never judged either.
func TestTheWindowOfAKeysFirstDecisionIsJudged(t *testing.T) {
	r := newHostileTenants(t)
	ctx := context.Background()
	ns := storetest.Namespace(t, "first")
	r.forget(t, ns)
	s, _ := r.tenant(t, ns)
	key := ns + "/report"
	now, err := r.own.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := now.Truncate(time.Minute).Add(-3 * time.Minute) // grace (1 min) long over
	view := store.View{Schedule: "* * * * *", Mode: "schedule", LeaseTTL: "30s"}
	if _, err := s.RecordView(ctx, key, "dc-a", view, store.DefaultViewRecency); err != nil {
		t.Fatal(err)
	}
	o := store.Owner{Cluster: "dc-a", Namespace: ns, Job: "report-1", JobUID: "uid", Pod: "p"}
	c := storetest.MustClaim(t, s, key, w, o, false, storetest.TTL, store.Claimed)
	if err := s.RecordDecision(ctx, store.Decision{Key: key, Window: w, Cluster: "dc-a", Job: "report-1", Pod: "p", Action: store.ActionRun, Token: c.Window.Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Finish(ctx, key, w, store.NotIndexed, c.Window.Token, store.StateFailed, storetest.Ptr(1)); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordDecision(ctx, store.Decision{Key: key, Window: w, Cluster: "dc-a", Job: "report-1", Pod: "p", Action: store.ActionFailed, Token: c.Window.Token}); err != nil {
		t.Fatal(err)
	}
	// As in production: the pod's first decision came 5 s after the tick.
	if _, err := r.raw.Exec(ctx, `UPDATE dislock.key_stats SET first_seen = $2 WHERE lock_key = $1`, key, w.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.raw.Exec(ctx, `UPDATE dislock.views SET changed_at = $2 WHERE lock_key = $1`, key, w.Add(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Later windows ran fine; the key is alive.
	for i := 1; i <= 2; i++ {
		wi := w.Add(time.Duration(i) * time.Minute)
		ci := storetest.MustClaim(t, s, key, wi, o, false, storetest.TTL, store.Claimed)
		if _, err := s.Finish(ctx, key, wi, store.NotIndexed, ci.Window.Token, store.StateSucceeded, storetest.Ptr(0)); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // and again: judged once means never again
		det, err := ledger.DetectMissed(ctx, r.own, ledger.MissedOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range det.New {
			if m.Key == key && m.Window.Equal(w) {
				return
			}
		}
	}
	missed, _, _ := ledger.ListMissed(ctx, r.own, ledger.MissedFilter{Key: key})
	if len(missed) == 0 {
		t.Errorf("window %s of %s failed and nobody took it over, its grace is over, and it is never found missed: it is the window whose pod created the key's statistics (judging starts after first_seen)",
			w.Format(time.RFC3339), key)
	}
}

// The detection judges a key's windows since its checkpoint with the
// NEWEST view's schedule. A CronJob whose schedule changes from hourly to
// every 10 minutes had its checkpoint an hour (the old grace) back; the
// first detection after the change judges the new schedule's ticks of that
// past hour, which were never ticks, and pages for each.
func TestAScheduleChangeMakesNoPastNonTickMissed(t *testing.T) {
	r := newHostileTenants(t)
	ctx := context.Background()
	ns := storetest.Namespace(t, "change")
	r.forget(t, ns)
	s, _ := r.tenant(t, ns)
	key := ns + "/report"
	o := store.Owner{Cluster: "dc-a", Namespace: ns, Job: "report-1", JobUID: "uid", Pod: "p"}
	now, err := r.own.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hourly := store.View{Schedule: "0 * * * *", Mode: "schedule", LeaseTTL: "30s"}
	if _, err := s.RecordView(ctx, key, "dc-a", hourly, store.DefaultViewRecency); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordDecision(ctx, store.Decision{Key: key, Cluster: "dc-a", Job: "j", Pod: "p", Action: store.ActionRun}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.raw.Exec(ctx, `UPDATE dislock.key_stats SET first_seen = now() - interval '5 hours' WHERE lock_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	// Every hourly tick since its first decision, 5 hours ago, ran and
	// succeeded.
	for h := now.Truncate(time.Hour).Add(-5 * time.Hour); !h.After(now); h = h.Add(time.Hour) {
		c := storetest.MustClaim(t, s, key, h, o, false, storetest.TTL, store.Claimed)
		if _, err := s.Finish(ctx, key, h, store.NotIndexed, c.Window.Token, store.StateSucceeded, storetest.Ptr(0)); err != nil {
			t.Fatal(err)
		}
	}
	det, err := ledger.DetectMissed(ctx, r.own, ledger.MissedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range det.New {
		if m.Key == key {
			t.Fatalf("the hourly key missed %s before the change", m.Window)
		}
	}
	// Now the CronJob is changed to */10 everywhere: its next pod records
	// the new view (a later seen_at) and runs.
	time.Sleep(10 * time.Millisecond)
	every10 := hourly
	every10.Schedule = "*/10 * * * *"
	if _, err := s.RecordView(ctx, key, "dc-a", every10, store.DefaultViewRecency); err != nil {
		t.Fatal(err)
	}
	det, err = ledger.DetectMissed(ctx, r.own, ledger.MissedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var false_ []string
	for _, m := range det.New {
		if m.Key == key {
			false_ = append(false_, m.Window.Format("15:04")+" "+m.Kind)
		}
	}
	if len(false_) > 0 {
		t.Errorf("right after %s's schedule changed from hourly to */10, the detection found %d windows missed that were never ticks (each pages DislockWindowMissed, critical): %v",
			key, len(false_), false_)
	}
}

// A view's missed-after is a value dislock.io/missed-after accepts, or
// none: one outside its bounds, or one that does not parse (a tenant
// writes its own views), is a problem naming the annotation, and the key's
// windows wait; they are not judged with the default grace instead.
func TestAMissedAfterOutsideItsBoundsIsAProblemNotTheDefault(t *testing.T) {
	r := newReplay(t, "after", 10*time.Minute)
	bad := map[string]string{r.key("short"): "30s", r.key("long"): "48h", r.key("word"): "soon"}
	for key, after := range bad {
		v := everyMinute
		v.MissedAfter = after
		r.ran(key, v, 0, "dc-a")
		r.ran(key, v, 2, "dc-a") // minute 1 ran nowhere
	}
	det := r.detect(r.minute(8))
	for key, after := range bad {
		if !slices.ContainsFunc(det.Problems, func(p string) bool {
			return strings.HasPrefix(p, key+": ") && strings.Contains(p, contract.AnnotationMissedAfter) && strings.Contains(p, strconv.Quote(after))
		}) {
			t.Errorf("missed-after %q of %s: problems %q, want one naming %s and the value", after, key, det.Problems, contract.AnnotationMissedAfter)
		}
		if got := r.reported(key); len(got) != 0 {
			t.Errorf("missed-after %q of %s: windows judged anyway: %v", after, key, got)
		}
	}
}
