package main

// The demo's story: the CronJob applied to every data centre, a row per
// window once every data centre's Job for it has finished, and a summary.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/e2e"
)

const (
	cronJobName = "report"
	// work is how long each run of the app takes.
	work = 2 * time.Second
	// tickMargin keeps the CronJobs' creation clear of a minute boundary,
	// so that every data centre's controller has the same first tick.
	tickMargin = 10 * time.Second
	// windowGrace is how long after its tick a window's Jobs may take to
	// finish in every data centre before the demo calls the window failed.
	windowGrace = 100 * time.Second
	// width is the terminal width the table is laid out for.
	width = 100
)

// dcOutcome is what one data centre did in a window.
type dcOutcome struct {
	dc       string
	job      *batchv1.Job // nil: the CronJob controller made none
	complete bool
	ran      *e2e.Run // the ledger's row, if the app ran here
	message  string   // the dislock-agent sidecar's termination message
	decided  time.Duration
}

// outcome is one window across the data centres, those that ran it first.
type outcome struct {
	window time.Time
	runs   int
	row    *store.Window // dislock.windows, as `dislock windows` shows it
	dcs    []dcOutcome
}

func (o outcome) ok() bool {
	if o.runs != 1 || o.row == nil || o.row.Cluster != o.dcs[0].dc {
		return false
	}
	for _, d := range o.dcs {
		if !d.complete {
			return false
		}
	}
	return true
}

// watch applies the CronJob, prints a row per window and the summary, and
// returns the exit code.
func watch(ctx context.Context, env *e2e.Env, cfg config, out *printer) int {
	if err := optIn(ctx, env, out); err != nil {
		if ctx.Err() != nil {
			return exitInterrupted
		}
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return exitFailed
	}
	if wait := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); wait < tickMargin {
		out.step("waiting %v for the minute to turn, so that every data centre gets the same first tick", round(wait))
		if !sleep(ctx, wait+time.Second) {
			return exitInterrupted
		}
	}
	first := time.Now().UTC().Truncate(time.Minute).Add(time.Minute)
	dir, err := os.MkdirTemp("", "dislock-demo-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return exitFailed
	}
	defer os.RemoveAll(dir)
	if err := applyCronJob(ctx, env, cfg, dir, out); err != nil {
		if ctx.Err() != nil {
			return exitInterrupted
		}
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return exitFailed
	}
	out.step("its app records each run in a ledger table, then works %v; first tick %s UTC, in %v",
		work, first.Format("15:04"), round(time.Until(first)))
	out.print("\nA row per window, once every data centre's Job of it has finished. TOKEN: the fencing token\n" +
		"the app got; RUN: the app's run (database time); DECIDED: Job created -> sidecar decided.\n" + header())

	var outcomes []outcome
	for i := range cfg.windows {
		w := first.Add(time.Duration(i) * time.Minute)
		o, err := awaitWindow(ctx, env, w)
		if ctx.Err() != nil {
			return exitInterrupted
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "demo: window %s: %v\n", w.Format(time.RFC3339), err)
		}
		out.print(o.rows())
		outcomes = append(outcomes, o)
	}
	out.print("\n" + summary(env, outcomes))
	code := exitOK
	for _, o := range outcomes {
		if !o.ok() {
			code = exitFailed
		}
	}
	if code != exitOK {
		fmt.Fprintf(os.Stderr, "demo: FAILED: not every window ran exactly once with every Job Complete; the state:\n%s", env.Dump())
	}
	return code
}

