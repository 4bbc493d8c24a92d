package outcome

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/webhook/inject"
	"github.com/dislock/dislock/webhook/internal/eventnote"
)

// Every message the agent leaves as its last word maps to one outcome, and
// to took-over when the run took a failed or lapsed owner's window: by its
// termination record (contract.Termination), or, for agents from before the
// record, by the prose they wrote (lockagent/agent: publish, record,
// finishRun, giveUp).
func TestTheAgentsTerminationMessageGivesTheOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, message string
		want          podOutcome
		reason        string
	}{
		{"a run that succeeded",
			"ran window 2026-12-02T02:00:00Z of reports/nightly with token 7: succeeded (1 container(s), exit code 0)",
			podOutcome{OutcomeSucceeded, false}, ReasonRan},
		{"a run that succeeded after taking the window over",
			"ran window 2026-12-02T02:00:00Z (taken over from a failed or lapsed owner) of reports/nightly with token 9: succeeded (2 container(s), exit code 0)",
			podOutcome{OutcomeSucceeded, true}, ReasonTookOver},
		{"a taken-over run that failed",
			"ran window 2026-12-02T02:00:00Z (taken over from a failed or lapsed owner) of reports/nightly with token 9: failed: container app exit code 1",
			podOutcome{OutcomeFailed, true}, ReasonRunFailed},
		{"a manual run whose app failed",
			"ran manual run of reports/nightly with token 3: failed: container app exit code 2",
			podOutcome{OutcomeFailed, false}, ReasonRunFailed},
		{"a run stopped because its lease was lost",
			"ran window 2026-12-02T02:00:00Z of reports/nightly with token 7: failed: container app exit code 143, stopped because the lease was lost",
			podOutcome{OutcomeFailed, false}, ReasonRunFailed},
		{"a run whose end could not be recorded still succeeded",
			"ran window 2026-12-02T02:00:00Z of reports/nightly with token 7: succeeded (1 container(s), exit code 0) (not recorded: recording the outcome: database unavailable)",
			podOutcome{OutcomeSucceeded, false}, ReasonRan},
		{"a run whose clusters disagree",
			"ran window 2026-12-02T02:00:00Z of reports/nightly with token 7: succeeded (1 container(s), exit code 0); clusters see this job differently: dc-b: schedule \"0 3 * * *\"",
			podOutcome{OutcomeSucceeded, false}, ReasonRan},
		{"no app container reported",
			"ran window 2026-12-02T02:00:00Z of reports/nightly with token 7: failed: no app container reported a result (killed, or never started)",
			podOutcome{OutcomeFailed, false}, ReasonRunFailed},
		{"another cluster owns the window",
			"skip: window 2026-12-02T02:00:00Z already claimed by dc-b/nightly-29123/nightly-29123-x (running)",
			podOutcome{OutcomeSkipped, false}, ReasonSkipped},
		{"a stale window",
			"skip: stale: window 2026-12-02T02:00:00Z started 3m0s ago by database time, more than catchup 1m0s",
			podOutcome{OutcomeSkipped, false}, ReasonSkipped},
		{"the database was unreachable",
			"error: could not decide: claiming window 2026-12-02T02:00:00Z: database unavailable: dial tcp 10.0.0.7:5432: connect: connection refused",
			podOutcome{OutcomeError, false}, ReasonError},
		{"the app never started",
			"gave the claim up: app container(s) app did not start within the app-start timeout 10m0s after the run decision (image pull failing, or a missing volume?)",
			podOutcome{OutcomeFailed, false}, ReasonRunFailed},
		{"stopped while the app may run",
			"stopped while an app of window 2026-12-02T02:00:00Z of reports/nightly may still run; the claim is left to lapse",
			podOutcome{OutcomeFailed, false}, ReasonRunFailed},
		{"stopped before deciding",
			"stopped before a decision was reached: nothing ran; a restarted sidecar decides again",
			podOutcome{OutcomeError, false}, ReasonError},
		{"killed after deciding to run, before recording the end",
			"run: window 2026-12-02T02:00:00Z of reports/nightly claimed; lease reports/nightly acquired until 2026-12-02T02:00:30Z",
			podOutcome{OutcomeFailed, false}, ReasonRunFailed},
		{"killed after taking a window over, before recording the end",
			"run: window 2026-12-02T02:00:00Z of reports/nightly took-over",
			podOutcome{OutcomeFailed, true}, ReasonRunFailed},
		{"killed while waiting as a standby",
			"waiting: standby: the window's owner dc-b/nightly-29123/nightly-29123-x is alive",
			podOutcome{OutcomeError, false}, ReasonError},
		{"a record of a run that succeeded after taking the window over",
			"ran window 2026-12-02T02:00:00Z (taken over from a failed or lapsed owner) of reports/nightly with token 9: succeeded (2 container(s), exit code 0)\n" +
				contract.LabelOutcome + "=succeeded " + contract.LabelTookOver + "=true",
			podOutcome{OutcomeSucceeded, true}, ReasonTookOver},
		{"a record says the outcome, whatever the prose before it",
			"ran window 2026-12-02T02:00:00Z of reports/nightly with token 7: succeeded\n" + contract.LabelOutcome + "=skipped",
			podOutcome{OutcomeSkipped, false}, ReasonSkipped},
		{"a record dislock does not write (or one the kubelet cut) is read by the account before it",
			"ran window 2026-12-02T02:00:00Z of reports/nightly with token 7: succeeded\n" + contract.LabelOutcome + "=great",
			podOutcome{OutcomeSucceeded, false}, ReasonRan},
		{"a broken record without an account is an error",
			contract.LabelOutcome + "=great",
			podOutcome{OutcomeError, false}, ReasonError},
		{"no message at all", "", podOutcome{OutcomeError, false}, ReasonError},
		{"the kubelet's trailing newline", "skip: stale\n", podOutcome{OutcomeSkipped, false}, ReasonSkipped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, _ := parseOutcome(tc.message)
			if got != tc.want {
				t.Fatalf("parseOutcome(%q) = %+v, want %+v", tc.message, got, tc.want)
			}
			eventType, reason := got.event()
			if reason != tc.reason {
				t.Errorf("reason %s, want %s", reason, tc.reason)
			}
			wantType := corev1.EventTypeWarning
			if reason == ReasonRan || reason == ReasonSkipped {
				wantType = corev1.EventTypeNormal
			}
			if eventType != wantType {
				t.Errorf("event type %s, want %s", eventType, wantType)
			}
		})
	}
}

