package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/ledger"
	"github.com/dislock/dislock/test/pgtest"
)

// Every cluster's decision for a window is in the ledger, with its reason,
// and each tenant writes and reads only its own namespace's rows.
func TestEveryClustersDecisionForAWindowIsInTheLedger(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		ns, other := storetest.Namespace(t, "ledger"), storetest.Namespace(t, "ledger-other")
		asTenant := storetest.TenantStore(t, dsn, storetest.Provision(t, own, ns))
		key := ns + "/report"
		w := storetest.WindowAt(0)
		for _, d := range []store.Decision{
			{Cluster: "dc-a", Action: store.ActionRun, Reason: "window claimed", Token: 7},
			{Cluster: "dc-b", Action: store.ActionSkip, Reason: "window already claimed by cluster dc-a"},
			{Cluster: "dc-c", Action: store.ActionWait, Reason: "standby: the window's owner is alive"},
			{Cluster: "dc-a", Action: store.ActionSucceeded, Reason: "succeeded (1 container(s), exit code 0)", Token: 7, Duration: 3 * time.Second},
		} {
			d.Key, d.Window, d.Index, d.Job, d.Pod = key, w, store.NotIndexed, "report-1", "report-1-"+d.Cluster
			if err := asTenant.RecordDecision(ctx, d); err != nil {
				t.Fatalf("the tenant recording its own decision: %v", err)
			}
		}
		err := asTenant.RecordDecision(ctx, store.Decision{Key: other + "/report", Window: w, Cluster: "dc-a", Job: "j", Pod: "p", Action: store.ActionRun})
		if !errors.Is(err, store.ErrForbidden) {
			t.Fatalf("a tenant recording another namespace's decision: err %v, want ErrForbidden", err)
		}
		for name, s := range map[string]*store.Store{"owner": own, "tenant": asTenant} {
			got, _, err := ledger.ListDecisions(ctx, s, ledger.DecisionFilter{Key: key, Window: w})
			if err != nil {
				t.Fatalf("%s listing: %v", name, err)
			}
			var seen []string
			for _, d := range got {
				seen = append(seen, d.Cluster+" "+string(d.Action)+": "+d.Reason)
			}
			want := []string{"dc-a run: window claimed", "dc-b skip: window already claimed by cluster dc-a",
				"dc-c wait: standby: the window's owner is alive", "dc-a succeeded: succeeded (1 container(s), exit code 0)"}
			if !slices.Equal(seen, want) {
				t.Fatalf("%s sees %q, want %q (in decision order)", name, seen, want)
			}
		}
		st, err := ledger.ReadStats(ctx, own)
		if err != nil {
			t.Fatal(err)
		}
		counts := map[string]int64{}
		for _, c := range st.Counts {
			if c.Key == key {
				counts[c.Cluster+"/"+string(c.Action)] = c.N
			}
		}
		if want := map[string]int64{"dc-a/run": 1, "dc-b/skip": 1, "dc-c/wait": 1, "dc-a/succeeded": 1}; !mapsEqual(counts, want) {
			t.Fatalf("decision counts %v, want %v", counts, want)
		}
		k := keyStats(t, st, key)
		if k.LastSuccess == nil || k.DurationCount != 1 || k.DurationSum != 3 {
			t.Fatalf("key statistics %+v: want a last success and one run of 3s", k)
		}
		// Cumulative buckets: 3s is above 1s and within every bound from 5s.
		if want := []int64{0, 1, 1, 1, 1, 1, 1, 1}; !slices.Equal(k.DurationBuckets, want) {
			t.Fatalf("duration buckets %v, want %v (bounds %v)", k.DurationBuckets, want, store.DurationBuckets)
		}
	})
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func keyStats(t *testing.T, st ledger.Stats, key string) ledger.KeyStats {
	t.Helper()
	for _, k := range st.Keys {
		if k.Key == key {
			return k
		}
	}
	t.Fatalf("no statistics for %s", key)
	return ledger.KeyStats{}
}

