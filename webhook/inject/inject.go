package inject

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/window"
)

// Names and paths of what Inject adds to a pod template.
const (
	// StatusAnnotation is written on every Job Inject mutated. A Job that
	// carries it is checked against what Inject would make of it, and left
	// alone only if it is exactly that.
	StatusAnnotation = contract.AnnotationStatus
	// StatusVersion is Status.Version as written by this package.
	StatusVersion = 1

	// SidecarName is the injected native sidecar, initContainers[0].
	SidecarName = "dislock-agent"
	// VolumeName is the emptyDir shared by the sidecar and the app containers.
	VolumeName = "dislock"
	// SharedDir is where VolumeName is mounted in every container; it is the
	// agent's and the wrapper's default DISLOCK_SHARED_DIR, so neither needs
	// the variable.
	SharedDir = contract.DefaultSharedDir

	// agentCommand is the binary's name in the dislock image, which has it
	// at /usr/local/bin/dislock-agent, on the image's PATH. The sidecar runs
	// it from the image; the app containers run the copy the agent installs
	// in the shared volume, because their images do not have it.
	agentCommand = "dislock-agent"

	// UIDLabel is the label the Job controller puts on every pod of a Job,
	// valued with the Job's UID. A Job has no UID yet when it is admitted,
	// and the downward API cannot read a pod's ownerReferences, so the
	// sidecar reads DISLOCK_JOB_UID from this label of its own pod.
	UIDLabel = contract.LabelJobUID

	// DatabaseCAVolumeName is the secret volume that carries the database's
	// CA (Options.DatabaseCA) from the namespace's database Secret, key
	// DatabaseCAKey, to the sidecar alone, at DatabaseCADir. The tenant URL
	// the webhook writes names the file there as its sslrootcert.
	DatabaseCAVolumeName = "dislock-database-ca"
	DatabaseCAKey        = "ca.crt"
	DatabaseCADir        = "/var/run/dislock/database-ca"
)

// DatabaseCAPath is where the sidecar reads the database's CA.
var DatabaseCAPath = path.Join(DatabaseCADir, DatabaseCAKey)

// databaseCAMode is the CA file's mode: read-only, and set explicitly so
// that the API server's defaulting does not change the volume between an
// injection and its reinvocation.
const databaseCAMode = int32(0o444)

// WrapperPrefix is what every app container's command starts with after
// injection: the agent copy in the shared volume, in wrapper mode.
var WrapperPrefix = []string{path.Join(SharedDir, protocol.BinPath), "exec", "--"}

// Defaults of Options.
const (
	DefaultDBSecretName         = "dislock-db"
	DefaultDBSecretKey          = "url"
	DefaultAgentImagePullPolicy = corev1.PullIfNotPresent

	// VolumeSizeLimit bounds the shared emptyDir. It holds the agent binary
	// (at most 15 MB), briefly a second copy while a restarted sidecar
	// re-installs it atomically, and a few small JSON files.
	VolumeSizeLimit = "64Mi"

	// DefaultInstallTimeout bounds the sidecar's postStart hook, which
	// waits for the agent to install its binary in the shared volume (it
	// takes milliseconds to seconds; the rest is slack for a slow disk or an
	// overloaded node). The kubelet puts no limit on a hook, so the hook
	// gives up after this and the kubelet restarts the sidecar. It gates
	// only the install, not the decision: the wrapper in each app container
	// waits for the decision itself, because a standby may wait as long as
	// the owner's whole run (hours), and a gate waiting for the decision
	// would have the kubelet restart a sidecar that is waiting exactly as it
	// should.
	DefaultInstallTimeout = 5 * time.Minute

	// agentUID is the sidecar's user. Not 65532, the distroless "nonroot"
	// user that many apps run as: a process of another uid needs
	// CAP_SYS_PTRACE to read the sidecar's /proc entries (the credential in
	// its environment, and in that of its exec'd postStart hook) or, unless
	// it is root, to signal it, even in a pod that shares its process
	// namespace.
	agentUID = 65533
)

// Options configure injection (set from the webhook's flags). Zero fields
// take the defaults above; ClusterName and AgentImage have none.
type Options struct {
	// ClusterName names this cluster (data centre) in every lock owner
	// string (--cluster-name). Required.
	ClusterName string
	// AgentImage is the dislock image (--agent-image). It must have the
	// dislock-agent binary on its PATH (/usr/local/bin/dislock-agent): the
	// sidecar's command is ["dislock-agent", "agent"]. Required.
	AgentImage           string
	AgentImagePullPolicy corev1.PullPolicy
	// DBSecretName and DBSecretKey locate the DSN in the Job's namespace
	// (--db-secret-name, --db-secret-key).
	DBSecretName string
	DBSecretKey  string
	// AgentResources are the sidecar's requests and limits; all-empty means
	// the defaults. A CronJob may set each size by annotation, up to
	// AgentMaxResources (empty: DefaultAgentMaxResources).
	AgentResources    corev1.ResourceRequirements
	AgentMaxResources corev1.ResourceList
	// InstallTimeout is how long the sidecar may take to install the agent
	// binary before its postStart hook fails and the kubelet restarts it.
	InstallTimeout time.Duration
	// DatabaseCA is the PEM bundle of the database's CA
	// (--database-ca-file). When set, the sidecar mounts DatabaseCAKey of
	// the namespace's database Secret at DatabaseCADir, and the Secrets the
	// webhook writes carry it; when empty, injection is as without TLS.
	DatabaseCA []byte
	// PodLabels and PodAnnotations are added to every injected Job's pod
	// template (--pod-labels, --pod-annotations), e.g. the label a
	// NetworkPolicy selects to let the sidecar reach PgBouncer. A key the
	// template sets already keeps the template's value: the Job's author
	// decides about their own pods.
	PodLabels      map[string]string
	PodAnnotations map[string]string
}

