// Package monitoring holds what tests need to check dislock's alerts and Grafana dashboard
// (charts/dislock/files): the promtool unit tests of the alerts (alerts_test.yaml), the metric
// names of the monitoring contract, and a reader of the dashboard that turns its panels' queries
// into PromQL a Prometheus can run.
package monitoring

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
)

// DatabaseMetrics are the metric names the webhook's elected leader computes from the database
// and every replica of every cluster serves alike (each histogram as its _bucket, _sum and _count
// series): the alerts on them must fire in the alerting cluster only.
var DatabaseMetrics = []string{
	"dislock_decisions_total",
	"dislock_last_success_timestamp_seconds",
	"dislock_missed_windows_total",
	"dislock_last_missed_window_timestamp_seconds",
	"dislock_key_silent",
	"dislock_clusters_disagree",
	"dislock_lease_held_seconds",
	"dislock_run_duration_seconds_bucket",
	"dislock_run_duration_seconds_sum",
	"dislock_run_duration_seconds_count",
	"dislock_ledger_snapshot_timestamp_seconds",
	"dislock_ledger_query_duration_seconds",
	"dislock_ledger_keys_left_out",
}

// Metrics are the metric names dislock serves (those computed from the database, and the webhook's
// own), each histogram as its _bucket, _sum and _count series, plus Prometheus' own `up`.
// Dashboards and alerts may query these and nothing else.
var Metrics = slices.Concat(DatabaseMetrics, []string{
	// Measured or known by each webhook replica.
	"dislock_database_up",
	"dislock_database_round_trip_seconds",
	"dislock_alerting_cluster",
	"dislock_build_info",
	"dislock_webhook_admissions_total",
	"dislock_webhook_admission_duration_seconds_bucket",
	"dislock_webhook_admission_duration_seconds_sum",
	"dislock_webhook_admission_duration_seconds_count",
	"dislock_secret_copies_total",
	"dislock_tenant_roles_total",
	// Prometheus' own, for the webhook's scrape targets.
	"up",
})

// The values Grafana gives its built-in interval variables, fixed here so that a query runs
// outside Grafana: a rate interval of four 30 s scrapes, and a dashboard time range of an hour.
var builtins = map[string]string{
	"__rate_interval": "2m",
	"__interval":      "1m",
	"__range":         "1h",
	"__range_s":       "3600",
}

// Query is one query of one panel, as the dashboard holds it.
type Query struct {
	// Panel is the title of the panel the query belongs to.
	Panel string
	// RefID is the query's letter within its panel.
	RefID string
	// Expr is the PromQL as written, with Grafana's variables ($namespace, $__rate_interval).
	Expr string
}

type dashboard struct {
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type variable struct {
	Name     string  `json:"name"`
	Type     string  `json:"type"`
	AllValue *string `json:"allValue"`
}

type panel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

func readDashboard(path string) (*dashboard, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("%s is not a dashboard: %w", path, err)
	}
	return &d, nil
}

// DashboardTargets returns every query of every panel of the Grafana dashboard at path, in the
// dashboard's order, rows' panels included. A panel without a query, or a query without an
// expression, is an error: it would be a dead panel.
func DashboardTargets(path string) ([]Query, error) {
	d, err := readDashboard(path)
	if err != nil {
		return nil, err
	}
	var out []Query
	var problems []error
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				problems = append(problems, fmt.Errorf("panel %q has no query", p.Title))
			}
			for _, t := range p.Targets {
				if strings.TrimSpace(t.Expr) == "" {
					problems = append(problems, fmt.Errorf("panel %q: query %s has no expression", p.Title, t.RefID))
					continue
				}
				out = append(out, Query{Panel: p.Title, RefID: t.RefID, Expr: t.Expr})
			}
		}
	}
	walk(d.Panels)
	if err := errors.Join(problems...); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// DashboardQueries returns the PromQL of every query of the dashboard at path, as Grafana sends