// A window with no successful run after its grace is found missed once,
// whichever clusters' webhooks look at the same time; windows that ran are
// not, a window still running is judged later, and a key nobody decided
// for over several periods is silent rather than missing every tick.
func TestMissedWindowsAreFoundOnceAndOnlyWhereNothingSucceeded(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 4)
		raw := storetest.RawConn(t, dsn)
		ns := storetest.Namespace(t, "missed")
		now, err := own.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m0 := now.Truncate(time.Minute).Add(-10 * time.Minute)
		minute := func(i int) time.Time { return m0.Add(time.Duration(i) * time.Minute) }
		view := store.View{Schedule: "* * * * *", Mode: "schedule", LeaseTTL: "30s"}
		seen := func(key string, firstSeen, lastDecided time.Time) {
			t.Helper()
			if _, err := own.RecordView(ctx, key, "dc-a", view, store.DefaultViewRecency); err != nil {
				t.Fatal(err)
			}
			if err := own.RecordDecision(ctx, store.Decision{Key: key, Cluster: "dc-a", Job: "j", Pod: "p", Action: store.ActionRun}); err != nil {
				t.Fatal(err)
			}
			if _, err := raw.Exec(ctx, `UPDATE dislock.key_stats SET first_seen = $2, last_decided = $3 WHERE lock_key = $1`, key, firstSeen, lastDecided); err != nil {
				t.Fatal(err)
			}
			if _, err := raw.Exec(ctx, `UPDATE dislock.views SET changed_at = $2 WHERE lock_key = $1`, key, firstSeen); err != nil {
				t.Fatal(err)
			}
		}
		run := func(key string, i int, state store.State, ttl time.Duration) {
			t.Helper()
			o := storetest.Owner("dc-a", "j-"+strings.ReplaceAll(key, "/", "-"), "p")
			c := storetest.MustClaim(t, own, key, minute(i), o, false, ttl, store.Claimed)
			if state == store.StateRunning {
				return
			}
			code := 0
			if state == store.StateFailed {
				code = 1
			}
			if _, err := own.Finish(ctx, key, minute(i), store.NotIndexed, c.Window.Token, state, &code); err != nil {
				t.Fatal(err)
			}
		}
		ranNowhere, allRan, failed, stillRunning, silent := ns+"/nowhere", ns+"/all", ns+"/failed", ns+"/running", ns+"/silent"
		for _, k := range []string{ranNowhere, allRan, failed, stillRunning} {
			seen(k, m0.Add(30*time.Second), now)
		}
		seen(silent, m0.Add(30*time.Second), now.Add(-10*time.Minute))
		// The detection judges windows m0 ... m0+9: each ended its
		// one-minute grace, and m0 is the window in which the key was first
		// seen. m0+10 ran everywhere, in case the clock passes a minute
		// meanwhile.
		for i := 0; i <= 10; i++ {
			switch {
			case i == 4: // ran nowhere: both clusters skipped it
				for _, c := range []string{"dc-a", "dc-b"} {
					if err := own.RecordDecision(ctx, store.Decision{Key: ranNowhere, Window: minute(i), Cluster: c, Job: "j", Pod: "p-" + c,
						Action: store.ActionSkip, Reason: "stale: window started 3m ago"}); err != nil {
						t.Fatal(err)
					}
				}
			default:
				run(ranNowhere, i, store.StateSucceeded, storetest.TTL)
			}
			run(allRan, i, store.StateSucceeded, storetest.TTL)
			switch i {
			case 5:
				run(failed, i, store.StateFailed, storetest.TTL)
			default:
				run(failed, i, store.StateSucceeded, storetest.TTL)
			}
			switch i {
			case 3: // nobody ran it
			case 9:
				run(stillRunning, i, store.StateRunning, time.Hour)
			default:
				run(stillRunning, i, store.StateSucceeded, storetest.TTL)
			}
		}

		// Two clusters' webhooks detect at the same time.
		var mu sync.Mutex
		var found []string
		var silentKeys []string
		var wg sync.WaitGroup
		for range 2 {
			s := storetest.Open(t, dsn, 2)
			wg.Add(1)
			go func() {
				defer wg.Done()
				det, err := ledger.DetectMissed(ctx, s, ledger.MissedOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for _, m := range det.New {
					if strings.HasPrefix(m.Key, ns+"/") {
						found = append(found, m.Key+"@"+m.Window.Format("15:04")+" "+m.Kind)
						if m.Key == ranNowhere && !(strings.Contains(m.Reason, "dc-a skip (stale") && strings.Contains(m.Reason, "dc-b skip (stale")) {
							t.Errorf("the reason %q does not say what each cluster decided", m.Reason)
						}
					}
				}
				for _, k := range det.Silent {
					if strings.HasPrefix(k.Key, ns+"/") {
						silentKeys = append(silentKeys, k.Key)
					}
				}
			}()
		}
		wg.Wait()
		slices.Sort(found)
		want := []string{
			failed + "@" + minute(5).Format("15:04") + " failed",
			ranNowhere + "@" + minute(4).Format("15:04") + " no-run",
			stillRunning + "@" + minute(3).Format("15:04") + " no-run",
		}
		slices.Sort(want)
		if !slices.Equal(found, want) {
			t.Fatalf("found missed %q, want each of %q exactly once", found, want)
		}
		if want := []string{silent, silent}; !slices.Equal(silentKeys, want) {
			t.Fatalf("silent keys %q, want %q (once per detection)", silentKeys, want)
		}
		again, err := ledger.DetectMissed(ctx, own, ledger.MissedOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range again.New {
			if strings.HasPrefix(m.Key, ns+"/") {
				t.Fatalf("a window was found missed twice: %+v", m)
			}
		}
		st, err := ledger.ReadStats(ctx, own)
		if err != nil {
			t.Fatal(err)
		}
		for key, n := range map[string]int64{ranNowhere: 1, allRan: 0, failed: 1, stillRunning: 1, silent: 0} {
			if k := keyStats(t, st, key); k.MissedTotal != n {
				t.Errorf("%s counts %d missed windows, want %d", key, k.MissedTotal, n)
			}
		}
		if k := keyStats(t, st, ranNowhere); k.LastMissedWindow == nil || !k.LastMissedWindow.Equal(minute(4)) {
			t.Errorf("%s: last missed window %v, want %s", ranNowhere, k.LastMissedWindow, minute(4))
		}
		listed, _, err := ledger.ListMissed(ctx, own, ledger.MissedFilter{Key: ranNowhere})
		if err != nil {
			t.Fatal(err)
		}
		if len(listed) != 1 || !listed[0].Window.Equal(minute(4)) || listed[0].Kind != ledger.MissedNoRun {
			t.Fatalf("listing %s's missed windows: %+v", ranNowhere, listed)
		}
	})
}