// The Event repeats the account the sidecar wrote for people, not its
// record line: the labels say that already.
func TestTheEventRepeatsTheAccountWithoutTheRecord(t *testing.T) {
	t.Parallel()
	account := "skip: window 2026-12-02T02:00:00Z already claimed by dc-b/reports/nightly-29123/uid/nightly-29123-x (running)"
	msg, _ := agentEnd(finishedPod(contract.Termination{Outcome: contract.OutcomeSkipped, Message: account}.Encode()))
	o, got := parseOutcome(msg)
	if o.Outcome != OutcomeSkipped || got != account {
		t.Errorf("parseOutcome(%q) = %+v, %q; want skipped and the account %q", msg, o, got, account)
	}
}

// finishedPod is an injected pod of Job report-1 whose sidecar ended with
// message after its app container exited.
func finishedPod(message string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "report-1-abcde", UID: "pod-uid", ResourceVersion: "7",
			Labels:          map[string]string{contract.LabelInjected: contract.LabelInjectedValue, "batch.kubernetes.io/job-name": "report-1"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "report-1", UID: "job-uid", Controller: ptr.To(true)}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodSucceeded,
			InitContainerStatuses: []corev1.ContainerStatus{{Name: inject.SidecarName,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Message: message + "\n"}}}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Message: "the app's own last words"}}}},
		},
	}
}