// awaitWindow waits until every data centre's Job of window w has finished
// and its pod's sidecar has left its termination message (or the grace
// has passed), then reads the ledger and the window's row.
func awaitWindow(ctx context.Context, env *e2e.Env, w time.Time) (outcome, error) {
	o := outcome{window: w}
	// The CronJob controller names a tick's Job <cronjob>-<minutes since the epoch>.
	jobName := fmt.Sprintf("%s-%d", cronJobName, w.Unix()/60)
	deadline := w.Add(windowGrace)
	var lastErr error
	for {
		o.dcs = o.dcs[:0]
		pending := false
		for _, dc := range env.DCs {
			// An API server that does not answer once is asked again.
			d, err := observe(ctx, dc, jobName)
			if err != nil {
				lastErr = err
			}
			pending = pending || err != nil || d.job == nil || d.message == ""
			o.dcs = append(o.dcs, d)
		}
		if !pending {
			lastErr = nil
			break
		}
		if time.Now().After(deadline) {
			break
		}
		if !sleep(ctx, time.Second) {
			return o, ctx.Err()
		}
	}
	runs, err := env.Runs(ctx)
	if err != nil {
		return o, fmt.Errorf("reading the ledger: %w", err)
	}
	for i := range runs {
		r := &runs[i]
		if r.Window != w.Format(time.RFC3339) || r.Namespace != namespace || !strings.HasPrefix(r.Pod, cronJobName+"-") {
			continue
		}
		o.runs++
		for j := range o.dcs {
			if o.dcs[j].dc == r.Cluster {
				o.dcs[j].ran = r
			}
		}
	}
	sort.SliceStable(o.dcs, func(i, j int) bool { return o.dcs[i].ran != nil && o.dcs[j].ran == nil })
	o.row, err = windowRow(env, w)
	return o, errors.Join(lastErr, err)
}

// observe reads one data centre's Job of a window and its pod.
func observe(ctx context.Context, dc *e2e.DC, jobName string) (dcOutcome, error) {
	d := dcOutcome{dc: dc.Name}
	job, err := dc.Client.BatchV1().Jobs(namespace).Get(ctx, jobName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return d, nil
	}
	if err != nil {
		return d, fmt.Errorf("%s: reading Job %s: %w", dc.Name, jobName, err)
	}
	done, complete := e2e.Finished(job)
	if !done {
		return d, nil
	}
	d.job, d.complete = job, complete
	pods, err := dc.PodsIn(ctx, namespace, jobName)
	if err != nil {
		return d, fmt.Errorf("%s: listing the pods of Job %s: %w", dc.Name, jobName, err)
	}
	for i := range pods {
		if msg := e2e.AgentMessage(&pods[i]); msg != "" {
			term, _ := contract.ParseTermination(msg)
			d.message = term.Message
			if t, ok := decisionTime(dc, &pods[i]); ok {
				d.decided = t.Sub(job.CreationTimestamp.Time)
			}
		}
	}
	return d, nil
}

// agentLogLine is the part of the sidecar's JSON log lines the demo reads.
type agentLogLine struct {
	Time time.Time `json:"time"`
	Msg  string    `json:"msg"`
}

// decisionTime is when a pod's sidecar logged its decision, read from the
// container log its node's kubelet writes (<pod-logs>/<ns>_<pod>_<uid>/
// <container>/<n>.log, each line "<time> <stream> <P|F> <message>"): the
// API servers here hold no credentials for the kubelets' log endpoint.
func decisionTime(dc *e2e.DC, pod *corev1.Pod) (time.Time, bool) {
	dir := filepath.Join(dc.Node.Dir(), "pod-logs", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), "dislock-agent")
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			fields := strings.SplitN(line, " ", 4)
			if len(fields) < 4 {
				continue
			}
			var l agentLogLine
			if json.Unmarshal([]byte(fields[3]), &l) == nil && l.Msg == "decision" {
				return l.Time, true
			}
		}
	}
	return time.Time{}, false
}

