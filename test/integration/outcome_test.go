package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/webhook/controller/outcome"
	"github.com/dislock/dislock/webhook/inject"
)

// A person asks kubectl how a CronJob's runs ended: `kubectl get jobs -l
// dislock.io/outcome=failed`, `kubectl describe cronjob`. The Job controller
// creates the pods of injected Jobs; with no kubelet here, each pod's status
// is written as the kubelet would once its dislock-agent sidecar ended with
// the agent's last message. The webhook labels the pod and its Job and puts
// one Event per pod on the CronJob; a Job's labels follow its last finished
// pod, so a retry that succeeds clears a failure.
func TestFinishedPodsSayHowTheirRunEndedOnPodJobAndCronJob(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	ctx := context.Background()
	namespace(t, cs, webhookNamespace, false)
	startWebhook(t, c, cs)
	const ns = "outcome"
	namespace(t, cs, ns, true)
	awaitOptedIn(t, cs, ns)
	cj, err := cs.BatchV1().CronJobs(ns).Create(ctx, withAnnotations(cronJob(ns, "report", "0 0 1 1 *"),
		map[string]string{contract.AnnotationMode: "schedule"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string // the namespace's Events at the last look, for a failure message
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("events in namespace %s:\n%s", ns, strings.Join(seen, "\n"))
		}
	})

	type want struct {
		outcome, tookOver, eventType, reason string
	}
	steps := []struct {
		name    string
		tick    time.Time
		phase   corev1.PodPhase
		message string // the sidecar's termination message; %s is the window
		want    want
	}{
		{"a run that succeeded", time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC), corev1.PodSucceeded,
			"ran window %s of outcome/report with token 7: succeeded (1 container(s), exit code 0)",
			want{outcome.OutcomeSucceeded, "", corev1.EventTypeNormal, outcome.ReasonRan}},
		{"a skip", time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC), corev1.PodSucceeded,
			"skip: window %s already claimed by dc-b/report-29123/report-29123-x (running)",
			want{outcome.OutcomeSkipped, "", corev1.EventTypeNormal, outcome.ReasonSkipped}},
		{"a taken-over run that failed", time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC), corev1.PodFailed,
			"ran window %s (taken over from a failed or lapsed owner) of outcome/report with token 9: failed: container app exit code 1",
			want{outcome.OutcomeFailed, "true", corev1.EventTypeWarning, outcome.ReasonRunFailed}},
	}
	jobs := map[string]*batchv1.Job{}
	pods := map[string]*corev1.Pod{}
	for _, s := range steps {
		job := createJob(t, cs, jobFor(cj, s.tick))
		jobs[s.name] = job
		pod := awaitNewPod(t, cs, job, nil)
		if pod.Labels[contract.LabelInjected] != contract.LabelInjectedValue {
			t.Fatalf("pod %s of an injected Job has labels %v, want %s", pod.Name, pod.Labels, contract.LabelInjected)
		}
		pods[s.name] = finishPod(t, cs, pod, s.phase, fmt.Sprintf(s.message, s.tick.Format(time.RFC3339)))
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			awaitOutcome(t, cs, jobs[s.name], pods[s.name], s.want.outcome, s.want.tookOver)
			e := awaitEvent(t, cs, &seen, pods[s.name].Name, s.want.reason)
			if e.Type != s.want.eventType || e.Regarding.Kind != "CronJob" || e.Regarding.Name != "report" ||
				e.Related == nil || e.Related.Name != pods[s.name].Name || !strings.Contains(e.Note, s.tick.Format(time.RFC3339)) {
				t.Errorf("event %s %s on %s/%s (related %v): %s", e.Type, e.Reason, e.Regarding.Kind, e.Regarding.Name, e.Related, e.Note)
			}
		})
	}

	// The failed pod's Job retries (after the Job controller's backoff); its
	// retry succeeds, and the Job says so, no longer took-over.
	failed := steps[2]
	retry := awaitNewPod(t, cs, jobs[failed.name], pods[failed.name])
	retry = finishPod(t, cs, retry, corev1.PodSucceeded,
		fmt.Sprintf("ran window %s of outcome/report with token 10: succeeded (1 container(s), exit code 0)", failed.tick.Format(time.RFC3339)))
	awaitOutcome(t, cs, jobs[failed.name], retry, outcome.OutcomeSucceeded, "")
	awaitEvent(t, cs, &seen, retry.Name, outcome.ReasonRan)

	// One Event per pod: the label the pod carries marks it handled.
	evs, err := cs.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	perPod := map[string]int{}
	for _, e := range evs.Items {
		if strings.HasPrefix(e.Reason, "Dislock") && e.Related != nil && e.Related.Kind == "Pod" {
			perPod[e.Related.Name] += occurrences(e.Series)
		}
	}
	for _, p := range append([]*corev1.Pod{retry}, pods[steps[0].name], pods[steps[1].name], pods[steps[2].name]) {
		if perPod[p.Name] != 1 {
			t.Errorf("pod %s has %d Events on the CronJob, want 1", p.Name, perPod[p.Name])
		}
	}
}

