package integration

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/monitoring"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/webhook/maintenance"
)

// Two webhook replicas of cluster dc-a share one database through PgBouncer:
// the leader computes the ledger metrics and stores them, the other only
// loads them, and both serve the same series; a replica of cluster dc-b
// serves none of dc-a's. The leader's detection puts a DislockMissedWindow
// Event on the CronJob of the key that missed windows, and a silent key's
// looks come from this cluster's CronJob.
func TestTwoReplicasServeTheSameLedgerMetrics(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	kc, err := client.New(c.RESTConfig(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	srv, err := pgtest.Start(pgtest.Options{Name: "ledger", Logf: t.Logf})
	if err != nil {
		pgtest.Missing(t, err)
	}
	t.Cleanup(func() { srv.Close() })
	open := func() *store.Store {
		t.Helper()
		s, err := store.Open(ctx, srv.BouncerDSN(), store.Options{MaxConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	leaderStore, otherStore := open(), open()
	if _, err := migrate.Up(ctx, leaderStore); err != nil {
		t.Fatal(err)
	}
	raw, err := pgx.Connect(ctx, srv.DirectDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close(context.Background()) })

	// This cluster's CronJobs (their own schedules never fire here; the
	// database's views are what the detection reads): nightly locks the key
	// that misses windows, paused is suspended; gone has none.
	const ns = "ledger"
	namespace(t, cs, ns, false)
	nightly := withAnnotations(cronJob(ns, "nightly", "0 0 1 1 *"), map[string]string{contract.AnnotationMode: "schedule"})
	paused := withAnnotations(cronJob(ns, "paused", "0 0 1 1 *"), map[string]string{contract.AnnotationMode: "schedule"})
	paused.Spec.Suspend = ptr.To(true)
	for _, cj := range []client.Object{nightly, paused} {
		if err := kc.Create(ctx, cj); err != nil {
			t.Fatal(err)
		}
	}

	everyMinute := store.View{Schedule: "* * * * *", Mode: "schedule", LeaseTTL: "30s"}
	decide := func(key, cluster string, action store.Action, took time.Duration) {
		t.Helper()
		if err := leaderStore.RecordDecision(ctx, store.Decision{Key: key, Cluster: cluster, Job: "j", Pod: "p-" + cluster,
			Action: action, Reason: "test", Duration: took}); err != nil {
			t.Fatal(err)
		}
	}
	seen := func(key, cluster string, v store.View, firstSeen, lastDecided string) {
		t.Helper()
		if _, err := leaderStore.RecordView(ctx, key, cluster, v, store.DefaultViewRecency); err != nil {
			t.Fatal(err)
		}
		decide(key, cluster, store.ActionRun, 0)
		// The ledger's clock is the database's: the history is moved back in it.
		if _, err := raw.Exec(ctx, `UPDATE dislock.key_stats SET first_seen = now() - $2::interval, last_decided = now() - $3::interval
			WHERE lock_key = $1`, key, firstSeen, lastDecided); err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Exec(ctx, `UPDATE dislock.views SET changed_at = now() - $2::interval WHERE lock_key = $1`, key, firstSeen); err != nil {
			t.Fatal(err)
		}
	}
	// nightly was first decided 5 minutes ago and no window since ran.
	seen(ns+"/nightly", "dc-a", everyMinute, "5 minutes", "0")
	// hourly ran once for 3s, holds its lease, and dc-b sees it otherwise.
	seen(ns+"/hourly", "dc-a", store.View{Schedule: "0 * * * *", Mode: "lease", LeaseTTL: "30s"}, "0", "0")
	if _, err := leaderStore.RecordView(ctx, ns+"/hourly", "dc-b", store.View{Schedule: "0 * * * *", TimeZone: "Europe/Berlin", Mode: "lease", LeaseTTL: "30s"}, store.DefaultViewRecency); err != nil {
		t.Fatal(err)
	}
	decide(ns+"/hourly", "dc-a", store.ActionSucceeded, 3*time.Second)
	decide(ns+"/hourly", "dc-b", store.ActionSkip, 0)
	if _, err := leaderStore.AcquireLease(ctx, ns+"/hourly", store.Owner{Cluster: "dc-a", Namespace: ns, Job: "hourly-1", JobUID: "u", Pod: "hourly-1-x"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	// gone and paused: nothing decided for an hour.
	seen(ns+"/gone", "dc-a", everyMinute, "2 hours", "1 hour")
	seen(ns+"/paused", "dc-a", everyMinute, "2 hours", "1 hour")

	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	stop := make(chan struct{})
	broadcaster.StartRecordingToSink(stop)
	t.Cleanup(func() { close(stop); broadcaster.Shutdown() })

	leader := maintenance.NewLedgerMetrics(leaderStore, "dc-a", kc)
	leader.Events = broadcaster.NewRecorder(scheme.Scheme, "dislock-webhook")
	follower := maintenance.NewLedgerMetrics(otherStore, "dc-a", kc)
	elsewhere := maintenance.NewLedgerMetrics(otherStore, "dc-b", kc)
	if err := leader.Compute(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*maintenance.LedgerMetrics{leader, follower, elsewhere} {
		if err := m.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	served, fromFollower := ledgerSeries(t, leader.Collector()), ledgerSeries(t, follower.Collector())
	if served != fromFollower {
		t.Fatalf("the leader serves\n%s\nthe other replica\n%s", served, fromFollower)
	}
	if got := ledgerSeries(t, elsewhere.Collector()); got != "" {
		t.Errorf("a replica of dc-b serves dc-a's metrics:\n%s", got)
	}
	// No cluster claimed the role of alerting cluster: every replica says
	// its own is not it.
	for _, m := range []*maintenance.LedgerMetrics{leader, follower, elsewhere} {
		if v := seriesValue(t, everything(t, m.Collector()), "dislock_alerting_cluster"); v != 0 {
			t.Errorf("dislock_alerting_cluster %v with no claim, want 0", v)
		}
	}
	for _, m := range []*maintenance.LedgerMetrics{leader, follower, elsewhere} {
		if up := seriesValue(t, everything(t, m.Collector()), "dislock_database_up"); up != 1 {
			t.Errorf("dislock_database_up %v, want 1", up)
		}
	}

	if n := seriesValue(t, served, `dislock_missed_windows_total{cronjob="nightly",namespace="ledger"}`); n < 3 {
		t.Errorf("nightly missed %v windows, want the 3 or 4 of the last 5 minutes", n)
	}
	for series, want := range map[string]float64{
		`dislock_missed_windows_total{cronjob="hourly",namespace="ledger"}`:                              0,
		`dislock_key_silent{cronjob="gone",looks="deleted",namespace="ledger"}`:                          1,
		`dislock_key_silent{cronjob="paused",looks="suspended",namespace="ledger"}`:                      1,
		`dislock_clusters_disagree{cronjob="hourly",namespace="ledger"}`:                                 1,
		`dislock_clusters_disagree{cronjob="nightly",namespace="ledger"}`:                                0,
		`dislock_decisions_total{action="succeeded",cluster="dc-a",cronjob="hourly",namespace="ledger"}`: 1,
		`dislock_decisions_total{action="skip",cluster="dc-b",cronjob="hourly",namespace="ledger"}`:      1,
		`dislock_run_duration_seconds_bucket{cronjob="hourly",namespace="ledger",le="1"}`:                0,
		`dislock_run_duration_seconds_bucket{cronjob="hourly",namespace="ledger",le="5"}`:                1,
		`dislock_run_duration_seconds_count{cronjob="hourly",namespace="ledger"}`:                        1,
	} {
		if got := seriesValue(t, served, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	for _, series := range []string{
		`dislock_last_missed_window_timestamp_seconds{cronjob="nightly",namespace="ledger"}`,
		`dislock_last_success_timestamp_seconds{cronjob="hourly",namespace="ledger"}`,
		`dislock_lease_held_seconds{cronjob="hourly",namespace="ledger"}`,
		`dislock_ledger_snapshot_timestamp_seconds`,
		`dislock_ledger_query_duration_seconds{query="detect_missed"}`,
		`dislock_ledger_query_duration_seconds{query="key_stats"}`,
	} {
		seriesValue(t, served, series)
	}
	if strings.Contains(served, `dislock_key_silent{cronjob="nightly"`) || strings.Contains(served, `dislock_last_success_timestamp_seconds{cronjob="nightly"`) {
		t.Errorf("nightly is served as silent or as having succeeded:\n%s", served)
	}

	// A new computation reaches the other replica at its next load, and
	// only a new one: a load without one changes nothing.
	decide(ns+"/hourly", "dc-a", store.ActionRun, 0)
	if err := follower.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ledgerSeries(t, follower.Collector()); got != fromFollower {
		t.Fatalf("the other replica's metrics changed without a computation:\n%s", got)
	}
	if err := leader.Compute(ctx); err != nil {
		t.Fatal(err)
	}
	if err := follower.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	runs := `dislock_decisions_total{action="run",cluster="dc-a",cronjob="hourly",namespace="ledger"}`
	if got := seriesValue(t, ledgerSeries(t, follower.Collector()), runs); got != 2 {
		t.Errorf("after the next computation the other replica serves %s %v, want 2", runs, got)
	}

	await(t, "a DislockMissedWindow Event on CronJob nightly", func() (bool, error) {
		evs, err := cs.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Regarding.Kind == "CronJob" && e.Regarding.Name == "nightly" && e.Reason == maintenance.ReasonMissedWindow &&
				e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, "of ledger/nightly was missed (no-run)") {
				return true, nil
			}
		}
		return false, nil
	})

	// A window another cluster's detection found first still gets its Event
	// on this cluster's CronJob: the database counts it once, every
	// cluster's CronJob says so.
	late := withAnnotations(cronJob(ns, "late", "0 0 1 1 *"), map[string]string{contract.AnnotationMode: "schedule"})
	if err := kc.Create(ctx, late); err != nil {
		t.Fatal(err)
	}
	seen(ns+"/late", "dc-a", everyMinute, "3 minutes", "0 seconds")
	if err := elsewhere.Compute(ctx); err != nil {
		t.Fatal(err)
	}
	if err := leader.Compute(ctx); err != nil {
		t.Fatal(err)
	}
	await(t, "a DislockMissedWindow Event on CronJob late, whose window dc-b's detection found", func() (bool, error) {
		evs, err := cs.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == "late" && e.Reason == maintenance.ReasonMissedWindow && strings.Contains(e.Note, "of ledger/late was missed") {
				return true, nil
			}
		}
		return false, nil
	})
}

// everything is c's exposition without help lines.
func everything(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	out, err := monitoring.Exposition(c)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ledgerSeries is c's exposition without the replica's own ping, which
// differs from replica to replica.
func ledgerSeries(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	var out []string
	for line := range strings.Lines(everything(t, c)) {
		// Not the ledger's: whether the database answers, and whether this
		// replica's own cluster is the alerting one.
		if !strings.Contains(line, "dislock_database_") && !strings.Contains(line, "dislock_alerting_cluster") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}

// seriesValue is the value of one series in an exposition; the test fails
// if it is not there.
func seriesValue(t *testing.T, exposition, series string) float64 {
	t.Helper()
	for line := range strings.Lines(exposition) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("%s is not served:\n%s", series, exposition)
	return 0
}
