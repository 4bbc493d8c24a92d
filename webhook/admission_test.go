package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/webhook/inject"
	"github.com/dislock/dislock/webhook/internal/injecttest"
	"github.com/dislock/dislock/webhook/internal/registrytest"
	"github.com/dislock/dislock/webhook/registry"
)

func TestAdmissionOverHTTPS(t *testing.T) {
	optedIn, job := cronJobAndJob(map[string]string{"dislock.io/mode": "schedule"})
	bad, badJob := cronJobAndJob(map[string]string{"dislock.io/mode": "sometimes", "dislock.io/lease-ttl": "5"})
	bad.Name, bad.UID = "bad", "bad-uid"
	badJob.OwnerReferences[0].Name, badJob.OwnerReferences[0].UID = "bad", "bad-uid"
	plain, plainJob := cronJobAndJob(nil)
	plain.Name, plain.UID = "plain", "plain-uid"
	plainJob.OwnerReferences[0].Name, plainJob.OwnerReferences[0].UID = "plain", "plain-uid"
	orphan := job.DeepCopy()
	orphan.OwnerReferences = nil
	ts := startTestServer(t, optedIn, bad, plain)

	t.Run("a CronJob's Job is patched with the sidecar", func(t *testing.T) {
		resp, _ := ts.review(t, MutateJobPath, reviewBody(t, "Job", admissionv1.Create, job))
		if resp == nil || !resp.Allowed || len(resp.Patch) == 0 || !strings.Contains(string(resp.Patch), "dislock-agent") {
			t.Fatalf("response %+v", resp)
		}
	})
	for name, j := range map[string]*batchv1.Job{"a Job of a CronJob that did not opt in": plainJob, "a Job no CronJob owns": orphan} {
		t.Run(name+" is left alone", func(t *testing.T) {
			resp, _ := ts.review(t, MutateJobPath, reviewBody(t, "Job", admissionv1.Create, j))
			if resp == nil || !resp.Allowed || len(resp.Patch) != 0 {
				t.Fatalf("response %+v", resp)
			}
		})
	}
	injected, _, err := inject.Inject(job, optedIn, testOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("a copy of an injected Job is allowed unchanged", func(t *testing.T) {
		resp, _ := ts.review(t, MutateJobPath, reviewBody(t, "Job", admissionv1.Create, injected))
		if resp == nil || !resp.Allowed || len(resp.Patch) != 0 {
			t.Fatalf("response %+v", resp)
		}
	})
	forged := injected.DeepCopy()
	forged.Spec.Template.Spec.InitContainers[0].Env[1] = corev1.EnvVar{Name: contract.EnvKey, Value: "team-b/report"}
	bareForged := forged.DeepCopy()
	bareForged.OwnerReferences = nil
	plainForged := forged.DeepCopy()
	plainForged.OwnerReferences = plainJob.OwnerReferences
	bareAnnotated := orphan.DeepCopy()
	bareAnnotated.Annotations[contract.AnnotationMode] = "schedule"
	bareAnnotated.Spec.Template.Annotations = map[string]string{contract.AnnotationKey: "report"}
	for _, tc := range []struct {
		name string
		job  *batchv1.Job
		want []string
	}{
		{"a forged sidecar with another team's key is denied, naming the variable", forged,
			[]string{"initContainers[0].env[DISLOCK_KEY].value is \"team-b/report\"", "remove the dislock-agent init container and the dislock.io/status annotation"}},
		{"a forged injection in a Job no CronJob owns is denied", bareForged,
			[]string{"dislock only injects Jobs created by a CronJob", "metadata.annotations[dislock.io/status] is set", "remove the dislock-agent init container"}},
		{"a forged injection in a Job of a CronJob that did not opt in is denied", plainForged,
			[]string{"neither it nor its CronJob opts in"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, _ := ts.review(t, MutateJobPath, reviewBody(t, "Job", admissionv1.Create, tc.job))
			if resp == nil || resp.Allowed || len(resp.Patch) != 0 {
				t.Fatalf("response %+v", resp)
			}
			for _, w := range tc.want {
				if !strings.Contains(resp.Result.Message, w) {
					t.Errorf("denial %q does not say %q", resp.Result.Message, w)
				}
			}
		})
	}
	t.Run("a Job no CronJob owns, with dislock.io/ annotations of its user's, is left alone", func(t *testing.T) {
		resp, _ := ts.review(t, MutateJobPath, reviewBody(t, "Job", admissionv1.Create, bareAnnotated))
		if resp == nil || !resp.Allowed || len(resp.Patch) != 0 {
			t.Fatalf("response %+v", resp)
		}
	})
	t.Run("a Job that names another namespace than the request's is denied", func(t *testing.T) {
		elsewhere := job.DeepCopy()
		elsewhere.Namespace = "team-b"
		resp, _ := ts.review(t, MutateJobPath, reviewBody(t, "Job", admissionv1.Create, elsewhere))
		if resp == nil || resp.Allowed || !strings.Contains(resp.Result.Message, `metadata.namespace "team-b" is not the namespace "team"`) {
			t.Fatalf("response %+v", resp)
		}
	})
	t.Run("a Job carrying bad annotations is denied with every problem named", func(t *testing.T) {
		resp, _ := ts.review(t, MutateJobPath, reviewBody(t, "Job", admissionv1.Create, badJob))
		if resp == nil || resp.Allowed {
			t.Fatalf("response %+v", resp)
		}
		for _, want := range []string{"dislock.io/mode", "sometimes", "dislock.io/lease-ttl", `"5"`} {
			if !strings.Contains(resp.Result.Message, want) {
				t.Errorf("denial %q does not name %q", resp.Result.Message, want)
			}
		}
	})
	t.Run("a CronJob with bad annotations is refused", func(t *testing.T) {
		resp, _ := ts.review(t, ValidateCronJobPath, reviewBody(t, "CronJob", admissionv1.Create, bad))
		if resp == nil || resp.Allowed || !strings.Contains(resp.Result.Message, "sometimes") || !strings.Contains(resp.Result.Message, "lease-ttl") {
			t.Fatalf("response %+v", resp)
		}
	})
	t.Run("a CronJob without a time zone is admitted with a warning kubectl prints", func(t *testing.T) {
		resp, _ := ts.review(t, ValidateCronJobPath, reviewBody(t, "CronJob", admissionv1.Create, optedIn))
		if resp == nil || !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "spec.timeZone") {
			t.Fatalf("response %+v", resp)
		}
		zoned := optedIn.DeepCopy()
		zoned.Spec.TimeZone = ptr.To("Etc/UTC")
		resp, _ = ts.review(t, ValidateCronJobPath, reviewBody(t, "CronJob", admissionv1.Create, zoned))
		if resp == nil || !resp.Allowed || len(resp.Warnings) != 0 {
			t.Fatalf("with a time zone: response %+v", resp)
		}
	})
	t.Run("a garbled review is answered, not dropped", func(t *testing.T) {
		for _, body := range []string{`{`, `{"request":{"uid":"x","operation":"CREATE","object":{"kind":"Job","spec":7}}}`, `[]`} {
			resp, code := ts.review(t, MutateJobPath, []byte(body))
			if resp != nil && resp.Allowed {
				t.Fatalf("%s: allowed", body)
			}
			if resp == nil && code < 400 {
				t.Fatalf("%s: status %d without a denial", body, code)
			}
		}
	})
}