// windowRow is the window's row in dislock.windows, read with the operator
// CLI the way a user would (`dislock windows -o json`).
func windowRow(env *e2e.Env, w time.Time) (*store.Window, error) {
	text, err := env.Dislock("windows", "--key", namespace+"/"+cronJobName, "--limit", "100", "-o", "json")
	if err != nil {
		return nil, fmt.Errorf("dislock windows: %w: %s", err, text)
	}
	var rows []store.Window
	if err := json.Unmarshal([]byte(text), &rows); err != nil {
		return nil, fmt.Errorf("dislock windows -o json: %w: %s", err, text)
	}
	for i := range rows {
		if rows[i].Start.Equal(w) {
			return &rows[i], nil
		}
	}
	return nil, nil
}

// The table's columns; the last one takes the rest of the width.
var columns = []struct {
	title string
	width int
}{
	// A token is 2⁴⁰ × epoch + n: 13 digits for years of claims.
	{"WINDOW", 6}, {"DC", 4}, {"OUTCOME", 7}, {"TOKEN", 13}, {"RUN", 5}, {"DECIDED", 7},
	{"WHY (the sidecar's termination message)", 0},
}

func header() string {
	cells := make([]string, len(columns))
	for i, c := range columns {
		cells[i] = c.title
	}
	return tableLine(cells...)
}

// tableLine lays out one line: numbers right-aligned, the last cell
// wrapped at spaces onto lines of their own, indented to its column.
func tableLine(cells ...string) string {
	var b strings.Builder
	for i, c := range columns {
		cell := cells[i]
		if c.width == 0 {
			indent := b.Len()
			for j, l := range wrap(cell, width-indent) {
				if j > 0 {
					b.WriteString("\n" + strings.Repeat(" ", indent))
				}
				b.WriteString(l)
			}
			break
		}
		switch c.title {
		case "TOKEN", "RUN", "DECIDED":
			fmt.Fprintf(&b, "%*s  ", c.width, cell)
		default:
			fmt.Fprintf(&b, "%-*s  ", c.width, cell)
		}
	}
	return strings.TrimRight(b.String(), " ") + "\n"
}

// wrap breaks s at spaces into lines of at most room bytes; a longer word
// is cut.
func wrap(s string, room int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		for len(w) > room {
			if line != "" {
				lines, line = append(lines, line), ""
			}
			lines, w = append(lines, w[:room]), w[room:]
		}
		switch {
		case line == "":
			line = w
		case len(line)+1+len(w) <= room:
			line += " " + w
		default:
			lines, line = append(lines, line), w
		}
	}
	return append(lines, line)
}

// rows renders a window: a line per data centre, those that ran it first.
func (o outcome) rows() string {
	var b strings.Builder
	for i, d := range o.dcs {
		window := ""
		if i == 0 {
			window = o.window.Format("15:04")
		}
		token, run, decided := "-", "-", "-"
		result := "pending"
		switch {
		case d.ran != nil:
			result = "ran"
			token = fmt.Sprint(d.ran.Token)
			if d.ran.Finished != nil {
				run = fmt.Sprintf("%.1fs", d.ran.Finished.Sub(d.ran.Started).Seconds())
			}
		case d.job == nil:
			result = "no Job"
		case strings.HasPrefix(d.message, "skip:"):
			result = "skipped"
		case !d.complete:
			result = "failed"
		}
		if d.decided > 0 {
			decided = fmt.Sprintf("%.1fs", d.decided.Seconds())
		}
		b.WriteString(tableLine(window, d.dc, result, token, run, decided, o.why(d)))
	}
	if o.runs > 1 {
		fmt.Fprintf(&b, "%*s  RAN %d TIMES\n", columns[0].width, "", o.runs)
	}
	if o.runs == 0 {
		fmt.Fprintf(&b, "%*s  DID NOT RUN\n", columns[0].width, "")
	}
	// The ledger says where the app ran; the lock's row must agree.
	switch {
	case o.row == nil:
		fmt.Fprintf(&b, "%*s  no row in dislock.windows\n", columns[0].width, "")
	case o.runs == 1 && o.row.Cluster != o.dcs[0].dc:
		fmt.Fprintf(&b, "%*s  but dislock.windows names cluster %s\n", columns[0].width, "", o.row.Cluster)
	}
	return b.String()
}

