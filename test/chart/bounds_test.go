package chart

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/dislock/dislock/webhook/flags"
)

// boundProbes are values on each side of every bound `dislock webhook`
// checks at start (webhook/flags, and the packages whose options it
// checks), for every value the chart turns into one of its flags.
//
// stricter are values the webhook starts with and the chart still refuses,
// each for the reason given beside it.
type boundProbe struct {
	path     string
	values   []any
	stricter []any
}

var boundProbes = []boundProbe{
	{"clusterName", []any{"dc-a", "dc/a", "dc a", strings.Repeat("a", 63), strings.Repeat("a", 64)}, nil},
	{"database.secretKey", []any{"url", "db.url", "bad key"}, nil},
	{"database.retention", []any{"1h", "47h", "47h59m59s", "47h59m59.999999999s", "47h59m59.99999999999999s", "48h", "2880m", "720h", "87600h", "2562047h", "9999999h"}, nil},
	{"database.ledgerInterval", []any{"0s", "1ns", "4999ms", "5s", "30s", "5m", "5m1s", "1h"}, nil},
	{"database.tokenRecordInterval", []any{"0s", "1s", "1m", "60001ms", "61s", "1h"}, nil},
	// 0 is the webhook's default for each of these: the chart asks for the
	// number itself (values.yaml holds the defaults).
	{"webhook.registryTimeout", []any{"1ms", "3s", "4s", "4.5s", "4999ms", "4.9999999999999999999s", "5s", "10s"}, []any{"0s", ".0s", "0.0000000001s"}},
	{"webhook.registry.reviewBudget", []any{"1ms", "2999ms", "3s", "4999ms", "5s"}, []any{"0s"}},
	{"webhook.registry.maxManifestBytes", []any{-1, 1, 67108864, 67108865}, []any{0}},
	{"webhook.registry.maxConfigBytes", []any{-1, 1, 16777216, 16777217}, []any{0}},
	{"webhook.registry.maxConcurrentLookups", []any{-1, 1, 256, 257}, []any{0}},
	{"webhook.registry.allow", []any{[]any{"ghcr.io"}, []any{"*.example.com:5000"}, []any{"http://ghcr.io"}, []any{"ghcr.io/x"}}, nil},
	{"agent.cpuRequest", []any{"0", "1m", "500m", "501m", "0.501", "0.50000000000000001", "1"}, nil},
	{"agent.cpuLimit", []any{"0", "9m", "10m", "1", "1001m"}, nil},
	{"agent.memoryRequest", []any{"0", "1Mi", "64Mi", "65Mi", "67108864.001", "67108864.00000000001"}, nil},
	{"agent.memoryLimit", []any{"0", "31Mi", "32Mi", "256Mi", "257Mi"}, nil},
	{"agent.maxCPU", []any{"0", "1m", "499m", "500m", "2"}, nil},
	{"agent.maxMemory", []any{"0", "63Mi", "64Mi", "1Gi"}, nil},
	{"agent.podLabels", []any{map[string]any{"team": "a"}, map[string]any{"example.com/team": ""}, map[string]any{"team": "-a"},
		map[string]any{"team": strings.Repeat("a", 64)}, map[string]any{"a b": "c"}, map[string]any{"/team": "a"}, map[string]any{"dislock.io/mode": "lease"},
		map[string]any{strings.Repeat("a", 253) + "/team": "a"}, map[string]any{strings.Repeat("a", 254) + "/team": "a"}}, nil},
	{"agent.podAnnotations", []any{map[string]any{"example.com/owner": "team a"}, map[string]any{"a b": "c"}, map[string]any{"Example.com/x": "y"},
		map[string]any{"dislock.io/mode": "lease"}}, nil},
}