func fuzzHandlers(f *testing.F) (*jobMutator, *cronJobValidator) {
	cj, _ := cronJobAndJob(map[string]string{"dislock.io/mode": "schedule,lease"})
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		f.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithRuntimeObjects(cj).Build()
	dec := admission.NewDecoder(scheme)
	return &jobMutator{cache: reader, api: reader, opts: testOptions(),
		// Registry lookups fail fast: there is no registry, and a fuzzer waiting
		// out the default timeout on every input explores nothing.
		resolver: registry.NewResolver(registry.Options{Timeout: 50 * time.Millisecond}), events: &events.FakeRecorder{}}, &cronJobValidator{decoder: dec}
}

// FuzzAdmission feeds arbitrary objects to both handlers: no panic, and
// anything not allowed says why.
func FuzzAdmission(f *testing.F) {
	mutator, validator := fuzzHandlers(f)
	cj, job := cronJobAndJob(map[string]string{"dislock.io/mode": "schedule,lease"})
	for _, o := range []runtime.Object{job, cj} {
		f.Add(string(reviewBody(f, "Job", admissionv1.Create, o)))
	}
	f.Add(`{"metadata":{"ownerReferences":[{"apiVersion":"batch/v1","kind":"CronJob","name":"report","uid":"cj-uid","controller":true}]}}`)
	f.Add(`{"spec":{"template":{"spec":{"containers":[{"name":"a"}]}}}}`)
	f.Fuzz(func(t *testing.T, raw string) {
		for _, h := range []admission.Handler{mutator, validator} {
			req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: "u", Operation: admissionv1.Create, Namespace: "team",
				Object: runtime.RawExtension{Raw: []byte(raw)}}}
			resp := h.Handle(context.Background(), req)
			if !resp.Allowed && (resp.Result == nil || resp.Result.Message == "") {
				t.Fatalf("denied without a reason: %+v", resp)
			}
		}
	})
}

