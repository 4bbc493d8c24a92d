package inject

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/webhook/internal/injecttest"
)

const (
	istioQuit   = "http://127.0.0.1:15020/quitquitquit"
	linkerdQuit = "http://127.0.0.1:4191/shutdown"
)

// proxyContainer is a mesh's classic sidecar as the mesh injects it: no
// command (the image's entrypoint runs), so that wrapping it would need a
// registry lookup.
func proxyContainer(name string) corev1.Container {
	return corev1.Container{Name: name, Image: "registry.example/mesh/" + name + ":1", Args: []string{"proxy", "sidecar"}}
}

// TestMeshSidecars: for every way Istio or Linkerd is found (or turned off),
// the sidecar's DISLOCK_PROXY_QUIT, which containers are wrapped, what the
// pod template gets, and what the user is told.
func TestMeshSidecars(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// proxyQuit is the CronJob's dislock.io/proxy-quit; "" leaves it unset.
		proxyQuit                 string
		podLabels, podAnnotations map[string]string
		// proxies are mesh proxy containers already in the pod template.
		proxies []string
		// nsLabels and nsAnnotations are the Job's namespace's;
		// unknownNamespace passes no namespace at all.
		nsLabels, nsAnnotations map[string]string
		unknownNamespace        bool

		wantQuit string // DISLOCK_PROXY_QUIT; "" = not set
		// wantAddedAnnotations are added to the pod template's.
		wantAddedAnnotations map[string]string
		// wantWarnings each appear in one admission warning; none = no
		// warning at all.
		wantWarnings []string
	}{
		{name: "no mesh: no quit URL and no warning"},
		{name: "a namespace labelled for another purpose: no mesh",
			nsLabels: map[string]string{"team": "billing", contract.LabelInjection: contract.LabelInjectionEnabled}},
		{name: "Istio: the pod template's label",
			podLabels: map[string]string{"sidecar.istio.io/inject": "true"},
			wantQuit:  istioQuit,
			wantWarnings: []string{"dislock: Istio sidecar detected (pod template label sidecar.istio.io/inject=true): " +
				"the agent will POST http://127.0.0.1:15020/quitquitquit once the app containers ended"}},
		{name: "Istio: the pod template's annotation",
			podAnnotations: map[string]string{"sidecar.istio.io/inject": "true"},
			wantQuit:       istioQuit,
			wantWarnings:   []string{"Istio sidecar detected (pod template annotation sidecar.istio.io/inject=true)"}},
		{name: "Istio: the namespace label istio-injection=enabled",
			nsLabels: map[string]string{"istio-injection": "enabled"},
			wantQuit: istioQuit,
			wantWarnings: []string{"dislock: Istio sidecar detected (namespace label istio-injection=enabled): " +
				"the agent will POST http://127.0.0.1:15020/quitquitquit once the app containers ended"}},
		{name: "Istio: the namespace label istio.io/rev, any revision",
			nsLabels:     map[string]string{"istio.io/rev": "canary"},
			wantQuit:     istioQuit,
			wantWarnings: []string{"Istio sidecar detected (namespace label istio.io/rev=canary)"}},
		{name: "Istio: the pod template's label false opts out of an enabled namespace",
			podLabels: map[string]string{"sidecar.istio.io/inject": "false"},
			nsLabels:  map[string]string{"istio-injection": "enabled"}},
		{name: "Istio: the pod template's annotation false opts out of a revision's namespace",
			podAnnotations: map[string]string{"sidecar.istio.io/inject": "false"},
			nsLabels:       map[string]string{"istio.io/rev": "stable"}},
		{name: "Istio: the pod template's label wins over its annotation, as in Istio",
			podLabels:      map[string]string{"sidecar.istio.io/inject": "false"},
			podAnnotations: map[string]string{"sidecar.istio.io/inject": "true"}},
		{name: "Istio: a namespace labelled istio-injection=disabled is never injected",
			podLabels: map[string]string{"sidecar.istio.io/inject": "true"},
			nsLabels:  map[string]string{"istio-injection": "disabled", "istio.io/rev": "canary"}},
		{name: "Istio: the proxy already in the template is not wrapped, not an app, and quit",
			proxies:      []string{IstioProxyContainer},
			wantQuit:     istioQuit,
			wantWarnings: []string{"Istio sidecar detected (container istio-proxy in the pod template)"}},
		{name: "Istio: the proxy in the template counts even where the namespace disables injection",
			proxies:      []string{IstioProxyContainer},
			nsLabels:     map[string]string{"istio-injection": "disabled"},
			wantQuit:     istioQuit,
			wantWarnings: []string{"Istio sidecar detected (container istio-proxy in the pod template)"}},
		{name: "Istio: the status port the pod template names",
			podAnnotations: map[string]string{"sidecar.istio.io/inject": "true", "status.sidecar.istio.io/port": "15099"},
			wantQuit:       "http://127.0.0.1:15099/quitquitquit",
			wantWarnings:   []string{"the agent will POST http://127.0.0.1:15099/quitquitquit"}},
		{name: "Istio: a status port that is not one keeps the default, with a warning",
			podAnnotations: map[string]string{"status.sidecar.istio.io/port": "0"},
			nsLabels:       map[string]string{"istio-injection": "enabled"},
			wantQuit:       istioQuit,
			wantWarnings: []string{`the pod template's annotation status.sidecar.istio.io/port="0" is not a port (want 1-65535): ` +
				"the agent will use the default port 15020"}},
		{name: "Istio: the namespace is not known, so only the pod template decides",
			nsLabels: map[string]string{"istio-injection": "enabled"}, unknownNamespace: true},
		{name: "Linkerd: the pod template's annotation, and the proxy's admin shutdown turned on",
			podAnnotations:       map[string]string{"linkerd.io/inject": "enabled"},
			wantQuit:             linkerdQuit,
			wantAddedAnnotations: map[string]string{LinkerdAdminShutdownAnnotation: "enabled"},
			wantWarnings: []string{"dislock: Linkerd sidecar detected (pod template annotation linkerd.io/inject=enabled): " +
				"the agent will POST http://127.0.0.1:4191/shutdown once the app containers ended " +
				"(the pod template gets config.linkerd.io/proxy-admin-shutdown=enabled, so that the proxy serves it)"}},
		{name: "Linkerd: the pod template's annotation ingress",
			podAnnotations:       map[string]string{"linkerd.io/inject": "ingress"},
			wantQuit:             linkerdQuit,
			wantAddedAnnotations: map[string]string{LinkerdAdminShutdownAnnotation: "enabled"},
			wantWarnings:         []string{"Linkerd sidecar detected (pod template annotation linkerd.io/inject=ingress)"}},
		{name: "Linkerd: the namespace's annotation",
			nsAnnotations:        map[string]string{"linkerd.io/inject": "enabled"},
			wantQuit:             linkerdQuit,
			wantAddedAnnotations: map[string]string{LinkerdAdminShutdownAnnotation: "enabled"},
			wantWarnings:         []string{"Linkerd sidecar detected (namespace annotation linkerd.io/inject=enabled)"}},
		{name: "Linkerd: the pod template's disabled opts out of the namespace's",
			podAnnotations: map[string]string{"linkerd.io/inject": "disabled"},
			nsAnnotations:  map[string]string{"linkerd.io/inject": "enabled"}},
		{name: "Linkerd: admin shutdown already enabled is left alone",
			podAnnotations: map[string]string{"linkerd.io/inject": "enabled", LinkerdAdminShutdownAnnotation: "enabled"},
			wantQuit:       linkerdQuit,
			wantWarnings:   []string{"Linkerd sidecar detected"}},
		{name: "Linkerd: the user's admin shutdown stands, with a warning that the pod will not end by itself",
			podAnnotations: map[string]string{"linkerd.io/inject": "enabled", LinkerdAdminShutdownAnnotation: "disabled"},
			wantQuit:       linkerdQuit,
			wantWarnings: []string{"Linkerd sidecar detected",
				`dislock: the pod template sets config.linkerd.io/proxy-admin-shutdown="disabled", so the Linkerd proxy may refuse the agent's POST to ` +
					`http://127.0.0.1:4191/shutdown and the pod will not end by itself after its app (remove the annotation, or set it to "enabled")`}},
		{name: "Linkerd: the admin port the pod template names",
			podAnnotations:       map[string]string{"linkerd.io/inject": "enabled", "config.linkerd.io/admin-port": "9991"},
			wantQuit:             "http://127.0.0.1:9991/shutdown",
			wantAddedAnnotations: map[string]string{LinkerdAdminShutdownAnnotation: "enabled"},
			wantWarnings:         []string{"Linkerd sidecar detected"}},
		{name: "Linkerd: the proxy already in the template is not wrapped, not an app, and quit",
			proxies:              []string{LinkerdProxyContainer},
			wantQuit:             linkerdQuit,
			wantAddedAnnotations: map[string]string{LinkerdAdminShutdownAnnotation: "enabled"},
			wantWarnings:         []string{"Linkerd sidecar detected (container linkerd-proxy in the pod template)"}},
		{name: "both meshes: both quit, Istio first",
			podAnnotations:       map[string]string{"linkerd.io/inject": "enabled"},
			nsLabels:             map[string]string{"istio-injection": "enabled"},
			wantQuit:             istioQuit + "," + linkerdQuit,
			wantAddedAnnotations: map[string]string{LinkerdAdminShutdownAnnotation: "enabled"},
			wantWarnings:         []string{"Istio sidecar detected", "Linkerd sidecar detected"}},
		{name: "dislock.io/proxy-quit none: nothing detected, nothing quit, nothing added",
			proxyQuit:      "none",
			podAnnotations: map[string]string{"linkerd.io/inject": "enabled"},
			nsLabels:       map[string]string{"istio-injection": "enabled"}},
		{name: "dislock.io/proxy-quit none still never wraps a proxy in the template",
			proxyQuit: "none",
			proxies:   []string{IstioProxyContainer, LinkerdProxyContainer}},
		{name: "dislock.io/proxy-quit URLs replace the detection",
			proxyQuit:      "http://localhost:15000/quitquitquit, http://[::1]:9901/quit",
			podAnnotations: map[string]string{"linkerd.io/inject": "enabled"},
			nsLabels:       map[string]string{"istio-injection": "enabled"},
			wantQuit:       "http://localhost:15000/quitquitquit,http://[::1]:9901/quit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			annotations := map[string]string{contract.AnnotationMode: "schedule"}
			if tc.proxyQuit != "" {
				annotations[contract.AnnotationProxyQuit] = tc.proxyQuit
			}
			cj, job := errCase(annotations, func(cj *batchv1.CronJob, job *batchv1.Job) {
				for _, js := range []*batchv1.JobSpec{&cj.Spec.JobTemplate.Spec, &job.Spec} {
					js.Template.Labels = maps.Clone(tc.podLabels)
					js.Template.Annotations = maps.Clone(tc.podAnnotations)
					for _, name := range tc.proxies {
						js.Template.Spec.Containers = append(js.Template.Spec.Containers, proxyContainer(name))
					}
				}
			})
			var ns *corev1.Namespace
			if !tc.unknownNamespace {
				ns = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: job.Namespace, Labels: tc.nsLabels, Annotations: tc.nsAnnotations}}
			}
			if need, err := NeedsEntrypoint(job, cj); err != nil || len(need) != 0 {
				t.Errorf("NeedsEntrypoint = %v, %v; a mesh proxy's image must never be looked up", need, err)
			}

			out, st, warnings, err := InjectInNamespace(job, cj, ns, goldenOptions(), nil)
			if err != nil {
				t.Fatalf("Inject: %v", err)
			}
			checkInjected(t, out, st)
			checkAgentReadsItsEnv(t, out, st)

			quit, set := injecttest.SidecarEnv(t, out, contract.EnvProxyQuit)
			if quit != tc.wantQuit || set != (tc.wantQuit != "") {
				t.Errorf("%s = %q (set %v), want %q", contract.EnvProxyQuit, quit, set, tc.wantQuit)
			}
			if apps, _ := injecttest.SidecarEnv(t, out, contract.EnvAppContainers); apps != "app" {
				t.Errorf("%s = %q, want only the app", contract.EnvAppContainers, apps)
			}
			if !slices.Equal(st.Containers, []string{"app"}) {
				t.Errorf("status containers %q, want only the app", st.Containers)
			}
			containers := out.Spec.Template.Spec.Containers
			if !wrapped(containers[0].Command) {
				t.Errorf("the app is not wrapped: %q", containers[0].Command)
			}
			for i, c := range containers[1:] {
				if want := job.Spec.Template.Spec.Containers[1+i]; !reflect.DeepEqual(c, want) {
					t.Errorf("proxy %s changed:\n got %+v\nwant %+v", c.Name, c, want)
				}
			}

			wantAnnotations := maps.Clone(tc.podAnnotations)
			if len(tc.wantAddedAnnotations) > 0 {
				if wantAnnotations == nil {
					wantAnnotations = map[string]string{}
				}
				maps.Copy(wantAnnotations, tc.wantAddedAnnotations)
			}
			if got := out.Spec.Template.Annotations; !maps.Equal(got, wantAnnotations) {
				t.Errorf("pod template annotations %v, want %v", got, wantAnnotations)
			}

			if len(tc.wantWarnings) == 0 && len(warnings) > 0 {
				t.Errorf("warnings %q, want none", warnings)
			}
			for _, w := range tc.wantWarnings {
				if !slices.ContainsFunc(warnings, func(got string) bool { return strings.Contains(got, w) }) {
					t.Errorf("no warning says %q; warnings:\n%s", w, strings.Join(warnings, "\n"))
				}
			}
			for _, w := range warnings {
				if !strings.HasPrefix(w, "dislock: ") || strings.Contains(w, "\n") {
					t.Errorf("warning %q is not one line starting with \"dislock: \"", w)
				}
			}

			// Reinvocation, or a copy of the Job: the same namespace gives the
			// same Job back.
			again, _, _, err := InjectInNamespace(out, cj, ns, goldenOptions(), nil)
			if err != nil {
				t.Fatalf("re-injecting: %v", err)
			}
			if !reflect.DeepEqual(toJSON(t, again), toJSON(t, out)) {
				t.Errorf("re-injecting changed the Job:\n%s", injecttest.LineDiff(string(injecttest.ToYAML(t, out)), string(injecttest.ToYAML(t, again))))
			}
			if errs := ValidateCronJob(cj, Options{}); len(errs) != 0 {
				t.Errorf("the CronJob does not validate: %v", errs)
			}
		})
	}
}

