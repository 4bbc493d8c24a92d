package outcome

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/webhook/inject"
	"github.com/dislock/dislock/webhook/internal/eventnote"
)

// jobPatchRetry paces the retries of a Job's label patch that lost a race
// with another update of the Job: 10 tries within about 2 s.
var jobPatchRetry = wait.Backoff{Steps: 10, Duration: 20 * time.Millisecond, Factor: 1.5, Jitter: 0.2}

// maxJobOutcomes bounds the indexes contract.AnnotationJobOutcomes keeps (an
// annotation is limited in size); past it, only failures and errors are
// added.
const maxJobOutcomes = 512

// indexOutcome is one entry of contract.AnnotationJobOutcomes.
type indexOutcome struct {
	Outcome  string    `json:"o"`
	TookOver bool      `json:"t,omitempty"`
	Pod      string    `json:"p"`
	Created  time.Time `json:"c"`
}

// outcomeRank orders a Job's outcomes: its label is the highest of its
// indexes' (a failed index makes the Job failed, whatever the others did).
var outcomeRank = map[string]int{OutcomeSkipped: 1, OutcomeSucceeded: 2, OutcomeError: 3, OutcomeFailed: 4}

// jobOutcome folds pod's outcome o into the Job's per-index outcomes (raw,
// the annotation's value) and returns the new annotation and the Job's
// outcome. A pod created before the one already recorded for its index (a
// retry handled first) changes nothing.
func jobOutcome(raw string, pod *corev1.Pod, o podOutcome) (annotation string, job podOutcome) {
	byIndex := map[string]indexOutcome{}
	if raw != "" {
		_ = json.Unmarshal([]byte(raw), &byIndex) // unreadable: start afresh
	}
	index := pod.Annotations[contract.AnnotationJobCompletionIndex]
	if index == "" {
		index = "-"
	}
	cur, seen := byIndex[index]
	newer := !seen || pod.CreationTimestamp.Time.After(cur.Created) ||
		(pod.CreationTimestamp.Time.Equal(cur.Created) && pod.Name >= cur.Pod)
	if newer && (seen || len(byIndex) < maxJobOutcomes || outcomeRank[o.Outcome] >= outcomeRank[OutcomeError]) {
		byIndex[index] = indexOutcome{Outcome: o.Outcome, TookOver: o.TookOver, Pod: pod.Name, Created: pod.CreationTimestamp.Time.UTC()}
	}
	for _, e := range byIndex {
		if outcomeRank[e.Outcome] > outcomeRank[job.Outcome] {
			job.Outcome = e.Outcome
		}
		job.TookOver = job.TookOver || e.TookOver
	}
	b, err := json.Marshal(byIndex)
	if err != nil {
		panic(err) // strings, booleans and times only
	}
	return string(b), job
}

// Values of contract.LabelOutcome: the Outcome of the sidecar's Termination.
const (
	OutcomeSucceeded = string(contract.OutcomeSucceeded)
	OutcomeFailed    = string(contract.OutcomeFailed)
	OutcomeSkipped   = string(contract.OutcomeSkipped)
	OutcomeError     = string(contract.OutcomeError)
)

// Reasons of the Event put on the CronJob for each finished pod.
const (
	ReasonRan       = "DislockRan"       // Normal: succeeded
	ReasonTookOver  = "DislockTookOver"  // Warning: succeeded after taking a failed or lapsed owner's window over
	ReasonSkipped   = "DislockSkipped"   // Normal
	ReasonRunFailed = "DislockRunFailed" // Warning
	ReasonError     = "DislockError"     // Warning
)

// msgNoMessage is the Event's note of a pod whose sidecar left no
// termination message: the kubelet never saw it end.
const msgNoMessage = "the dislock-agent container left no termination message"

// podOutcome is what a finished pod's sidecar said, as labels and an Event.
type podOutcome struct {
	Outcome  string
	TookOver bool
}

// parseOutcome reads the sidecar's termination message
// (contract.Termination): the pod's outcome, and the account the Event
// repeats. A message that is not one dislock writes is an error outcome:
// the pod ended without the agent saying how its run ended.
func parseOutcome(msg string) (podOutcome, string) {
	t, _ := contract.ParseTermination(msg)
	return podOutcome{Outcome: string(t.Outcome), TookOver: t.TookOver}, t.Message
}

// event is the Event type and reason of an outcome: Normal for a run that
// succeeded as planned and for a skip, Warning otherwise (a take-over means
// another pod's run failed or died first).
func (o podOutcome) event() (eventType, reason string) {
	switch {
	case o.Outcome == OutcomeSucceeded && o.TookOver:
		return corev1.EventTypeWarning, ReasonTookOver
	case o.Outcome == OutcomeSucceeded:
		return corev1.EventTypeNormal, ReasonRan
	case o.Outcome == OutcomeSkipped:
		return corev1.EventTypeNormal, ReasonSkipped
	case o.Outcome == OutcomeFailed:
		return corev1.EventTypeWarning, ReasonRunFailed
	}
	return corev1.EventTypeWarning, ReasonError
}