// The pull secrets a review reads to resolve an image's entrypoint are
// bounded: each name once however often the pod lists it, only
// docker-config Secrets, at most maxPullSecrets names and maxPullSecretBytes
// of credentials. A review found 400 references to one 1 MiB Secret made
// one review read 400 MiB.
func TestPullSecretsAreReadOnceEachAndBounded(t *testing.T) {
	_, job := cronJobAndJob(map[string]string{"dislock.io/mode": "schedule"})
	secret := func(name string, typ corev1.SecretType, size int) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: job.Namespace, Name: name}, Type: typ,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(strings.Repeat("x", size))}}
	}
	var objs []runtime.Object
	objs = append(objs, secret("registry", corev1.SecretTypeDockerConfigJson, 100), secret("opaque", corev1.SecretTypeOpaque, 100),
		secret("huge", corev1.SecretTypeDockerConfigJson, maxPullSecretBytes/2+1), secret("huge2", corev1.SecretTypeDockerConfigJson, maxPullSecretBytes/2+1))
	for i := range maxPullSecrets + 1 {
		objs = append(objs, secret(fmt.Sprintf("s%d", i), corev1.SecretTypeDockerConfigJson, 10))
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	reads := 0
	reader := fake.NewClientBuilder().WithScheme(scheme).WithRuntimeObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			reads++
			return c.Get(ctx, key, obj, opts...)
		}}).Build()
	m := &jobMutator{cache: reader, api: reader, opts: testOptions()}
	refs := func(names ...string) *batchv1.Job {
		j := job.DeepCopy()
		for _, n := range names {
			j.Spec.Template.Spec.ImagePullSecrets = append(j.Spec.Template.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: n})
		}
		return j
	}

	many := make([]string, 400)
	for i := range many {
		many[i] = "registry"
	}
	got, err := m.pullSecrets(context.Background(), refs(append(many, "opaque", "missing")...))
	if err != nil || len(got) != 1 || reads != 3 {
		t.Errorf("400 references to one Secret, an Opaque one and a missing one: %d configs, %d reads, %v; want 1 config from 3 reads", len(got), reads, err)
	}
	var names []string
	for i := range maxPullSecrets + 1 {
		names = append(names, fmt.Sprintf("s%d", i))
	}
	reads = 0
	if _, err := m.pullSecrets(context.Background(), refs(names...)); err == nil || reads != 0 ||
		!strings.Contains(err.Error(), fmt.Sprintf("lists %d image pull secrets", maxPullSecrets+1)) || !strings.Contains(err.Error(), contract.AnnotationEntrypoint) {
		t.Errorf("%d names: %v after %d reads; want a refusal before reading, naming the count and %s", maxPullSecrets+1, err, reads, contract.AnnotationEntrypoint)
	}
	if _, err := m.pullSecrets(context.Background(), refs("huge", "huge2")); err == nil || !strings.Contains(err.Error(), "more than the webhook reads") {
		t.Errorf("two Secrets above the byte bound together: %v, want a refusal", err)
	}
}

// A pod template without imagePullSecrets pulls with its service account's
// (the ServiceAccount admission plugin copies them into the pod), so the
// entrypoint lookup uses those; a template that lists its own uses only
// those, as the pod does. A service account that does not exist gives none.
func TestPullSecretsComeFromTheServiceAccountWhenThePodNamesNone(t *testing.T) {
	_, job := cronJobAndJob(map[string]string{"dislock.io/mode": "schedule"})
	secret := func(name string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: job.Namespace, Name: name}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)}}
	}
	sa := func(name string, pullSecrets ...string) *corev1.ServiceAccount {
		a := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: job.Namespace, Name: name}}
		for _, n := range pullSecrets {
			a.ImagePullSecrets = append(a.ImagePullSecrets, corev1.LocalObjectReference{Name: n})
		}
		return a
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithRuntimeObjects(
		secret("from-default-sa"), secret("from-runner-sa"), secret("from-pod"),
		sa("default", "from-default-sa"), sa("runner", "from-runner-sa", "from-runner-sa")).Build()
	m := &jobMutator{cache: reader, api: reader, opts: testOptions()}
	for _, tc := range []struct {
		name    string
		edit    func(*corev1.PodSpec)
		secrets []string
	}{
		{"the default service account's", func(*corev1.PodSpec) {}, []string{"from-default-sa"}},
		{"the named service account's, each once", func(p *corev1.PodSpec) { p.ServiceAccountName = "runner" }, []string{"from-runner-sa"}},
		{"the pod's own, not the service account's", func(p *corev1.PodSpec) {
			p.ServiceAccountName = "runner"
			p.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "from-pod"}}
		}, []string{"from-pod"}},
		{"none from a service account that does not exist", func(p *corev1.PodSpec) { p.ServiceAccountName = "ghost" }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := job.DeepCopy()
			tc.edit(&j.Spec.Template.Spec)
			got, err := m.pullSecrets(context.Background(), j)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range got {
				names = append(names, s.Name)
			}
			if !slices.Equal(names, tc.secrets) {
				t.Errorf("read %q, want %q", names, tc.secrets)
			}
		})
	}
}

