package webhook

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/webhook/inject"
	"github.com/dislock/dislock/webhook/registry"
)

// Paths the webhooks are served at (the chart's configurations name them).
const (
	MutateJobPath       = "/mutate-batch-v1-job"
	ValidateCronJobPath = "/validate-batch-v1-cronjob"
)

// jobMutator injects the lock agent into Jobs of opted-in CronJobs.
type jobMutator struct {
	cache client.Reader // the manager's cache: CronJobs
	api   client.Reader // uncached reads: a just-created CronJob, pull secrets
	// namespaces reads the Job's Namespace, whose labels and annotations
	// say whether a mesh will add a sidecar to its pods: the manager's
	// cache when it watches Namespaces anyway (for the tenant roles or the
	// Secret copies), else nil, and the pod template alone decides. Never
	// the API: that would be one more call on every admission, and the
	// webhook is not granted Namespaces without those controllers.
	namespaces client.Reader
	// opts are defaulted and valid, once, when the handler is made (the
	// webhook refuses to start with invalid ones), not on every review.
	opts     inject.Options
	resolver *registry.Resolver
	events   events.EventRecorder
}

func (m *jobMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	resp, result := m.handle(ctx, req)
	admissionsTotal.WithLabelValues("mutate-job", result).Inc()
	admissionDuration.WithLabelValues("mutate-job").Observe(time.Since(start).Seconds())
	reason := ""
	if resp.Result != nil {
		reason = resp.Result.Message
	}
	log.FromContext(ctx).V(1).Info("job admission", "namespace", req.Namespace, "name", req.Name, "result", result, "reason", reason)
	return resp
}

func (m *jobMutator) handle(ctx context.Context, req admission.Request) (admission.Response, string) {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("dislock only changes Jobs at creation"), resultNotApplicable
	}
	job, err := decodeJob(req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the Job: %w", err)), resultError
	}
	switch {
	case job.Namespace == "":
		job.Namespace = req.Namespace
	case req.Namespace != "" && job.Namespace != req.Namespace:
		// The API server refuses this before admission; the lock key's
		// namespace must not hang on that alone.
		return admission.Denied(fmt.Sprintf("dislock: the Job's metadata.namespace %q is not the namespace %q it is created in", job.Namespace, req.Namespace)), resultDenied
	}
	if job.Name == "" {
		job.Name = req.Name
	}
	owner := metav1.GetControllerOf(job)
	if owner == nil || owner.Kind != "CronJob" || owner.APIVersion != batchv1.SchemeGroupVersion.String() {
		// Such a Job reaches the webhook only when it carries a dislock
		// marker (the configurations' matchConditions). The webhook never
		// injects it, so anything of an injection on it was written by
		// hand: a sidecar with another team's key, say.
		if mk := inject.InjectionMarker(job); mk != nil {
			return admission.Denied("dislock: dislock only injects Jobs created by a CronJob, and this Job looks injected (" + mk.String() + "): " +
				"remove the " + inject.SidecarName + " init container and the " + inject.StatusAnnotation + " annotation (and any other part of an injection), " +
				"or create the Job from an opted-in CronJob (kubectl create job --from=cronjob/<name>)"), resultDenied
		}
		return admission.Allowed("not controlled by a CronJob"), resultNotApplicable
	}
	cronJob, err := m.cronJob(ctx, types.NamespacedName{Namespace: job.Namespace, Name: owner.Name}, owner.UID)
	if err != nil {
		// Fail closed: a Job that may need a lock is not let through unlocked.
		return admission.Errored(http.StatusInternalServerError, err), resultError
	}
	// Read once: whether it is opted in, and whether it carries an
	// injection already (which is checked, never trusted).
	r := inject.NewReview(job, cronJob)
	if !r.OptedIn() && !r.CarriesInjection() {
		return admission.Allowed("the CronJob has no dislock.io/mode annotation"), resultNotApplicable
	}
	if r.OptedIn() {
		r.Namespace = m.namespace(ctx, job.Namespace)
	}
	entrypoints, err := m.entrypoints(ctx, job, r)
	if err == nil {
		var in inject.Injection
		in, err = r.Inject(m.opts, entrypoints)
		if err == nil {
			return m.patch(ctx, req, job, cronJob, in)
		}
	}
	if errors.Is(err, inject.ErrNotOptedIn) {
		return admission.Allowed("the CronJob is not opted in"), resultNotApplicable
	}
	if !dryRun(req) {
		m.events.Eventf(cronJob, job, corev1.EventTypeWarning, "DislockDenied", "Inject",
			"Job %s was refused: %v", job.Name, err)
	}
	return admission.Denied("dislock: " + err.Error()), resultDenied
}