// awaitNewPod waits for a pod of job other than not (the Job controller
// creates them) and returns it.
func awaitNewPod(t *testing.T, cs kubernetes.Interface, job *batchv1.Job, not *corev1.Pod) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	await(t, "a pod of Job "+job.Name, func() (bool, error) {
		list, err := cs.CoreV1().Pods(job.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job.Name})
		if err != nil {
			return false, err
		}
		for i := range list.Items {
			if not == nil || list.Items[i].UID != not.UID {
				pod = &list.Items[i]
				return true, nil
			}
		}
		if refused := failedCreate(context.Background(), cs, job); refused != "" {
			return false, fmt.Errorf("the Job controller could not create a pod: %s", refused)
		}
		return false, nil
	})
	return pod
}

// finishPod writes the status the kubelet would once the pod's app exited
// and its sidecar ended with message.
func finishPod(t *testing.T, cs kubernetes.Interface, pod *corev1.Pod, phase corev1.PodPhase, message string) *corev1.Pod {
	t.Helper()
	now := metav1.Now()
	exit := int32(0)
	if phase == corev1.PodFailed {
		exit = 1
	}
	terminated := func(code int32, msg string) corev1.ContainerState {
		reason := "Completed"
		if code != 0 {
			reason = "Error"
		}
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: msg, StartedAt: now, FinishedAt: now}}
	}
	pod = pod.DeepCopy()
	pod.Status.Phase = phase
	pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: inject.SidecarName, Image: pod.Spec.InitContainers[0].Image,
		ImageID: "docker.io/library/dislock@sha256:" + strings.Repeat("0", 64), State: terminated(0, message+"\n")}}
	var apps []corev1.ContainerStatus
	for _, c := range pod.Spec.Containers {
		apps = append(apps, corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: "docker.io/library/busybox@sha256:" + strings.Repeat("1", 64),
			State: terminated(exit, "")})
	}
	pod.Status.ContainerStatuses = apps
	updated, err := cs.CoreV1().Pods(pod.Namespace).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("writing pod %s's status: %v", pod.Name, err)
	}
	return updated
}

// awaitOutcome waits until pod and job carry the outcome labels.
func awaitOutcome(t *testing.T, cs kubernetes.Interface, job *batchv1.Job, pod *corev1.Pod, outcome, tookOver string) {
	t.Helper()
	ctx := context.Background()
	await(t, fmt.Sprintf("pod %s and Job %s labelled %s=%s, %s=%q", pod.Name, job.Name, contract.LabelOutcome, outcome, contract.LabelTookOver, tookOver), func() (bool, error) {
		p, err := cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		j, err := cs.BatchV1().Jobs(job.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Labels[contract.LabelOutcome] == outcome && p.Labels[contract.LabelTookOver] == tookOver &&
			j.Labels[contract.LabelOutcome] == outcome && j.Labels[contract.LabelTookOver] == tookOver, nil
	})
}

// awaitEvent waits for the Event of reason about pod and returns it.
func awaitEvent(t *testing.T, cs kubernetes.Interface, seen *[]string, pod, reason string) (found eventsv1.Event) {
	t.Helper()
	await(t, reason+" Event for pod "+pod, func() (bool, error) {
		evs, err := cs.EventsV1().Events("outcome").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		*seen = (*seen)[:0]
		for _, e := range evs.Items {
			*seen = append(*seen, e.Type+" "+e.Regarding.Kind+"/"+e.Regarding.Name+" "+e.Reason+": "+e.Note)
		}
		for _, e := range evs.Items {
			if e.Reason == reason && strings.HasPrefix(e.Note, "pod "+pod+": ") {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	return found
}

// occurrences is how many times an Event happened: a repeat is a series.
func occurrences(s *eventsv1.EventSeries) int {
	if s == nil {
		return 1
	}
	return int(s.Count)
}