// agentEnd returns the sidecar's last termination message, and whether the
// pod is done: it finished (Succeeded or Failed), or the sidecar ended after
// every app container did (the phase follows), or it ended in a pod being
// deleted. A native sidecar that ends while the apps run is restarted by the
// kubelet: its message then is not the pod's last word.
func agentEnd(pod *corev1.Pod) (message string, done bool) {
	var st *corev1.ContainerStatus
	for i := range pod.Status.InitContainerStatuses {
		if pod.Status.InitContainerStatuses[i].Name == inject.SidecarName {
			st = &pod.Status.InitContainerStatuses[i]
		}
	}
	ended := st != nil && st.State.Terminated != nil
	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		done = true
	default:
		done = ended && (pod.DeletionTimestamp != nil || allTerminated(pod.Status.ContainerStatuses))
	}
	switch {
	case ended:
		message = st.State.Terminated.Message
	case st != nil && st.LastTerminationState.Terminated != nil:
		message = st.LastTerminationState.Terminated.Message
	}
	return strings.TrimSpace(message), done
}

func allTerminated(statuses []corev1.ContainerStatus) bool {
	for _, s := range statuses {
		if s.State.Terminated == nil {
			return false
		}
	}
	return len(statuses) > 0
}

// outcomeNote is the Event's note: the pod, what its agent said, cut to
// what an Event holds.
func outcomeNote(pod *corev1.Pod, message string) string {
	if message == "" {
		message = msgNoMessage
		if pod.Status.Reason != "" {
			message += " (pod " + string(pod.Status.Phase) + ": " + pod.Status.Reason + ")"
		}
	}
	return eventnote.Cut("pod " + pod.Name + ": " + message)
}

// PodCache is what the manager's cache holds of Pods: only those
// injectedPodsSelector selects, trimmed by trimPod.
func PodCache() cache.ByObject {
	return cache.ByObject{Label: injectedPodsSelector(), Transform: trimPod}
}

// injectedPodsSelector selects the pods of injected Jobs that have no
// outcome yet: the only pods the manager's cache holds. A pod leaves the
// cache once it is labelled, so the cache holds the injected pods that are
// pending, running or about to be handled, never the cluster's other pods
// nor finished ones.
func injectedPodsSelector() labels.Selector {
	injected, err := labels.NewRequirement(contract.LabelInjected, selection.Equals, []string{contract.LabelInjectedValue})
	if err != nil {
		panic(err) // constant arguments
	}
	unhandled, err := labels.NewRequirement(contract.LabelOutcome, selection.DoesNotExist, nil)
	if err != nil {
		panic(err)
	}
	return labels.NewSelector().Add(*injected, *unhandled)
}

// trimPod keeps of a cached pod what the outcome controller reads, so that
// a pod costs the cache a few hundred bytes however large its spec: its
// identity, labels and owners, the phase, and the containers' states (the
// sidecar's with its termination message, the others' without theirs).
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			Labels: pod.Labels, OwnerReferences: pod.OwnerReferences, DeletionTimestamp: pod.DeletionTimestamp,
			// Which pod of a Job's index is newest (jobOutcome).
			CreationTimestamp: pod.CreationTimestamp,
		},
		Status: corev1.PodStatus{Phase: pod.Status.Phase, Reason: pod.Status.Reason},
	}
	if i, ok := pod.Annotations[contract.AnnotationJobCompletionIndex]; ok {
		out.Annotations = map[string]string{contract.AnnotationJobCompletionIndex: i}
	}
	for _, s := range pod.Status.InitContainerStatuses {
		if s.Name == inject.SidecarName {
			out.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: s.Name, State: s.State, LastTerminationState: s.LastTerminationState}}
		}
	}
	for _, s := range pod.Status.ContainerStatuses {
		state := corev1.ContainerState{Running: s.State.Running, Waiting: s.State.Waiting}
		if t := s.State.Terminated; t != nil {
			state.Terminated = &corev1.ContainerStateTerminated{ExitCode: t.ExitCode, Reason: t.Reason}
		}
		out.Status.ContainerStatuses = append(out.Status.ContainerStatuses, corev1.ContainerStatus{Name: s.Name, State: state})
	}
	return out, nil
}

// outcomeRecorder labels each finished injected pod and its Job with the
// outcome and puts one Event on the CronJob. It runs on the elected leader
// (the builder's default); the pod's label marks it handled, so a resync, a
// restart or a new leader does not emit the Event again.
type outcomeRecorder struct {
	client client.Client
	// reader reads Jobs from the API server (the manager caches no Jobs).
	reader client.Reader
	events events.EventRecorder
}

