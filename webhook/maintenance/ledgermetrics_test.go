package maintenance

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/ledger"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/monitoring"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/webhook/internal/eventnote"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// ledgerFixture is what one computation could read: a key that ran and
// missed, one with only an error, a silent one, an Indexed Job's leases and
// two clusters that disagree.
func ledgerFixture() ledgerInputs {
	return ledgerInputs{
		stats: ledger.Stats{
			At: at("2026-12-02T12:00:00Z"),
			Keys: []ledger.KeyStats{
				{Key: "reports/fresh", DurationBuckets: []int64{0, 0, 0, 0, 0, 0, 0, 0}},
				{Key: "reports/gone", DurationBuckets: []int64{0, 0, 0, 0, 0, 0, 0, 0}},
				// Three runs of 3s, 40s and 200s; the stored buckets are cumulative.
				{Key: "reports/nightly", LastSuccess: ptr.To(at("2026-12-02T11:00:05Z")), MissedTotal: 2,
					LastMissedWindow: ptr.To(at("2026-12-02T02:00:00Z")), DurationCount: 3, DurationSum: 243,
					DurationBuckets: []int64{0, 1, 1, 2, 3, 3, 3, 3}},
			},
			Counts: []ledger.DecisionCount{
				{Key: "reports/fresh", Cluster: "dc-a", Action: store.ActionError, N: 1},
				{Key: "reports/nightly", Cluster: "dc-a", Action: store.ActionRun, N: 3},
				{Key: "reports/nightly", Cluster: "dc-a", Action: store.ActionSucceeded, N: 3},
				{Key: "reports/nightly", Cluster: "dc-b", Action: store.ActionSkip, N: 3},
			},
			Leases: []ledger.HeldLease{
				{Key: "batch/shards#0", Age: 10 * time.Second},
				{Key: "batch/shards#1", Age: 40 * time.Second},
				{Key: "reports/nightly", Age: 30 * time.Second},
			},
			QueryTime: map[string]time.Duration{"key_stats": 2 * time.Millisecond, "decision_counts": time.Millisecond, "leases": 500 * time.Microsecond},
		},
		detection: ledger.Detection{Silent: []ledger.SilentKey{{Key: "reports/gone"}}},
		disagreeing: []store.ClusterView{
			{Key: "reports/nightly", Cluster: "dc-a", View: store.View{Schedule: "0 2 * * *", TimeZone: "Europe/Berlin"}},
			{Key: "reports/nightly", Cluster: "dc-b", View: store.View{Schedule: "0 2 * * *"}},
		},
		looks:   map[string]string{"reports/gone": LooksDeleted},
		queries: map[string]time.Duration{QueryDetectMissed: 12 * time.Millisecond, QueryDisagreements: 1500 * time.Microsecond},
	}
}

