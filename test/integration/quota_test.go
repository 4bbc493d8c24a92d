package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/webhook/inject"
)

// Opted-in Jobs run where a ResourceQuota counts CPU and memory limits (so
// every container must set them) and a strict LimitRange bounds each
// container: the sidecar's default sizes satisfy the quota, and a CronJob
// whose namespace wants more sets its sidecar's sizes by annotation. The
// API server's own quota and LimitRange admission decide, on the pods the
// real Job controller creates.
func TestOptedInJobsRunUnderAResourceQuotaAndAStrictLimitRange(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	ctx := context.Background()
	startWebhook(t, c, cs)
	namespace(t, cs, webhookNamespace, false)
	for _, ns := range []string{"quota", "quota-strict"} {
		namespace(t, cs, ns, true)
		awaitOptedIn(t, cs, ns)
		quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "compute", Namespace: ns},
			Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
				corev1.ResourceRequestsCPU: resource.MustParse("2"), corev1.ResourceRequestsMemory: resource.MustParse("2Gi"),
				corev1.ResourceLimitsCPU: resource.MustParse("4"), corev1.ResourceLimitsMemory: resource.MustParse("4Gi"),
			}}}
		if _, err := cs.CoreV1().ResourceQuotas(ns).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The quota admits pods once its controller has computed its usage.
		await(t, "the quota of "+ns+" to be counted", func() (bool, error) {
			q, err := cs.CoreV1().ResourceQuotas(ns).Get(ctx, "compute", metav1.GetOptions{})
			return err == nil && len(q.Status.Hard) > 0, err
		})
	}
	// At least 50m CPU and 32Mi per container, and a limit at most 4 times
	// the request: the sidecar's defaults (10m/500m) break all three.
	strict := &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "strict", Namespace: "quota-strict"},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
			Type:                 corev1.LimitTypeContainer,
			Min:                  corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Max:                  corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("512Mi")},
			MaxLimitRequestRatio: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")},
		}}}}
	if _, err := cs.CoreV1().LimitRanges("quota-strict").Create(ctx, strict, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	sized := map[string]string{
		contract.AnnotationAgentCPURequest: "50m", contract.AnnotationAgentCPULimit: "200m",
		contract.AnnotationAgentMemoryRequest: "32Mi", contract.AnnotationAgentMemoryLimit: "64Mi",
	}
	tests := []struct {
		name, ns string
		sizes    map[string]string
		// refusal is what the API server says of the pod, "" if admitted.
		refusal string
	}{
		{"the default sizes under a limits quota", "quota", nil, ""},
		// The LimitRange names no container; 10m is the sidecar's request.
		{"the default sizes under a strict LimitRange", "quota-strict", nil, "minimum cpu usage per Container is 50m, but request is " + inject.DefaultAgentCPURequest},
		{"sizes set by annotation under a strict LimitRange", "quota-strict", sized, ""},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			annotations := map[string]string{contract.AnnotationMode: "schedule"}
			for k, v := range tc.sizes {
				annotations[k] = v
			}
			cj := withAnnotations(cronJob(tc.ns, "sized-"+itoa(i), "*/5 * * * *"), annotations)
			app := &cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0]
			app.Resources = corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
			}
			created, err := cs.BatchV1().CronJobs(tc.ns).Create(ctx, cj, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			job := createJob(t, cs, jobFor(created, time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)))
			var pod *corev1.Pod
			var refused string
			await(t, "a pod of Job "+job.Name+", or the Job controller's report that it could not create one", func() (bool, error) {
				pods, err := cs.CoreV1().Pods(tc.ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job.Name})
				if err != nil {
					return false, err
				}
				if len(pods.Items) > 0 {
					pod = &pods.Items[0]
					return true, nil
				}
				refused = failedCreate(ctx, cs, job)
				return refused != "", nil
			})
			switch {
			case tc.refusal == "" && pod == nil:
				t.Fatalf("the API server refused the pod: %s", refused)
			case tc.refusal != "" && pod != nil:
				t.Fatalf("the pod was admitted; want it refused with %q", tc.refusal)
			case tc.refusal != "":
				if !strings.Contains(refused, tc.refusal) {
					t.Errorf("refusal %q does not name the sidecar's problem %q", refused, tc.refusal)
				}
				return
			}
			agent := pod.Spec.InitContainers[0]
			if agent.Name != inject.SidecarName {
				t.Fatalf("the pod's first init container is %s, want the sidecar", agent.Name)
			}
			if _, ok := agent.Resources.Limits[corev1.ResourceCPU]; !ok {
				t.Errorf("the sidecar has no CPU limit: %v", agent.Resources)
			}
			for k, v := range tc.sizes {
				want := resource.MustParse(v)
				var got resource.Quantity
				switch k {
				case contract.AnnotationAgentCPURequest:
					got = agent.Resources.Requests[corev1.ResourceCPU]
				case contract.AnnotationAgentCPULimit:
					got = agent.Resources.Limits[corev1.ResourceCPU]
				case contract.AnnotationAgentMemoryRequest:
					got = agent.Resources.Requests[corev1.ResourceMemory]
				case contract.AnnotationAgentMemoryLimit:
					got = agent.Resources.Limits[corev1.ResourceMemory]
				}
				if got.Cmp(want) != 0 {
					t.Errorf("%s = %s, but the sidecar has %s", k, v, got.String())
				}
			}
			t.Logf("pod %s admitted; sidecar %v", pod.Name, agent.Resources)
		})
	}
}

// failedCreate is the message of the Job controller's FailedCreate event on
// the Job, "" while there is none.
func failedCreate(ctx context.Context, cs kubernetes.Interface, job *batchv1.Job) string {
	events, err := cs.CoreV1().Events(job.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + job.Name})
	if err != nil {
		return ""
	}
	for _, e := range events.Items {
		if e.Reason == "FailedCreate" {
			return e.Message
		}
	}
	return ""
}