// WithDefaults returns o with every zero field that has a default set to it.
func (o Options) WithDefaults() Options {
	if o.AgentImagePullPolicy == "" {
		o.AgentImagePullPolicy = DefaultAgentImagePullPolicy
	}
	if o.DBSecretName == "" {
		o.DBSecretName = DefaultDBSecretName
	}
	if o.DBSecretKey == "" {
		o.DBSecretKey = DefaultDBSecretKey
	}
	if len(o.AgentResources.Requests) == 0 && len(o.AgentResources.Limits) == 0 && len(o.AgentResources.Claims) == 0 {
		o.AgentResources = DefaultAgentResources()
	} else {
		o.AgentResources = *o.AgentResources.DeepCopy()
	}
	if len(o.AgentMaxResources) == 0 {
		o.AgentMaxResources = DefaultAgentMaxResources()
	}
	if o.InstallTimeout == 0 {
		o.InstallTimeout = DefaultInstallTimeout
	}
	return o
}

// Validate lists every problem of o, zero fields taken as their defaults.
func (o Options) Validate() error {
	o = o.WithDefaults()
	var errs []error
	switch {
	case o.ClusterName == "":
		errs = append(errs, errors.New("cluster name is empty (set --cluster-name to this data centre's name, e.g. dc-a)"))
	case !contract.ValidClusterName(o.ClusterName):
		errs = append(errs, fmt.Errorf("cluster name %q is not usable in a lock owner (want at most 63 printable characters without '/' or spaces, e.g. dc-a)", o.ClusterName))
	}
	switch {
	case o.AgentImage == "":
		errs = append(errs, errors.New("agent image is empty (set --agent-image to the dislock image, e.g. ghcr.io/dislock/dislock:v1.0.0)"))
	case strings.ContainsAny(o.AgentImage, " \t\r\n") || !printable(o.AgentImage):
		errs = append(errs, fmt.Errorf("agent image %q is not an image reference", o.AgentImage))
	}
	switch o.AgentImagePullPolicy {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, fmt.Errorf("agent image pull policy %q is not valid (want Always, IfNotPresent or Never)", o.AgentImagePullPolicy))
	}
	if msgs := validation.IsDNS1123Subdomain(o.DBSecretName); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("database secret name %q is not a valid Secret name: %s", o.DBSecretName, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsConfigMapKey(o.DBSecretKey); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("database secret key %q is not a valid Secret key: %s", o.DBSecretKey, strings.Join(msgs, "; ")))
	}
	for name, req := range o.AgentResources.Requests {
		if lim, ok := o.AgentResources.Limits[name]; ok && req.Cmp(lim) > 0 {
			errs = append(errs, fmt.Errorf("agent %s request %s is above its limit %s", name, req.String(), lim.String()))
		}
	}
	for _, l := range []corev1.ResourceList{o.AgentResources.Requests, o.AgentResources.Limits} {
		for name, q := range l {
			if most, ok := o.AgentMaxResources[name]; ok && q.Cmp(most) > 0 {
				errs = append(errs, fmt.Errorf("agent %s %s is above the most a CronJob may ask for, %s (raise --agent-max-%s)", name, q.String(), most.String(), name))
			}
		}
	}
	if o.InstallTimeout < time.Second {
		errs = append(errs, fmt.Errorf("install timeout %v is below 1s (want minutes, e.g. 5m: copying the agent binary takes seconds on a slow node)", o.InstallTimeout))
	}
	errs = append(errs, podMetadataProblems("--pod-labels", o.PodLabels, true)...)
	errs = append(errs, podMetadataProblems("--pod-annotations", o.PodAnnotations, false)...)
	return errors.Join(errs...)
}

