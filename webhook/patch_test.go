package webhook

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/dislock/dislock/webhook/inject"
	"github.com/dislock/dislock/webhook/internal/injecttest"
)

// goldenDir holds the golden cases of the injection (injecttest.Cases).
const goldenDir = "inject/testdata/inject"

// goldenOptions are the options every golden file was made with.
func goldenOptions() inject.Options {
	return inject.Options{ClusterName: injecttest.ClusterName, AgentImage: injecttest.AgentImage}
}

// applyResponse applies resp's JSON patch to raw with a JSON-patch
// implementation (as the API server does) and returns the resulting JSON.
func applyResponse(t testing.TB, raw []byte, resp admission.Response) []byte {
	t.Helper()
	patch := resp.Patch
	if len(resp.Patches) > 0 { // the diffed patch, before the server encodes it
		var err error
		if patch, err = json.Marshal(resp.Patches); err != nil {
			t.Fatal(err)
		}
	}
	if len(patch) == 0 {
		return raw
	}
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("decoding the patch: %v\n%s", err, patch)
	}
	out, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("applying the patch: %v\npatch: %s\nobject: %s", err, patch, raw)
	}
	return out
}

// checkPatched checks that resp's patch turns raw into exactly what Inject
// returned, compared as Jobs decoded from JSON.
func checkPatched(t testing.TB, raw []byte, resp admission.Response, injected *batchv1.Job) {
	t.Helper()
	if !resp.Allowed {
		t.Fatalf("response not allowed: %+v", resp.Result)
	}
	got, err := decodeJob(applyResponse(t, raw, resp))
	if err != nil {
		t.Fatalf("decoding the patched Job: %v", err)
	}
	_, want := asRequest(t, injected)
	if !apiequality.Semantic.DeepEqual(got, want) {
		t.Fatalf("the patched Job is not the injected one (patch %s):\n%s", resp.Patch, injecttest.LineDiff(string(injecttest.ToYAML(t, want)), string(injecttest.ToYAML(t, got))))
	}
}

// asRequest returns job's JSON, as an admission request carries it, and the
// Job the webhook decodes from that.
func asRequest(t testing.TB, job *batchv1.Job) ([]byte, *batchv1.Job) {
	t.Helper()
	raw, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	out, err := decodeJob(raw)
	if err != nil {
		t.Fatal(err)
	}
	return raw, out
}

// injectedRequest returns a CronJob's new Job as the JSON of an admission
// request, edited first by the JSON patch edit when it is not empty; the Job
// decoded from it as the webhook does; and Inject's result for that.
func injectedRequest(t testing.TB, edit string) (raw []byte, job, injected *batchv1.Job) {
	t.Helper()
	cj, job := cronJobAndJob(map[string]string{"dislock.io/mode": "schedule,lease"})
	raw, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	if edit != "" {
		p, err := jsonpatch.DecodePatch([]byte(edit))
		if err != nil {
			t.Fatal(err)
		}
		if raw, err = p.Apply(raw); err != nil {
			t.Fatal(err)
		}
	}
	if job, err = decodeJob(raw); err != nil {
		t.Fatal(err)
	}
	injected, _, err = inject.Inject(job, cj, testOptions(), nil)
	if err != nil {
		t.Fatalf("Inject: %v", err)
	}
	return raw, job, injected
}

// TestPatchGolden: for every golden case, the patch built from the
// injection turns the request's JSON into the injected Job, without falling
// back to diffing documents; an injected Job gives no patch at all.
func TestPatchGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range injecttest.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			cj, fromFile := injecttest.ReadCase(t, filepath.Join(goldenDir, tc.Name+".yaml"))
			raw, job := asRequest(t, fromFile)
			injected, _, err := inject.Inject(job, cj, goldenOptions(), tc.Entrypoints)
			if err != nil {
				t.Fatalf("Inject: %v", err)
			}
			patch, ok, err := jobPatch(job, injected)
			if err != nil || !ok {
				t.Fatalf("jobPatch: ok %v, %v; want a patch built from the injection", ok, err)
			}
			resp, err := patchResponse(raw, job, injected)
			if err != nil {
				t.Fatal(err)
			}
			checkPatched(t, raw, resp, injected)
			if tc.Name == "already-injected" && (patch != nil || resp.PatchType != nil) {
				t.Errorf("an injected Job got the patch %s", patch)
			}

			_, again := asRequest(t, injected)
			reinjected, _, err := inject.Inject(again, cj, goldenOptions(), nil)
			if err != nil {
				t.Fatalf("re-injecting: %v", err)
			}
			if patch, ok, err := jobPatch(again, reinjected); patch != nil || !ok || err != nil {
				t.Errorf("re-injecting gave the patch %s (ok %v, %v); want none", patch, ok, err)
			}
		})
	}
}