// A namespace object that is not the Job's says nothing about its pods.
func TestMeshIgnoresAnotherNamespace(t *testing.T) {
	t.Parallel()
	cj, job := errCase(map[string]string{contract.AnnotationMode: "lease"}, nil)
	other := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere", Labels: map[string]string{"istio-injection": "enabled"}}}
	out, _, warnings, err := InjectInNamespace(job, cj, other, goldenOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, set := injecttest.SidecarEnv(t, out, contract.EnvProxyQuit); set || len(warnings) > 0 {
		t.Errorf("%s = %q, warnings %q; want neither", contract.EnvProxyQuit, v, warnings)
	}
}

// The pod's restartPolicy reaches the agent: under Never it may record a
// failure as soon as every app container ended.
func TestRestartPolicyReachesTheAgent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy corev1.RestartPolicy
		// container is the app container's own restartPolicy, which
		// overrides the pod's: a failed container of a Never pod may be
		// restarted, so its exit is not final.
		container *corev1.ContainerRestartPolicy
		rules     bool
		want      string // "" = not set
	}{
		{name: "Never", policy: corev1.RestartPolicyNever, want: "Never"},
		{name: "OnFailure", policy: corev1.RestartPolicyOnFailure, want: "OnFailure"},
		{name: "unset"}, // the API server defaults it first
		{name: "Never with a container's own OnFailure", policy: corev1.RestartPolicyNever,
			container: ptr.To(corev1.ContainerRestartPolicy("OnFailure"))},
		{name: "Never with a container's restart rules", policy: corev1.RestartPolicyNever, rules: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, func(cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.RestartPolicy = tc.policy
				job.Spec.Template.Spec.Containers[0].RestartPolicy = tc.container
				if tc.rules {
					job.Spec.Template.Spec.Containers[0].RestartPolicy = ptr.To(corev1.ContainerRestartPolicy("Never"))
					job.Spec.Template.Spec.Containers[0].RestartPolicyRules = []corev1.ContainerRestartRule{{
						Action:    "Restart",
						ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: "In", Values: []int32{42}},
					}}
				}
			})
			out, st, err := Inject(job, cj, goldenOptions(), nil)
			if err != nil {
				t.Fatal(err)
			}
			got, set := injecttest.SidecarEnv(t, out, contract.EnvRestartPolicy)
			if got != tc.want || set != (tc.want != "") {
				t.Errorf("%s = %q (set %v), want %q", contract.EnvRestartPolicy, got, set, tc.want)
			}
			checkAgentReadsItsEnv(t, out, st)
		})
	}
}

