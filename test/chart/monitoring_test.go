package chart

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/dislock/dislock/test/monitoring"
)

var updateRules = flag.Bool("update-rules", false,
	"rewrite config/prometheus/rules/prometheusrule.yaml from the chart's rendering with its default values")

var (
	dashboardFile  = filepath.Join(chartDir, "files", "dashboard.json")
	alertUnitTests = filepath.Join("..", "monitoring", "alerts_test.yaml")
	kustomizeRules = filepath.Join(configDir, "prometheus", "rules", "prometheusrule.yaml")
)

// alerts are the alerts docs/operations.md documents, with their severities and how long their condition
// must hold: the chart ships these and no others.
var alerts = map[string]struct{ severity, forDuration string }{
	"DislockWindowMissed":        {"critical", ""},
	"DislockRunsFailing":         {"warning", ""},
	"DislockLeaseStuck":          {"warning", ""},
	"DislockClustersDisagree":    {"warning", "10m"},
	"DislockKeySilent":           {"info", ""},
	"DislockWebhookDown":         {"critical", "5m"},
	"DislockWebhookDenying":      {"warning", ""},
	"DislockDatabaseUnreachable": {"critical", "2m"},
	"DislockLedgerStale":         {"warning", ""},
}

const runbooks = "https://github.com/dislock/dislock/blob/main/docs/operations.md#"

// defaultJobSelector is prometheusRule.webhookJobSelector's default.
const defaultJobSelector = `job=~".*dislock.*"`

// inTheAlertingCluster is how the chart ends each alert on the metrics computed from the database,
// with the default job selector: the alert fires only where dislock_alerting_cluster is 1.
const inTheAlertingCluster = ` and on () max(dislock_alerting_cluster{` + defaultJobSelector + `}) == 1`

// promtool returns the path of Debian's promtool. Its absence fails the test: the alert tests
// are the only check of the rules, and skipping them would pass a broken rule file.
func promtool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/promtool"); err == nil {
		return "/usr/bin/promtool"
	}
	t.Fatal("promtool is not installed (not in PATH, no /usr/bin/promtool): run hack/install-deps.sh, which installs Debian's prometheus package")
	return ""
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

// renderedRules renders the chart with the PrometheusRule on (and more values) and returns the
// PrometheusRule and its spec, which is a Prometheus rule file.
func renderedRules(t *testing.T, kv ...any) (*unstructured.Unstructured, ruleFile) {
	t.Helper()
	obj := helmTemplate(t, "dislock", "dislock-system", base(append([]any{"prometheusRule.enabled", true}, kv...)...)).one(t, "PrometheusRule")
	spec, _, _ := unstructured.NestedMap(obj.Object, "spec")
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := json.Unmarshal(b, &rf); err != nil {
		t.Fatalf("the PrometheusRule's spec is not a rule file: %v", err)
	}
	return obj, rf
}

// writeRules writes a rule file into dir as alerts.yaml and returns its path. Given a
// PrometheusRule, it writes its spec as rendered, every field included: promtool refuses the
// fields it does not know.
func writeRules(t *testing.T, dir string, rules any) string {
	t.Helper()
	if o, ok := rules.(*unstructured.Unstructured); ok {
		rules = o.Object["spec"]
	}
	b, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "alerts.yaml")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The PrometheusRule needs the Prometheus Operator's CRD and the dashboard a Grafana: neither is
// rendered unless asked for.
func TestMonitoringObjectsRenderOnlyWhenAskedFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		vals map[string]any
		want []string
	}{
		{"by default, neither", base(), nil},
		{"with both toggles, the PrometheusRule and the dashboard's ConfigMap", base(
			"prometheusRule.enabled", true, "grafanaDashboard.enabled", true),
			[]string{"ConfigMap/dislock-system/dislock-dashboard", "PrometheusRule/dislock-system/dislock"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			for _, o := range helmTemplate(t, "dislock", "dislock-system", tc.vals) {
				if o.GetKind() == "PrometheusRule" || o.GetKind() == "ConfigMap" {
					got = append(got, id(o))
				}
			}
			sort.Strings(got)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("rendered %v, want %v", got, tc.want)
			}
		})
	}
}