// podMetadataProblems checks the labels (or annotations) of a flag as the
// API server would check them on a pod, so that a bad one stops the webhook
// at start rather than every injected Job at admission.
func podMetadataProblems(flag string, m map[string]string, labels bool) []error {
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		var msgs []string
		var bad field.ErrorList
		switch one := map[string]string{k: v}; {
		case strings.HasPrefix(k, contract.Prefix):
			// dislock itself reads the keys under its prefix.
			msgs = []string{"keys in the " + contract.Prefix + " prefix are dislock's own"}
		case labels:
			bad = metav1validation.ValidateLabels(one, field.NewPath(flag))
		default:
			bad = apivalidation.ValidateAnnotations(one, field.NewPath(flag))
		}
		for _, e := range bad {
			msgs = append(msgs, e.Detail)
		}
		if len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s entry %q: %s (want key=value,... with Kubernetes %s keys and values)",
				flag, k+"="+v, strings.Join(msgs, "; "), map[bool]string{true: "label", false: "annotation"}[labels]))
		}
	}
	return errs
}

// PodMetadataFlag parses a --pod-labels or --pod-annotations value,
// key=value pairs separated by commas (a value may hold '=' but not ','),
// into *into; the flag may be repeated. Keys and values are checked by
// Options.Validate.
func PodMetadataFlag(flag string, into *map[string]string) func(string) error {
	return func(v string) error {
		if *into == nil {
			*into = map[string]string{}
		}
		for _, entry := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(entry, "=")
			if !ok || k == "" {
				return fmt.Errorf("%s entry %q is not key=value (want e.g. %s team=payments,tier=batch)", flag, entry, flag)
			}
			(*into)[k] = val
		}
		return nil
	}
}

// ReadDatabaseCA reads --database-ca-file: a PEM bundle with at least one
// certificate. It is read once, at start; a bad file stops the webhook
// rather than every sidecar later.
func ReadDatabaseCA(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--database-ca-file %s: %w (mount the database's CA there, e.g. the chart's database.tls.caSecret)", file, err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--database-ca-file %s holds no PEM certificate (want the CA that signed the database's or PgBouncer's certificate, -----BEGIN CERTIFICATE-----)", file)
	}
	return b, nil
}

func printable(s string) bool {
	for _, r := range s {
		if r < 0x21 || r == 0x7f || r == 0xfffd {
			return false
		}
	}
	return true
}

// Status is the JSON in the dislock.io/status annotation of an injected Job.
type Status struct {
	Version int    `json:"version"`
	Mode    string `json:"mode"`
	Key     string `json:"key"`
	// Window is the window start in RFC 3339 UTC; empty when the agent
	// computes it from the schedule at database time, and for manual runs.
	Window string `json:"window"`
	// WindowSource is the rule that gave the window: annotation, job-name,
	// schedule (computed by the agent) or manual (no window).
	WindowSource string `json:"windowSource"`
	// Containers are the app containers whose command was wrapped, in order.
	Containers []string `json:"containers"`
}

// ErrNotOptedIn is returned when neither the CronJob nor the Job carries a
// dislock.io/ annotation: the caller allows the Job untouched.
var ErrNotOptedIn = errors.New("the job is not opted in to dislock (no dislock.io/ annotation on it or its CronJob)")

// plan is everything Inject decided about a Job before changing anything:
// the lock request, the sidecar's environment, where the window came from
// and what each app container runs. The injection only applies it.
type plan struct {
	spec         contract.Spec
	env          contract.AgentEnv
	windowSource window.Source
	// commands holds the original entrypoint of each regular container, by
	// index; nil for a mesh proxy, which is not wrapped.
	commands  [][]string
	resources corev1.ResourceRequirements
	// mesh is what was decided about the pod's classic mesh sidecars; its
	// quit URLs are env.ProxyQuit.
	mesh MeshPlan
}

// Injection is what one admission made of a Job: the Job to admit, its
// status, and what the user should hear about it.
type Injection struct {
	Job    *batchv1.Job
	Status *Status
	Mesh   MeshPlan
}

// Warnings are the admission warnings of the injection (kubectl prints
// them): what was found about the pod's mesh sidecars, and what will go
// wrong with them.
func (in Injection) Warnings() []string {
	return append(append([]string(nil), in.Mesh.notes...), in.Mesh.Warnings...)
}

// Inject returns a mutated deep copy of job: the dislock-agent sidecar, the
// shared volume, each app container's command wrapped, and the
// dislock.io/status annotation. cronJob is the Job's owning CronJob.
// entrypoints maps a container name to its image's entrypoint, resolved by
// the caller for the containers NeedsEntrypoint lists.
//
// It reads nothing but its arguments. A Job with no dislock annotation gives
// ErrNotOptedIn. A Job that already carries a part of an injection (see
// InjectionMarker) is not injected again: it must be exactly what Inject
// makes of the Job it was made from, and then comes back unchanged
// (reinvocation, or a copy of an injected Job); otherwise the error wraps
// ErrForgedInjection and names the first field that differs. Otherwise every
// problem (bad annotations, no window, a container without a known
// entrypoint, names dislock needs already taken) is reported at once, each
// saying what to fix.
//
// The Job's namespace is not known to Inject: classic mesh sidecars are
// detected from the pod template alone (see InjectInNamespace).
func Inject(job *batchv1.Job, cronJob *batchv1.CronJob, opts Options, entrypoints map[string][]string) (*batchv1.Job, *Status, error) {
	out, st, _, err := InjectInNamespace(job, cronJob, nil, opts, entrypoints)
	return out, st, err
}

