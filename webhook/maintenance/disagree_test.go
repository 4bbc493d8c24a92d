package maintenance

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dislock/dislock/lockagent/store"
)

func TestDisagreementsNameTheCronJobsThatLockTheKey(t *testing.T) {
	t.Parallel()
	cronJob := func(ns, name string, annotations map[string]string) batchv1.CronJob {
		return batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations}}
	}
	views := []store.ClusterView{
		{Key: "reports/nightly", Cluster: "dc-a", View: store.View{Schedule: "0 2 * * *", TimeZone: "Europe/Berlin", Mode: "schedule"}},
		{Key: "reports/nightly", Cluster: "dc-b", View: store.View{Schedule: "0 2 * * *", Mode: "schedule"}},
	}
	got := disagreements(views, []batchv1.CronJob{
		cronJob("reports", "nightly", map[string]string{"dislock.io/mode": "schedule"}),
		// The lock name comes from dislock.io/key, not the CronJob's name.
		cronJob("reports", "nightly-v2", map[string]string{"dislock.io/mode": "schedule", "dislock.io/key": "nightly"}),
		cronJob("reports", "other", map[string]string{"dislock.io/mode": "schedule"}),
		cronJob("billing", "nightly", map[string]string{"dislock.io/mode": "schedule"}),
		cronJob("reports", "unlocked", nil),
	})
	if len(got) != 2 || got[0].cronJob.Name != "nightly" || got[1].cronJob.Name != "nightly-v2" {
		t.Fatalf("disagreements = %+v, want the two CronJobs locking reports/nightly", got)
	}
	for _, want := range []string{`dc-a: schedule "0 2 * * *", timeZone "Europe/Berlin"`, `dc-b: schedule "0 2 * * *", timeZone ""`, "spec.timeZone"} {
		if !strings.Contains(got[0].message, want) {
			t.Errorf("message %q lacks %q", got[0].message, want)
		}
	}
}

// Clusters that prefer different clusters run the same windows, but each
// waits as its own CronJob says: the report names the preference and asks
// for identical annotations, not for a time zone.
func TestADisagreementOnThePreferredClusterAsksForIdenticalAnnotations(t *testing.T) {
	t.Parallel()
	views := []store.ClusterView{
		{Key: "reports/nightly", Cluster: "dc-a", View: store.View{Schedule: "0 2 * * *", Mode: "schedule", PreferCluster: "dc-a", PreferGrace: "20s"}},
		{Key: "reports/nightly", Cluster: "dc-b", View: store.View{Schedule: "0 2 * * *", Mode: "schedule"}},
	}
	if diff := views[0].View.Diff(views[1].View); len(diff) != 2 {
		t.Fatalf("Diff = %q, want the preferred cluster and its grace", diff)
	}
	got := disagreements(views, []batchv1.CronJob{{ObjectMeta: metav1.ObjectMeta{Namespace: "reports", Name: "nightly",
		Annotations: map[string]string{"dislock.io/mode": "schedule"}}}})
	if len(got) != 1 {
		t.Fatalf("disagreements = %+v", got)
	}
	for _, want := range []string{`dc-a: schedule "0 2 * * *", timeZone "", mode schedule`, `preferCluster "dc-a", preferGrace 20s`, "make the dislock.io/ annotations identical in every cluster"} {
		if !strings.Contains(got[0].message, want) {
			t.Errorf("message %q lacks %q", got[0].message, want)
		}
	}
	if strings.Contains(got[0].message, "above all spec.timeZone") {
		t.Errorf("message %q blames the time zone", got[0].message)
	}
}

// Clusters whose Jobs differ in completion mode are told to mend the Job
// template, not an annotation.
func TestADisagreementOnTheCompletionModeNamesTheJobTemplate(t *testing.T) {
	t.Parallel()
	a := store.View{Schedule: "0 2 * * *", Mode: "schedule", CompletionMode: store.CompletionModeIndexed, Completions: 3}
	b := store.View{Schedule: "0 2 * * *", Mode: "schedule", CompletionMode: store.CompletionModeNonIndexed}
	got := store.DisagreementAdvice(a, b)
	if want := "make spec.jobTemplate.spec.completionMode and completions identical in every cluster"; !strings.Contains(got, want) || strings.Contains(got, "annotations") {
		t.Errorf("advice %q, want it to say %q and nothing of annotations", got, want)
	}
}
