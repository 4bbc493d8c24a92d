package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/webhook/inject"
)

// A tenant who writes the injection itself gets nothing the webhook did not
// make: the API server, calling the webhook through the shipped
// matchConditions, refuses an injected Job with another team's key, and a
// Job no CronJob owns that carries a sidecar; an exact copy of an injected
// Job, defaulted by the API server, is stored as it is.
func TestForgedInjectionsAreRefusedByTheAPIServer(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	ctx := context.Background()
	startWebhook(t, c, cs)
	namespace(t, cs, webhookNamespace, false)
	namespace(t, cs, "team-a", true)
	awaitOptedIn(t, cs, "team-a")

	cj := withAnnotations(cronJob("team-a", "nightly", "0 3 * * *"), map[string]string{contract.AnnotationMode: "schedule,lease"})
	cj.Spec.Suspend = ptr.To(true) // no Job of the controller's in the way
	cj, err := cs.BatchV1().CronJobs("team-a").Create(ctx, cj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stored := createJob(t, cs, jobFor(cj, time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)))
	assertInjected(t, stored, "2026-12-02T03:00:00Z", "schedule,lease")

	// What `kubectl get job -o yaml` gives, less what the API server
	// generates for each Job (the selector and its labels) and keeps for it.
	copyOf := func(job *batchv1.Job) *batchv1.Job {
		out := job.DeepCopy()
		out.ObjectMeta = metav1.ObjectMeta{Namespace: job.Namespace, Name: job.Name, Labels: job.Labels,
			Annotations: job.Annotations, OwnerReferences: job.OwnerReferences}
		out.Status = batchv1.JobStatus{}
		out.Spec.Selector = nil
		for _, l := range []string{"controller-uid", "job-name", inject.UIDLabel, contract.LabelJobName} {
			delete(out.Labels, l)
			delete(out.Spec.Template.Labels, l)
		}
		return out
	}
	refused := func(t *testing.T, job *batchv1.Job, want ...string) {
		t.Helper()
		_, err := cs.BatchV1().Jobs(job.Namespace).Create(ctx, job, metav1.CreateOptions{})
		if err == nil {
			t.Fatalf("the API server stored job %s", job.Name)
		}
		for _, w := range append([]string{`admission webhook "jobs.dislock.io" denied the request`}, want...) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("the refusal does not say %q:\n%v", w, err)
			}
		}
	}

	t.Run("an injected Job with another team's key is refused, naming DISLOCK_KEY", func(t *testing.T) {
		forged := copyOf(stored)
		forged.Name = stored.Name + "-forged"
		sc := &forged.Spec.Template.Spec.InitContainers[0]
		for i := range sc.Env {
			if sc.Env[i].Name == contract.EnvKey {
				sc.Env[i].Value = "team-b/nightly"
			}
		}
		refused(t, forged, `env[DISLOCK_KEY].value is "team-b/nightly"; dislock injects "team-a/nightly"`,
			"remove the dislock-agent init container and the dislock.io/status annotation")
	})

	t.Run("a Job no CronJob owns that carries the injection is refused", func(t *testing.T) {
		bare := copyOf(stored)
		bare.Name, bare.OwnerReferences = "bare-forged", nil
		refused(t, bare, "dislock only injects Jobs created by a CronJob")
	})

	t.Run("a Job no CronJob owns with only a sidecar of that name is refused", func(t *testing.T) {
		bare := jobFor(cj, time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC))
		bare.Name, bare.OwnerReferences, bare.Annotations = "bare-sidecar", nil, nil
		bare.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: inject.SidecarName, Image: "dislock:test",
			RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways), Env: []corev1.EnvVar{{Name: contract.EnvKey, Value: "team-b/nightly"}}}}
		refused(t, bare, "dislock only injects Jobs created by a CronJob", `spec.template.spec.initContainers[0] is named "dislock-agent"`)
	})

	t.Run("a Job no CronJob owns with dislock.io/ annotations of its user's is stored untouched", func(t *testing.T) {
		bare := jobFor(cj, time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC))
		bare.Name, bare.OwnerReferences = "bare-annotated", nil
		bare.Annotations[contract.AnnotationMode] = "schedule"
		assertUntouched(t, createJob(t, cs, bare))
	})

	t.Run("an exact copy of an injected Job is stored as it is", func(t *testing.T) {
		cp := copyOf(stored)
		background := metav1.DeletePropagationBackground
		if err := cs.BatchV1().Jobs(stored.Namespace).Delete(ctx, stored.Name, metav1.DeleteOptions{PropagationPolicy: &background}); err != nil {
			t.Fatal(err)
		}
		await(t, "job "+stored.Name+" to be deleted", func() (bool, error) {
			_, err := cs.BatchV1().Jobs(stored.Namespace).Get(ctx, stored.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		again := createJob(t, cs, cp)
		if again.Annotations[contract.AnnotationStatus] != stored.Annotations[contract.AnnotationStatus] ||
			!apiequality.Semantic.DeepEqual(again.Spec.Template.Spec, stored.Spec.Template.Spec) {
			t.Errorf("the copy was changed:\nstatus %s\nwas    %s", again.Annotations[contract.AnnotationStatus], stored.Annotations[contract.AnnotationStatus])
		}
	})
}