// A bad dislock.io/proxy-quit denies the Job, and refuses the CronJob at
// apply time, naming the annotation, the bad URL and the fix.
func TestBadProxyQuitIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		value string
		want  string
	}{
		{"http://10.0.0.7:15020/quitquitquit",
			`annotation dislock.io/proxy-quit: "http://10.0.0.7:15020/quitquitquit" is not on the pod's loopback ` +
				`(want a loopback http URL with a port, e.g. "http://127.0.0.1:15020/quitquitquit")`},
		{"http://127.0.0.1:15020/quitquitquit,https://localhost:4191/shutdown",
			`holds "https://localhost:4191/shutdown", which is not an http URL (want a loopback http URL with a port`},
		{"", `annotation dislock.io/proxy-quit is empty (want "none", or at most 4 comma-separated loopback http URLs with a port`},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Parallel()
			cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationProxyQuit: tc.value}, nil)
			if _, _, err := Inject(job, cj, goldenOptions(), nil); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Inject: %v\nwant an error containing %s", err, tc.want)
			}
			errs := ValidateCronJob(cj, Options{})
			if len(errs) != 1 || errs[0].Field != "metadata.annotations[dislock.io/proxy-quit]" {
				t.Fatalf("ValidateCronJob: %v", errs)
			}
			if fix := tc.want[strings.Index(tc.want, "(want"):]; !strings.Contains(errs[0].Error(), fix) {
				t.Errorf("ValidateCronJob: %v\nwant the fix %s", errs[0], fix)
			}
		})
	}
}