// InjectInNamespace is Inject for a Job whose namespace is known (nil: not
// known), whose labels and annotations say, with the pod template's, whether
// Istio or Linkerd will add a classic sidecar to the pod. It also returns
// the admission warnings: which mesh sidecar was found and why, and what
// will keep the pod from ending.
func InjectInNamespace(job *batchv1.Job, cronJob *batchv1.CronJob, namespace *corev1.Namespace, opts Options, entrypoints map[string][]string) (*batchv1.Job, *Status, []string, error) {
	if job == nil || cronJob == nil {
		return nil, nil, nil, errors.New("inject: job and cronJob must not be nil")
	}
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, nil, nil, fmt.Errorf("invalid webhook options: %w", err)
	}
	r := NewReview(job, cronJob)
	r.Namespace = namespace
	in, err := r.Inject(opts, entrypoints)
	if err != nil {
		return nil, nil, nil, err
	}
	return in.Job, in.Status, in.Warnings(), nil
}

// Review is what one admission reads from a Job before anything is injected,
// read once: the dislock annotations that apply to it, whether they opt it
// in, and the first part of an earlier injection it carries. The admission
// handler reviews each Job once and asks it what the Job needs (OptedIn,
// CarriesInjection, NeedsEntrypoint) before injecting it (Review.Inject).
type Review struct {
	job         *batchv1.Job
	cronJob     *batchv1.CronJob
	annotations map[string]string // the CronJob's dislock annotations, overridden by the Job's
	enabled     bool
	marker      *Marker // nil: the Job carries no part of an injection
	// Namespace is the Job's namespace, for its mesh labels and
	// annotations; nil when it is not known (the pod template alone
	// decides then).
	Namespace *corev1.Namespace
	// carriedQuit is the proxy-quit choice an injection under verify
	// carries (nil: decide afresh). The mesh plan is the one part of an
	// injection that depends on what may change between the first pass
	// and a reinvocation (the namespace's labels as a replica's cache sees
	// them, a pod-template label another webhook adds), so it is carried
	// rather than recomputed: otherwise such a change would make dislock
	// deny its own injection, every Job of the CronJob.
	carriedQuit *contract.ProxyQuit
}

// NewReview reads job, whose owning CronJob is cronJob.
func NewReview(job *batchv1.Job, cronJob *batchv1.CronJob) *Review {
	annotations := contract.Merge(cronJob.Annotations, job.Annotations)
	return &Review{job: job, cronJob: cronJob, annotations: annotations,
		enabled: contract.Enabled(annotations), marker: InjectionMarker(job)}
}

// OptedIn tells whether the Job or its CronJob opts in to dislock.
func (r *Review) OptedIn() bool { return r.enabled }

// CarriesInjection tells whether the Job carries a part of an injection
// already, which Inject checks rather than trusts.
func (r *Review) CarriesInjection() bool { return r.marker != nil }

// Inject injects the Job under review, or checks the injection it carries.
// opts are defaulted and valid: Inject checks them, the admission handler
// had them checked once at start.
func (r *Review) Inject(opts Options, entrypoints map[string][]string) (Injection, error) {
	switch {
	case r.marker != nil:
		return r.verify(opts)
	case !r.enabled:
		return Injection{}, ErrNotOptedIn
	}
	return r.fresh(r.job, opts, entrypoints)
}