// The PrometheusRule carries every alert of the issue, each with its severity, a summary, a
// description and the runbook in docs/operations.md, and no other; the thresholds follow the
// values.
func TestMonitoringPrometheusRuleCarriesEveryAlert(t *testing.T) {
	t.Parallel()
	docs, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	obj, rf := renderedRules(t, "prometheusRule.labels", map[string]any{"release": "kube-prometheus-stack"})
	if obj.GetNamespace() != "dislock-system" || obj.GetName() != "dislock" {
		t.Errorf("PrometheusRule %s: want dislock in the release namespace", id(obj))
	}
	if obj.GetLabels()["release"] != "kube-prometheus-stack" || obj.GetLabels()["app.kubernetes.io/name"] != "dislock" {
		t.Errorf("labels %v: want the chart's and prometheusRule.labels", obj.GetLabels())
	}
	if len(rf.Groups) != 1 || rf.Groups[0].Name != "dislock" {
		t.Fatalf("groups %+v: want one group, dislock", rf.Groups)
	}
	seen := map[string]bool{}
	for _, r := range rf.Groups[0].Rules {
		t.Run(r.Alert, func(t *testing.T) {
			want, ok := alerts[r.Alert]
			if !ok {
				t.Fatalf("rule %+v is not one of the documented alerts", r)
			}
			seen[r.Alert] = true
			if got := r.Labels["severity"]; got != want.severity {
				t.Errorf("severity %q, want %q", got, want.severity)
			}
			if r.For != want.forDuration {
				t.Errorf("for %q, want %q", r.For, want.forDuration)
			}
			for _, a := range []string{"summary", "description"} {
				if !strings.Contains(r.Annotations[a], "{{") {
					t.Errorf("%s %q names nothing of what fired", a, r.Annotations[a])
				}
			}
			anchor := strings.ToLower(r.Alert)
			if got := r.Annotations["runbook_url"]; got != runbooks+anchor {
				t.Errorf("runbook_url %q, want %s", got, runbooks+anchor)
			}
			if !strings.Contains(string(docs), "\n### "+r.Alert+"\n") {
				t.Errorf("docs/operations.md has no section %q, which the runbook_url's anchor #%s needs", "### "+r.Alert, anchor)
			}
			for _, m := range monitoring.MetricNames(r.Expr) {
				if !slices.Contains(monitoring.Metrics, m) {
					t.Errorf("expr %q queries %s, which dislock does not serve", r.Expr, m)
				}
			}
		})
	}
	for a := range alerts {
		if !seen[a] {
			t.Errorf("no alert %s", a)
		}
	}

	t.Run("the thresholds follow the values", func(t *testing.T) {
		obj, rf := renderedRules(t, "prometheusRule.leaseStuckAfter", "1h30m",
			"prometheusRule.webhookJobSelector", `job="dislock-webhook",namespace="dislock-system"`)
		exprs := map[string]string{}
		for _, r := range rf.Groups[0].Rules {
			exprs[r.Alert] = r.Expr
		}
		if got, want := exprs["DislockLeaseStuck"], `(dislock_lease_held_seconds{job="dislock-webhook",namespace="dislock-system"}) > 5400`+
			` and on () max(dislock_alerting_cluster{job="dislock-webhook",namespace="dislock-system"}) == 1`; !strings.HasSuffix(got, want) {
			t.Errorf("DislockLeaseStuck with leaseStuckAfter 1h30m: %q, want it to end in %q", got, want)
		}
		if got, want := exprs["DislockWebhookDown"], `up{job="dislock-webhook",namespace="dislock-system"} == 0 or absent(up{job="dislock-webhook",namespace="dislock-system"})`; got != want {
			t.Errorf("DislockWebhookDown with a job selector: %q, want %q", got, want)
		}
		promtoolCheck(t, writeRules(t, t.TempDir(), obj))
	})
}