// The chart refuses at install every value the webhook refuses at start,
// and renders every value the webhook starts with: a value that passes helm
// never crash-loops the webhook's pods. The webhook's own check decides: the
// rendered container's arguments go through webhook/flags, with the
// database URL and namespace the pod gets from its environment.
func TestEveryValueTheWebhookRefusesTheChartRefuses(t *testing.T) {
	t.Parallel()
	for _, p := range boundProbes {
		for _, v := range append(p.values, p.stricter...) {
			t.Run(fmt.Sprintf("%s=%v", p.path, v), func(t *testing.T) {
				t.Parallel()
				m, chartErr := helmTemplateErr(t, "dislock", "dislock-system", base(p.path, v))
				if slices.Contains(p.stricter, v) {
					if chartErr == nil {
						t.Errorf("the chart renders %s=%v, listed as a value it refuses", p.path, v)
					}
					if !webhookAccepts(t, p.path, v) {
						t.Errorf("the webhook refuses %s=%v: move it from stricter to values", p.path, v)
					}
					return
				}
				var webhookErr error
				if chartErr == nil {
					webhookErr = webhookStarts(t, m)
				}
				switch {
				case chartErr == nil && webhookErr != nil:
					t.Errorf("the chart renders %s=%v, but the webhook refuses it at start: %v", p.path, v, webhookErr)
				case chartErr != nil && !webhookAccepts(t, p.path, v):
					// Both refuse: the chart's reason must name the value.
					if !strings.Contains(chartErr.Error(), p.path[strings.LastIndex(p.path, ".")+1:]) {
						t.Errorf("the chart refuses %s=%v without naming it: %v", p.path, v, chartErr)
					}
				case chartErr != nil:
					t.Errorf("the chart refuses %s=%v, which the webhook starts with: %v", p.path, v, chartErr)
				}
			})
		}
	}
}

// webhookStarts runs the rendered webhook container's arguments, then
// extra, through the webhook's flag parsing and check.
func webhookStarts(t *testing.T, m manifest, extra ...string) error {
	t.Helper()
	dep := typed[appsv1.Deployment](t, m.one(t, "Deployment"))
	args := dep.Spec.Template.Spec.Containers[0].Args
	if len(args) == 0 || args[0] != "webhook" {
		t.Fatalf("the webhook container's arguments do not start with webhook: %q", args)
	}
	// What the pod's environment gives (DISLOCK_DATABASE_URL from the
	// database Secret, POD_NAMESPACE), first: a flag the chart renders wins.
	args = append([]string{"--database-url=" + testURL, "--namespace=dislock-system"}, args[1:]...)
	s, err := flags.Parse(append(args, extra...), io.Discard)
	if err != nil {
		return err
	}
	return s.Check()
}

// webhookAccepts reports whether the webhook starts with path=v when the
// chart's checks are set aside: the defaults' rendering, and the flag the
// chart would render for it.
func webhookAccepts(t *testing.T, path string, v any) bool {
	t.Helper()
	flag, value := flagOf(t, path, v)
	return webhookStarts(t, helmTemplate(t, "dislock", "dislock-system", base()), "--"+flag+"="+value) == nil
}

// flagOf is the webhook flag the chart renders path into, and v as that
// flag's value.
func flagOf(t *testing.T, path string, v any) (string, string) {
	t.Helper()
	flag, ok := map[string]string{
		"clusterName":                           "cluster-name",
		"database.secretKey":                    "db-secret-key",
		"database.retention":                    "retention",
		"database.ledgerInterval":               "ledger-interval",
		"database.tokenRecordInterval":          "token-record-interval",
		"webhook.registryTimeout":               "registry-timeout",
		"webhook.registry.reviewBudget":         "registry-review-budget",
		"webhook.registry.maxManifestBytes":     "registry-max-manifest-bytes",
		"webhook.registry.maxConfigBytes":       "registry-max-config-bytes",
		"webhook.registry.maxConcurrentLookups": "registry-max-concurrent-lookups",
		"webhook.registry.allow":                "registry-allow",
		"agent.cpuRequest":                      "agent-cpu-request",
		"agent.cpuLimit":                        "agent-cpu-limit",
		"agent.memoryRequest":                   "agent-memory-request",
		"agent.memoryLimit":                     "agent-memory-limit",
		"agent.maxCPU":                          "agent-max-cpu",
		"agent.maxMemory":                       "agent-max-memory",
		"agent.podLabels":                       "pod-labels",
		"agent.podAnnotations":                  "pod-annotations",
	}[path]
	if !ok {
		t.Fatalf("no webhook flag known for %s: add it to flagOf", path)
	}
	switch v := v.(type) {
	case []any:
		var s []string
		for _, e := range v {
			s = append(s, fmt.Sprint(e))
		}
		return flag, strings.Join(s, ",")
	case map[string]any:
		var s []string
		for k, e := range v {
			s = append(s, fmt.Sprintf("%s=%v", k, e))
		}
		return flag, strings.Join(s, ",")
	}
	return flag, fmt.Sprint(v)
}