// SetupWithManager adds the controller, which the manager runs on the
// elected leader only.
func SetupWithManager(mgr ctrl.Manager) error {
	r := &outcomeRecorder{client: mgr.GetClient(), reader: mgr.GetAPIReader(), events: mgr.GetEventRecorder("dislock-webhook")}
	finished := predicate.NewPredicateFuncs(func(o client.Object) bool {
		pod, ok := o.(*corev1.Pod)
		if !ok || pod.Labels[contract.LabelOutcome] != "" {
			return false
		}
		_, done := agentEnd(pod)
		return done
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("dislock-outcome").
		For(&corev1.Pod{}, builder.WithPredicates(finished)).
		Complete(r)
}

func (r *outcomeRecorder) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	var pod corev1.Pod
	if err := r.client.Get(ctx, req.NamespacedName, &pod); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if pod.Labels[contract.LabelInjected] != contract.LabelInjectedValue || pod.Labels[contract.LabelOutcome] != "" {
		return reconcile.Result{}, nil
	}
	message, done := agentEnd(&pod)
	if !done {
		return reconcile.Result{}, nil
	}
	o, account := parseOutcome(message)

	// The Job first: a failure leaves the pod unmarked, to be tried again.
	// Its labels fold this pod's outcome into those of the Job's other
	// indexes (contract.AnnotationJobOutcomes); the patch carries the Job's
	// resourceVersion, so two pods of one Job handled at once cannot lose
	// each other's outcome. Its controller is the CronJob.
	var cronJobRef *metav1.OwnerReference
	if ref := metav1.GetControllerOfNoCopy(&pod); ref != nil && ref.Kind == "Job" && ref.APIVersion == batchv1.SchemeGroupVersion.String() {
		// The Job controller updates the Job's status as its pods end: a
		// conflict is retried at once with the Job read again, not left to
		// the work queue's growing backoff.
		var job batchv1.Job
		err := retry.RetryOnConflict(jobPatchRetry, func() error {
			job = batchv1.Job{}
			if err := r.reader.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: ref.Name}, &job); err != nil {
				return err
			}
			if job.UID != ref.UID {
				return apierrors.NewNotFound(batchv1.Resource("jobs"), ref.Name)
			}
			annotation, jo := jobOutcome(job.Annotations[contract.AnnotationJobOutcomes], &pod, o)
			patch := labelPatch(job.UID, job.ResourceVersion, jo, map[string]any{contract.AnnotationJobOutcomes: annotation})
			return r.client.Patch(ctx, &job, client.RawPatch(types.MergePatchType, patch))
		})
		switch {
		case err == nil:
			if c := metav1.GetControllerOfNoCopy(&job); c != nil && c.Kind == "CronJob" && c.APIVersion == batchv1.SchemeGroupVersion.String() {
				cronJobRef = c
			}
		case apierrors.IsConflict(err):
			return reconcile.Result{Requeue: true}, nil
		case apierrors.IsNotFound(err) || apierrors.IsInvalid(err):
			// Gone, or another Job of that name now: the pod's outcome is
			// still its own.
			logger.Info("the pod's Job is gone; labelling the pod only", "job", ref.Name, "reason", err.Error())
		default:
			return reconcile.Result{}, fmt.Errorf("labelling Job %s: %w", ref.Name, err)
		}
	}

	// The pod, with its resourceVersion: only the reconcile whose patch set
	// the mark goes on to the Event.
	if err := r.client.Patch(ctx, &pod, client.RawPatch(types.MergePatchType, labelPatch(pod.UID, pod.ResourceVersion, o, nil))); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		if apierrors.IsConflict(err) {
			return reconcile.Result{Requeue: true}, nil
		}
		return reconcile.Result{}, fmt.Errorf("labelling pod %s: %w", pod.Name, err)
	}
	eventType, reason := o.event()
	logger.Info("pod finished", "outcome", o.Outcome, "tookOver", o.TookOver, "message", account)
	if cronJobRef == nil {
		return reconcile.Result{}, nil
	}
	var cj batchv1.CronJob
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: cronJobRef.Name}, &cj); err != nil || cj.UID != cronJobRef.UID {
		// The pod is marked: its Event is not worth a retry that could
		// emit it twice.
		logger.Info("the Job's CronJob is gone; no Event", "cronJob", cronJobRef.Name, "err", err)
		return reconcile.Result{}, nil
	}
	r.events.Eventf(&cj, &pod, eventType, reason, "Run", "%s", outcomeNote(&pod, account))
	return reconcile.Result{}, nil
}

// labelPatch is a JSON merge patch setting the outcome labels (and
// annotations, when given). uid (and resourceVersion, when set) make it a
// precondition: the API server refuses to change either.
func labelPatch(uid types.UID, resourceVersion string, o podOutcome, annotations map[string]any) []byte {
	var tookOver any // null removes the label
	if o.TookOver {
		tookOver = "true"
	}
	meta := map[string]any{"uid": uid, "labels": map[string]any{contract.LabelOutcome: o.Outcome, contract.LabelTookOver: tookOver}}
	if annotations != nil {
		meta["annotations"] = annotations
	}
	if resourceVersion != "" {
		meta["resourceVersion"] = resourceVersion
	}
	b, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		panic(err) // strings only
	}
	return b
}