// A pod template of mesh proxies only has no app to lock.
func TestOnlyMeshProxiesIsRefused(t *testing.T) {
	t.Parallel()
	cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, func(cj *batchv1.CronJob, job *batchv1.Job) {
		for _, js := range []*batchv1.JobSpec{&cj.Spec.JobTemplate.Spec, &job.Spec} {
			js.Template.Spec.Containers = []corev1.Container{proxyContainer(IstioProxyContainer)}
		}
	})
	const want = "every container is a mesh proxy (istio-proxy or linkerd-proxy), which dislock never wraps"
	if _, _, err := Inject(job, cj, goldenOptions(), nil); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Inject: %v", err)
	}
	if errs := ValidateCronJob(cj, Options{}); len(errs) != 1 || !strings.Contains(errs[0].Error(), want) ||
		errs[0].Field != "spec.jobTemplate.spec.template.spec.containers" {
		t.Errorf("ValidateCronJob: %v", errs)
	}
}

// The mesh plan is carried across a reinvocation, not decided again: what it
// is decided from may change in between (the namespace as another replica's
// cache sees it, or not at all within the read's timeout; a pod-template
// label a later webhook adds, such as a policy's
// sidecar.istio.io/inject=false for Jobs), and a plan decided again could
// differ, so that dislock denied its own injection, every Job of the
// CronJob. A changed plan would change nothing that matters: the agent
// only POSTs to the pod's loopback.
func TestAReinvocationKeepsTheMeshPlanOfTheFirstPass(t *testing.T) {
	t.Parallel()
	cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, nil)
	istio := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: job.Namespace, Labels: map[string]string{"istio-injection": "enabled"}}}
	for _, tc := range []struct {
		name        string
		first, then *corev1.Namespace
		edit        func(*batchv1.Job) // what a later webhook changed
		quit        string             // the sidecar's DISLOCK_PROXY_QUIT throughout
	}{
		{"the reinvocation cannot read the namespace", istio, nil, nil, "http://127.0.0.1:15020/quitquitquit"},
		{"a later webhook labels the pod for Istio", nil, nil, func(j *batchv1.Job) {
			j.Spec.Template.Labels["sidecar.istio.io/inject"] = "true" // next to dislock's own label
		}, ""},
		{"a later policy opts the pod out of Istio", istio, istio, func(j *batchv1.Job) {
			j.Spec.Template.Labels["sidecar.istio.io/inject"] = "false" // next to dislock's own label
		}, "http://127.0.0.1:15020/quitquitquit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, _, _, err := InjectInNamespace(job, cj, tc.first, goldenOptions(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.edit != nil {
				tc.edit(out)
			}
			again, _, _, err := InjectInNamespace(out, cj, tc.then, goldenOptions(), nil)
			if err != nil {
				t.Fatalf("dislock denies its own injection on reinvocation: %v", err)
			}
			if got, _ := injecttest.SidecarEnv(t, again, contract.EnvProxyQuit); got != tc.quit {
				t.Errorf("%s = %q after the reinvocation, want %q (the first pass's)", contract.EnvProxyQuit, got, tc.quit)
			}
		})
	}
}

