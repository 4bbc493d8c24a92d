// Package chart tests how dislock is installed: the Helm chart
// (charts/dislock) and the kustomize configuration (config/). Rendering,
// linting and the refusals of bad values run `helm` alone; applying, the
// ServiceAccount's permissions and the webhook running as the chart
// configures it need the private kube-apiserver of test/kube. helm and
// kubectl come from bin/ (`make tools`); under CI=true a missing one fails
// the tests instead of skipping them.
package chart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/dislock/dislock/test/kube"
)

func TestMain(m *testing.M) {
	code := kube.Main(m, kube.Options{Name: "chart"})
	if builtDir != "" {
		_ = os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

var (
	chartDir  = filepath.Join("..", "..", "charts", "dislock")
	configDir = filepath.Join("..", "..", "config")
)

// tool returns the path of a binary from bin/, ending the test (skip, or
// fail under CI=true) when it was not built.
func tool(t testing.TB, name string) string {
	t.Helper()
	p, err := kube.FindBinary(name)
	if err != nil {
		kube.Missing(t, err)
	}
	return p
}

// run runs a program and returns its stdout; a failure carries stderr.
func run(stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// values builds a values document from dotted keys and their values:
// values("clusterName", "dc-a", "webhook.replicas", 3).
func values(kv ...any) map[string]any {
	out := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		path := strings.Split(kv[i].(string), ".")
		m := out
		for _, k := range path[:len(path)-1] {
			next, ok := m[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[k] = next
			}
			m = next
		}
		m[path[len(path)-1]] = kv[i+1]
	}
	return out
}

// base are the values every install needs: a cluster name and a database.
func base(kv ...any) map[string]any {
	return values(append([]any{"clusterName", "dc-a", "database.existingSecret", "dislock-db"}, kv...)...)
}

// helmTemplate renders the chart as release in namespace ns.
func helmTemplate(t testing.TB, release, ns string, vals map[string]any) manifest {
	t.Helper()
	out, err := helmTemplateErr(t, release, ns, vals)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func helmTemplateErr(t testing.TB, release, ns string, vals map[string]any) (manifest, error) {
	t.Helper()
	out, err := run(nil, tool(t, "helm"), "template", release, chartDir, "--namespace", ns, "--values", valuesFile(t, vals))
	if err != nil {
		return nil, err
	}
	return decode(t, out), nil
}

// valuesFile writes vals where helm can read them: a file, not --set,
// because helm splits --set (and --values) on commas, which a database URL
// (and t.TempDir's name for a test with a comma) may have.
func valuesFile(t testing.TB, vals map[string]any) string {
	t.Helper()
	b, err := yaml.Marshal(vals)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "dislock-values-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	f := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// kustomize builds an overlay of config/: a kustomization in a temp dir
// whose text names config/ as CONFIG.
func kustomize(t testing.TB, kustomization string) manifest {
	t.Helper()
	dir := t.TempDir()
	abs, err := filepath.Abs(configDir)
	if err != nil {
		t.Fatal(err)
	}
	// kustomize only accepts relative paths to other kustomizations.
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(strings.ReplaceAll(kustomization, "CONFIG", rel)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(nil, tool(t, "kubectl"), "kustomize", dir)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, out)
}

// manifest is a list of rendered objects.
type manifest []*unstructured.Unstructured

func decode(t testing.TB, data []byte) manifest {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out manifest
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("decoding the manifest: %v\n%s", err, data)
		}
		if obj != nil {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

// get returns the object of that kind and name, failing the test when there
// is none.
func (m manifest) get(t testing.TB, kind, name string) *unstructured.Unstructured {
	t.Helper()
	if o := m.find(kind, name); o != nil {
		return o
	}
	t.Fatalf("no %s %q in the manifest; it has %s", kind, name, m.ids())
	return nil
}

func (m manifest) find(kind, name string) *unstructured.Unstructured {
	for _, o := range m {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// named returns the object of kind called name.
func (m manifest) named(t testing.TB, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range m {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s in the manifest; it has %s", kind, name, m.ids())
	return nil
}

// one returns the only object of kind.
func (m manifest) one(t testing.TB, kind string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range m {
		if o.GetKind() == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s in the manifest, found %d; it has %s", kind, len(found), m.ids())
	}
	return found[0]
}

func (m manifest) ids() string {
	ids := make([]string, 0, len(m))
	for _, o := range m {
		ids = append(ids, id(o))
	}
	sort.Strings(ids)
	return strings.Join(ids, ", ")
}

func id(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetKind() + "/" + o.GetName()
	}
	return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
}

// yaml is the manifest again as a multi-document stream, for kubectl.
func (m manifest) yaml(t testing.TB) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, o := range m {
		doc, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(doc)
	}
	return b.Bytes()
}

// typed converts a rendered object into its API type.
func typed[T any](t testing.TB, o *unstructured.Unstructured) *T {
	t.Helper()
	v := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, v, true); err != nil {
		t.Fatalf("%s is not a valid %T: %v", id(o), *v, err)
	}
	return v
}

// await polls cond every 100 ms until it holds, failing the test after
// within (or when cond returns an error).
func await(t testing.TB, within time.Duration, what string, cond func(context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		ok, err := cond(ctx)
		if err != nil && ctx.Err() != nil {
			t.Fatalf("%s: not within %s (last: %v)", what, within, err)
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %s", what, within)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// kubectl runs kubectl as the cluster's admin and returns its stdout.
func kubectl(t testing.TB, c *kube.Cluster, stdin []byte, args ...string) string {
	t.Helper()
	out, err := run(stdin, tool(t, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
