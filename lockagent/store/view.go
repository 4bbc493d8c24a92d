package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dislock/dislock/lockagent/store/internal/db"
)

// View is how one cluster's CronJob looks to dislock: the settings every
// cluster must agree on for "once per window" to mean the same window
// everywhere. Clusters whose views differ can turn one tick into two windows
// (a different time zone or schedule: both run) or break a promise (standby
// set in one cluster only).
type View struct {
	Schedule string `json:"schedule"`
	TimeZone string `json:"timeZone"`
	Mode     string `json:"mode"`
	Standby  bool   `json:"standby"`
	LeaseTTL string `json:"leaseTTL"`
	Catchup  string `json:"catchup"`
	// MissedAfter is dislock.io/missed-after: how long after its start a
	// window without a successful run counts as missed. Empty: the default
	// (DefaultMissedGrace).
	MissedAfter string `json:"missedAfter,omitempty"`
	// PreferCluster and PreferGrace are dislock.io/prefer-cluster and its
	// grace; empty when unset, and in the views of agents older than the
	// fields, which claim at once: a cluster that prefers another differs
	// from one that does not.
	PreferCluster string `json:"preferCluster,omitempty"`
	PreferGrace   string `json:"preferGrace,omitempty"`
	// CompletionMode is the Job's completionMode, CompletionModeIndexed or
	// CompletionModeNonIndexed; empty in the views of agents older than the
	// field, where it is not known. Completions is an Indexed Job's
	// spec.completions (0 when not known: Jobs admitted by a webhook that
	// did not pass it on). A window is one unit whatever the mode: where
	// clusters disagree on it the database refuses the second shape
	// (ErrCompletionModesDisagree). Unknown values differ from nothing, so
	// that agents of two releases side by side are no disagreement.
	CompletionMode string `json:"completionMode,omitempty"`
	Completions    int    `json:"completions,omitempty"`
}

// The values of View.CompletionMode, as Kubernetes spells them.
const (
	CompletionModeIndexed    = "Indexed"
	CompletionModeNonIndexed = "NonIndexed"
)

// String spells every setting of v, for reports of clusters that disagree.
func (v View) String() string {
	s := fmt.Sprintf("schedule %q, timeZone %q, mode %s, standby %t, leaseTTL %s, catchup %q, missedAfter %q",
		v.Schedule, v.TimeZone, v.Mode, v.Standby, v.LeaseTTL, v.Catchup, v.MissedAfter)
	if v.PreferCluster != "" {
		s += fmt.Sprintf(", preferCluster %q, preferGrace %s", v.PreferCluster, v.PreferGrace)
	}
	if v.CompletionMode != "" {
		s += ", completionMode " + v.CompletionMode
	}
	if v.Completions > 0 {
		s += fmt.Sprintf(", completions %d", v.Completions)
	}
	return s
}

// ClusterView is a View as a cluster last recorded it.
type ClusterView struct {
	Key     string    `json:"key"`
	Cluster string    `json:"cluster"`
	View    View      `json:"view"`
	SeenAt  time.Time `json:"seenAt"`
}

// Diff names the settings in which other differs from v, e.g.
// `timeZone "Europe/Berlin" ≠ ""`.
func (v View) Diff(other View) []string {
	var out []string
	add := func(name string, a, b any) {
		if a != b {
			out = append(out, fmt.Sprintf("%s %q here, %q there", name, fmt.Sprint(a), fmt.Sprint(b)))
		}
	}
	add("schedule", v.Schedule, other.Schedule)
	add("timeZone", v.TimeZone, other.TimeZone)
	add("mode", v.Mode, other.Mode)
	add("standby", v.Standby, other.Standby)
	add("leaseTTL", v.LeaseTTL, other.LeaseTTL)
	add("catchup", v.Catchup, other.Catchup)
	add("missedAfter", v.MissedAfter, other.MissedAfter)
	add("preferCluster", v.PreferCluster, other.PreferCluster)
	add("preferGrace", v.PreferGrace, other.PreferGrace)
	// "" and 0 are "not known" (an older agent or webhook): no
	// disagreement to report.
	if v.CompletionMode != "" && other.CompletionMode != "" {
		add("completionMode", v.CompletionMode, other.CompletionMode)
	}
	if v.Completions > 0 && other.Completions > 0 {
		add("completions", v.Completions, other.Completions)
	}
	return out
}

