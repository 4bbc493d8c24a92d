package inject

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"

	"github.com/dislock/dislock/webhook/internal/injecttest"
)

// podSecurityLevel is the most restrictive Pod Security Standards level
// (latest version) the pod passes, as the API server's admission judges it.
func podSecurityLevel(t *testing.T, ev policy.Evaluator, tmpl corev1.PodTemplateSpec) api.Level {
	t.Helper()
	for _, level := range []api.Level{api.LevelRestricted, api.LevelBaseline} {
		res := ev.EvaluatePod(api.LevelVersion{Level: level, Version: api.LatestVersion()}, &tmpl.ObjectMeta, &tmpl.Spec)
		if policy.AggregateCheckResults(res).Allowed {
			return level
		}
	}
	return api.LevelPrivileged
}

var levelRank = map[api.Level]int{api.LevelPrivileged: 0, api.LevelBaseline: 1, api.LevelRestricted: 2}

// A namespace enforcing a Pod Security Standards level admits the pods of
// an opted-in CronJob exactly as before it opted in: injection (the
// sidecar, its volume, the wrapper) never lowers the level a pod passes,
// in every golden case, and a restricted app stays restricted.
func TestInjectionKeepsThePodsSecurityLevel(t *testing.T) {
	t.Parallel()
	ev, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	restricted := 0
	for _, tc := range injecttest.Cases {
		cj, job := injecttest.ReadCase(t, goldenDir+"/"+tc.Name+".yaml")
		out, _, err := Inject(job, cj, caseOptions(tc), tc.Entrypoints)
		if err != nil {
			t.Errorf("%s: Inject: %v", tc.Name, err)
			continue
		}
		before := podSecurityLevel(t, ev, job.Spec.Template)
		after := podSecurityLevel(t, ev, out.Spec.Template)
		if levelRank[after] < levelRank[before] {
			t.Errorf("%s: the pod passes %q, injected only %q", tc.Name, before, after)
		}
		if before == api.LevelRestricted {
			restricted++
		}
	}
	if restricted == 0 {
		t.Error("no golden case's pod is restricted before injection: add one, or this test shows nothing about that level")
	}
}
