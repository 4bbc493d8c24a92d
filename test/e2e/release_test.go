package e2e

import (
	"context"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/test/images"
)

// `helm uninstall`, as docs/install.md says it goes: the webhook
// configurations leave with the release, so no Job of an opted-in
// namespace is refused (a configuration left behind with failurePolicy
// Fail, pointing at a Service with no endpoints, would refuse every one),
// and Jobs are created without the sidecar, unlocked; the namespaces'
// database Secrets stay. The release is installed again afterwards, as a
// user would, for the tests that follow.
func TestHelmUninstallLeavesNoWebhookConfigurationAndJobsAreCreatedUnlocked(t *testing.T) {
	e := Need(t)
	dc := e.DCs[len(e.DCs)-1]
	ctx := context.Background()
	if _, err := dc.helm(ctx, "uninstall", ReleaseName, "--namespace", WebhookNamespace, "--wait"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := installRelease(ctx, dc, e.root, dc.bouncer.DSN(), t.Logf); err != nil {
			t.Fatalf("installing %s again: %v", ReleaseName, err)
		}
		for _, team := range Teams {
			if err := awaitReady(ctx, dc, team); err != nil {
				t.Fatal(err)
			}
		}
	})

	mutating, err := dc.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	validating, err := dc.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, m := range mutating.Items {
		left = append(left, "mutating "+m.Name)
	}
	for _, v := range validating.Items {
		left = append(left, "validating "+v.Name)
	}
	if len(left) > 0 {
		t.Errorf("after helm uninstall these webhook configurations are left: %s", strings.Join(left, ", "))
	}

	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "after-uninstall", Namespace: Namespace},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To(int32(0)),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "app", Image: images.BusyboxRef, ImagePullPolicy: corev1.PullNever,
					Command: []string{"true"}}},
			}},
		},
	}
	created, err := dc.Client.BatchV1().Jobs(Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a Job in opted-in namespace %s after helm uninstall: %v", Namespace, err)
	}
	t.Cleanup(func() {
		_ = dc.Client.BatchV1().Jobs(Namespace).Delete(ctx, job.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	})
	if n := len(created.Spec.Template.Spec.InitContainers); n != 0 {
		t.Errorf("the Job was created with %d init containers; after helm uninstall it gets no sidecar", n)
	}
	if _, err := dc.Client.CoreV1().Secrets(Namespace).Get(ctx, DBSecretName, metav1.GetOptions{}); err != nil {
		t.Errorf("the namespace's database Secret after helm uninstall: %v (docs/install.md: it stays)", err)
	}
}