func (m *jobMutator) patch(ctx context.Context, req admission.Request, job *batchv1.Job, cronJob *batchv1.CronJob, in inject.Injection) (admission.Response, string) {
	injected, status := in.Job, in.Status
	resp, err := patchResponse(req.Object.Raw, job, injected)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err), resultError
	}
	if len(resp.Patch) == 0 && len(resp.Patches) == 0 {
		return admission.Allowed("already injected"), resultNotApplicable
	}
	mesh := ""
	if f := in.Mesh.Findings; len(f) > 0 {
		var meshes, why []string
		for _, x := range f {
			meshes, why = append(meshes, x.Mesh), append(why, x.Why)
			mesh += fmt.Sprintf("; %s sidecar detected (%s): the agent will POST %s once the app containers ended", x.Mesh, x.Why, x.URL)
		}
		log.FromContext(ctx).Info("classic mesh sidecar detected", "namespace", job.Namespace, "name", job.Name, "cronJob", cronJob.Name,
			"mesh", meshes, "why", why, "quit", in.Mesh.Quit, "podAnnotations", in.Mesh.PodAnnotations, "warnings", in.Mesh.Warnings, "dryRun", dryRun(req))
	}
	window := status.Window
	switch status.WindowSource {
	case "manual":
		window = "none: a manual run takes no schedule lock"
	case "schedule":
		window = "computed by the agent from the schedule at database time"
	}
	if !dryRun(req) {
		m.events.Eventf(cronJob, injected, corev1.EventTypeNormal, "DislockInjected", "Inject",
			"Job %s will run under %s lock %s (window %s)%s", injected.Name, status.Mode, status.Key, window, mesh)
		for _, w := range in.Mesh.Warnings {
			// Most Jobs are created by the CronJob controller, which shows
			// no admission warning to anyone: the Event is what users see.
			m.events.Eventf(cronJob, injected, corev1.EventTypeWarning, "DislockMeshSidecar", "Inject", "Job %s: %s", injected.Name, strings.TrimPrefix(w, "dislock: "))
		}
	}
	// kubectl prints these (kubectl create job --from=cronjob/...).
	return resp.WithWarnings(in.Warnings()...), resultInjected
}

// namespaceReadTimeout bounds the read of the Job's namespace: from a cache
// not synced yet it would wait, and the admission has seconds in all.
const namespaceReadTimeout = time.Second

// namespace reads the Job's namespace from the cache, or returns nil (and
// says why in the log) when it cannot: the pod template alone decides
// about mesh sidecars then.
func (m *jobMutator) namespace(ctx context.Context, name string) *corev1.Namespace {
	if m.namespaces == nil {
		return nil // SetupWithManager said so once
	}
	readCtx, cancel := context.WithTimeout(ctx, namespaceReadTimeout)
	defer cancel()
	ns := &corev1.Namespace{}
	if err := m.namespaces.Get(readCtx, types.NamespacedName{Name: name}, ns); err != nil {
		log.FromContext(ctx).Info("the Job's namespace could not be read: mesh sidecars are detected from the pod template alone",
			"namespace", name, "error", err.Error())
		return nil
	}
	return ns
}

// dryRun: a server-side dry run (kubectl --dry-run=server) stores nothing,
// so it gets no Event saying a Job was injected or refused.
func dryRun(req admission.Request) bool { return req.DryRun != nil && *req.DryRun }

// cronJob reads the Job's owner from the cache, falling back to the API for
// a CronJob created moments ago; the UID must match the ownerReference.
func (m *jobMutator) cronJob(ctx context.Context, key types.NamespacedName, uid types.UID) (*batchv1.CronJob, error) {
	cj := &batchv1.CronJob{}
	err := m.cache.Get(ctx, key, cj)
	// The cache may lag a CronJob just created, or just annotated (`kubectl
	// annotate cronjob/x dislock.io/mode=schedule` a moment before a tick):
	// a cached copy that is not opted in is read again from the API, so
	// that such a Job is never let through unlocked.
	if apierrors.IsNotFound(err) || (err == nil && (cj.UID != uid || !contract.Enabled(contract.Merge(cj.Annotations, cj.Spec.JobTemplate.Annotations)))) {
		err = m.api.Get(ctx, key, cj)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the Job's CronJob %s: %w", key, err)
	}
	if cj.UID != uid {
		return nil, fmt.Errorf("the Job's CronJob %s has UID %s, the ownerReference names %s", key, cj.UID, uid)
	}
	return cj, nil
}

