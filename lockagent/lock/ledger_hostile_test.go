package lock_test

// Attacks on the ledger, the missed-window detection and the statistics the
// metrics read, by a tenant through its own rows and by ordinary production
// trouble. Each one broke something for other namespaces before it was
// fixed; each test fails if it comes back.

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/test/pgtest"
)

// hostile16 is one attack's setting: the owner's Store and a raw owner connection
// on the direct DSN.
type hostile16 struct {
	dsn string
	own *lock.Store
	raw *pgx.Conn
}

func newHostile16(t *testing.T) hostile16 {
	t.Helper()
	dsn := pgtest.Need(t).DirectDSN()
	own := openStore(t, dsn, 4)
	return hostile16{dsn: dsn, own: own, raw: rawConn(t, dsn)}
}

// tenant provisions ns and returns its Store and a raw connection with its
// role.
func (r hostile16) tenant(t *testing.T, ns string) (*lock.Store, *pgx.Conn) {
	t.Helper()
	c := provision(t, r.own, ns)
	return tenantStore(t, r.dsn, c), rawConn(t, mustTenantDSN(t, r.dsn, c))
}

// forget deletes, as the owner, every ledger, window, lease and view row of
// ns: the tests share one database and DetectMissed reads all of it.
func (r hostile16) forget(t *testing.T, ns string) {
	t.Helper()
	t.Cleanup(func() {
		for _, table := range []string{"decisions", "decision_counts", "key_stats", "missed", "windows", "leases", "views"} {
			if _, err := r.raw.Exec(context.Background(), `DELETE FROM dislock.`+table+` WHERE starts_with(lock_key, $1::text)`, ns+"/"); err != nil {
				t.Logf("cleaning %s of %s: %v", table, ns, err)
			}
		}
	})
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// A tenant may write the statistics of its own keys, and the owner reads
// every namespace's in one query: a value the metrics cannot serve (a NULL
// or two-dimensional histogram, a NaN or infinite duration, a negative
// count) would fail that read, or the snapshot's encoding, for every
// namespace. The database refuses each; the owner's read goes on.
func TestATenantCannotWriteStatisticsTheOwnersMetricsCannotServe(t *testing.T) {
	r := newHostile16(t)
	ctx := context.Background()
	victim, hostile := namespace(t, "victim"), namespace(t, "hostile")
	r.forget(t, victim)
	r.forget(t, hostile)
	vs, _ := r.tenant(t, victim)
	hs, hraw := r.tenant(t, hostile)
	for _, d := range []struct {
		s   *lock.Store
		key string
	}{{vs, victim + "/report"}, {hs, hostile + "/x"}} {
		if err := d.s.RecordDecision(ctx, lock.Decision{Key: d.key, Cluster: "dc-a", Job: "j", Pod: "p", Action: lock.ActionRun}); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []struct{ set, value string }{
		{"duration_buckets = $2::bigint[]", "{NULL}"},
		{"duration_buckets = $2::bigint[]", "{{1,2},{3,4}}"},
		{"duration_buckets = $2::bigint[]", "[5:6]={1,2}"},
		{"duration_buckets = $2::bigint[]", "{1,NULL,3}"},
		{"duration_buckets = $2::bigint[]", "{1,-1}"},
		{"duration_sum = $2::float8", "NaN"},
		{"duration_sum = $2::float8", "Infinity"},
		{"duration_sum = $2::float8", "-Infinity"},
		{"duration_count = $2::bigint", "-5"},
	} {
		_, err := hraw.Exec(ctx, `UPDATE dislock.key_stats SET `+bad.set+` WHERE lock_key = $1`, hostile+"/x", bad.value)
		if err == nil {
			t.Errorf("the tenant wrote %s with %q into its own statistics", bad.set, bad.value)
		}
	}
	st, err := r.own.ReadLedgerStats(ctx)
	if err != nil {
		t.Fatalf("the owner's statistics after the tenant's attempts: %v", err)
	}
	keyStats(t, st, victim+"/report")
}

// The detection records every key's checkpoint and missed windows in one
// statement (qRecordMissed) that UPDATEs the key_stats rows of every
// namespace. A tenant holding a row lock on its OWN key_stats row (it has
// UPDATE on some of its columns: an open transaction, or one slow
// statement) makes that statement wait: the detection of every namespace
// times out (Compute then stores no snapshot at all). The statement is not
// cancelled (neverCancel): its backend stays, holding the locks of the rows
// it already updated — other namespaces' rows — so their agents' ledger
// writes (which upsert the same rows) wait too, and each leaves one more
// orphan backend of that namespace's role when it times out.
func TestATenantLockingItsOwnStatisticsStallsNoOtherNamespace(t *testing.T) {
	r := newHostile16(t)
	ctx := context.Background()
	seq := keySeq.Add(1)
	hostile := fmt.Sprintf("m-hostile-%d", seq)
	r.forget(t, hostile)
	hs, hraw := r.tenant(t, hostile)
	type victimNS struct {
		ns, key string
		s       *lock.Store
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
	view := lock.View{Schedule: "* * * * *", Mode: "schedule", LeaseTTL: "30s", MissedAfter: grace.String()}
	seen := func(s *lock.Store, key string) {
		t.Helper()
		if _, err := s.RecordView(ctx, key, "dc-a", view, lock.DefaultViewRecency); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordDecision(ctx, lock.Decision{Key: key, Cluster: "dc-a", Job: "j", Pod: "p", Action: lock.ActionRun}); err != nil {
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
	if _, err := r.own.DetectMissed(ctx, lock.MissedOptions{}); err != nil {
		t.Fatalf("baseline detection: %v", err)
	}
	awaitDBPast(t, r.own, w.Add(grace).Add(100*time.Millisecond))

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
	_, derr := r.own.DetectMissed(dctx, lock.MissedOptions{})
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
		verr := v.s.RecordDecision(vctx, lock.Decision{Key: v.key, Cluster: "dc-a", Job: "j", Pod: "p2", Action: lock.ActionSkip, Reason: "x"})
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
	vcred := provision(t, r.own, v.ns)
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
			ps := tenantStore(t, r.dsn, vcred)
			for i := 0; i < 8; i++ {
				wctx, cancel := context.WithTimeout(ctx, time.Second)
				ps.RecordDecision(wctx, lock.Decision{Key: v.key, Cluster: "dc-a", Job: "j", Pod: fmt.Sprintf("p-%d-%d", p, i), Action: lock.ActionWait, Reason: "x"})
				cancel()
			}
		}()
	}
	wg.Wait()
	t.Logf("sessions of %s's role %s after 80 ledger writes of 10 pods timed out: %d (its connection limit: %d)", v.ns, vcred.Role, roleBackends(), lock.TenantConnectionLimit)
	fresh := tenantStore(t, r.dsn, vcred) // a pod starting now
	_, cerr := fresh.ClaimWindow(ctx, lock.ClaimRequest{Key: v.key, Window: w.Add(time.Hour), Index: lock.NotIndexed,
		Owner: lock.Owner{Cluster: "dc-a", Namespace: v.ns, Job: "j", JobUID: "u", Pod: "p"}, TTL: ttl})
	_, cerr2 := v.s.ClaimWindow(ctx, lock.ClaimRequest{Key: v.key, Window: w.Add(2 * time.Hour), Index: lock.NotIndexed,
		Owner: lock.Owner{Cluster: "dc-a", Namespace: v.ns, Job: "j2", JobUID: "u2", Pod: "p"}, TTL: ttl})
	if cerr != nil || cerr2 != nil {
		t.Errorf("after %d of namespace %s's ledger writes timed out behind the orphaned detection, its claims fail: %v / %v",
			lock.TenantConnectionLimit, v.ns, cerr, cerr2)
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

// The statistics read "at most 1000 keys per namespace", but the held
// leases of a key in bounds are read without any bound: an Indexed Job's
// per-index lease keys are "<key>#<index>", and a tenant may insert as many
// lease rows under its prefix as it likes. Every one of them is read, every
// computation, into the leader's memory.
func TestTheHeldLeasesOfOneKeyAreReadAsOneRow(t *testing.T) {
	r := newHostile16(t)
	ctx := context.Background()
	hostile := namespace(t, "hostile")
	r.forget(t, hostile)
	hs, hraw := r.tenant(t, hostile)
	key := hostile + "/x"
	if err := hs.RecordDecision(ctx, lock.Decision{Key: key, Cluster: "dc-a", Job: "j", Pod: "p", Action: lock.ActionRun}); err != nil {
		t.Fatal(err)
	}
	n := envInt("R16_LEASES", 5*lock.MaxKeysPerNamespace)
	if _, err := hraw.Exec(ctx, `INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at)
		SELECT $1::text || '#' || i, 'x', 1, now(), now() + interval '1 day' FROM generate_series(1, $2::int) i`, key, n); err != nil {
		t.Fatalf("the tenant inserting lease rows under its own prefix: %v", err)
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	st, err := r.own.ReadLedgerStats(ctx)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	got := 0
	for _, l := range st.Leases {
		if strings.HasPrefix(l.Key, hostile+"/") {
			got++
		}
	}
	t.Logf("%d lease rows of one key read in %s (leases query %s), %d MiB allocated", got, took.Round(time.Millisecond),
		st.QueryTime["leases"].Round(time.Millisecond), (after.TotalAlloc-before.TotalAlloc)>>20)
	if got > lock.MaxKeysPerNamespace {
		t.Errorf("the owner's statistics read %d held leases of namespace %s (one key); nothing bounds them (MaxKeysPerNamespace %d bounds only key_stats)",
			got, hostile, lock.MaxKeysPerNamespace)
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
	r := newHostile16(t)
	ctx := context.Background()
	hostile := namespace(t, "hostile")
	r.forget(t, hostile)
	_, hraw := r.tenant(t, hostile)
	keys := envInt("R16_KEYS", 200)
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
	det, err := r.own.DetectMissed(dctx, lock.MissedOptions{})
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	t.Logf("%d keys of one namespace: detection took %s, judged %d windows, %d new missed, %d MiB allocated (peak heap %d MiB), err %v",
		keys, took.Round(time.Millisecond), det.Windows, len(det.New), (after.TotalAlloc-before.TotalAlloc)>>20, after.HeapSys>>20, err)
	if err != nil {
		t.Errorf("%d keys of one tenant make the detection of every namespace fail: %v", keys, err)
	}
	if det.Windows > 10*lock.MaxKeysPerNamespace {
		t.Errorf("one namespace made one detection judge %d windows and record %d missed ones (scales as keys × MaxWindowsPerKey, up to %d × %d per namespace per run)",
			det.Windows, len(det.New), lock.MaxKeysPerNamespace, lock.DefaultMaxWindowsPerKey)
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
	r := newHostile16(t)
	ctx := context.Background()
	ns := namespace(t, "first")
	r.forget(t, ns)
	s, _ := r.tenant(t, ns)
	key := ns + "/report"
	now, err := r.own.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := now.Truncate(time.Minute).Add(-3 * time.Minute) // grace (1 min) long over
	view := lock.View{Schedule: "* * * * *", Mode: "schedule", LeaseTTL: "30s"}
	if _, err := s.RecordView(ctx, key, "dc-a", view, lock.DefaultViewRecency); err != nil {
		t.Fatal(err)
	}
	o := lock.Owner{Cluster: "dc-a", Namespace: ns, Job: "report-1", JobUID: "uid", Pod: "p"}
	c := mustClaim(t, s, key, w, o, false, ttl, lock.Claimed)
	if err := s.RecordDecision(ctx, lock.Decision{Key: key, Window: w, Cluster: "dc-a", Job: "report-1", Pod: "p", Action: lock.ActionRun, Token: c.Window.Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Finish(ctx, key, w, lock.NotIndexed, c.Window.Token, lock.StateFailed, ptr(1)); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordDecision(ctx, lock.Decision{Key: key, Window: w, Cluster: "dc-a", Job: "report-1", Pod: "p", Action: lock.ActionFailed, Token: c.Window.Token}); err != nil {
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
		ci := mustClaim(t, s, key, wi, o, false, ttl, lock.Claimed)
		if _, err := s.Finish(ctx, key, wi, lock.NotIndexed, ci.Window.Token, lock.StateSucceeded, ptr(0)); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // and again: judged once means never again
		det, err := r.own.DetectMissed(ctx, lock.MissedOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range det.New {
			if m.Key == key && m.Window.Equal(w) {
				return
			}
		}
	}
	missed, _, _ := r.own.ListMissed(ctx, lock.MissedFilter{Key: key})
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
	r := newHostile16(t)
	ctx := context.Background()
	ns := namespace(t, "change")
	r.forget(t, ns)
	s, _ := r.tenant(t, ns)
	key := ns + "/report"
	o := lock.Owner{Cluster: "dc-a", Namespace: ns, Job: "report-1", JobUID: "uid", Pod: "p"}
	now, err := r.own.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hourly := lock.View{Schedule: "0 * * * *", Mode: "schedule", LeaseTTL: "30s"}
	if _, err := s.RecordView(ctx, key, "dc-a", hourly, lock.DefaultViewRecency); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordDecision(ctx, lock.Decision{Key: key, Cluster: "dc-a", Job: "j", Pod: "p", Action: lock.ActionRun}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.raw.Exec(ctx, `UPDATE dislock.key_stats SET first_seen = now() - interval '5 hours' WHERE lock_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	// Every hourly tick since its first decision, 5 hours ago, ran and
	// succeeded.
	for h := now.Truncate(time.Hour).Add(-5 * time.Hour); !h.After(now); h = h.Add(time.Hour) {
		c := mustClaim(t, s, key, h, o, false, ttl, lock.Claimed)
		if _, err := s.Finish(ctx, key, h, lock.NotIndexed, c.Window.Token, lock.StateSucceeded, ptr(0)); err != nil {
			t.Fatal(err)
		}
	}
	det, err := r.own.DetectMissed(ctx, lock.MissedOptions{})
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
	if _, err := s.RecordView(ctx, key, "dc-a", every10, lock.DefaultViewRecency); err != nil {
		t.Fatal(err)
	}
	det, err = r.own.DetectMissed(ctx, lock.MissedOptions{})
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