// fresh injects job, which carries no part of an injection: r.job itself, or
// the Job verify recovered from it.
func (r *Review) fresh(job *batchv1.Job, opts Options, entrypoints map[string][]string) (Injection, error) {
	cronJob := r.cronJob
	p, err := makePlan(job, cronJob, r.Namespace, r.annotations, entrypoints, r.carriedQuit, opts)
	if err != nil {
		return Injection{}, err
	}

	out := job.DeepCopy()
	if out.Spec.Template.Labels == nil {
		out.Spec.Template.Labels = map[string]string{}
	}
	out.Spec.Template.Labels[contract.LabelInjected] = contract.LabelInjectedValue
	if len(p.mesh.PodAnnotations) > 0 {
		if out.Spec.Template.Annotations == nil {
			out.Spec.Template.Annotations = map[string]string{}
		}
		maps.Copy(out.Spec.Template.Annotations, p.mesh.PodAnnotations)
	}
	addPodMetadata(&out.Spec.Template.ObjectMeta, opts)
	pod := &out.Spec.Template.Spec
	if len(opts.DatabaseCA) > 0 {
		// Before the shared volume, which stays last: strip finds both
		// at the end of the list.
		pod.Volumes = append(pod.Volumes, databaseCAVolume(opts.DBSecretName))
	}
	pod.Volumes = append(pod.Volumes, corev1.Volume{
		Name: VolumeName,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			SizeLimit: ptr.To(resource.MustParse(VolumeSizeLimit)),
		}},
	})
	pod.InitContainers = append([]corev1.Container{sidecar(p, opts)}, pod.InitContainers...)
	names := make([]string, 0, len(pod.Containers))
	for i := range pod.Containers {
		c := &pod.Containers[i]
		if meshProxy(*c) {
			continue // not the app: left as the mesh made it
		}
		c.Command = append(slices.Clone(WrapperPrefix), p.commands[i]...)
		c.Env = append(slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == contract.EnvContainerName }),
			corev1.EnvVar{Name: contract.EnvContainerName, Value: c.Name})
		c.VolumeMounts = append(c.VolumeMounts, sharedMount())
		names = append(names, c.Name)
	}
	// With the default policy, TerminatingOrFailed, the Job controller
	// creates a replacement pod while the old one is still terminating (a
	// drain, an eviction, a preemption). The lock keeps the two from running
	// together, but the replacement would wait out the old pod's claim;
	// with Failed it is normally created only once the old pod is gone. A
	// user's explicit choice stands. The choice is read from the CronJob's
	// job template: the API server defaults a Job's policy to
	// TerminatingOrFailed before admission webhooks see it, so on the Job
	// "unset" and "chosen" look the same, while a CronJob's template keeps
	// it unset.
	switch chosen := cronJob.Spec.JobTemplate.Spec.PodReplacementPolicy; {
	case chosen == nil:
		out.Spec.PodReplacementPolicy = ptr.To(batchv1.Failed)
	case out.Spec.PodReplacementPolicy == nil:
		out.Spec.PodReplacementPolicy = ptr.To(*chosen)
	}

	window := ""
	if !p.env.Window.IsZero() {
		window = p.env.Window.UTC().Format(time.RFC3339)
	}
	st := &Status{
		Version:      StatusVersion,
		Mode:         p.spec.Mode.String(),
		Key:          p.spec.Key(),
		Window:       window,
		WindowSource: string(p.windowSource),
		Containers:   names,
	}
	b, err := json.Marshal(st)
	if err != nil {
		return Injection{}, fmt.Errorf("encoding %s: %w", StatusAnnotation, err)
	}
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[StatusAnnotation] = string(b)
	return Injection{Job: out, Status: st, Mesh: p.mesh}, nil
}

// makePlan parses and checks everything Inject needs, and reports every
// problem at once. namespace is the Job's, nil when not known.
func makePlan(job *batchv1.Job, cronJob *batchv1.CronJob, namespace *corev1.Namespace, annotations map[string]string, entrypoints map[string][]string, carriedQuit *contract.ProxyQuit, opts Options) (plan, error) {
	var errs []error
	ns := jobNamespace(job, cronJob)
	if job.Namespace != "" && cronJob.Namespace != "" && job.Namespace != cronJob.Namespace {
		// The key is the Job's namespace's: a CronJob read from elsewhere
		// must not lend its annotations to it.
		errs = append(errs, fmt.Errorf("the Job's namespace %q is not its CronJob's namespace %q", job.Namespace, cronJob.Namespace))
	}
	s, err := contract.FromAnnotations(annotations, ns, cronJob.Name)
	if err != nil {
		errs = append(errs, err)
	}
	p := plan{spec: s, env: contract.AgentEnv{
		Mode:            s.Mode,
		Key:             s.Key(),
		Schedule:        cronJob.Spec.Schedule,
		TimeZone:        ptr.Deref(cronJob.Spec.TimeZone, ""),
		LeaseTTL:        s.LeaseTTL,
		Standby:         s.Standby,
		Catchup:         s.Catchup,
		MissedAfter:     s.MissedAfter,
		PreferCluster:   s.PreferCluster,
		PreferGrace:     s.PreferGrace,
		AppStartTimeout: s.AppStartTimeout,
		// Each pod reads its own index from the downward API.
		Indexed: ptr.Deref(job.Spec.CompletionMode, batchv1.NonIndexedCompletion) == batchv1.IndexedCompletion,
		Cluster: opts.ClusterName,
		// Empty for a Job admitted with generateName: the pod reads it then.
		JobName: job.Name,
	}}
	if p.env.Indexed {
		// Reported when clusters disagree; a Job of more than
		// contract.MaxCompletions is Kubernetes' to refuse.
		p.env.Completions = int(min(max(ptr.Deref(job.Spec.Completions, 0), 0), contract.MaxCompletions))
	}

	resources, sizeErrs := agentResourcesFor(annotations, opts)
	for _, e := range sizeErrs {
		errs = append(errs, e)
	}
	p.resources = resources

	// A Job of a CronJob that should not have passed ValidateCronJob (it
	// predates the webhook, say) is denied with the same message.
	badSchedule := scheduleProblems(cronJob, annotations)
	for _, e := range append(badSchedule, preferProblems(cronJob, s, annotations)...) {
		errs = append(errs, fmt.Errorf("CronJob %s: %w", cronJob.Name, e))
	}
	if err := resolveWindow(&p, job, cronJob); err != nil && len(badSchedule) == 0 {
		errs = append(errs, err)
	}
	for _, e := range templateProblems(field.NewPath("spec"), &job.Spec) {
		errs = append(errs, e)
	}

	// Under Never a container's exit is final, and the agent may record a
	// failure as soon as every app container ended. The API server
	// defaults a Job's pod to one of these two and refuses any other. A
	// container's own restartPolicy or restartPolicyRules override the
	// pod's (the kubelet may restart a failed container of a Never pod):
	// then the agent is not told, and records a failure when it is stopped.
	switch rp := job.Spec.Template.Spec.RestartPolicy; rp {
	case corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure:
		if !slices.ContainsFunc(job.Spec.Template.Spec.Containers, ownRestartPolicy) {
			p.env.RestartPolicy = string(rp)
		}
	}

	// Classic mesh sidecars, which the agent quits once every app
	// container ended (the containers listed in AppContainers below).
	if namespace != nil && namespace.Name != ns {
		namespace = nil // not the Job's: its labels say nothing of this pod
	}
	choice := s.ProxyQuit
	if carriedQuit != nil {
		choice = *carriedQuit
	}
	p.mesh = planMeshes(&job.Spec.Template, namespace, choice)
	p.env.ProxyQuit = p.mesh.Quit

	// Every regular container but a mesh proxy is an app container.
	// With dislock.io/entrypoint present but bad, its own error says
	// everything; do not add one "no entrypoint" error per container.
	_, haveAnnotation := annotations[contract.AnnotationEntrypoint]
	for _, c := range job.Spec.Template.Spec.Containers {
		if meshProxy(c) {
			// Not the app: never wrapped, so it needs no entrypoint.
			p.commands = append(p.commands, nil)
			continue
		}
		cmd := originalCommand(c, s.Entrypoint, entrypoints)
		if cmd == nil && !haveAnnotation {
			errs = append(errs, fmt.Errorf("container %q has no command and its image's entrypoint could not be read: set the container's command, or the annotation %s on the CronJob to the image's entrypoint as a JSON array (e.g. [\"/app/run\"])",
				c.Name, contract.AnnotationEntrypoint))
		}
		p.commands = append(p.commands, cmd)
		p.env.AppContainers = append(p.env.AppContainers, c.Name)
	}
	return p, errors.Join(errs...)
}

