// Package injecttest holds what the tests of the injection (webhook/inject)
// and of the admission that answers with it (webhook) share: the golden
// cases in webhook/inject/testdata/inject and the helpers that read and
// compare them. It imports neither package, so that both may import it.
package injecttest

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// ClusterName and AgentImage are the options every golden file was made
// with; the other options keep their defaults.
const (
	ClusterName = "dc-a"
	AgentImage  = "ghcr.io/dislock/dislock:v0.1.0"
)

// Case is one input in testdata/inject: <Name>.yaml holds a CronJob and the
// Job its controller (or kubectl) created, and <Name>.injected.yaml the Job
// Inject returns.
type Case struct {
	Name        string
	Entrypoints map[string][]string // what the caller resolved from the registry
	// DatabaseCAAndPodMetadata: the case is injected with a database CA,
	// pod labels and pod annotations besides the golden options.
	DatabaseCAAndPodMetadata bool
}

// Cases are the golden cases, every file of testdata/inject.
var Cases = []Case{
	{Name: "schedule"},
	{Name: "lease"},
	{Name: "schedule-lease"},
	{Name: "manual"},
	{Name: "entrypoint-from-registry", Entrypoints: map[string][]string{"app": {"/usr/local/bin/report", "serve"}}},
	{Name: "entrypoint-annotation", Entrypoints: map[string][]string{"app": {"/ignored"}}},
	{Name: "several-containers"},
	{Name: "existing-init-containers-and-volumes"},
	{Name: "already-injected"},
	{Name: "run-as-non-root"},
	{Name: "template-annotation-overrides-cronjob"},
	{Name: "window-from-job-name"},
	{Name: "window-from-schedule"},
	{Name: "indexed"},
	{Name: "explicit-pod-replacement-policy"},
	{Name: "defaulted-pod-replacement-policy"},
	{Name: "mesh-istio-proxy-in-template"},
	{Name: "mesh-linkerd-annotation"},
	{Name: "database-ca-and-pod-metadata", DatabaseCAAndPodMetadata: true},
}

// ReadCase decodes a case file: a CronJob, then a Job, as YAML documents.
func ReadCase(t testing.TB, path string) (*batchv1.CronJob, *batchv1.Job) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cj *batchv1.CronJob
	var job *batchv1.Job
	for doc := range bytes.SplitSeq(b, []byte("\n---\n")) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch tm.Kind {
		case "CronJob":
			cj = &batchv1.CronJob{}
			err = yaml.UnmarshalStrict(doc, cj)
		case "Job":
			job = &batchv1.Job{}
			err = yaml.UnmarshalStrict(doc, job)
		default:
			t.Fatalf("%s: unexpected kind %q", path, tm.Kind)
		}
		if err != nil {
			t.Fatalf("%s: %s: %v", path, tm.Kind, err)
		}
	}
	if cj == nil || job == nil {
		t.Fatalf("%s: want a CronJob and a Job", path)
	}
	return cj, job
}

// ToYAML is obj as YAML.
func ToYAML(t testing.TB, obj any) []byte {
	t.Helper()
	b, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// LineDiff shows the first differing lines of two texts.
func LineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < max(len(w), len(g)) && shown < 20; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n  - " + wl + "\n  + " + gl + "\n")
			shown++
		}
	}
	return b.String()
}

// SidecarEnv returns the value of the injected sidecar's variable name, and
// whether it is set.
func SidecarEnv(t testing.TB, job *batchv1.Job, name string) (string, bool) {
	t.Helper()
	for _, e := range job.Spec.Template.Spec.InitContainers[0].Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}