// A tenant may write statistics rows for as many keys of its own namespace
// as it likes; the owner's statistics and detection read at most
// MaxKeysPerNamespace of them, those decided last, so that one namespace
// cannot grow every namespace's metrics, nor push another's keys out.
func TestOneNamespacesKeysCannotCrowdOutAnothersStatistics(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		flood, quiet := storetest.Namespace(t, "flood"), storetest.Namespace(t, "quiet")
		asTenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, storetest.Provision(t, own, flood)))
		extra := 5
		if _, err := asTenant.Exec(ctx, `INSERT INTO dislock.key_stats (lock_key, first_seen, last_decided)
			SELECT $1::text || '/k' || i, now(), now() - i * interval '1 second' FROM generate_series(1, $2::int) i`,
			flood, ledger.MaxKeysPerNamespace+extra); err != nil {
			t.Fatalf("the tenant writing its own namespace's statistics: %v", err)
		}
		if err := own.RecordDecision(ctx, store.Decision{Key: quiet + "/report", Cluster: "dc-a", Job: "j", Pod: "p", Action: store.ActionRun}); err != nil {
			t.Fatal(err)
		}
		st, err := ledger.ReadStats(ctx, own)
		if err != nil {
			t.Fatal(err)
		}
		var flooded int
		for _, k := range st.Keys {
			if strings.HasPrefix(k.Key, flood+"/") {
				flooded++
				if k.Key == fmt.Sprintf("%s/k%d", flood, ledger.MaxKeysPerNamespace+1) {
					t.Errorf("read %s, which was decided before the newest %d of its namespace", k.Key, ledger.MaxKeysPerNamespace)
				}
			}
		}
		if flooded != ledger.MaxKeysPerNamespace {
			t.Errorf("read %d keys of the flooding namespace, want %d", flooded, ledger.MaxKeysPerNamespace)
		}
		keyStats(t, st, quiet+"/report")
		if st.KeysLeftOut < int64(extra) {
			t.Errorf("%d keys counted as left out, want at least %d", st.KeysLeftOut, extra)
		}
	})
}