// jobNamespace is the Job's namespace; the API server sets it before
// admission, the CronJob's (the same) is the fallback.
func jobNamespace(job *batchv1.Job, cronJob *batchv1.CronJob) string {
	if job.Namespace != "" {
		return job.Namespace
	}
	return cronJob.Namespace
}

// resolveWindow decides the window the sidecar gets. The webhook has no
// database clock, so it asks window.Resolve for the rules that need no clock
// only (by passing no schedule); when only the schedule can give the window,
// it checks that the schedule parses and leaves the window to the agent,
// which computes it at database time.
func resolveWindow(p *plan, job *batchv1.Job, cronJob *batchv1.CronJob) error {
	t, src, err := window.Resolve(window.Input{
		Annotations: job.Annotations,
		JobName:     job.Name,
		CronJobName: cronJob.Name,
		TimeZone:    p.env.TimeZone,
	}, time.Time{})
	p.windowSource = src
	switch {
	case src == window.SourceManual:
		// No schedule tick: no schedule lock, the lease still honoured.
		p.env.Manual = true
		return nil
	case err == nil:
		p.env.Window = t.UTC()
		return nil
	case src != window.SourceSchedule:
		return err
	}
	if _, err := window.ParseSchedule(cronJob.Spec.Schedule, p.env.TimeZone); err != nil {
		return fmt.Errorf("job %q has no window: no %s annotation, its name is not %q followed by the scheduled minute, and the CronJob's schedule cannot give one: %w",
			job.Name, window.ScheduledTimestampAnnotation, cronJob.Name+"-", err)
	}
	return nil
}

// originalCommand is what the wrapper runs: the container's command, else
// dislock.io/entrypoint, else the image's entrypoint from entrypoints; nil
// if none is known. A resolved entrypoint may be empty but non-nil (an image
// with only a Cmd, which the container's args replace): then the args are
// the program, and the wrapper prefix alone is right.
func originalCommand(c corev1.Container, annotated []string, entrypoints map[string][]string) []string {
	switch ep, resolved := entrypoints[c.Name]; {
	case len(c.Command) > 0:
		return slices.Clone(c.Command)
	case len(annotated) > 0:
		return slices.Clone(annotated)
	case resolved && (len(ep) > 0 || len(c.Args) > 0):
		return append([]string{}, ep...)
	}
	return nil
}