// exposition gathers c through a pedantic registry (which checks every
// metric against the collector's descriptions) and returns the text format
// without the help lines.
func exposition(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	out, err := monitoring.Exposition(c)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// servedBy is a collector serving snap, as a replica does.
func servedBy(snap *ledgerSnapshot) prometheus.Collector {
	st := &ledgerState{}
	st.serve(snap)
	return ledgerCollector{state: st}
}

// What the ledger holds becomes the contract's metrics: every key with
// statistics has its missed-windows counter (at 0 too), its histogram and its
// disagreement gauge; decisions per deciding cluster and action; success and
// missed times only once they happened; a silent key with how its CronJob
// looks here; the oldest of an Indexed Job's leases; and each query's time.
func TestTheLedgerSnapshotServesTheContractsMetrics(t *testing.T) {
	t.Parallel()
	snap := buildLedgerSnapshot(ledgerFixture())
	want := `# TYPE dislock_clusters_disagree gauge
dislock_clusters_disagree{cronjob="fresh",namespace="reports"} 0
dislock_clusters_disagree{cronjob="gone",namespace="reports"} 0
dislock_clusters_disagree{cronjob="nightly",namespace="reports"} 1
# TYPE dislock_decisions_total counter
dislock_decisions_total{action="error",cluster="dc-a",cronjob="fresh",namespace="reports"} 1
dislock_decisions_total{action="run",cluster="dc-a",cronjob="nightly",namespace="reports"} 3
dislock_decisions_total{action="skip",cluster="dc-b",cronjob="nightly",namespace="reports"} 3
dislock_decisions_total{action="succeeded",cluster="dc-a",cronjob="nightly",namespace="reports"} 3
# TYPE dislock_key_silent gauge
dislock_key_silent{cronjob="gone",looks="deleted",namespace="reports"} 1
# TYPE dislock_last_missed_window_timestamp_seconds gauge
dislock_last_missed_window_timestamp_seconds{cronjob="nightly",namespace="reports"} 1.7961768e+09
# TYPE dislock_last_success_timestamp_seconds gauge
dislock_last_success_timestamp_seconds{cronjob="nightly",namespace="reports"} 1.796209205e+09
# TYPE dislock_lease_held_seconds gauge
dislock_lease_held_seconds{cronjob="nightly",namespace="reports"} 30
dislock_lease_held_seconds{cronjob="shards",namespace="batch"} 40
# TYPE dislock_ledger_keys_left_out gauge
dislock_ledger_keys_left_out 0
# TYPE dislock_ledger_query_duration_seconds gauge
dislock_ledger_query_duration_seconds{query="decision_counts"} 0.001
dislock_ledger_query_duration_seconds{query="detect_missed"} 0.012
dislock_ledger_query_duration_seconds{query="disagreements"} 0.0015
dislock_ledger_query_duration_seconds{query="key_stats"} 0.002
dislock_ledger_query_duration_seconds{query="leases"} 0.0005
# TYPE dislock_ledger_snapshot_timestamp_seconds gauge
dislock_ledger_snapshot_timestamp_seconds 1.7962128e+09
# TYPE dislock_missed_windows_total counter
dislock_missed_windows_total{cronjob="fresh",namespace="reports"} 0
dislock_missed_windows_total{cronjob="gone",namespace="reports"} 0
dislock_missed_windows_total{cronjob="nightly",namespace="reports"} 2
# TYPE dislock_run_duration_seconds histogram
dislock_run_duration_seconds_bucket{cronjob="fresh",namespace="reports",le="1"} 0
dislock_run_duration_seconds_bucket{cronjob="fresh",namespace="reports",le="5"} 0
dislock_run_duration_seconds_bucket{cronjob="fresh",namespace="reports",le="15"} 0
dislock_run_duration_seconds_bucket{cronjob="fresh",namespace="reports",le="60"} 0
dislock_run_duration_seconds_bucket{cronjob="fresh",namespace="reports",le="300"} 0
dislock_run_duration_seconds_bucket{cronjob="fresh",namespace="reports",le="900"} 0
dislock_run_duration_seconds_bucket{cronjob="fresh",namespace="reports",le="3600"} 0
dislock_run_duration_seconds_bucket{cronjob="fresh",namespace="reports",le="14400"} 0
dislock_run_duration_seconds_bucket{cronjob="fresh",namespace="reports",le="+Inf"} 0
dislock_run_duration_seconds_sum{cronjob="fresh",namespace="reports"} 0
dislock_run_duration_seconds_count{cronjob="fresh",namespace="reports"} 0
dislock_run_duration_seconds_bucket{cronjob="gone",namespace="reports",le="1"} 0
dislock_run_duration_seconds_bucket{cronjob="gone",namespace="reports",le="5"} 0
dislock_run_duration_seconds_bucket{cronjob="gone",namespace="reports",le="15"} 0
dislock_run_duration_seconds_bucket{cronjob="gone",namespace="reports",le="60"} 0
dislock_run_duration_seconds_bucket{cronjob="gone",namespace="reports",le="300"} 0
dislock_run_duration_seconds_bucket{cronjob="gone",namespace="reports",le="900"} 0
dislock_run_duration_seconds_bucket{cronjob="gone",namespace="reports",le="3600"} 0
dislock_run_duration_seconds_bucket{cronjob="gone",namespace="reports",le="14400"} 0
dislock_run_duration_seconds_bucket{cronjob="gone",namespace="reports",le="+Inf"} 0
dislock_run_duration_seconds_sum{cronjob="gone",namespace="reports"} 0
dislock_run_duration_seconds_count{cronjob="gone",namespace="reports"} 0
dislock_run_duration_seconds_bucket{cronjob="nightly",namespace="reports",le="1"} 0
dislock_run_duration_seconds_bucket{cronjob="nightly",namespace="reports",le="5"} 1
dislock_run_duration_seconds_bucket{cronjob="nightly",namespace="reports",le="15"} 1
dislock_run_duration_seconds_bucket{cronjob="nightly",namespace="reports",le="60"} 2
dislock_run_duration_seconds_bucket{cronjob="nightly",namespace="reports",le="300"} 3
dislock_run_duration_seconds_bucket{cronjob="nightly",namespace="reports",le="900"} 3
dislock_run_duration_seconds_bucket{cronjob="nightly",namespace="reports",le="3600"} 3
dislock_run_duration_seconds_bucket{cronjob="nightly",namespace="reports",le="14400"} 3
dislock_run_duration_seconds_bucket{cronjob="nightly",namespace="reports",le="+Inf"} 3
dislock_run_duration_seconds_sum{cronjob="nightly",namespace="reports"} 243
dislock_run_duration_seconds_count{cronjob="nightly",namespace="reports"} 3
`
	if got := exposition(t, servedBy(&snap)); got != want {
		t.Errorf("served\n%s\nwant\n%s", got, want)
	}

	// Every replica serves the stored snapshot alike.
	body, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := decodeLedgerSnapshot(body)
	if err != nil {
		t.Fatal(err)
	}
	if got := exposition(t, servedBy(loaded)); got != want {
		t.Errorf("a replica serves the stored snapshot as\n%s", got)
	}
	if len(body) > 2048 {
		t.Errorf("the snapshot of four keys takes %d bytes: %s", len(body), body)
	}
}

// A replica's own ping is served beside the snapshot, and before any
// snapshot exists; nothing is served before the first ping.
func TestEachReplicaServesItsOwnPing(t *testing.T) {
	t.Parallel()
	st := &ledgerState{}
	if got := exposition(t, ledgerCollector{state: st}); got != "" {
		t.Fatalf("before the first ping and snapshot: %q", got)
	}
	st.pinged, st.up, st.rtt = true, false, 1500*time.Millisecond
	want := `# TYPE dislock_database_round_trip_seconds gauge
dislock_database_round_trip_seconds 1.5
# TYPE dislock_database_up gauge
dislock_database_up 0
`
	if got := exposition(t, ledgerCollector{state: st}); got != want {
		t.Errorf("served\n%s\nwant\n%s", got, want)
	}
}

// A snapshot of another format is not served: a replica of the other
// version keeps serving what it had.
func TestASnapshotOfAnotherVersionIsRefused(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{"v":2,"at":1}`, `{"v":1,"k":"not a list"}`} {
		if _, err := decodeLedgerSnapshot([]byte(body)); err == nil {
			t.Errorf("%s was accepted", body)
		}
	}
}

// A silent key looks deleted, suspended or unknown from this cluster's
// CronJobs of it: those that lock it by dislock.io/key or by name, else one
// named like it that no longer opts in. Each namespace is listed once.
func TestASilentKeyLooksLikeItsCronJobHere(t *testing.T) {
	t.Parallel()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cronJob := func(name string, annotations map[string]string, suspend bool) *batchv1.CronJob {
		return &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: "reports", Name: name, Annotations: annotations},
			Spec: batchv1.CronJobSpec{Schedule: "0 2 * * *", Suspend: ptr.To(suspend)}}
	}
	optIn := map[string]string{contract.AnnotationMode: "schedule"}
	lists := 0
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		cronJob("nightly-v2", map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationKey: "nightly"}, false),
		cronJob("nightly", nil, true), // the old one, no longer opted in and suspended
		cronJob("paused", optIn, true),
		cronJob("plain", nil, false),
	).WithInterceptorFuncs(interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
		lists++
		return c.List(ctx, list, opts...)
	}}).Build()
	byKey := &cronJobsByKey{reader: c}
	for key, want := range map[string]string{
		"reports/nightly": LooksUnknown, // nightly-v2 locks it
		"reports/paused":  LooksSuspended,
		"reports/plain":   LooksUnknown,
		"reports/gone":    LooksDeleted,
	} {
		cjs, err := byKey.of(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if got := looksOf(cjs); got != want {
			t.Errorf("%s looks %s, want %s (CronJobs %d)", key, got, want, len(cjs))
		}
	}
	if cjs, _ := byKey.of(context.Background(), "reports/nightly"); len(cjs) != 1 || cjs[0].Name != "nightly-v2" {
		t.Errorf("the CronJobs of reports/nightly: %d, want nightly-v2 alone", len(cjs))
	}
	if lists != 1 {
		t.Errorf("namespace reports was listed %d times, want once", lists)
	}
}

// One key's missed windows give at most maxMissedEvents Events, each within
// an Event's note, the last counting the rest.
func TestMissedWindowsAreToldInABoundedNumberOfNotes(t *testing.T) {
	t.Parallel()
	var ws []ledger.MissedWindow
	for i := range 8 {
		ws = append(ws, ledger.MissedWindow{Key: "reports/nightly", Window: at("2026-12-02T02:00:00Z").Add(time.Duration(i) * time.Hour),
			Kind: ledger.MissedNoRun, Reason: "no cluster ran it: " + strings.Repeat("dc-a skip (stale); ", 200)})
	}
	notes := missedNotes(ws)
	if len(notes) != maxMissedEvents {
		t.Fatalf("%d notes, want %d", len(notes), maxMissedEvents)
	}
	for _, n := range notes {
		if len(n) > eventnote.Max {
			t.Errorf("a note of %d bytes", len(n))
		}
	}
	if !strings.HasPrefix(notes[0], "window 2026-12-02T02:00:00Z of reports/nightly was missed (no-run): no cluster ran it") {
		t.Errorf("first note %.100q", notes[0])
	}
	if want := "4 more windows of reports/nightly were missed, from 2026-12-02T06:00:00Z to 2026-12-02T09:00:00Z"; !strings.HasPrefix(notes[4], want) {
		t.Errorf("last note %q, want it to start %q", notes[4], want)
	}
	if got := missedNotes(ws[:maxMissedEvents]); len(got) != maxMissedEvents || strings.Contains(got[maxMissedEvents-1], "more windows") {
		t.Errorf("exactly %d windows: %q", maxMissedEvents, got)
	}
}

// The interval may be left 0 (the default) but not be shorter than the
// minimum or negative.
func TestALedgerIntervalBelowTheMinimumIsRefused(t *testing.T) {
	t.Parallel()
	o := Options{DatabaseURL: "postgres://owner@db/dislock", Retention: store.DefaultRetention, Cluster: "dc-a", Namespace: "dislock-system"}
	if err := o.Validate(); err != nil {
		t.Fatalf("the interval left 0: %v", err)
	}
	for _, bad := range []time.Duration{time.Second, -time.Second} {
		o.LedgerInterval = bad
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), bad.String()) || !strings.Contains(err.Error(), "--ledger-interval") {
			t.Errorf("interval %s: %v, want an error naming it and the flag", bad, err)
		}
	}
}

// tenantsDB is a PostgreSQL of the test's own, migrated, with the owner's
// Store (as the webhook's leader opens it: one connection) and a raw
// owner connection.
type tenantsDB struct {
	dsn string
	own *store.Store
	raw *pgx.Conn
}

func newTenantsDB(t *testing.T) tenantsDB {
	t.Helper()
	srv, err := pgtest.Start(pgtest.Options{Name: "tenant-rows", Logf: t.Logf})
	if err != nil {
		pgtest.Missing(t, err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx := context.Background()
	dsn := srv.DirectDSN()
	own, err := store.Open(ctx, dsn, store.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Close)
	if _, err := migrate.Up(ctx, own); err != nil {
		t.Fatal(err)
	}
	raw, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close(context.Background()) })
	return tenantsDB{dsn: dsn, own: own, raw: raw}
}

// tenant is a raw connection with namespace ns's own tenant role.
func (d tenantsDB) tenant(t *testing.T, ns string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	c, err := tenant.Provision(ctx, d.own, "dc-a", ns)
	if err != nil {
		t.Fatal(err)
	}
	dsn, err := tenant.DSN(d.dsn, c)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := store.ParseDatabaseURL(dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// toReport lists the missed windows found since the last computation,
// newest window first, at most 1000, and then moves reportedThrough past
// every one it saw. A tenant whose keys produce more than 1000 missed
// windows newer than another namespace's, found in the same computation
// (or by another cluster in between), pushes that namespace's window out
// of the list; and since reportedThrough moves past its detection time, its
// CronJob never gets the DislockMissedWindow Event.
func TestATenantsMissedWindowsCannotBuryAnotherNamespacesEvent(t *testing.T) {
	d := newTenantsDB(t)
	ctx := context.Background()
	m, rec := eventingMetrics(t, d, optedIn("victim", "report", "0 * * * *"), 100000)
	if err := m.Compute(ctx); err != nil { // the leader's first computation
		t.Fatal(err)
	}

	// The victim: an hourly CronJob whose last window ran nowhere (grace:
	// one hour).
	key := "victim/report"
	if _, err := d.own.RecordView(ctx, key, "dc-a", store.View{Schedule: "0 * * * *", Mode: "schedule", LeaseTTL: "30s"}, store.DefaultViewRecency); err != nil {
		t.Fatal(err)
	}
	if err := d.own.RecordDecision(ctx, store.Decision{Key: key, Cluster: "dc-a", Job: "j", Pod: "p", Action: store.ActionRun}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.raw.Exec(ctx, `UPDATE dislock.key_stats SET first_seen = date_trunc('hour', now()) - interval '61 minutes' WHERE lock_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	if _, err := d.raw.Exec(ctx, `UPDATE dislock.views SET changed_at = date_trunc('hour', now()) - interval '61 minutes' WHERE lock_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	// The tenant: 25 per-minute keys of its own, first seen 70 minutes ago
	// (it writes its own key_stats and views), whose windows ran nowhere.
	hostile := d.tenant(t, "hostile")
	if _, err := hostile.Exec(ctx, `INSERT INTO dislock.key_stats (lock_key, first_seen, last_decided)
		SELECT 'hostile/k' || i, now() - interval '70 minutes', now() + interval '10 years' FROM generate_series(1, 25) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := hostile.Exec(ctx, `INSERT INTO dislock.views (lock_key, cluster, view, seen_at)
		SELECT 'hostile/k' || i, 'dc-a', '{"schedule":"* * * * *","mode":"schedule"}'::jsonb, now() FROM generate_series(1, 25) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := hostile.Exec(ctx, `UPDATE dislock.views SET changed_at = now() - interval '70 minutes' WHERE starts_with(lock_key, 'hostile/')`); err != nil {
		t.Fatal(err)
	}
	if err := m.Compute(ctx); err != nil {
		t.Fatal(err)
	}
	missed, _, err := ledger.ListMissed(ctx, d.own, ledger.MissedFilter{Key: key})
	if err != nil || len(missed) == 0 {
		t.Fatalf("the victim's window was not found missed (%v): the attack needs it found", err)
	}
	close(rec.Events)
	var got []string
	for e := range rec.Events {
		if strings.Contains(e, key) {
			got = append(got, e)
		}
	}
	if len(got) == 0 {
		t.Errorf("window %s of %s was found missed in this computation, and CronJob victim/report got no DislockMissedWindow Event: namespace hostile's %d+ newer missed windows filled toReport's list of %d",
			missed[0].Window.Format(time.RFC3339), key, maxMissedReported, maxMissedReported)
	}
	// And never will: the next computation lists only what was detected
	// after the newest detection time it saw.
	if next := m.toReport(ctx, nil); len(next) != 0 {
		for _, w := range next {
			if w.Key == key {
				return
			}
		}
	}
}

// optedIn is an opted-in CronJob of this cluster.
func optedIn(namespace, name, schedule string) *batchv1.CronJob {
	return &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: "cj-uid",
		Annotations: map[string]string{contract.AnnotationMode: "schedule"}}, Spec: batchv1.CronJobSpec{Schedule: schedule}}
}

// eventingMetrics are the ledger metrics of cluster dc-a on d, whose
// CronJob is cj, recording up to n Events.
func eventingMetrics(t *testing.T, d tenantsDB, cj *batchv1.CronJob, n int) (*LedgerMetrics, *events.FakeRecorder) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	rec := events.NewFakeRecorder(n)
	m := NewLedgerMetrics(d.own, "dc-a", fake.NewClientBuilder().WithScheme(scheme).WithObjects(cj).Build())
	m.Events = rec
	return m, rec
}