// it with "All" selected in every variable: each of the dashboard's variables is replaced by its
// allValue, $__rate_interval by 2m, $__interval by 1m and $__range by 1h. The result runs
// against any Prometheus, as an instant or a range query.
func DashboardQueries(path string) ([]string, error) {
	d, err := readDashboard(path)
	if err != nil {
		return nil, err
	}
	targets, err := DashboardTargets(path)
	if err != nil {
		return nil, err
	}
	vars, err := allValues(d)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(targets))
	var problems []error
	for _, q := range targets {
		expr, err := expand(q.Expr, vars)
		if err != nil {
			problems = append(problems, fmt.Errorf("panel %q, query %s: %w", q.Panel, q.RefID, err))
			continue
		}
		out = append(out, expr)
	}
	if err := errors.Join(problems...); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// allValues maps the dashboard's query variables to their allValue, and Grafana's built-in
// interval variables to fixed durations.
func allValues(d *dashboard) (map[string]string, error) {
	vars := maps.Clone(builtins)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		if v.AllValue == nil || *v.AllValue == "" {
			// Grafana's own "All" is the list of values it found, which only a Prometheus knows.
			return nil, fmt.Errorf("variable %s has no allValue", v.Name)
		}
		vars[v.Name] = *v.AllValue
	}
	return vars, nil
}

var variableRef = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// expand replaces Grafana's variable references ($name, ${name}, ${name:format}, [[name]]) in
// expr; a reference to a variable vars lacks is an error.
func expand(expr string, vars map[string]string) (string, error) {
	var unknown []string
	out := variableRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := variableRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		v, ok := vars[name]
		if !ok {
			unknown = append(unknown, ref)
			return ref
		}
		return v
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown variable %s in %s", strings.Join(unknown, ", "), expr)
	}
	return out, nil
}

// PromQL's keywords and the aggregation operators, which may stand before "by" or "without"
// rather than before a parenthesis.
var (
	keywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
		"group_left", "group_right", "inf", "nan"}
	labelLists   = []string{"by", "without", "on", "ignoring", "group_left", "group_right"}
	aggregations = []string{"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
		"count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
)

// MetricNames returns the metric names a PromQL expression selects, in order of appearance
// without repeats. It reads the expression's tokens rather than parsing it: an identifier is a
// metric name unless it calls a function, is a keyword or an aggregation, or sits in a label
// list, a selector's braces, a range's brackets or a string. A selector by __name__ alone is not
// seen.
func MetricNames(expr string) []string {
	var names []string
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	// next returns the index of the first non-space byte at or after i.
	next := func(i int) int {
		for i < len(expr) && strings.ContainsRune(" \t\r\n", rune(expr[i])) {
			i++
		}
		return i
	}
	// skip returns the index just after the bracket that closes the one at i, stepping over
	// strings.
	skip := func(i int, open, close byte) int {
		depth := 0
		for ; i < len(expr); i++ {
			switch c := expr[i]; {
			case c == '"' || c == '\'' || c == '`':
				i = skipString(expr, i) - 1
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return i
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(expr, i)
		case c == '{':
			i = skip(i, '{', '}')
		case c == '[':
			i = skip(i, '[', ']')
		case c == '#': // a comment, to the end of the line
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			// A number or a duration (5m, 1e3, 0x1f): letters that follow belong to it.
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			start := i
			for i < len(expr) && isIdent(expr[i]) {
				i++
			}
			word := expr[start:i]
			lower := strings.ToLower(word)
			after := next(i)
			nextIsParen := after < len(expr) && expr[after] == '('
			switch {
			case slices.Contains(labelLists, lower):
				if nextIsParen {
					i = skip(after, '(', ')')
				}
			case slices.Contains(keywords, lower), nextIsParen:
				// A keyword or a function call.
			case slices.Contains(aggregations, lower) && (strings.HasPrefix(expr[after:], "by") || strings.HasPrefix(expr[after:], "without")):
				// An aggregation with its grouping first: max by (le) (...).
			default:
				if !slices.Contains(names, word) {
					names = append(names, word)
				}
			}
		default:
			i++
		}
	}
	return names
}

// skipString returns the index just after the string literal that starts at i.
func skipString(s string, i int) int {
	quote := s[i]
	for i++; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if quote != '`' {
				i++
			}
		case quote:
			return i + 1
		}
	}
	return i
}