// The owner strings in skip messages (<cluster>/<namespace>/<job>/<job
// uid>[/<pod>]) are long; the table names the cluster alone.
var (
	// "already claimed by cluster dc-a (dc-a/e2e/report-29936220/6c1e…, state running)"
	ownerBesideCluster = regexp.MustCompile(`\([^ ,()]+/[^ ,()]+, `)
	// "lease e2e/report held by dc-a/e2e/report-29936220/6c1e…/report-29936220-x7k2p until …"
	owner = regexp.MustCompile(`\b([A-Za-z0-9][A-Za-z0-9._-]*)/[^\s,()/]+/[^\s,()/]+/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(/[^\s,()]+)?`)
)

// why shortens the sidecar's termination message for the table: the window
// and key are in the row already.
func (o outcome) why(d dcOutcome) string {
	msg := d.message
	if msg == "" {
		if d.job == nil {
			return "the CronJob controller has not created its Job"
		}
		return "(no termination message yet)"
	}
	w := o.window.Format(time.RFC3339)
	if _, result, ok := strings.Cut(msg, " with token "); ok && strings.HasPrefix(msg, "ran ") {
		if _, after, ok := strings.Cut(result, ": "); ok {
			return after
		}
	}
	msg = strings.TrimPrefix(msg, "skip: ")
	msg = strings.TrimPrefix(msg, "window "+w+" ")
	msg = ownerBesideCluster.ReplaceAllString(msg, "(")
	return owner.ReplaceAllString(msg, "$1")
}

// summary counts windows, runs and Jobs, the decision latency, the memory
// of the setup and shows `dislock windows` for the key.
func summary(env *e2e.Env, outcomes []outcome) string {
	var b strings.Builder
	runs, double, missed, jobs, complete := 0, 0, 0, 0, 0
	perDC := map[string]int{}
	var decided []time.Duration
	for _, o := range outcomes {
		runs += o.runs
		switch {
		case o.runs > 1:
			double++
		case o.runs == 0:
			missed++
		}
		for _, d := range o.dcs {
			if d.ran != nil {
				perDC[d.dc]++
			}
			if d.job != nil {
				jobs++
			}
			if d.complete {
				complete++
			}
			if d.decided > 0 {
				decided = append(decided, d.decided)
			}
		}
	}
	var split []string
	for _, dc := range env.DCs {
		split = append(split, fmt.Sprintf("%s %d", dc.Name, perDC[dc.Name]))
	}
	fmt.Fprintf(&b, "%d windows, %d runs, %d double runs, %d windows without a run; runs per DC: %s\n",
		len(outcomes), runs, double, missed, strings.Join(split, ", "))
	fmt.Fprintf(&b, "%d of %d Jobs Complete, the skipping data centres' too (%d expected)\n",
		complete, jobs, len(outcomes)*len(env.DCs))
	if len(decided) > 0 {
		sort.Slice(decided, func(i, j int) bool { return decided[i] < decided[j] })
		fmt.Fprintf(&b, "Job created -> sidecar decided, %d pods: min %.1fs, median %.1fs, max %.1fs (Job times: whole s)\n",
			len(decided), decided[0].Seconds(), decided[len(decided)/2].Seconds(), decided[len(decided)-1].Seconds())
	}
	if _, total := env.RSS(); total > 0 {
		fmt.Fprintf(&b, "resident memory of the whole %d-DC setup: %d MiB\n", len(env.DCs), total>>10)
	}
	key := namespace + "/" + cronJobName
	text, err := env.Dislock("windows", "--key", key, "--limit", fmt.Sprint(len(outcomes)+1))
	if err != nil {
		text += err.Error() + "\n"
	}
	fmt.Fprintf(&b, "\n$ dislock windows --key %s\n%s", key, text)
	return b.String()
}

// sleep waits for d, or less if ctx ends first; false then.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