// TestPatchCases covers the JSON shapes and differences the golden cases do
// not: empty or null arrays and maps in the request, keys that need escaping
// in a JSON pointer, elements inserted or replaced in the middle, and
// changes outside what jobPatch covers, which are diffed instead.
func TestPatchCases(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// request edits the request's JSON (a JSON patch) before decoding.
		request string
		// change edits Inject's result, for differences Inject does not make
		// today; the patch must describe any difference.
		change func(*batchv1.Job)
		diffed bool // the difference is outside jobPatch's paths
	}{
		{name: "arrays present but empty are set whole",
			request: `[{"op":"add","path":"/spec/template/spec/initContainers","value":[]},
				{"op":"add","path":"/spec/template/spec/volumes","value":[]},
				{"op":"add","path":"/spec/template/spec/containers/0/env","value":[]},
				{"op":"add","path":"/spec/template/spec/containers/0/volumeMounts","value":[]}]`},
		{name: "null arrays and annotations are set whole",
			request: `[{"op":"add","path":"/spec/template/spec/initContainers","value":null},
				{"op":"add","path":"/spec/template/spec/volumes","value":null},
				{"op":"add","path":"/spec/template/spec/containers/0/env","value":null},
				{"op":"add","path":"/metadata/annotations","value":null}]`},
		{name: "empty annotations are set whole",
			request: `[{"op":"add","path":"/metadata/annotations","value":{}}]`},
		{name: "a stale container-name variable in the middle of env is dropped and appended anew",
			request: `[{"op":"add","path":"/spec/template/spec/containers/0/env","value":[
				{"name":"A","value":"1"},{"name":"DISLOCK_CONTAINER_NAME","value":"stale"},{"name":"B","value":"2"}]}]`},
		{name: "existing init containers, volumes and mounts keep their place",
			request: `[{"op":"add","path":"/spec/template/spec/initContainers","value":[{"name":"fetch","image":"fetch"}]},
				{"op":"add","path":"/spec/template/spec/volumes","value":[{"name":"scratch","emptyDir":{}}]},
				{"op":"add","path":"/spec/template/spec/containers/0/volumeMounts","value":[{"name":"scratch","mountPath":"/tmp"}]}]`},
		{name: "annotation and label keys with ~ and / are escaped",
			request: `[{"op":"add","path":"/metadata/labels","value":{"a~b/c":"old","gone/x~y":"1"}}]`,
			change: func(j *batchv1.Job) {
				j.Annotations["example.com/a~b"] = "new"
				j.Labels["a~b/c"] = "changed"
				delete(j.Labels, "gone/x~y")
			}},
		{name: "all labels removed",
			request: `[{"op":"add","path":"/metadata/labels","value":{"team":"a"}}]`,
			change:  func(j *batchv1.Job) { j.Labels = nil }},
		{name: "a volume inserted in the middle",
			request: `[{"op":"add","path":"/spec/template/spec/volumes","value":[{"name":"a","emptyDir":{}},{"name":"b","emptyDir":{}},{"name":"c","emptyDir":{}}]}]`,
			change: func(j *batchv1.Job) {
				v := j.Spec.Template.Spec.Volumes
				j.Spec.Template.Spec.Volumes = []corev1.Volume{v[0], {Name: "new"}, v[1], v[2]}
			}},
		{name: "a volume removed from the middle",
			request: `[{"op":"add","path":"/spec/template/spec/volumes","value":[{"name":"a","emptyDir":{}},{"name":"b","emptyDir":{}},{"name":"c","emptyDir":{}}]}]`,
			change: func(j *batchv1.Job) {
				v := j.Spec.Template.Spec.Volumes
				j.Spec.Template.Spec.Volumes = []corev1.Volume{v[0], v[2]}
			}},
		{name: "a container changed beyond its command is replaced whole",
			change: func(j *batchv1.Job) { j.Spec.Template.Spec.Containers[0].Image = "other" }},
		{name: "args and a command removed",
			request: `[{"op":"add","path":"/spec/template/spec/containers/0/args","value":["--x"]}]`,
			change: func(j *batchv1.Job) {
				j.Spec.Template.Spec.Containers[0].Args = nil
				j.Spec.Template.Spec.Containers[0].Command = nil
			}},
		{name: "a null container is replaced whole",
			request: `[{"op":"add","path":"/spec/template/spec/containers/-","value":null},
				{"op":"add","path":"/metadata/annotations/dislock.io~1entrypoint","value":"[\"/run\"]"}]`},
		{name: "a chosen pod replacement policy is kept",
			request: `[{"op":"add","path":"/spec/podReplacementPolicy","value":"TerminatingOrFailed"}]`},
		{name: "a pod replacement policy replaced",
			request: `[{"op":"add","path":"/spec/podReplacementPolicy","value":"TerminatingOrFailed"}]`,
			change:  func(j *batchv1.Job) { j.Spec.PodReplacementPolicy = ptr.To(batchv1.Failed) }},
		{name: "a pod replacement policy removed",
			request: `[{"op":"add","path":"/spec/podReplacementPolicy","value":"TerminatingOrFailed"}]`,
			change:  func(j *batchv1.Job) { j.Spec.PodReplacementPolicy = nil }},
		{name: "a null pod replacement policy is set",
			request: `[{"op":"add","path":"/spec/podReplacementPolicy","value":null}]`},
		{name: "a pod template annotation added where the template's metadata is empty sets the metadata whole",
			change: func(j *batchv1.Job) {
				j.Spec.Template.Annotations = map[string]string{inject.LinkerdAdminShutdownAnnotation: "enabled"}
			}},
		{name: "a pod template annotation added where the request has no template metadata",
			request: `[{"op":"remove","path":"/spec/template/metadata"}]`,
			change: func(j *batchv1.Job) {
				j.Spec.Template.Annotations = map[string]string{inject.LinkerdAdminShutdownAnnotation: "enabled"}
			}},
		{name: "a pod template annotation added next to others, with keys escaped",
			request: `[{"op":"add","path":"/spec/template/metadata/labels","value":{"app":"report"}},
				{"op":"add","path":"/spec/template/metadata/annotations","value":{"linkerd.io/inject":"enabled"}}]`},
		{name: "pod template annotations added to a null map",
			request: `[{"op":"add","path":"/spec/template/metadata/annotations","value":null},
				{"op":"add","path":"/spec/template/metadata/labels","value":{"app":"report"}}]`,
			change: func(j *batchv1.Job) {
				j.Spec.Template.Annotations = map[string]string{inject.LinkerdAdminShutdownAnnotation: "enabled"}
			}},
		{name: "a change outside the covered paths is diffed",
			change: func(j *batchv1.Job) { j.Spec.BackoffLimit = ptr.To(int32(9)) },
			diffed: true},
		{name: "a request without a pod spec is diffed",
			request: `[{"op":"remove","path":"/spec"}]`,
			diffed:  true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			raw, decoded, injected := injectedRequest(t, tc.request)
			if tc.change != nil {
				tc.change(injected)
			}
			if _, ok, err := jobPatch(decoded, injected); err != nil || ok == tc.diffed {
				t.Fatalf("jobPatch: ok %v, %v; want ok %v", ok, err, !tc.diffed)
			}
			resp, err := patchResponse(raw, decoded, injected)
			if err != nil {
				t.Fatal(err)
			}
			checkPatched(t, raw, resp, injected)
		})
	}
}