// A pod is judged once it finished, or once its sidecar ended after its apps
// (the phase follows) or while it is deleted; a sidecar the kubelet
// restarts while the apps run has not said the pod's last word.
func TestAPodIsJudgedOnlyOnceItsAgentHasSaidItsLastWord(t *testing.T) {
	t.Parallel()
	const last = "skip: stale"
	for _, tc := range []struct {
		name     string
		edit     func(*corev1.Pod)
		done     bool
		wantText string
	}{
		{"the pod succeeded", func(*corev1.Pod) {}, true, last},
		{"the pod failed without its sidecar ever running", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodFailed
			p.Status.InitContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}
		}, true, ""},
		{"the sidecar and every app ended, the phase not yet", func(p *corev1.Pod) { p.Status.Phase = corev1.PodRunning }, true, last},
		{"the sidecar ended while the app still runs", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
		}, false, last},
		{"the sidecar ended in a pod being deleted", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.DeletionTimestamp = &metav1.Time{}
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
		}, true, last},
		{"the kubelet restarted the sidecar; the pod then ended", func(p *corev1.Pod) {
			p.Status.InitContainerStatuses[0].LastTerminationState = p.Status.InitContainerStatuses[0].State
			p.Status.InitContainerStatuses[0].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
		}, true, last},
		{"the restarted sidecar runs on", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.InitContainerStatuses[0].LastTerminationState = p.Status.InitContainerStatuses[0].State
			p.Status.InitContainerStatuses[0].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
		}, false, last},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod := finishedPod(last)
			tc.edit(pod)
			msg, done := agentEnd(pod)
			if done != tc.done || msg != tc.wantText {
				t.Fatalf("agentEnd = %q, %v; want %q, %v", msg, done, tc.wantText, tc.done)
			}
		})
	}
}

// An Event's note holds at most 1 kB: the agent's message (up to 4000
// bytes) is cut on a rune boundary, and an empty one says why.
func TestTheEventNoteNamesThePodAndFitsAnEvent(t *testing.T) {
	t.Parallel()
	long := "ran window 2026-12-02T02:00:00Z of reports/nightly with token 7: failed: " + strings.Repeat("ü", 3000)
	note := outcomeNote(finishedPod(long), long)
	if len(note) > eventnote.Max || !utf8.ValidString(note) || !strings.HasPrefix(note, "pod report-1-abcde: ran window") || !strings.HasSuffix(note, "…") {
		t.Errorf("note of %d bytes (valid UTF-8: %v): %.80q…", len(note), utf8.ValidString(note), note)
	}
	pod := finishedPod("")
	pod.Status.Phase, pod.Status.Reason = corev1.PodFailed, "DeadlineExceeded"
	if got, want := outcomeNote(pod, ""), "pod report-1-abcde: "+msgNoMessage+" (pod Failed: DeadlineExceeded)"; got != want {
		t.Errorf("note %q, want %q", got, want)
	}
}

// The cache keeps of a pod what the controller reads: its identity, labels,
// owners, creation time and completion index, phase and container states,
// the sidecar's message, and nothing of its spec or of the apps' messages.
func TestTheCachedPodIsTrimmedToWhatTheOutcomeNeeds(t *testing.T) {
	t.Parallel()
	pod := finishedPod("skip: stale")
	pod.Annotations = map[string]string{"big": strings.Repeat("x", 10000), contract.AnnotationJobCompletionIndex: "3"}
	pod.CreationTimestamp = metav1.NewTime(time.Date(2026, 12, 2, 2, 0, 1, 0, time.UTC))
	pod.Spec.Containers = []corev1.Container{{Name: "app", Image: "app", Env: []corev1.EnvVar{{Name: "A", Value: "b"}}}}
	pod.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	got, err := trimPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := got.(*corev1.Pod)
	msg, done := agentEnd(trimmed)
	// The creation time and completion index tell which pod of a Job's
	// index is newest.
	if msg != "skip: stale" || !done || trimmed.ResourceVersion != "7" || trimmed.UID != "pod-uid" ||
		metav1.GetControllerOf(trimmed) == nil || trimmed.Labels[contract.LabelInjected] != contract.LabelInjectedValue ||
		!trimmed.CreationTimestamp.Equal(&pod.CreationTimestamp) || trimmed.Annotations[contract.AnnotationJobCompletionIndex] != "3" {
		t.Fatalf("the trimmed pod lost what the controller reads: %+v", trimmed)
	}
	if len(trimmed.Annotations) != 1 || len(trimmed.Spec.Containers) != 0 || len(trimmed.ManagedFields) != 0 ||
		trimmed.Status.ContainerStatuses[0].State.Terminated.Message != "" {
		t.Errorf("the trimmed pod keeps what nobody reads: %+v", trimmed)
	}
	if other, _ := trimPod("not a pod"); other != "not a pod" {
		t.Errorf("trimPod changed a non-pod: %v", other)
	}
}