// hostileTenants is the setting of a test in which a tenant attacks the ledger,
// the missed-window detection or the statistics through its own rows: the
// owner's Store and a raw owner connection on the direct DSN.
type hostileTenants struct {
	dsn string
	own *store.Store
	raw *pgx.Conn
}

func newHostileTenants(t *testing.T) hostileTenants {
	t.Helper()
	dsn := pgtest.Need(t).DirectDSN()
	own := storetest.Open(t, dsn, 4)
	return hostileTenants{dsn: dsn, own: own, raw: storetest.RawConn(t, dsn)}
}

// tenant provisions ns and returns its Store and a raw connection with its
// role.
func (r hostileTenants) tenant(t *testing.T, ns string) (*store.Store, *pgx.Conn) {
	t.Helper()
	c := storetest.Provision(t, r.own, ns)
	return storetest.TenantStore(t, r.dsn, c), storetest.RawConn(t, storetest.TenantDSN(t, r.dsn, c))
}

// forget deletes, as the owner, every ledger, window, lease and view row of
// ns: the tests share one database and DetectMissed reads all of it.
func (r hostileTenants) forget(t *testing.T, ns string) {
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
	r := newHostileTenants(t)
	ctx := context.Background()
	victim, hostile := storetest.Namespace(t, "victim"), storetest.Namespace(t, "hostile")
	r.forget(t, victim)
	r.forget(t, hostile)
	vs, _ := r.tenant(t, victim)
	hs, hraw := r.tenant(t, hostile)
	for _, d := range []struct {
		s   *store.Store
		key string
	}{{vs, victim + "/report"}, {hs, hostile + "/x"}} {
		if err := d.s.RecordDecision(ctx, store.Decision{Key: d.key, Cluster: "dc-a", Job: "j", Pod: "p", Action: store.ActionRun}); err != nil {
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
	st, err := ledger.ReadStats(ctx, r.own)
	if err != nil {
		t.Fatalf("the owner's statistics after the tenant's attempts: %v", err)
	}
	keyStats(t, st, victim+"/report")
}

// The statistics read "at most 1000 keys per namespace", but the held
// leases of a key in bounds are read without any bound: an Indexed Job's
// per-index lease keys are "<key>#<index>", and a tenant may insert as many
// lease rows under its prefix as it likes. Every one of them is read, every
// computation, into the leader's memory.
func TestTheHeldLeasesOfOneKeyAreReadAsOneRow(t *testing.T) {
	r := newHostileTenants(t)
	ctx := context.Background()
	hostile := storetest.Namespace(t, "hostile")
	r.forget(t, hostile)
	hs, hraw := r.tenant(t, hostile)
	key := hostile + "/x"
	if err := hs.RecordDecision(ctx, store.Decision{Key: key, Cluster: "dc-a", Job: "j", Pod: "p", Action: store.ActionRun}); err != nil {
		t.Fatal(err)
	}
	n := envInt("DISLOCK_TEST_HELD_LEASES", 5*ledger.MaxKeysPerNamespace)
	if _, err := hraw.Exec(ctx, `INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at)
		SELECT $1::text || '#' || i, 'x', 1, now(), now() + interval '1 day' FROM generate_series(1, $2::int) i`, key, n); err != nil {
		t.Fatalf("the tenant inserting lease rows under its own prefix: %v", err)
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	st, err := ledger.ReadStats(ctx, r.own)
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
	if got > ledger.MaxKeysPerNamespace {
		t.Errorf("the owner's statistics read %d held leases of namespace %s (one key); nothing bounds them (MaxKeysPerNamespace %d bounds only key_stats)",
			got, hostile, ledger.MaxKeysPerNamespace)
	}
}