// entrypoints resolves, from the image registry, the entrypoint of each app
// container that has no command and no dislock.io/entrypoint annotation.
func (m *jobMutator) entrypoints(ctx context.Context, job *batchv1.Job, r *inject.Review) (map[string][]string, error) {
	need, err := r.NeedsEntrypoint()
	if err != nil || len(need) == 0 {
		return nil, err
	}
	secrets, err := m.pullSecrets(ctx, job)
	if err != nil {
		return nil, err
	}
	kc, err := registry.PullSecretKeychain(ctx, secrets, registry.Hosts(need))
	if err != nil {
		return nil, err
	}
	// In parallel, inside the review budget and the namespace's share of the
	// lookup slots (see registry.Resolver.Entrypoints).
	return m.resolver.Entrypoints(ctx, job.Namespace, need, kc)
}

// Bounds on the pull secrets one review reads: each is a read of the API
// server and a copy in the webhook's memory, and a Job may list any number
// of them, the same one many times.
const (
	maxPullSecrets     = 16
	maxPullSecretBytes = 1 << 20 // in all
)

// pullSecrets reads the image pull secrets the kubelet will use for the
// Job's pods, each name once, within maxPullSecrets and maxPullSecretBytes:
// the pod template's imagePullSecrets or, when it lists none, its service
// account's (the ServiceAccount admission plugin copies them into the pod
// then, and only then). Only docker-config Secrets count, as for the
// kubelet; a missing Secret or service account is skipped, as the kubelet
// skips a missing pull secret.
//
// Each Secret is one the tenant's own pod names in the tenant's own
// namespace, and the kubelet would pull with it anyway: the lookup learns
// nothing the pod could not. The Jobs of a CronJob are created by the
// CronJob controller, so the request carries no tenant identity whose
// permissions could scope the read further.
func (m *jobMutator) pullSecrets(ctx context.Context, job *batchv1.Job) ([]corev1.Secret, error) {
	pod := &job.Spec.Template.Spec
	refs, source := pod.ImagePullSecrets, "the pod template"
	if len(refs) == 0 {
		saName := cmp.Or(pod.ServiceAccountName, pod.DeprecatedServiceAccount, "default")
		sa := &corev1.ServiceAccount{}
		err := m.api.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: saName}, sa)
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("reading service account %s for its image pull secrets: %w", saName, err)
		}
		refs, source = sa.ImagePullSecrets, "service account "+saName
	}
	var names []string
	for _, ref := range refs {
		if !slices.Contains(names, ref.Name) {
			names = append(names, ref.Name)
		}
	}
	if len(names) > maxPullSecrets {
		return nil, fmt.Errorf("%s lists %d image pull secrets; to read an image's entrypoint the webhook uses at most %d: "+
			"set the container's command, or the annotation %s on the CronJob", source, len(names), maxPullSecrets, contract.AnnotationEntrypoint)
	}
	var out []corev1.Secret
	total := 0
	for _, name := range names {
		s := &corev1.Secret{}
		if err := m.api.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: name}, s); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("reading image pull secret %s: %w", name, err)
		}
		if s.Type != corev1.SecretTypeDockerConfigJson && s.Type != corev1.SecretTypeDockercfg {
			continue
		}
		for _, k := range []string{corev1.DockerConfigJsonKey, corev1.DockerConfigKey} {
			total += len(s.Data[k])
		}
		if total > maxPullSecretBytes {
			return nil, fmt.Errorf("the image pull secrets of %s hold more than %d bytes of registry credentials, more than the webhook reads: "+
				"set the container's command, or the annotation %s on the CronJob", source, maxPullSecretBytes, contract.AnnotationEntrypoint)
		}
		// Nothing but the credentials stays in memory.
		out = append(out, corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s.Name}, Type: s.Type, Data: map[string][]byte{
			corev1.DockerConfigJsonKey: s.Data[corev1.DockerConfigJsonKey], corev1.DockerConfigKey: s.Data[corev1.DockerConfigKey]}})
	}
	return out, nil
}

// cronJobValidator refuses opted-in CronJobs whose dislock annotations or
// schedule are wrong, listing every problem at once.
type cronJobValidator struct {
	decoder admission.Decoder
	opts    inject.Options
}

func (v *cronJobValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	resp, result := v.handle(req)
	admissionsTotal.WithLabelValues("validate-cronjob", result).Inc()
	admissionDuration.WithLabelValues("validate-cronjob").Observe(time.Since(start).Seconds())
	return resp
}

func (v *cronJobValidator) handle(req admission.Request) (admission.Response, string) {
	cj := &batchv1.CronJob{}
	if err := v.decoder.Decode(req, cj); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the CronJob: %w", err)), resultError
	}
	if cj.Namespace == "" {
		cj.Namespace = req.Namespace
	}
	warnings := inject.CronJobWarnings(cj)
	if errs := inject.ValidateCronJob(cj, v.opts); len(errs) > 0 {
		return admission.Denied("dislock: " + errs.ToAggregate().Error()).WithWarnings(warnings...), resultDenied
	}
	return admission.Allowed("").WithWarnings(warnings...), resultAllowed
}
