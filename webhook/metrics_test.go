package webhook

import (
	"runtime"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/dislock/dislock/internal/version"
)

// The metrics endpoint names the build that answers: dislock_build_info is
// 1, labelled with the stamped version and commit and the Go version.
func TestTheMetricsEndpointNamesTheBuild(t *testing.T) {
	t.Parallel()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"version": version.Version, "commit": version.Commit, "goversion": runtime.Version()}
	for _, f := range families {
		if f.GetName() != "dislock_build_info" {
			continue
		}
		if len(f.GetMetric()) != 1 {
			t.Fatalf("dislock_build_info has %d series, want one", len(f.GetMetric()))
		}
		m := f.GetMetric()[0]
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if len(got) != len(want) || got["version"] != want["version"] || got["commit"] != want["commit"] || got["goversion"] != want["goversion"] {
			t.Errorf("labels %v, want %v", got, want)
		}
		if v := m.GetGauge().GetValue(); v != 1 {
			t.Errorf("value %v, want 1", v)
		}
		return
	}
	t.Fatal("the metrics registry has no dislock_build_info")
}