// Istio and Linkerd never inject a pod on the node's network, and its
// loopback is the node's: no quit URL is predicted for it (the agent would
// POST to whatever listens on the node, such as a gateway's pilot-agent),
// not even for a container named istio-proxy; an explicit
// dislock.io/proxy-quit is kept, with a warning.
func TestAPodOnTheNodesNetworkGetsNoPredictedQuitURL(t *testing.T) {
	t.Parallel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team",
		Labels: map[string]string{"istio-injection": "enabled"}, Annotations: map[string]string{"linkerd.io/inject": "enabled"}}}
	for _, tc := range []struct {
		name     string
		explicit string
		proxy    bool
		quit     string
		warning  string
	}{
		{name: "from the namespace"},
		{name: "from a container named istio-proxy", proxy: true},
		{name: "an explicit URL", explicit: "http://127.0.0.1:15020/quitquitquit", quit: "http://127.0.0.1:15020/quitquitquit",
			warning: "reaches the node's loopback"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			annotations := map[string]string{contract.AnnotationMode: "schedule"}
			if tc.explicit != "" {
				annotations[contract.AnnotationProxyQuit] = tc.explicit
			}
			cj, job := errCase(annotations, func(cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.HostNetwork = true
				if tc.proxy {
					job.Spec.Template.Spec.Containers = append(job.Spec.Template.Spec.Containers,
						corev1.Container{Name: IstioProxyContainer, Image: "proxy", Command: []string{"proxy"}})
				}
			})
			ns := ns.DeepCopy()
			ns.Name = job.Namespace
			out, _, warnings, err := InjectInNamespace(job, cj, ns, goldenOptions(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := injecttest.SidecarEnv(t, out, contract.EnvProxyQuit); got != tc.quit {
				t.Errorf("%s = %q, want %q", contract.EnvProxyQuit, got, tc.quit)
			}
			if _, set := out.Spec.Template.Annotations[LinkerdAdminShutdownAnnotation]; set {
				t.Errorf("the pod template got %s though no mesh injects the pod", LinkerdAdminShutdownAnnotation)
			}
			if joined := strings.Join(warnings, "\n"); tc.warning != "" && !strings.Contains(joined, tc.warning) || tc.warning == "" && joined != "" {
				t.Errorf("warnings %q, want %q", warnings, tc.warning)
			}
		})
	}
}
