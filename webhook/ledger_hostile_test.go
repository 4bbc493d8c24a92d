package webhook

// Attacks on the ledger metrics' Events, the outcome controller and the
// injected label, each of which once misled an operator about another
// namespace or refused Jobs; each test fails if it comes back.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/lockagent/spec"
	"github.com/dislock/dislock/test/pgtest"
)

// hostileDB is a PostgreSQL of the test's own, migrated, with the owner's
// Store (as the webhook's leader opens it: one connection) and a raw
// owner connection.
type hostileDB struct {
	dsn string
	own *lock.Store
	raw *pgx.Conn
}

func newHostileDB(t *testing.T) hostileDB {
	t.Helper()
	srv, err := pgtest.Start(pgtest.Options{Name: "review16", Logf: t.Logf})
	if err != nil {
		pgtest.Missing(t, err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx := context.Background()
	dsn := srv.DirectDSN()
	own, err := lock.Open(ctx, dsn, lock.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Close)
	if _, err := own.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	raw, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close(context.Background()) })
	return hostileDB{dsn: dsn, own: own, raw: raw}
}

// tenant is a raw connection with namespace ns's own tenant role.
func (d hostileDB) tenant(t *testing.T, ns string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	c, err := d.own.ProvisionTenant(ctx, "dc-a", ns)
	if err != nil {
		t.Fatal(err)
	}
	dsn, err := lock.TenantDSN(d.dsn, c)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := lock.ParseDatabaseURL(dsn)
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
	d := newHostileDB(t)
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cj := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "report", UID: "cj-uid",
		Annotations: map[string]string{spec.AnnotationMode: "schedule"}}, Spec: batchv1.CronJobSpec{Schedule: "0 * * * *"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(cj).Build()
	rec := events.NewFakeRecorder(100000)
	m := NewLedgerMetrics(d.own, "dc-a", c)
	m.Events = rec
	if err := m.Compute(ctx); err != nil { // the leader's first computation
		t.Fatal(err)
	}

	// The victim: an hourly CronJob whose last window ran nowhere (grace:
	// one hour).
	key := "victim/report"
	if _, err := d.own.RecordView(ctx, key, "dc-a", lock.View{Schedule: "0 * * * *", Mode: "schedule", LeaseTTL: "30s"}, lock.DefaultViewRecency); err != nil {
		t.Fatal(err)
	}
	if err := d.own.RecordDecision(ctx, lock.Decision{Key: key, Cluster: "dc-a", Job: "j", Pod: "p", Action: lock.ActionRun}); err != nil {
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
	missed, _, err := d.own.ListMissed(ctx, lock.MissedFilter{Key: key})
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

// The outcome controller labels the pod's Job with the outcome of
// whichever of its pods it handles last. An Indexed Job's shard that failed
// for good (index 1), handled before the last shard that succeeded (index
// 0), leaves the Job labelled succeeded: `kubectl get jobs -l
// dislock.io/outcome=failed` misses a Job that failed. Likewise a Job whose
// retry succeeded, when the failed first pod is handled after it (a new
// leader's first reconcile order is the cache's, not the pods' end order).
func TestAJobsOutcomeIsItsWorstIndexWhateverOrderPodsAreHandledIn(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cj := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "report", UID: "cj-uid"}}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "report-1", UID: "job-uid",
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))}},
		Spec:   batchv1.JobSpec{CompletionMode: ptr.To(batchv1.IndexedCompletion), Completions: ptr.To[int32](2)},
		Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue}}}}
	failed := finishedPod("ran window 2026-12-02T02:00:00Z of team/report#1 with token 8: failed: container app exit code 1")
	failed.Name, failed.UID = "report-1-1-aaaaa", "pod-1"
	failed.Status.Phase = corev1.PodFailed
	ok := finishedPod("ran window 2026-12-02T02:00:00Z of team/report#0 with token 7: succeeded (1 container(s), exit code 0)")
	ok.Name, ok.UID = "report-1-0-bbbbb", "pod-0"
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(cj, job, failed, ok).Build()
	r := &outcomeRecorder{client: c, reader: c, events: events.NewFakeRecorder(10)}
	for _, p := range []*corev1.Pod{failed, ok} {
		if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: p.Name}}); err != nil {
			t.Fatal(err)
		}
	}
	var got batchv1.Job
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(job), &got); err != nil {
		t.Fatal(err)
	}
	if l := got.Labels[OutcomeLabel]; l != OutcomeFailed {
		t.Errorf("Job %s failed (its shard 1 failed; condition Failed) and is labelled %s=%q: the label is the outcome of the last pod handled",
			job.Name, OutcomeLabel, l)
	}
}

// The injection now adds dislock.io/injected to the pod template's
// labels. A mutating webhook ordered after dislock that sets the template's
// labels as a whole (a JSON patch "add /spec/template/metadata/labels",
// the shape the mesh test used before this change) drops it; on
// reinvocation dislock finds its own injection changed. Before this change
// that edit passed (the test was rewritten to add the label "next to
// dislock's own label" instead).
func TestALaterWebhookThatSetsTheTemplateLabelsGetsTheInjectedLabelBack(t *testing.T) {
	cj, job := errCase(map[string]string{spec.AnnotationMode: "schedule"}, nil)
	out, _, _, err := InjectInNamespace(job, cj, nil, goldenOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out.Spec.Template.Labels = map[string]string{"sidecar.istio.io/inject": "true"}
	again, _, _, err := InjectInNamespace(out, cj, nil, goldenOptions(), nil)
	if err != nil {
		t.Errorf("a later webhook replacing the pod template's labels gets the Job refused on reinvocation (every Job of the CronJob, in this cluster): %v", err)
		return
	}
	if again.Spec.Template.Labels[InjectedLabel] != InjectedLabelValue {
		t.Errorf("after the reinvocation the pod template has no %s: its pods are never handled by the outcome controller", InjectedLabel)
	}
}