// meshMutator is the Job admission handler over an in-memory API holding
// objects; namespaces says whether it reads the Job's namespace (the
// installation watches Namespaces).
func meshMutator(t testing.TB, namespaces bool, resolver *registry.Resolver, objects ...runtime.Object) (*jobMutator, *events.FakeRecorder) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithRuntimeObjects(objects...).Build()
	rec := &events.FakeRecorder{Events: make(chan string, 16)}
	m := &jobMutator{cache: reader, api: reader, opts: testOptions(), resolver: resolver, events: rec}
	if namespaces {
		m.namespaces = reader
	}
	if m.resolver == nil {
		m.resolver = registry.NewResolver(registry.Options{})
	}
	return m, rec
}

// admit runs one Job admission and returns the response and the Job it
// makes of job.
func admit(t testing.TB, m *jobMutator, job *batchv1.Job) (admission.Response, *batchv1.Job) {
	t.Helper()
	raw, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	resp := m.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "review-1", Operation: admissionv1.Create, Namespace: job.Namespace, Object: runtime.RawExtension{Raw: raw}}})
	if !resp.Allowed {
		return resp, nil
	}
	out, err := decodeJob(applyResponse(t, raw, resp))
	if err != nil {
		t.Fatal(err)
	}
	return resp, out
}

// The admission reads the Job's namespace from the cache (when the webhook
// watches Namespaces), tells kubectl what it found as a warning, logs it and
// puts it in the Event; a user's admin-shutdown choice that keeps the pod
// running is a Warning Event too, since the CronJob controller shows
// admission warnings to no one.
func TestAdmissionDetectsMeshesFromTheNamespace(t *testing.T) {
	t.Parallel()
	cj, job := cronJobAndJob(map[string]string{contract.AnnotationMode: "schedule"})
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team", Labels: map[string]string{"istio-injection": "enabled"}}}
	const istioQuit = "http://127.0.0.1:15020/quitquitquit"
	const note = "dislock: Istio sidecar detected (namespace label istio-injection=enabled): the agent will POST http://127.0.0.1:15020/quitquitquit once the app containers ended"

	t.Run("the namespace is read from the cache", func(t *testing.T) {
		t.Parallel()
		m, rec := meshMutator(t, true, nil, cj, ns)
		resp, out := admit(t, m, job)
		if out == nil || !slices.Equal(resp.Warnings, []string{note}) {
			t.Fatalf("response allowed %v, warnings %q; want the note %q", resp.Allowed, resp.Warnings, note)
		}
		if quit, _ := injecttest.SidecarEnv(t, out, contract.EnvProxyQuit); quit != istioQuit {
			t.Errorf("%s = %q", contract.EnvProxyQuit, quit)
		}
		if ev := <-rec.Events; !strings.Contains(ev, "DislockInjected") || !strings.Contains(ev, "Istio sidecar detected (namespace label istio-injection=enabled)") {
			t.Errorf("event %q does not tell the mesh", ev)
		}
	})
	t.Run("without a namespace cache the pod template alone decides", func(t *testing.T) {
		t.Parallel()
		m, _ := meshMutator(t, false, nil, cj, ns)
		resp, out := admit(t, m, job)
		if out == nil || len(resp.Warnings) != 0 {
			t.Fatalf("response allowed %v, warnings %q", resp.Allowed, resp.Warnings)
		}
		if quit, set := injecttest.SidecarEnv(t, out, contract.EnvProxyQuit); set {
			t.Errorf("%s = %q, want unset", contract.EnvProxyQuit, quit)
		}
	})
	t.Run("a namespace the cache does not hold: the pod template alone decides", func(t *testing.T) {
		t.Parallel()
		m, _ := meshMutator(t, true, nil, cj)
		labelled := job.DeepCopy()
		labelled.Spec.Template.Labels = map[string]string{"sidecar.istio.io/inject": "true"}
		resp, out := admit(t, m, labelled)
		if out == nil || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "pod template label sidecar.istio.io/inject=true") {
			t.Fatalf("response allowed %v, warnings %q", resp.Allowed, resp.Warnings)
		}
	})
	t.Run("a user's admin shutdown that keeps the pod running is a Warning Event", func(t *testing.T) {
		t.Parallel()
		linkerdNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team", Annotations: map[string]string{"linkerd.io/inject": "enabled"}}}
		m, rec := meshMutator(t, true, nil, cj, linkerdNS)
		off := job.DeepCopy()
		off.Spec.Template.Annotations = map[string]string{inject.LinkerdAdminShutdownAnnotation: "disabled"}
		resp, out := admit(t, m, off)
		if out == nil || len(resp.Warnings) != 2 || !strings.Contains(resp.Warnings[1], "the pod will not end by itself") {
			t.Fatalf("response allowed %v, warnings %q", resp.Allowed, resp.Warnings)
		}
		if got := out.Spec.Template.Annotations[inject.LinkerdAdminShutdownAnnotation]; got != "disabled" {
			t.Errorf("the user's %s became %q", inject.LinkerdAdminShutdownAnnotation, got)
		}
		if ev := <-rec.Events; !strings.Contains(ev, "DislockInjected") {
			t.Errorf("first event %q", ev)
		}
		if ev := <-rec.Events; !strings.HasPrefix(ev, "Warning DislockMeshSidecar") || !strings.Contains(ev, "the pod will not end by itself") {
			t.Errorf("second event %q, want the warning", ev)
		}
	})
	t.Run("the Linkerd admin shutdown is patched into the pod template", func(t *testing.T) {
		t.Parallel()
		m, _ := meshMutator(t, true, nil, cj)
		meshed := job.DeepCopy()
		meshed.Spec.Template.Annotations = map[string]string{"linkerd.io/inject": "enabled"}
		_, out := admit(t, m, meshed)
		if out == nil || out.Spec.Template.Annotations[inject.LinkerdAdminShutdownAnnotation] != "enabled" {
			t.Fatalf("patched Job %+v", out)
		}
	})
	t.Run("a bad dislock.io/proxy-quit is denied naming it", func(t *testing.T) {
		t.Parallel()
		badCJ, badJob := cronJobAndJob(map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationProxyQuit: "http://10.0.0.7:15020/quitquitquit"})
		m, _ := meshMutator(t, true, nil, badCJ, ns)
		resp, _ := admit(t, m, badJob)
		if resp.Allowed || !strings.Contains(resp.Result.Message, `annotation dislock.io/proxy-quit: "http://10.0.0.7:15020/quitquitquit" is not on the pod's loopback`) {
			t.Fatalf("response %+v", resp.Result)
		}
	})
}