func promtoolCheck(t *testing.T, file string) {
	t.Helper()
	if out, err := run(nil, promtool(t), "check", "rules", file); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

func TestMonitoringRulesPassPromtoolCheck(t *testing.T) {
	t.Parallel()
	obj, _ := renderedRules(t)
	promtoolCheck(t, writeRules(t, t.TempDir(), obj))
}

// The values kube-prometheus-stack users expect of a chart's alerts: prometheusRule.disabled leaves
// alerts out by name, prometheusRule.additionalRuleLabels joins every alert's labels, and every
// runbook_url starts with prometheusRule.runbookBaseURL.
func TestMonitoringAlertsCanBeLeftOutLabelledAndPointedAtOtherRunbooks(t *testing.T) {
	t.Parallel()
	const base = "https://runbooks.example.com/dislock/v0.3.0/operations.html"
	obj, rf := renderedRules(t,
		"prometheusRule.disabled", map[string]any{"DislockKeySilent": true, "DislockWebhookDenying": true, "DislockLeaseStuck": false},
		"prometheusRule.additionalRuleLabels", map[string]any{"team": "platform", "page_via": "dc-routing"},
		"prometheusRule.runbookBaseURL", base)
	var names []string
	for _, r := range rf.Groups[0].Rules {
		names = append(names, r.Alert)
		if got := r.Annotations["runbook_url"]; got != base+"#"+strings.ToLower(r.Alert) {
			t.Errorf("%s: runbook_url %q, want %s#%s", r.Alert, got, base, strings.ToLower(r.Alert))
		}
		want := map[string]string{"severity": alerts[r.Alert].severity, "team": "platform", "page_via": "dc-routing"}
		if !reflect.DeepEqual(r.Labels, want) {
			t.Errorf("%s: labels %v, want %v", r.Alert, r.Labels, want)
		}
	}
	var want []string
	for a := range alerts {
		if a != "DislockKeySilent" && a != "DislockWebhookDenying" {
			want = append(want, a)
		}
	}
	sort.Strings(names)
	sort.Strings(want)
	if !slices.Equal(names, want) {
		t.Errorf("alerts %v, want %v: the disabled ones left out, and only they", names, want)
	}
	promtoolCheck(t, writeRules(t, t.TempDir(), obj))

	t.Run("every alert disabled leaves an empty group Prometheus accepts", func(t *testing.T) {
		t.Parallel()
		all := map[string]any{}
		for a := range alerts {
			all[a] = true
		}
		obj, rf := renderedRules(t, "prometheusRule.disabled", all)
		if len(rf.Groups) != 1 || len(rf.Groups[0].Rules) != 0 {
			t.Errorf("groups %+v, want one group without rules", rf.Groups)
		}
		promtoolCheck(t, writeRules(t, t.TempDir(), obj))
	})
}

// The values schema names every alert prometheusRule.disabled may name, and refuses as
// prometheusRule.additionalRuleLabels every label an alert carries itself (which the added label
// would overwrite): both lists are checked against the alerts, so that neither drifts from them.
func TestMonitoringValuesSchemaKnowsTheAlertsAndTheirLabels(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			PrometheusRule struct {
				Properties struct {
					Disabled struct {
						PropertyNames struct {
							Enum []string `json:"enum"`
						} `json:"propertyNames"`
					} `json:"disabled"`
					AdditionalRuleLabels struct {
						PropertyNames struct {
							Not struct {
								Enum []string `json:"enum"`
							} `json:"not"`
						} `json:"propertyNames"`
					} `json:"additionalRuleLabels"`
				} `json:"properties"`
			} `json:"prometheusRule"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	props := schema.Properties.PrometheusRule.Properties
	var names []string
	for a := range alerts {
		names = append(names, a)
	}
	enum := slices.Clone(props.Disabled.PropertyNames.Enum)
	sort.Strings(names)
	sort.Strings(enum)
	if !slices.Equal(enum, names) {
		t.Errorf("prometheusRule.disabled may name %v, want the alerts %v", enum, names)
	}

	// Every label an alert fires with is in a case of alerts_test.yaml (each alert has one where
	// it fires, and promtool compares the labels exactly).
	tests := readAlertTests(t)
	carried := map[string]bool{"alertname": true}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			for _, exp := range a.ExpAlerts {
				labels, _ := exp["exp_labels"].(map[string]any)
				for l := range labels {
					carried[l] = true
				}
			}
		}
	}
	for l := range carried {
		if !slices.Contains(props.AdditionalRuleLabels.PropertyNames.Not.Enum, l) {
			t.Errorf("prometheusRule.additionalRuleLabels may name %q, a label the alerts carry", l)
		}
	}
	for _, bad := range []any{map[string]any{"severity": "page"}, map[string]any{"namespace": "x"}, map[string]any{"a-b": "c"}, map[string]any{"__name__": "x"}} {
		if _, err := helmTemplateErr(t, "dislock", "dislock-system", base("prometheusRule.enabled", true, "prometheusRule.additionalRuleLabels", bad)); err == nil {
			t.Errorf("additionalRuleLabels %v rendered", bad)
		}
	}
	for _, bad := range []any{"https://example.com/ops.md#dislock", "ftp://example.com/ops.md", "https://example.com/a b", ""} {
		if _, err := helmTemplateErr(t, "dislock", "dislock-system", base("prometheusRule.enabled", true, "prometheusRule.runbookBaseURL", bad)); err == nil {
			t.Errorf("runbookBaseURL %q rendered", bad)
		}
	}
	if _, err := helmTemplateErr(t, "dislock", "dislock-system", base("prometheusRule.enabled", true, "prometheusRule.disabled", map[string]any{"DislockKeySilnt": true})); err == nil {
		t.Error("prometheusRule.disabled naming no alert rendered")
	}
}

// An alert on the metrics computed from the database, which every cluster's webhook serves alike,
// fires only in the alerting cluster's Prometheus: its expression ends in the alerting cluster's
// condition, and alerts_test.yaml has a case where it stays quiet in a Prometheus whose webhook
// says its cluster is not the alerting one (dislock_alerting_cluster 0). An alert on what each
// replica measures itself fires in every cluster.
func TestMonitoringAlertsOnTheDatabasesMetricsFireOnlyInTheAlertingCluster(t *testing.T) {
	t.Parallel()
	_, rf := renderedRules(t)
	quietElsewhere := map[string]bool{}
	zeros := regexp.MustCompile(`^0(x[0-9]+)?( 0(x[0-9]+)?)*$`)
	for _, tc := range readAlertTests(t).Tests {
		elsewhere := false
		for _, in := range tc.InputSeries {
			if strings.HasPrefix(in.Series, `dislock_alerting_cluster{job="dislock-webhook"`) {
				if !zeros.MatchString(strings.TrimSpace(in.Values)) {
					elsewhere = false
					break
				}
				elsewhere = true
			}
		}
		for _, a := range tc.AlertRuleTest {
			if elsewhere && len(a.ExpAlerts) == 0 {
				quietElsewhere[a.Alertname] = true
			}
		}
	}
	for _, r := range rf.Groups[0].Rules {
		onTheDatabase := false
		for _, m := range monitoring.MetricNames(r.Expr) {
			onTheDatabase = onTheDatabase || slices.Contains(monitoring.DatabaseMetrics, m)
		}
		gated := strings.HasSuffix(r.Expr, inTheAlertingCluster)
		switch {
		case onTheDatabase && !gated:
			t.Errorf("%s reads the database's metrics, which every cluster serves, yet fires in every cluster: %q does not end in %q", r.Alert, r.Expr, inTheAlertingCluster)
		case !onTheDatabase && gated:
			t.Errorf("%s reads only what each replica measures, yet fires only in the alerting cluster: %q", r.Alert, r.Expr)
		case onTheDatabase && !quietElsewhere[r.Alert]:
			t.Errorf("%s: %s has no case where it stays quiet in a cluster that is not the alerting one", alertUnitTests, r.Alert)
		}
	}
}

// alertTests is the part of a promtool unit test file this test reads.
type alertTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		InputSeries []struct {
			Series string `json:"series"`
			Values string `json:"values"`
		} `json:"input_series"`
		AlertRuleTest []struct {
			EvalTime  string           `json:"eval_time"`
			Alertname string           `json:"alertname"`
			ExpAlerts []map[string]any `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// Every alert has a unit test in which it fires, with its labels and annotations as written, and
// one in which it does not; promtool runs them on the rules as the chart renders them.
func TestMonitoringAlertsPassTheirUnitTests(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(alertUnitTests)
	if err != nil {
		t.Fatal(err)
	}
	tests := readAlertTests(t)
	if !reflect.DeepEqual(tests.RuleFiles, []string{"alerts.yaml"}) {
		t.Fatalf("%s: rule_files %v, want [alerts.yaml] (the chart's rendering, written next to it)", alertUnitTests, tests.RuleFiles)
	}
	fires, quiet := map[string]int{}, map[string]int{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname]++
			} else {
				quiet[a.Alertname]++
			}
		}
	}
	obj, rf := renderedRules(t)
	for _, r := range rf.Groups[0].Rules {
		if fires[r.Alert] == 0 {
			t.Errorf("%s: no case where %s fires", alertUnitTests, r.Alert)
		}
		if quiet[r.Alert] == 0 {
			t.Errorf("%s: no case where %s stays quiet", alertUnitTests, r.Alert)
		}
	}

	dir := t.TempDir()
	writeRules(t, dir, obj)
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(nil, promtool(t), "test", "rules", filepath.Join(dir, "alerts_test.yaml"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// The kustomize overlay docs/operations.md shows under "Tuning the alerts" builds and does what the
// docs say: the runbooks on another page, a label on every alert, DislockKeySilent left out, and the
// ConfigMap it reads them from not deployed.
func TestMonitoringKustomizeOverlayInTheDocsTunesTheAlerts(t *testing.T) {
	t.Parallel()
	docs, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	const marker = "<!-- the kustomize overlay of \"Tuning the alerts\" -->\n```yaml\n"
	_, block, ok := strings.Cut(string(docs), marker)
	if !ok {
		t.Fatalf("docs/operations.md has no %q", marker)
	}
	block, _, _ = strings.Cut(block, "```")
	built := kustomize(t, strings.ReplaceAll(block, "../dislock/config", "CONFIG"))
	if len(built) != 1 {
		t.Fatalf("the overlay builds %d objects, want the PrometheusRule alone", len(built))
	}
	rule := built.one(t, "PrometheusRule")
	var rf ruleFile
	b, err := json.Marshal(rule.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rf); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range rf.Groups[0].Rules {
		seen[r.Alert] = true
		if want := "https://wiki.example.com/dislock/operations#" + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
		}
		if r.Labels["team"] != "platform" || r.Labels["severity"] != alerts[r.Alert].severity {
			t.Errorf("%s: labels %v, want its severity and team=platform", r.Alert, r.Labels)
		}
	}
	for a := range alerts {
		if seen[a] == (a == "DislockKeySilent") {
			t.Errorf("%s shipped: %v, want every alert but DislockKeySilent", a, seen[a])
		}
	}
	promtoolCheck(t, writeRules(t, t.TempDir(), rule))
}

// readAlertTests reads alerts_test.yaml.
func readAlertTests(t *testing.T) alertTests {
	t.Helper()
	raw, err := os.ReadFile(alertUnitTests)
	if err != nil {
		t.Fatal(err)
	}
	var tests alertTests
	if err := yaml.Unmarshal(raw, &tests); err != nil {
		t.Fatalf("%s: %v", alertUnitTests, err)
	}
	return tests
}

// The rules for kustomize (config/prometheus/rules) are the chart's, rendered with its defaults;
// -update-rules rewrites them after a change to files/alerts.yaml.
func TestMonitoringKustomizeRulesAreTheChartRules(t *testing.T) {
	t.Parallel()
	fromChart, _ := renderedRules(t)
	if *updateRules {
		o := fromChart.DeepCopy()
		o.SetLabels(map[string]string{"app.kubernetes.io/name": "dislock", "app.kubernetes.io/component": "webhook"})
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		header := "# dislock's alerts: charts/dislock/files/alerts.yaml rendered with the chart's default values\n" +
			"# (see kustomization.yaml); the runbooks are in docs/operations.md, \"Alerts\". Needs the\n" +
			"# Prometheus Operator's PrometheusRule CRD. Do not edit: `go test ./test/chart -run\n" +
			"# KustomizeRules -update-rules` writes it.\n"
		if err := os.WriteFile(kustomizeRules, append([]byte(header), b...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fromKustomize := kustomize(t, clusterOverlay+"components:\n  - CONFIG/prometheus/rules\n").one(t, "PrometheusRule")
	chart, kust := normalise(manifest{fromChart}), normalise(manifest{fromKustomize})
	if diffs := differences(chart[id(fromChart)], kust[id(fromKustomize)], ""); len(diffs) > 0 || id(fromChart) != id(fromKustomize) {
		t.Errorf("%s (kustomize's %s) differs from the chart's %s; run go test ./test/chart -run KustomizeRules -update-rules:\n  %s",
			kustomizeRules, id(fromKustomize), id(fromChart), strings.Join(diffs, "\n  "))
	}
}

// With grafanaDashboard on, the chart ships files/dashboard.json in a ConfigMap Grafana's
// sidecar finds: by its label by default, in the namespace and with the labels and annotations
// the values give. Its queries of the webhook's `up` select the scrape targets as the alerts do
// (prometheusRule.webhookJobSelector); the file has the default, so that a hand import is what
// the chart installs by default.
func TestMonitoringDashboardConfigMap(t *testing.T) {
	t.Parallel()
	want, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	const selector = `job="dislock-webhook",namespace=~"dislock-(a|b)\\.x"`
	for _, tc := range []struct {
		name        string
		vals        map[string]any
		ns          string
		labels      map[string]string
		annotations map[string]string
		selector    string
	}{
		{"by default, in the release namespace with the sidecar's label", base("grafanaDashboard.enabled", true),
			"dislock-system", map[string]string{"grafana_dashboard": "1"}, nil, defaultJobSelector},
		{"in Grafana's namespace, in a folder, with a label of its own", base("grafanaDashboard.enabled", true,
			"grafanaDashboard.namespace", "monitoring",
			"grafanaDashboard.labels", map[string]any{"team": "platform"},
			"grafanaDashboard.annotations", map[string]any{"grafana_folder": "dislock"}),
			"monitoring", map[string]string{"grafana_dashboard": "1", "team": "platform"}, map[string]string{"grafana_folder": "dislock"}, defaultJobSelector},
		{"with the webhook's scrape job selected otherwise", base("grafanaDashboard.enabled", true,
			"prometheusRule.webhookJobSelector", selector),
			"dislock-system", map[string]string{"grafana_dashboard": "1"}, nil, selector},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cm := helmTemplate(t, "dislock", "dislock-system", tc.vals).get(t, "ConfigMap", "dislock-dashboard")
			if cm.GetNamespace() != tc.ns {
				t.Errorf("namespace %q, want %q", cm.GetNamespace(), tc.ns)
			}
			for k, v := range tc.labels {
				if cm.GetLabels()[k] != v {
					t.Errorf("label %s=%q, want %q (labels %v)", k, cm.GetLabels()[k], v, cm.GetLabels())
				}
			}
			if !reflect.DeepEqual(cm.GetAnnotations(), tc.annotations) && len(cm.GetAnnotations())+len(tc.annotations) > 0 {
				t.Errorf("annotations %v, want %v", cm.GetAnnotations(), tc.annotations)
			}
			data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
			if len(data) != 1 {
				t.Fatalf("data has %d keys, want dislock.json alone", len(data))
			}
			var got, file any
			if err := json.Unmarshal([]byte(data["dislock.json"]), &got); err != nil {
				t.Fatalf("dislock.json in the ConfigMap is not JSON: %v", err)
			}
			if err := json.Unmarshal(want, &file); err != nil {
				t.Fatal(err)
			}
			ups := 0
			file = replaceInStrings(file, func(s string) string {
				if strings.Contains(s, "up{"+defaultJobSelector+"}") {
					ups++
				}
				return strings.ReplaceAll(s, "up{"+defaultJobSelector+"}", "up{"+tc.selector+"}")
			})
			if ups == 0 {
				t.Fatalf("files/dashboard.json has no query of up{%s}", defaultJobSelector)
			}
			if !reflect.DeepEqual(got, file) {
				t.Errorf("dislock.json in the ConfigMap is not files/dashboard.json with up{%s}", tc.selector)
			}
		})
	}
}

// replaceInStrings returns v with every string in it (JSON's values, not keys) replaced by f.
func replaceInStrings(v any, f func(string) string) any {
	switch v := v.(type) {
	case string:
		return f(v)
	case []any:
		for i := range v {
			v[i] = replaceInStrings(v[i], f)
		}
	case map[string]any:
		for k := range v {
			v[k] = replaceInStrings(v[k], f)
		}
	}
	return v
}

// The dashboard's panels the issue asks for, each as a metric some query must use.
var dashboardMetrics = []string{
	"dislock_last_success_timestamp_seconds",            // last success per key
	"dislock_missed_windows_total",                      // missed windows
	"dislock_decisions_total",                           // decisions by cluster and action, failures
	"dislock_lease_held_seconds",                        // lease held
	"dislock_run_duration_seconds_bucket",               // run duration quantiles
	"dislock_clusters_disagree",                         // clusters disagree
	"dislock_key_silent",                                // silent keys
	"dislock_database_up",                               // database up
	"dislock_database_round_trip_seconds",               // round trip
	"dislock_webhook_admissions_total",                  // admissions by result
	"dislock_webhook_admission_duration_seconds_bucket", // p99 admission latency
	"dislock_ledger_snapshot_timestamp_seconds",         // ledger snapshot age
	"dislock_alerting_cluster",                          // whether this cluster's Prometheus raises the database-wide alerts
	"dislock_build_info",                                // the builds the replicas run
}

// The dashboard is one Grafana can import and a Prometheus can answer: a datasource variable,
// key variables from dislock_decisions_total, a query in every panel, and queries that are
// PromQL over dislock's metrics alone.
func TestMonitoringDashboardQueriesDislocksMetrics(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		SchemaVersion int    `json:"schemaVersion"`
		UID           string `json:"uid"`
		Templating    struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Query      any    `json:"query"`
				Definition string `json:"definition"`
				AllValue   string `json:"allValue"`
			} `json:"list"`
		} `json:"templating"`
		Panels []map[string]any `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s is not JSON: %v", dashboardFile, err)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want 36 or later (datasources as {type, uid})", d.SchemaVersion)
	}
	if d.UID == "" {
		t.Error("no uid: every import would make a new dashboard")
	}

	t.Run("variables", func(t *testing.T) {
		vars := map[string]string{}
		for _, v := range d.Templating.List {
			vars[v.Name] = v.Type
			switch v.Type {
			case "datasource":
				if v.Query != "prometheus" {
					t.Errorf("variable %s picks %v datasources, want prometheus", v.Name, v.Query)
				}
			case "query":
				if !strings.HasPrefix(v.Definition, "label_values(dislock_decisions_total") || !strings.HasSuffix(v.Definition, ", "+v.Name+")") {
					t.Errorf("variable %s: %q, want label_values(dislock_decisions_total..., %s)", v.Name, v.Definition, v.Name)
				}
			}
		}
		want := map[string]string{"datasource": "datasource", "namespace": "query", "cronjob": "query", "cluster": "query"}
		if !reflect.DeepEqual(vars, want) {
			t.Errorf("variables %v, want %v", vars, want)
		}
	})

	t.Run("every panel and query reads the datasource variable", func(t *testing.T) {
		ids := map[float64]string{}
		var walk func([]any)
		walk = func(panels []any) {
			for _, p := range panels {
				p := p.(map[string]any)
				title, _ := p["title"].(string)
				id, _ := p["id"].(float64)
				if other, ok := ids[id]; ok {
					t.Errorf("panels %q and %q have the same id %v", other, title, id)
				}
				ids[id] = title
				if p["type"] == "row" {
					sub, _ := p["panels"].([]any)
					walk(sub)
					continue
				}
				if !usesDatasourceVariable(p["datasource"]) {
					t.Errorf("panel %q: datasource %v, want {type: prometheus, uid: ${datasource}}", title, p["datasource"])
				}
				targets, _ := p["targets"].([]any)
				for _, tg := range targets {
					if ds := tg.(map[string]any)["datasource"]; !usesDatasourceVariable(ds) {
						t.Errorf("panel %q: a query's datasource is %v", title, ds)
					}
				}
			}
		}
		var panels []any
		for _, p := range d.Panels {
			panels = append(panels, p)
		}
		walk(panels)
	})

	targets, err := monitoring.DashboardTargets(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	t.Run("every query reads dislock's metrics alone", func(t *testing.T) {
		for _, q := range targets {
			names := monitoring.MetricNames(q.Expr)
			if len(names) == 0 {
				t.Errorf("panel %q, query %s: %q reads no metric", q.Panel, q.RefID, q.Expr)
			}
			for _, m := range names {
				used[m] = true
				if !slices.Contains(monitoring.Metrics, m) {
					t.Errorf("panel %q, query %s reads %s, which dislock does not serve: %s", q.Panel, q.RefID, m, q.Expr)
				}
			}
		}
		var missing []string
		for _, m := range dashboardMetrics {
			if !used[m] {
				missing = append(missing, m)
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("no panel shows %v", missing)
		}
	})

	t.Run("every query is PromQL once Grafana's variables are replaced", func(t *testing.T) {
		queries, err := monitoring.DashboardQueries(dashboardFile)
		if err != nil {
			t.Fatal(err)
		}
		if len(queries) != len(targets) {
			t.Fatalf("%d queries for %d targets", len(queries), len(targets))
		}
		var rf ruleFile
		rf.Groups = []ruleGroup{{Name: "dashboard"}}
		for i, q := range queries {
			if strings.Contains(q, "$") {
				t.Errorf("panel %q, query %s: a variable is left in %q", targets[i].Panel, targets[i].RefID, q)
			}
			rf.Groups[0].Rules = append(rf.Groups[0].Rules, rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: q})
		}
		// promtool parses every expression of a rule file: recording rules make it parse ours.
		promtoolCheck(t, writeRules(t, t.TempDir(), rf))
	})
}

func usesDatasourceVariable(ds any) bool {
	m, ok := ds.(map[string]any)
	return ok && m["type"] == "prometheus" && m["uid"] == "${datasource}"
}

// The dashboard check stands on MetricNames: it must find every metric a query reads, and only
// those, or a query of a metric dislock does not serve would pass.
func TestMonitoringMetricNamesFindsWhatAQueryReads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`max by (namespace, cronjob) (increase(dislock_missed_windows_total{namespace=~"$namespace", cronjob="a b"}[$__range])) > 0`,
			[]string{"dislock_missed_windows_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(foo_bucket{le!="+Inf", a='{x}'}[5m] offset 1h)))`, []string{"foo_bucket"}},
		{`sum(a) by (job) / on (job) group_left (instance) b_total or on() vector(0)`, []string{"a", "b_total"}},
		{`count(x == 1) or label_replace(vector(0), "dst", "$1", "src", "(.*)") unless y:recorded`, []string{"x", "y:recorded"}},
		{`time() - max without (pod) (ts_seconds @ end()) > 3e2`, []string{"ts_seconds"}},
	} {
		if got := monitoring.MetricNames(tc.expr); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("MetricNames(%s) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// Only a release whose Prometheus evaluates dislock's rules
// (prometheusRule.enabled) makes its cluster a candidate for the alerting
// cluster: scrapes alone do not tell, since any client of the metrics
// port looks like a Prometheus. The kustomize rules component does the same.
func TestOnlyAClusterThatEvaluatesTheRulesIsACandidateToAlert(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		vals map[string]any
		want bool
	}{
		{base(), false},
		{base("serviceMonitor.enabled", true), false},
		{base("prometheusRule.enabled", true), true},
	} {
		dep := typed[appsv1.Deployment](t, helmTemplate(t, "dislock", "dislock-system", tc.vals).one(t, "Deployment"))
		if got := parseFlags(t, dep.Spec.Template.Spec.Containers[0].Args).set("alerting-candidate"); got != tc.want {
			t.Errorf("values %v: --alerting-candidate %v, want %v", tc.vals, got, tc.want)
		}
	}
	dep := typed[appsv1.Deployment](t, kustomize(t, clusterOverlay+"components:\n  - CONFIG/prometheus/rules\n").one(t, "Deployment"))
	if !slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--alerting-candidate") {
		t.Errorf("kustomize with config/prometheus/rules: args %q lack --alerting-candidate", dep.Spec.Template.Spec.Containers[0].Args)
	}
}
