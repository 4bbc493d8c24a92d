package chart

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// clusterOverlay sets the cluster name config/default leaves empty, the way
// docs/install.md shows; extra lines add components.
const clusterOverlay = `
resources:
  - CONFIG/default
configMapGenerator:
  - name: dislock-config
    behavior: merge
    literals:
      - cluster-name=dc-a
`

// config/ is the chart for people who install with kustomize: for the same
// settings it must build the same objects, so that neither drifts from what
// the other (and the code) needs. Only the labels differ (Helm's own), plus
// the Namespace and the ConfigMap that carries the cluster name, which the
// chart gets from --namespace and its values.
func TestKustomizeBuildsWhatTheChartRenders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		vals       map[string]any
		components []string
	}{
		{"with the webhook's own certificates", base(), nil},
		{"with cert-manager and a ServiceMonitor", base("certManager.enabled", true, "serviceMonitor.enabled", true),
			[]string{"certmanager", "prometheus"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			overlay := clusterOverlay
			if len(tc.components) > 0 {
				overlay += "components:\n"
				for _, c := range tc.components {
					overlay += "  - CONFIG/" + c + "\n"
				}
			}
			fromChart := normalise(withoutHelmTests(helmTemplate(t, "dislock", "dislock-system", tc.vals)))
			fromKustomize := normalise(kubeletExpanded(t, kustomize(t, overlay)))
			if got, want := ids(fromKustomize), ids(fromChart); !reflect.DeepEqual(got, want) {
				t.Fatalf("kustomize builds\n  %v\nthe chart renders\n  %v", got, want)
			}
			for key, k := range fromKustomize {
				if diffs := differences(fromChart[key], k, ""); len(diffs) > 0 {
					t.Errorf("%s differs:\n  %s", key, strings.Join(diffs, "\n  "))
				}
			}
		})
	}
	t.Run("config/default alone leaves the cluster name empty, which the webhook refuses", func(t *testing.T) {
		t.Parallel()
		cm := kustomize(t, "resources:\n  - CONFIG/default\n").one(t, "ConfigMap")
		if v, found, _ := unstructured.NestedString(cm.Object, "data", "cluster-name"); !found || v != "" {
			t.Errorf("cluster-name %q (found %v): want present and empty", v, found)
		}
	})
}

// kubeletExpanded drops the ConfigMap that carries the cluster name and the
// agent image, and puts its values into the Deployment's args the way the
// kubelet expands $(VAR) from the container's env.
func kubeletExpanded(t *testing.T, m manifest) manifest {
	t.Helper()
	cm := m.one(t, "ConfigMap")
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	dep := m.one(t, "Deployment")
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		c := c.(map[string]any)
		vars := map[string]string{}
		var kept []any
		for _, e := range c["env"].([]any) {
			e := e.(map[string]any)
			ref, found, _ := unstructured.NestedStringMap(e, "valueFrom", "configMapKeyRef")
			if !found || ref["name"] != cm.GetName() {
				kept = append(kept, e)
				continue
			}
			vars[e["name"].(string)] = data[ref["key"]]
		}
		c["env"] = kept
		for i, a := range c["args"].([]any) {
			for k, v := range vars {
				a = strings.ReplaceAll(a.(string), "$("+k+")", v)
			}
			c["args"].([]any)[i] = a
		}
	}
	if err := unstructured.SetNestedSlice(dep.Object, containers, "spec", "template", "spec", "containers"); err != nil {
		t.Fatal(err)
	}
	var out manifest
	for _, o := range m {
		if o != cm && o.GetKind() != "Namespace" {
			out = append(out, o)
		}
	}
	return out
}

// withoutHelmTests drops the `helm test` hooks, which kustomize has no
// counterpart of: `dislock check` is run by hand there (docs/install.md).
func withoutHelmTests(m manifest) manifest {
	var out manifest
	for _, o := range m {
		if o.GetAnnotations()["helm.sh/hook"] != "test" {
			out = append(out, o)
		}
	}
	return out
}

// normalise keys the objects by kind, namespace and name, without their
// labels and annotations (but cert-manager's inject-ca-from, which matters).
func normalise(m manifest) map[string]any {
	out := map[string]any{}
	for _, o := range m {
		c := o.DeepCopy()
		inject := c.GetAnnotations()["cert-manager.io/inject-ca-from"]
		unstructured.RemoveNestedField(c.Object, "metadata", "labels")
		unstructured.RemoveNestedField(c.Object, "metadata", "annotations")
		if inject != "" {
			c.SetAnnotations(map[string]string{"cert-manager.io/inject-ca-from": inject})
		}
		// Through JSON, so that numbers compare alike whichever tool wrote them.
		b, _ := json.Marshal(c.Object)
		var v any
		_ = json.Unmarshal(b, &v)
		out[id(o)] = v
	}
	return out
}

func ids(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// differences lists the paths where a and b differ, with both values.
func differences(a, b any, path string) []string {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		var out []string
		keys := map[string]bool{}
		for k := range am {
			keys[k] = true
		}
		for k := range bm {
			keys[k] = true
		}
		for k := range keys {
			out = append(out, differences(am[k], bm[k], path+"."+k)...)
		}
		sort.Strings(out)
		return out
	}
	as, aok := a.([]any)
	bs, bok := b.([]any)
	if aok && bok && len(as) == len(bs) {
		var out []string
		for i := range as {
			out = append(out, differences(as[i], bs[i], fmt.Sprintf("%s[%d]", path, i))...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return []string{fmt.Sprintf("%s: chart %s, kustomize %s", path, ja, jb)}
}