// TestPatchKeepsWhatTheWebhookDoesNotKnow: fields of a newer API than the
// webhook's survive the admission, in the Job and in the containers it
// wraps, as long as the injection does not replace them.
func TestPatchKeepsWhatTheWebhookDoesNotKnow(t *testing.T) {
	t.Parallel()
	future := map[string]string{
		"/metadata/future":                                 `"m"`,
		"/spec/future":                                     `"j"`,
		"/spec/template/spec/future":                       `"p"`,
		"/spec/template/spec/containers/0/future":          `"c"`,
		"/spec/template/spec/containers/0/env":             `[{"name":"A","value":"1","future":"e"}]`,
		"/spec/template/spec/containers/0/resources":       `{"limits":{"cpu":"1500m","memory":"1Gi"},"future":"r"}`,
		"/spec/template/spec/containers/0/securityContext": `{"future":"s"}`,
		"/spec/template/spec/containers/0/volumeMounts":    `[{"name":"x","mountPath":"/x","future":"v"}]`,
	}
	var ops []string
	for path, v := range future {
		ops = append(ops, `{"op":"add","path":"`+path+`","value":`+v+`}`)
	}
	raw, decoded, injected := injectedRequest(t, "["+strings.Join(ops, ",")+"]")
	resp, err := patchResponse(raw, decoded, injected)
	if err != nil {
		t.Fatal(err)
	}
	checkPatched(t, raw, resp, injected)
	var out struct {
		Metadata map[string]any `json:"metadata"`
		Spec     struct {
			Future   string `json:"future"`
			Template struct {
				Spec struct {
					Future     string `json:"future"`
					Containers []struct {
						Future          string           `json:"future"`
						Env             []map[string]any `json:"env"`
						Resources       map[string]any   `json:"resources"`
						SecurityContext map[string]any   `json:"securityContext"`
						VolumeMounts    []map[string]any `json:"volumeMounts"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(applyResponse(t, raw, resp), &out); err != nil {
		t.Fatal(err)
	}
	pod := out.Spec.Template.Spec
	c := pod.Containers[0]
	got := []any{out.Metadata["future"], out.Spec.Future, pod.Future, c.Future, c.Env[0]["future"],
		c.Resources["future"], c.SecurityContext["future"], c.VolumeMounts[0]["future"]}
	want := []any{"m", "j", "p", "c", "e", "r", "s", "v"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("unknown fields after the patch: %v, want %v", got, want)
			break
		}
	}
}

// TestAdmissionPatch: over HTTPS, a CronJob's new Job is answered with a
// patch that gives exactly Inject's result, and a Job the webhook already
// injected (reinvocation) is allowed without a patch.
func TestAdmissionPatch(t *testing.T) {
	t.Parallel()
	cj, job := cronJobAndJob(map[string]string{"dislock.io/mode": "schedule,lease"})
	ts := startTestServer(t, cj)
	injected, _, err := inject.Inject(job, cj, testOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := asRequest(t, job)
	resp, _ := ts.review(t, MutateJobPath, reviewBody(t, "Job", admissionv1.Create, job))
	if resp == nil || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("response %+v, want a JSON patch", resp)
	}
	checkPatched(t, raw, admission.Response{AdmissionResponse: *resp}, injected)

	resp, _ = ts.review(t, MutateJobPath, reviewBody(t, "Job", admissionv1.Create, injected))
	if resp == nil || !resp.Allowed || len(resp.Patch) != 0 || resp.PatchType != nil {
		t.Fatalf("an injected Job: response %+v, want allowed without a patch", resp)
	}
}

// FuzzPatch: for any Job Inject accepts, the admission's patch (built, or
// diffed when it cannot be built) turns the request's JSON into exactly the
// injected Job. Seeded with the golden cases; the fuzzer edits the JSON.
func FuzzPatch(f *testing.F) {
	cronJobs := make([]*batchv1.CronJob, len(injecttest.Cases))
	for i, tc := range injecttest.Cases {
		cj, job := injecttest.ReadCase(f, filepath.Join(goldenDir, tc.Name+".yaml"))
		cronJobs[i] = cj
		raw, _ := asRequest(f, job)
		f.Add(uint8(i), string(raw))
	}
	f.Fuzz(func(t *testing.T, n uint8, raw string) {
		i := int(n) % len(injecttest.Cases)
		job, err := decodeJob([]byte(raw))
		if err != nil {
			return
		}
		injected, _, err := inject.Inject(job, cronJobs[i], goldenOptions(), injecttest.Cases[i].Entrypoints)
		if err != nil {
			return
		}
		resp, err := patchResponse([]byte(raw), job, injected)
		if err != nil {
			t.Fatal(err)
		}
		checkPatched(t, []byte(raw), resp, injected)
	})
}