// The label patch carries the UID (and the pod's resourceVersion) as
// preconditions, and removes took-over where the run did not take over, so
// that a retry that succeeded clears it.
func TestTheLabelPatchSetsTheOutcomeAndRemovesAStaleTookOver(t *testing.T) {
	t.Parallel()
	var got map[string]map[string]any
	if err := json.Unmarshal(labelPatch("u", "", podOutcome{Outcome: OutcomeSkipped}, nil), &got); err != nil {
		t.Fatal(err)
	}
	labels := got["metadata"]["labels"].(map[string]any)
	if v, ok := labels[contract.LabelTookOver]; !ok || v != nil || labels[contract.LabelOutcome] != OutcomeSkipped || got["metadata"]["uid"] != "u" {
		t.Errorf("patch %v", got)
	}
	if _, ok := got["metadata"]["resourceVersion"]; ok {
		t.Errorf("a Job's patch carries a resourceVersion: %v", got)
	}
	if err := json.Unmarshal(labelPatch("u", "7", podOutcome{Outcome: OutcomeSucceeded, TookOver: true}, nil), &got); err != nil {
		t.Fatal(err)
	}
	if labels := got["metadata"]["labels"].(map[string]any); labels[contract.LabelTookOver] != "true" || got["metadata"]["resourceVersion"] != "7" {
		t.Errorf("patch %v", got)
	}
}

// A finished pod labels itself and its Job and gives its CronJob one Event;
// reconciling it again (a resync, a new leader) gives no second one.
func TestAFinishedPodIsLabelledAndToldOnItsCronJobOnce(t *testing.T) {
	t.Parallel()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cj := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "report", UID: "cj-uid"}}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "report-1", UID: "job-uid",
		Labels:          map[string]string{contract.LabelTookOver: "true"}, // an earlier pod of the Job took over
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))}}}
	pod := finishedPod("ran window 2026-12-02T02:00:00Z of team/report with token 7: succeeded (1 container(s), exit code 0)")
	pod.ResourceVersion = ""
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(cj, job, pod).Build()
	rec := events.NewFakeRecorder(10)
	r := &outcomeRecorder{client: c, reader: c, events: rec}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: pod.Name}}
	for range 2 {
		if _, err := r.Reconcile(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	for name, o := range map[string]client.Object{pod.Name: &corev1.Pod{}, job.Name: &batchv1.Job{}} {
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "team", Name: name}, o); err != nil {
			t.Fatal(err)
		}
		if l := o.GetLabels(); l[contract.LabelOutcome] != OutcomeSucceeded || l[contract.LabelTookOver] != "" {
			t.Errorf("%T %s labels %v, want outcome succeeded and no took-over", o, name, l)
		}
	}
	close(rec.Events)
	var got []string
	for e := range rec.Events {
		got = append(got, e)
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], "Normal DislockRan pod report-1-abcde: ran window 2026-12-02T02:00:00Z") {
		t.Fatalf("events %q, want one DislockRan naming the pod", got)
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
	if l := got.Labels[contract.LabelOutcome]; l != OutcomeFailed {
		t.Errorf("Job %s failed (its shard 1 failed; condition Failed) and is labelled %s=%q: the label is the outcome of the last pod handled",
			job.Name, contract.LabelOutcome, l)
	}
}