// templateProblems finds what in a Job spec would clash with the injection.
// ValidateCronJob shares it, so a CronJob whose Jobs could never be injected
// is rejected when it is applied. jobSpec is the path of the Job spec.
func templateProblems(jobSpec *field.Path, js *batchv1.JobSpec) field.ErrorList {
	var errs field.ErrorList
	if ptr.Deref(js.CompletionMode, batchv1.NonIndexedCompletion) != batchv1.IndexedCompletion {
		// Every pod of a non-Indexed Job claims the same window: one would
		// run, the others wait for it and then find the window done.
		for _, f := range []struct {
			name  string
			value *int32
		}{{"parallelism", js.Parallelism}, {"completions", js.Completions}} {
			if n := ptr.Deref(f.value, 1); n > 1 {
				errs = append(errs, field.Invalid(jobSpec.Child(f.name), n,
					fmt.Sprintf("dislock claims one window per Job, so of %d pods only one would run (set completionMode: Indexed so that each completion index claims its own window, or set %s to 1)", n, f.name)))
			}
		}
	}
	if ptr.Deref(js.ManualSelector, false) {
		errs = append(errs, field.Invalid(jobSpec.Child("manualSelector"), true,
			fmt.Sprintf("the Job controller then does not label pods with %s, which the dislock agent needs to name its Job (remove manualSelector)", UIDLabel)))
	}
	podPath := jobSpec.Child("template", "spec")
	pod := &js.Template.Spec
	for i, v := range pod.Volumes {
		if v.Name == VolumeName {
			errs = append(errs, field.Invalid(podPath.Child("volumes").Index(i).Child("name"), v.Name,
				"dislock adds a volume of this name (rename this volume)"))
		}
		// Reserved with or without a CA: a user's volume of that name in
		// the CA's shape would be taken for the injected one when a
		// reinvocation strips the injection.
		if v.Name == DatabaseCAVolumeName {
			errs = append(errs, field.Invalid(podPath.Child("volumes").Index(i).Child("name"), v.Name,
				"dislock reserves this volume name for the database's CA (rename this volume)"))
		}
	}
	for _, list := range []struct {
		name       string
		containers []corev1.Container
	}{{"initContainers", pod.InitContainers}, {"containers", pod.Containers}} {
		for i, c := range list.containers {
			cp := podPath.Child(list.name).Index(i)
			if c.Name == SidecarName {
				errs = append(errs, field.Invalid(cp.Child("name"), c.Name,
					"dislock adds a container of this name (rename this container)"))
			}
			// The sidecar's and the wrappers' variables come from the
			// webhook only: one written into a template could point the
			// wrapper at another directory than the agent's, or claim a
			// key the webhook never chose.
			for j, e := range c.Env {
				if dislockVariable(list.name, e.Name) {
					errs = append(errs, field.Invalid(cp.Child("env").Index(j).Child("name"), e.Name,
						"dislock sets the "+envPrefix+" variables itself, on its sidecar and on each app container (remove this variable)"))
				}
			}
			// The CA's volume is the sidecar's alone (a template here has
			// no sidecar: a reinvocation's was stripped).
			for j, m := range c.VolumeMounts {
				if m.Name == DatabaseCAVolumeName {
					errs = append(errs, field.Invalid(cp.Child("volumeMounts").Index(j).Child("name"), m.Name,
						"the database's CA volume is mounted into dislock's sidecar only (remove this mount)"))
				}
			}
			if runsAgent(c.Command) {
				errs = append(errs, field.Invalid(cp.Child("command").Index(0), c.Command[0],
					"only the sidecar and the wrapped commands dislock injects run dislock-agent (remove it: the webhook wraps every app container's command itself)"))
			}
		}
	}
	if len(pod.Containers) > 0 && !slices.ContainsFunc(pod.Containers, func(c corev1.Container) bool { return !meshProxy(c) }) {
		errs = append(errs, field.Invalid(podPath.Child("containers"), len(pod.Containers),
			fmt.Sprintf("every container is a mesh proxy (%s or %s), which dislock never wraps, so there is no app to run under the lock (add the app's container)",
				IstioProxyContainer, LinkerdProxyContainer)))
	}
	for i, c := range pod.Containers {
		for j, m := range c.VolumeMounts {
			if mp := path.Clean(m.MountPath); mp == SharedDir || strings.HasPrefix(mp, SharedDir+"/") {
				errs = append(errs, field.Invalid(podPath.Child("containers").Index(i).Child("volumeMounts").Index(j).Child("mountPath"), m.MountPath,
					fmt.Sprintf("dislock mounts its shared volume at %s in every app container (move this mount)", SharedDir)))
			}
		}
	}
	return errs
}

// addPodMetadata adds Options.PodLabels and PodAnnotations to a pod
// template, leaving alone every key it sets already. It adds only what is
// missing, so it is idempotent, and verify uses it to put back what a later
// webhook dropped.
func addPodMetadata(meta *metav1.ObjectMeta, opts Options) {
	for _, m := range []struct {
		add map[string]string
		to  *map[string]string
	}{{opts.PodLabels, &meta.Labels}, {opts.PodAnnotations, &meta.Annotations}} {
		for k, v := range m.add {
			if *m.to == nil {
				*m.to = map[string]string{}
			}
			if _, set := (*m.to)[k]; !set {
				(*m.to)[k] = v
			}
		}
	}
}