// A mesh proxy in the pod template is not the app: its image's entrypoint
// is never looked up in a registry, even without a command. The same image
// in an app container is looked up, so the test would see a lookup.
func TestMeshProxyImageIsNeverLookedUp(t *testing.T) {
	t.Parallel()
	reg := registrytest.Start(t, nil)
	image := registrytest.PushImage(t, reg.Host+"/istio/proxyv2:1.24", v1.Config{Entrypoint: []string{"/usr/local/bin/pilot-agent"}})
	reg.Take()
	cj, job := cronJobAndJob(map[string]string{contract.AnnotationMode: "schedule"})
	resolver := registry.NewResolver(registry.Options{Insecure: true})

	for _, tc := range []struct {
		container  string
		wantLookup bool
	}{
		{inject.IstioProxyContainer, false},
		{inject.LinkerdProxyContainer, false},
		{"not-a-proxy", true},
	} {
		t.Run(tc.container, func(t *testing.T) {
			withProxy := job.DeepCopy()
			withProxy.Spec.Template.Spec.Containers = append(withProxy.Spec.Template.Spec.Containers,
				corev1.Container{Name: tc.container, Image: image, Args: []string{"proxy", "sidecar"}})
			m, _ := meshMutator(t, false, resolver, cj)
			resp, out := admit(t, m, withProxy)
			requests := reg.Take()
			if out == nil {
				t.Fatalf("denied: %+v", resp.Result)
			}
			if looked := len(requests) > 0; looked != tc.wantLookup {
				t.Fatalf("registry requests %q; want a lookup: %v", requests, tc.wantLookup)
			}
			c := out.Spec.Template.Spec.Containers[1]
			wrapped := len(c.Command) >= len(inject.WrapperPrefix) && slices.Equal(c.Command[:len(inject.WrapperPrefix)], inject.WrapperPrefix)
			if wrapped != tc.wantLookup {
				t.Errorf("container %s: command %q", c.Name, c.Command)
			}
		})
	}
}