// DisagreementAdvice says what views that differ lead to, and what to make
// identical.
func DisagreementAdvice(views ...View) string {
	var fix []string
	windows := false
	for _, v := range views {
		w := views[0]
		windows = windows || v.Schedule != w.Schedule || v.TimeZone != w.TimeZone
		// "" and 0 are not known (see Diff).
		if v.CompletionMode != "" && w.CompletionMode != "" && v.CompletionMode != w.CompletionMode ||
			v.Completions > 0 && w.Completions > 0 && v.Completions != w.Completions {
			fix = append(fix, "spec.jobTemplate.spec.completionMode and completions")
		}
		if v.Mode != w.Mode || v.Standby != w.Standby || v.LeaseTTL != w.LeaseTTL || v.Catchup != w.Catchup ||
			v.MissedAfter != w.MissedAfter || v.PreferCluster != w.PreferCluster || v.PreferGrace != w.PreferGrace {
			fix = append(fix, "the dislock.io/ annotations")
		}
	}
	slices.Sort(fix)
	fix = slices.Compact(fix)
	if windows {
		return "one tick may be a different window in each cluster and run once in each; make the CronJobs identical, above all spec.timeZone"
	}
	if len(fix) == 0 {
		return "make the CronJobs identical"
	}
	return "each cluster's pods lock as its own CronJob says; make " + strings.Join(fix, " and ") + " identical in every cluster"
}

// DefaultViewRecency is how far back another cluster's view counts as
// current: a cluster that has not claimed for a week has probably had its
// CronJob removed or suspended.
const DefaultViewRecency = 7 * 24 * time.Hour

// RecordView stores cluster's view of key and returns the other clusters'
// views seen within recency that differ from it.
func (s *Store) RecordView(ctx context.Context, key, cluster string, v View, recency time.Duration) ([]ClusterView, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return s.views(ctx, "recording the job's view of "+key, qRecordView, key, cluster, string(b), db.Micros(recency))
}

// ListDisagreements returns, for every key whose clusters' views seen within
// recency differ, each of those clusters' views.
func (s *Store) ListDisagreements(ctx context.Context, recency time.Duration) ([]ClusterView, error) {
	views, err := s.views(ctx, "listing disagreeing views", qListDisagreements, db.Micros(recency))
	if err != nil {
		return nil, err
	}
	// The statement compares views as text; a key whose views differ only
	// in what one of them does not know (see Diff) is no disagreement.
	byKey := map[string][]ClusterView{}
	for _, v := range views {
		byKey[v.Key] = append(byKey[v.Key], v)
	}
	var out []ClusterView
	for _, v := range views {
		if slices.ContainsFunc(byKey[v.Key], func(o ClusterView) bool { return len(v.View.Diff(o.View)) > 0 }) {
			out = append(out, v)
		}
	}
	return out, nil
}

// otherViews reads the other clusters' views a claim returned, one array
// per column, as views reads rows.
func (s *Store) otherViews(op, key string, clusters, views []string, seen []time.Time) []ClusterView {
	var out []ClusterView
	for i := range min(len(clusters), len(views), len(seen)) {
		cv := ClusterView{Key: key, Cluster: clusters[i], SeenAt: seen[i].UTC()}
		if err := json.Unmarshal([]byte(views[i]), &cv.View); err != nil {
			s.h.SkipRow(op, &db.UnreadableRow{Table: "views", Key: key, Problems: []string{"view does not decode (" + err.Error() + ")"}})
			continue
		}
		out = append(out, cv)
	}
	return out
}

// views runs a query returning (lock_key, cluster, view, seen_at) rows. A
// row whose view does not decode, or whose seen_at no time.Time can hold,
// was not written by an agent (by hand, or by a tenant into its own key):
// it is left out, logged and counted, so that it cannot hide every other
// key's report.
func (s *Store) views(ctx context.Context, op, query string, args ...any) ([]ClusterView, error) {
	rows, err := s.h.Pool.Query(ctx, query, args...)
	if err != nil {
		return nil, s.classify(op, err)
	}
	defer rows.Close()
	var out []ClusterView
	for rows.Next() {
		var cv ClusterView
		var raw string
		var problems []string
		if err := rows.Scan(&cv.Key, &cv.Cluster, &raw, &db.FiniteTime{Column: "seen_at", T: &cv.SeenAt, Problems: &problems}); err != nil {
			return nil, s.classify(op, err)
		}
		if err := json.Unmarshal([]byte(raw), &cv.View); err != nil {
			problems = append(problems, "view does not decode ("+err.Error()+")")
		}
		if len(problems) > 0 {
			s.h.SkipRow(op, &db.UnreadableRow{Table: "views", Key: cv.Key, Problems: problems})
			continue
		}
		out = append(out, cv)
	}
	return out, s.classify(op, rows.Err())
}