// databaseCAVolume is the sidecar's view of the database's CA: the one key
// of the namespace's database Secret, read-only. The app containers do not
// mount it: it is the sidecar's connection, not theirs.
func databaseCAVolume(secretName string) corev1.Volume {
	return corev1.Volume{Name: DatabaseCAVolumeName, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName:  secretName,
		Items:       []corev1.KeyToPath{{Key: DatabaseCAKey, Path: DatabaseCAKey}},
		DefaultMode: ptr.To(databaseCAMode),
	}}}
}

// sidecar is the dislock-agent native sidecar.
func sidecar(p plan, opts Options) corev1.Container {
	mounts := []corev1.VolumeMount{sharedMount()}
	if len(opts.DatabaseCA) > 0 {
		mounts = append(mounts, corev1.VolumeMount{Name: DatabaseCAVolumeName, MountPath: DatabaseCADir, ReadOnly: true})
	}
	return corev1.Container{
		Name:            SidecarName,
		Image:           opts.AgentImage,
		ImagePullPolicy: opts.AgentImagePullPolicy,
		Command:         []string{agentCommand, "agent"},
		// A native sidecar: it starts before, runs alongside and is stopped
		// after the app containers, and the kubelet restarts it if it dies.
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Env:           envVars(p.env.Render(), opts),
		Resources:     p.resources,
		VolumeMounts:  mounts,
		// The app containers (and any later init containers) start only once
		// this returns, i.e. once the agent has installed itself in the
		// shared volume; their wrappers then wait for the decision. A hook,
		// not a startupProbe: the kubelet runs it inside the sync that starts
		// the sidecar and starts the app containers at its next look at the
		// pod, where a probe adds a wait for the probe worker's next period
		// (about a second per pod start, docs/benchmarks.md).
		Lifecycle: &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{
			Exec: &corev1.ExecAction{Command: []string{agentCommand, "probe", "--wait=" + opts.InstallTimeout.String()}},
		}},
		TerminationMessagePath:   contract.DefaultTerminationLog,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
		// Explicit on the container, so it holds whatever the pod's own
		// securityContext says (a pod runAsUser is overridden here), and
		// meets the "restricted" Pod Security Standard.
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To(int64(agentUID)),
			RunAsGroup:               ptr.To(int64(agentUID)),
			ReadOnlyRootFilesystem:   ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false),
			Privileged:               ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}

// envVars maps the sidecar's environment, as spec renders it, to the
// container's variables. Only the sidecar gets the database credentials.
func envVars(vars []contract.EnvVar, opts Options) []corev1.EnvVar {
	out := make([]corev1.EnvVar, len(vars))
	for i, v := range vars {
		switch {
		case v.FieldPath != "":
			out[i] = corev1.EnvVar{Name: v.Name, ValueFrom: fieldRef(v.FieldPath)}
		case v.FromDatabaseSecret:
			out[i] = corev1.EnvVar{Name: v.Name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: opts.DBSecretName},
				Key:                  opts.DBSecretKey,
			}}}
		default:
			out[i] = corev1.EnvVar{Name: v.Name, Value: v.Value}
		}
	}
	return out
}

func fieldRef(path string) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path}}
}

// sharedMount is the mount of the shared volume in every container.
func sharedMount() corev1.VolumeMount {
	return corev1.VolumeMount{Name: VolumeName, MountPath: SharedDir}
}

// NeedsEntrypoint lists the app containers Inject will need an image
// entrypoint for: those without a command, when dislock.io/entrypoint is not
// set. A mesh proxy container is never one: it is not wrapped, so its image
// is never looked up. The caller resolves them (from the registry) and
// passes them to Inject. It returns nothing for a Job that carries a part of an injection
// (its wrapped commands are checked, not resolved again), and
// ErrNotOptedIn for a Job that is not opted in.
func NeedsEntrypoint(job *batchv1.Job, cronJob *batchv1.CronJob) ([]corev1.Container, error) {
	if job == nil || cronJob == nil {
		return nil, errors.New("needs entrypoint: job and cronJob must not be nil")
	}
	return NewReview(job, cronJob).NeedsEntrypoint()
}

func (r *Review) NeedsEntrypoint() ([]corev1.Container, error) {
	switch {
	case r.marker != nil:
		return nil, nil
	case !r.enabled:
		return nil, ErrNotOptedIn
	}
	if _, ok := r.annotations[contract.AnnotationEntrypoint]; ok {
		return nil, nil
	}
	var out []corev1.Container
	for _, c := range r.job.Spec.Template.Spec.Containers {
		if len(c.Command) == 0 && !meshProxy(c) {
			out = append(out, *c.DeepCopy())
		}
	}
	return out, nil
}

// ownRestartPolicy reports whether a regular container sets a restart
// policy of its own, which overrides the pod's.
func ownRestartPolicy(c corev1.Container) bool {
	return c.RestartPolicy != nil || len(c.RestartPolicyRules) > 0
}
