package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Run is one run of the app, as its own ledger lines (and, for an app that
// was killed, the harness's kill or exit time) tell it.
type Run struct {
	Cluster, Pod string
	Window       int
	Index        int // completion index, -1 when not Indexed
	// Token is DISLOCK_FENCING_TOKEN, -1 when the app had none.
	Token      int64
	Start, End time.Time
	// Code is the stop line's exit code, -1 when the app wrote none.
	Code int
}

// Success is a run that reached its end: a stop line with code 0 that its
// wrapper saw as an exit 0 (see Runs).
func (r Run) Success() bool { return r.Code == 0 }

func (r Run) String() string {
	tok := "none"
	if r.Token >= 0 {
		tok = strconv.FormatInt(r.Token, 10)
	}
	code := "killed"
	if r.Code >= 0 {
		code = "exit " + strconv.Itoa(r.Code)
	}
	return fmt.Sprintf("%s %s window %s token %s [%s, %s] %s", r.Cluster, r.Pod, unitKey(strconv.Itoa(r.Window), r.Index), tok,
		r.Start.Format("15:04:05.000"), r.End.Format("15:04:05.000"), code)
}

func (r Run) sameUnit(o Run) bool { return r.Window == o.Window && r.Index == o.Index }

func (r Run) overlaps(o Run) bool { return r.Start.Before(o.End) && o.Start.Before(r.End) }

// Violation is one broken invariant, or one documented exception to it.
type Violation struct {
	// Kind is short and stable ("a: window ran twice"), for the run's tally.
	Kind string
	Text string
	// Pods involved, whose agent logs the report shows.
	Pods []string
	// Exception: the design's stated exception to invariant 1 (DESIGN.md
	// "Invariants"), proven from the fault log: the owner's pod could not
	// reach the database from its app's successful end until its claim's
	// liveness lapsed. Counted apart; not a failure.
	Exception bool
}

// Exceptions and Violations split vs.
func Exceptions(vs []Violation) (exceptions, violations []Violation) {
	for _, v := range vs {
		if v.Exception {
			exceptions = append(exceptions, v)
		} else {
			violations = append(violations, v)
		}
	}
	return exceptions, violations
}

// Runs parses the ledger. A run without a stop line ends when its app
// container was killed or exited; one still running ends at o.End.
func (o *Outcome) Runs() ([]Run, []string) {
	var runs []Run
	var problems []string
	byPod := map[string]int{}
	pods := map[string]PodRecord{}
	for _, p := range o.Pods {
		pods[p.Cluster+"/"+p.Name] = p
	}
	sc := bufio.NewScanner(strings.NewReader(o.Ledger))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		// A SIGTERM that arrives while the app computes $(date ...) kills
		// date and leaves the time empty: such a run starts (or stops)
		// when the other line of the pair, or the container's end, says.
		ns, err := strconv.ParseInt(f[1], 10, 64)
		rest := f[2:]
		if err != nil {
			ns, rest = 0, f[1:]
		}
		kv := map[string]string{}
		for _, x := range rest {
			k, v, _ := strings.Cut(x, "=")
			kv[k] = v
		}
		id := kv["cluster"] + "/" + kv["pod"]
		var at time.Time
		if ns > 0 {
			at = time.Unix(0, ns)
		}
		switch f[0] {
		case "start":
			if _, dup := byPod[id]; dup {
				problems = append(problems, "the app of pod "+id+" started twice")
			}
			w, _ := strconv.Atoi(kv["w"])
			index := -1
			if v, ok := kv["i"]; ok {
				index, _ = strconv.Atoi(v)
			}
			tok, err := strconv.ParseInt(kv["token"], 10, 64)
			if err != nil {
				tok = -1
			}
			run := Run{Cluster: kv["cluster"], Pod: kv["pod"], Window: w, Index: index, Token: tok, Start: at, End: o.End, Code: -1}
			if p, ok := pods[id]; ok && p.AppRan && !p.AppEnd.IsZero() {
				run.End = p.AppEnd
			}
			byPod[id] = len(runs)
			runs = append(runs, run)
		case "stop":
			i, ok := byPod[id]
			if !ok {
				continue // SIGTERM before the start line: nothing ran
			}
			if !at.IsZero() {
				runs[i].End = at
			}
			runs[i].Code, _ = strconv.Atoi(kv["code"])
			// The end that counts is the one the wrapper saw and
			// reported to the agent: an app killed between writing its
			// stop line and exiting (a kill-app fault in that instant)
			// failed for dislock, and its Job rightly runs it again. A
			// wrapper killed after it reported a success (while it waits
			// for the record) does not undo the success.
			if p, ok := pods[id]; ok && p.AppRan && !p.AppEnd.IsZero() && runs[i].Code == 0 && p.AppCode != 0 && p.AppResult != 0 {
				runs[i].Code = p.AppCode
			}
		}
	}
	for i := range runs {
		if runs[i].Start.IsZero() {
			runs[i].Start = runs[i].End
		}
	}
	slices.SortStableFunc(runs, func(a, b Run) int { return a.Start.Compare(b.Start) })
	return runs, problems
}

// Check holds the schedule to DESIGN.md's invariants:
//
//	(a) at most one run of a (key, window[, index]) ends successfully (modes with
//	    schedule); a window's runs never overlap; with lease in the mode no
//	    two runs of the key (of the key and index, for Indexed Jobs) overlap;
//	(b) with standby (and schedule), a window where at least one cluster's
//	    Job was clean (its bouncer never cut while the Job lived, no app of
//	    its never started, exited non-zero or was killed) got a successful
//	    run; under schedule,lease a window skipped because an earlier
//	    window's run held the lease is exempt, as designed;
//	(c) fencing tokens strictly increase from one grant to the next: a run
//	    granted after another ended has a larger token (granted when it
//	    started, or in schedule mode across windows by its window's claim:
//	    see grantedAt), no two runs share one, and every run has one;
//	(d) every pod ended within StuckBound of the later of its creation and
//	    the last healed fault, a PostgreSQL restart by another schedule
//	    included (pods whose app never started excepted: they wait for
//	    their Job's deadline as in Kubernetes);
//	(e) the database agrees with the ledger: a window with a successful
//	    run is recorded succeeded, and one recorded succeeded had one;
//	(f) no run starts while the key is paused: no window claim or lease
//	    grant (re-entries keep their grant and are none) was checked while
//	    a pause the owner set held, as far as the flips' brackets in
//	    database time prove it (see PausedSpan); a pod that skipped
//	    because of a pause ran no app and exited as a skip (exit 0: its
//	    Job succeeds), and did so only once a pause had been sent; and a
//	    run already going is not stopped by one: no Job completed by such
//	    a skip had its running pod deleted.
//
// A window where a pod skipped because of a pause is exempt from (b): the
// pause kept it from being run, as designed.
//
// A window that ran to completion twice (a), or whose success is not
// recorded (e), is the design's documented exception, not a violation, only
// when the fault log proves for every unrecorded success that its pod could
// not reach the database from the app's end until the claim's liveness
// lapsed (see unrecordable).
func Check(o *Outcome) []Violation {
	var vs []Violation
	add := func(kind string, pods []string, format string, args ...any) {
		vs = append(vs, Violation{Kind: kind, Text: fmt.Sprintf(format, args...), Pods: pods})
	}
	// addUnrecorded reports kind for the successes done, none of which was
	// recorded: an exception if every one of them is proven unrecordable.
	addUnrecorded := func(kind string, u unit, done []Run, format string, args ...any) {
		text := fmt.Sprintf(format, args...)
		exception := true
		why := ""
		for _, r := range done {
			ok, because := o.unrecordable(r, u)
			text += fmt.Sprintf("\n  the success of %s/%s: %s", r.Cluster, r.Pod, because)
			if !ok && exception {
				exception, why = false, because
			}
		}
		if exception {
			kind += " (owner cut off until its claim lapsed)"
		} else {
			kind += " (" + violationClass(why) + ")"
		}
		vs = append(vs, Violation{Kind: kind, Text: text, Pods: podsOf(done...), Exception: exception})
	}
	runs, problems := o.Runs()
	for _, p := range problems {
		add("ledger", nil, "%s", p)
	}
	p := o.Plan

	for _, pr := range o.Pods {
		if b, err := os.ReadFile(pr.AgentLog); err == nil && strings.Contains(string(b), "bad agent configuration") {
			add("harness: the agent rejected its configuration", []string{pr.Cluster + "/" + pr.Name},
				"the sidecar of %s/%s rejected the environment the simulator gave it (see its log)", pr.Cluster, pr.Name)
			break
		}
	}

	// (a)
	for _, u := range o.units() {
		var done []Run
		for _, r := range runs {
			if r.Window == u.window && r.Index == u.index && r.Success() {
				done = append(done, r)
			}
		}
		if p.HasSchedule() && len(done) > 1 {
			// Each success but the last went unrecorded, or the next run
			// could not have claimed the window.
			addUnrecorded("a: window ran to completion twice", u, done[:len(done)-1],
				"window %s ran to completion %d times:\n  %s", u, len(done), joinRuns(done))
		}
	}
	// A window is one unit whatever the completion mode: where clusters
	// disagree on it, runs of one window in both shapes are two runs.
	for w := range p.Windows {
		var plain, indexed []Run
		for _, r := range runs {
			switch {
			case r.Window != w:
			case r.Index < 0:
				plain = append(plain, r)
			default:
				indexed = append(indexed, r)
			}
		}
		if len(plain) > 0 && len(indexed) > 0 {
			add("a: window ran in both completion modes", podsOf(append(plain, indexed...)...),
				"window %d ran as a plain Job's and as an Indexed Job's:\n  %s", w, joinRuns(append(plain, indexed...)))
		}
	}
	for i, a := range runs {
		for _, b := range runs[i+1:] {
			switch {
			case !a.overlaps(b):
			case a.sameUnit(b):
				add("a: runs of one window overlap", podsOf(a, b), "runs of window %s overlap:\n  %s\n  %s", unitKey(strconv.Itoa(a.Window), a.Index), a, b)
			case p.HasLease() && a.Index == b.Index:
				// An Indexed Job holds a lease per index: its indexes run side by side.
				add("a: runs of the key overlap under lease", podsOf(a, b), "runs of the key overlap though the mode has lease:\n  %s\n  %s", a, b)
			}
		}
	}

	// (b)
	if p.HasSchedule() && p.Standby && !o.Overran {
		for _, u := range o.units() {
			if slices.ContainsFunc(runs, func(r Run) bool { return r.Window == u.window && r.Index == u.index && r.Success() }) {
				continue
			}
			state := o.WindowStates[o.unitKey(u)]
			if p.HasLease() && state == "skipped" {
				continue
			}
			// Standby is promised within a shape: a window claimed as a
			// plain Job's is never run by an Indexed Job, nor the other way
			// round, whatever becomes of its owner.
			if o.otherShapeClaimed(u) {
				continue
			}
			if o.pausedIn(u) {
				continue
			}
			if clean := o.cleanClusters(u); len(clean) > 0 {
				var pods []string
				for _, pr := range o.Pods {
					if pr.Window == u.window && pr.Index == u.index {
						pods = append(pods, pr.Cluster+"/"+pr.Name)
					}
				}
				add("b: window lost although a cluster was healthy", pods,
					"window %s (row state %q) got no successful run although %s stayed healthy", u, state, strings.Join(clean, ", "))
			}
		}
	}

	// (c) Successive grants: a run granted after another ended must carry a
	// larger token. A run is granted when it starts, except in schedule
	// mode across windows, where its window's claim is the grant (see
	// grantedAt). Runs that overlap (different windows in schedule mode)
	// are concurrent grants, not successive ones, but never share a token.
	// The indexes of an Indexed Job are fenced apart (each holds its own
	// lease, <key>#<index>) and run side by side: one index's grant may
	// reach its app after another index's later grant, so their order is
	// compared only within an index.
	for i, r := range runs {
		if r.Token < 0 {
			add("c: run without a fencing token", podsOf(r), "run without a fencing token: %s", r)
			continue
		}
		for _, a := range runs[:i] {
			switch {
			case a.Token < 0:
			case a.Token != r.Token && a.Index != r.Index:
			case a.Token == r.Token:
				add("c: two runs with one token", podsOf(a, r), "two runs share fencing token %d:\n  %s\n  %s", r.Token, a, r)
			case r.Token < a.Token && !a.End.After(o.grantedAt(r, a)):
				add("c: tokens do not increase", podsOf(a, r), "a run granted after another ended has a smaller fencing token:\n  %s\n  %s", a, r)
			}
		}
	}

	// (d)
	for _, pr := range o.Pods {
		id := pr.Cluster + "/" + pr.Name
		switch {
		case pr.App.NeverStart:
		case pr.Ended.IsZero():
			add("d: pod never ended", []string{id}, "pod %s never ended, even when killed", id)
		case pr.Stuck:
			add("d: pod stuck", []string{id}, "pod %s (window %d) was still alive %s after the later of its creation (%s) and the last healed fault (%s); its Job's deadline deleted it",
				id, pr.Window, o.Plan.StuckBound(o.Settings), pr.Created.Format("15:04:05.000"), o.Quiet.Format("15:04:05.000"))
		}
	}
	if o.Overran {
		add("d: schedule overran", nil, "the schedule overran its hard deadline; everything was killed")
	}

	// (e)
	if p.HasSchedule() && o.WindowStates != nil {
		for _, u := range o.units() {
			var done []Run
			for _, r := range runs {
				if r.Window == u.window && r.Index == u.index && r.Success() {
					done = append(done, r)
				}
			}
			state := o.WindowStates[o.unitKey(u)]
			switch {
			case len(done) > 0 && state != "succeeded":
				// A succeeded row never changes hands: none was recorded.
				addUnrecorded("e: success not recorded", u, done, "window %s ran to completion but its row is %q:\n  %s", u, state, joinRuns(done))
			case len(done) == 0 && state == "succeeded":
				add("e: recorded success without a run", nil, "window %s is recorded succeeded but no run of it completed", u)
			}
		}
	}

	// (f)
	for _, v := range o.checkPauses(runs) {
		add(v.Kind, v.Pods, "%s", v.Text)
	}
	return vs
}

// grantedAt is the latest time run r's token can have been granted, as far
// as its order against run a's goes: when r started, except where a's window
// is another and the mode is schedule alone. There r's token is its
// window's claim, and r may start long after it: a pod whose claim's reply
// was held up (a paused bouncer) renews its own claim, which nobody took
// meanwhile, and runs its window late, after a later window's run elsewhere
// ended. Windows are apart in schedule mode; only a lease orders runs of a
// key by their start. The window's row bounds r's claim from above whoever
// holds it now: its claimed_at is r's own claim's (a re-entry keeps it) or a
// later take's. Within a few milliseconds only: claimed_at is the claim's
// transaction start, just before it drew its token.
func (o *Outcome) grantedAt(r, a Run) time.Time {
	if o.Plan.HasLease() || r.Window == a.Window {
		return r.Start
	}
	if c, ok := o.rowClaim(unit{r.Window, r.Index}); ok && c.ClaimedAt.Before(r.Start) {
		return c.ClaimedAt
	}
	return r.Start
}

// unit is what runs at most once: a window, or one completion index of it.
type unit struct{ window, index int }

func (u unit) String() string { return unitKey(strconv.Itoa(u.window), u.index) }

func (o *Outcome) units() []unit {
	var us []unit
	for w := range o.Plan.Windows {
		if o.Plan.Completions <= 1 || o.Plan.PlainCluster >= 0 {
			us = append(us, unit{w, -1})
		}
		if o.Plan.Completions > 1 {
			for i := range o.Plan.Completions {
				us = append(us, unit{w, i})
			}
		}
	}
	return us
}

// otherShapeClaimed tells, for a plan whose clusters disagree on the
// completion mode, that u's window was claimed in the other shape than u's
// (the database then refuses u's shape for good).
func (o *Outcome) otherShapeClaimed(u unit) bool {
	if o.Plan.PlainCluster < 0 {
		return false
	}
	_, plain := o.WindowStates[unitKey(o.Windows[u.window], -1)]
	indexed := false
	for i := range o.Plan.Completions {
		if _, ok := o.WindowStates[unitKey(o.Windows[u.window], i)]; ok {
			indexed = true
		}
	}
	if u.index < 0 {
		return indexed
	}
	return plain
}

// unitKey is u's key in WindowStates.
func (o *Outcome) unitKey(u unit) string { return unitKey(o.Windows[u.window], u.index) }

// rowClaim is unit u's row's last claim, if the schedule read its row.
func (o *Outcome) rowClaim(u unit) (WindowClaim, bool) {
	if u.window >= len(o.Windows) {
		return WindowClaim{}, false
	}
	c, ok := o.WindowClaims[o.unitKey(u)]
	return c, ok
}

// cleanClusters are the clusters whose Job for window w no fault made
// unable to run it: the bouncer was never cut while the Job lived, and none
// of its apps never started, exited non-zero or was killed.
func (o *Outcome) cleanClusters(u unit) []string {
	var clean []string
	for c := range o.Plan.Clusters {
		name := ClusterName(c)
		var from, to time.Time
		ok := false
		for _, pr := range o.Pods {
			if pr.Cluster != name || pr.Window != u.window || pr.Index != u.index {
				continue
			}
			if from.IsZero() || pr.Created.Before(from) {
				from = pr.Created
			}
			to = maxTime(to, pr.Ended)
			ok = true
			if pr.App.NeverStart || (pr.App.Exit != 0 && pr.AppRan) {
				ok = false
				break
			}
			for _, e := range o.Events {
				if e.Fault && e.Pod == pr.Name && e.Cluster == name && e.Kind == string(KillApp) {
					ok = false
				}
			}
		}
		if !ok {
			continue
		}
		if to.IsZero() {
			to = o.End
		}
		for _, cut := range o.Cuts[name] {
			if cut[0].Before(to) && from.Before(cut[1]) {
				ok = false
			}
		}
		if ok {
			clean = append(clean, name)
		}
	}
	return clean
}

// recordSlack is how long the owner's pod must have been able to reach the
// database for its failure to record a success to be the agent's fault: a
// restarted sidecar starts, connects and records in well under a second.
const recordSlack = time.Second

// unrecordable reports whether the fault log proves that the pod of the
// successful run r could not reach the database (its cluster cut, its
// bouncer restarting, PostgreSQL down, its sidecar paused or not running) at
// any time from the run's end E until its claim's liveness lapsed (at L),
// allowing healthy stretches of up to recordSlack; because says why, or why
// not. A stretch ends early where the owner's sidecar began recording the
// outcome and the record was still in flight when the outage began: the
// outage cut that record off (a slow commit on a busy machine is no fault
// of the agent's).
//
// L is not observable, so the proof bounds it. The claim is taken by
// another pod (a run decision for the window with another token, time T in
// that pod's agent log; or, earlier, a claim of the row by another pod, its
// last or one the grant log kept, time T by the database's clock: a
// standby waiting for the lease, or a pod stopped before it decided, took
// the row without a run decision) only once lapsed, so L ≤ T. And L = h + TTL, h the
// owner's last call that reached the database: so if the pod could not reach
// it during [E, M] with M = min(T, max(E+TTL, T−TTL)), then h < E (h lies at
// or before T−TTL ≤ M), so L < E+TTL ≤ M, and [E, L] ⊆ [E, M]. Without a
// take (T = ∞) a success can be recorded as long as the pod lives (recording
// does not need liveness), so M is the end of the schedule. A take before E
// means the claim was lost while the app ran: never an exception.
func (o *Outcome) unrecordable(r Run, u unit) (bool, string) {
	var pod *PodRecord
	for i := range o.Pods {
		if o.Pods[i].Cluster == r.Cluster && o.Pods[i].Name == r.Pod {
			pod = &o.Pods[i]
		}
	}
	if pod == nil {
		return false, "its pod is unknown"
	}
	e := r.End
	// The takes after the owner's own run decision (its app starts after it).
	claimed := r.Start
	if d, ok := o.runDecision(*pod, r.Token); ok {
		claimed = d
	}
	var take *decision
	for _, d := range o.takes(u, r.Token) {
		if d.At.After(claimed) {
			take = &d
			break
		}
	}
	if c, ok := o.rowClaim(u); ok && !strings.HasSuffix(c.Owner, "/"+r.Pod) && c.ClaimedAt.After(claimed) &&
		(take == nil || c.ClaimedAt.Before(take.At)) {
		take = &decision{At: c.ClaimedAt, Pod: c.Owner + "'s claim of the row", Token: c.Token}
	}
	// The grant log has every claim of the row, not only its last: a
	// standby that took it and then waited, or was stopped, before its
	// run decision, and whose claim another took in turn.
	if u.window < len(o.Windows) {
		for _, g := range o.Grants {
			if !g.Lease && g.Window == o.unitKey(u) && !strings.HasSuffix(g.Owner, "/"+r.Pod) && g.GrantedAt.After(claimed) &&
				(take == nil || g.GrantedAt.Before(take.At)) {
				take = &decision{At: g.GrantedAt, Pod: g.Owner + "'s claim (grant log)", Token: g.Token}
			}
		}
	}
	m := o.End
	if take != nil {
		if !take.At.After(e) {
			return false, fmt.Sprintf("its claim was taken by %s (token %d) at %s, before its app ended at %s",
				take.Pod, take.Token, take.At.Format("15:04:05.000"), e.Format("15:04:05.000"))
		}
		m = minTime(take.At, maxTime(e.Add(o.Settings.TTL), take.At.Add(-o.Settings.TTL)))
	}
	down := o.downSpans(*pod)
	recording := recordings(*pod, r.Token)
	var longest Span
	at := e
	for _, d := range down {
		if !d.To.After(at) {
			continue
		}
		if d.From.After(at) {
			gap := Span{at, minTime(d.From, m)}
			// A record in flight when the outage began was cut off by it:
			// the pod could reach the database only until it tried.
			for _, rec := range recording {
				if !rec.From.Before(gap.From) && rec.From.Before(gap.To) && !rec.To.Before(d.From) {
					gap.To = rec.From
					break
				}
			}
			if gap.To.Sub(gap.From) > longest.To.Sub(longest.From) {
				longest = gap
			}
		}
		at = maxTime(at, d.To)
		if !at.Before(m) {
			break
		}
	}
	if at.Before(m) {
		if gap := (Span{at, m}); gap.To.Sub(gap.From) > longest.To.Sub(longest.From) {
			longest = gap
		}
	}
	until := "the end of the schedule (nobody took the claim)"
	if take != nil {
		until = fmt.Sprintf("%s (its claim lapsed by then: %s (token %d) took it at %s)", m.Format("15:04:05.000"),
			take.Pod, take.Token, take.At.Format("15:04:05.000"))
	}
	// A sidecar that exits by itself while its pod can reach the database
	// chose not to record: however briefly the pod then lived.
	if n := len(pod.Sidecars); n > 0 {
		last := pod.Sidecars[n-1]
		if !last.To.IsZero() && !last.Killed && !last.To.Before(e) && !last.To.After(m) && !o.cutOff(*pod, last.To) {
			taken := "nobody took the claim"
			if take != nil {
				taken = fmt.Sprintf("%s (token %d) took the claim at %s", take.Pod, take.Token, take.At.Format("15:04:05.000"))
			}
			return false, fmt.Sprintf("its sidecar exited (code %d) at %s, when its pod could reach the database, without recording the success (app's end at %s; %s)",
				last.Code, last.To.Format("15:04:05.000"), e.Format("15:04:05.000"), taken)
		}
	}
	if d := longest.To.Sub(longest.From); d > recordSlack {
		return false, fmt.Sprintf("its pod could reach the database for %s (%s to %s) between the app's end at %s and %s%s",
			d.Round(time.Millisecond), longest.From.Format("15:04:05.000"), longest.To.Format("15:04:05.000"), e.Format("15:04:05.000"), until,
			sidecarExit(*pod, Span{e, m}))
	}
	var causes []string
	for _, d := range down {
		if d.To.After(e) && d.From.Before(m) && !slices.Contains(causes, d.What) {
			causes = append(causes, d.What)
		}
	}
	return true, fmt.Sprintf("its pod could not reach the database (%s) from the app's end at %s until %s",
		strings.Join(causes, ", "), e.Format("15:04:05.000"), until)
}

// violationClass names why an unrecorded success is not the exception, for
// the tally.
func violationClass(why string) string {
	switch {
	case strings.Contains(why, "before its app ended"):
		return "claim taken while the owner's app ran"
	case strings.Contains(why, "without recording the success"):
		return "owner's sidecar exited without recording"
	case strings.Contains(why, "could reach the database"):
		return "owner's pod could reach the database"
	}
	return why
}

// labelledSpan is a time the owner's pod could not reach the database, and why.
type labelledSpan struct {
	From, To time.Time
	What     string
}

// downSpans are the times pod could not reach the database, sorted by start:
// the outages that hit it and the times no sidecar of it ran through no
// choice of its own: before its first start, between incarnations (the
// kubelet's restart backoff), and after the last one if that was SIGKILLed.
// A last sidecar that exited by itself could have recorded before it did.
func (o *Outcome) downSpans(pod PodRecord) []labelledSpan {
	var ds []labelledSpan
	for _, x := range o.Outages {
		if x.hits(pod.Cluster, pod.Name) {
			ds = append(ds, labelledSpan{x.From, x.To, x.What})
		}
	}
	forever := o.End.Add(time.Hour)
	prev := time.Time{}
	for i, sc := range pod.Sidecars {
		if sc.From.After(prev) {
			ds = append(ds, labelledSpan{prev, sc.From, "sidecar not running"})
		}
		prev = sc.To
		if sc.To.IsZero() {
			prev = forever
		} else if i == len(pod.Sidecars)-1 && sc.Killed {
			ds = append(ds, labelledSpan{sc.To, forever, "sidecar killed"})
		}
	}
	slices.SortFunc(ds, func(a, b labelledSpan) int { return a.From.Compare(b.From) })
	return ds
}

// cutOff reports whether an outage cut pod off at t.
func (o *Outcome) cutOff(pod PodRecord, t time.Time) bool {
	for _, x := range o.Outages {
		if x.hits(pod.Cluster, pod.Name) && !t.Before(x.From) && !t.After(x.To) {
			return true
		}
	}
	return false
}

// sidecarExit says how pod's last sidecar ended, if it exited by itself
// within span: the reason its pod could reach the database but did not.
func sidecarExit(pod PodRecord, span Span) string {
	if n := len(pod.Sidecars); n > 0 {
		last := pod.Sidecars[n-1]
		if !last.To.IsZero() && !last.Killed && !last.To.Before(span.From) && !last.To.After(span.To) {
			return fmt.Sprintf("; its sidecar exited (code %d) at %s without recording the success", last.Code, last.To.Format("15:04:05.000"))
		}
	}
	return ""
}

// recordings are the times pod's sidecars spent recording the outcome of
// the run with token: from the agent's "recording the outcome" until it
// logged the record's end (recorded, or failed), or its next incarnation
// started, or for ever.
func recordings(pod PodRecord, token int64) []Span {
	b, err := os.ReadFile(pod.AgentLog)
	if err != nil {
		return nil
	}
	var spans []Span
	open := -1
	for _, line := range strings.Split(string(b), "\n") {
		var l struct {
			Time  time.Time `json:"time"`
			Msg   string    `json:"msg"`
			Token int64     `json:"token"`
		}
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		switch {
		case l.Msg == "recording the outcome" && l.Token == token:
			spans = append(spans, Span{l.Time, l.Time.Add(time.Hour)})
			open = len(spans) - 1
		case open >= 0 && (l.Msg == "recorded" || l.Msg == "recording the outcome failed" || l.Msg == "starting"):
			spans[open].To = l.Time
			open = -1
		}
	}
	return spans
}

// decision is one "run" decision from an agent log.
type decision struct {
	At    time.Time
	Pod   string
	Token int64
}

// runDecision is when pod's sidecar published its run decision with token.
func (o *Outcome) runDecision(pod PodRecord, token int64) (time.Time, bool) {
	for _, d := range decisions(pod) {
		if d.Token == token {
			return d.At, true
		}
	}
	return time.Time{}, false
}

// decisions are the run decisions in pod's agent log.
func decisions(pr PodRecord) []decision {
	b, err := os.ReadFile(pr.AgentLog)
	if err != nil {
		return nil
	}
	var ds []decision
	for _, line := range strings.Split(string(b), "\n") {
		var l struct {
			Time   time.Time `json:"time"`
			Msg    string    `json:"msg"`
			Action string    `json:"action"`
			Token  int64     `json:"token"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "decision" && l.Action == "run" {
			ds = append(ds, decision{At: l.Time, Pod: pr.Cluster + "/" + pr.Name, Token: l.Token})
		}
	}
	return ds
}

// takes are the run decisions of unit u's pods with a token other than
// token, by time: the claims taken from the holder of token.
func (o *Outcome) takes(u unit, token int64) []decision {
	var ds []decision
	for _, pr := range o.Pods {
		if pr.Window != u.window || pr.Index != u.index {
			continue
		}
		for _, d := range decisions(pr) {
			if d.Token != token {
				ds = append(ds, d)
			}
		}
	}
	slices.SortFunc(ds, func(a, b decision) int { return a.At.Compare(b.At) })
	return ds
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func podsOf(runs ...Run) []string {
	var ps []string
	for _, r := range runs {
		ps = append(ps, r.Cluster+"/"+r.Pod)
	}
	return ps
}

func joinRuns(runs []Run) string {
	var ss []string
	for _, r := range runs {
		ss = append(ss, r.String())
	}
	return strings.Join(ss, "\n  ")
}

// Report is the full account of a schedule with violations: the seed, the
// plan, the fault and event log, the runs and ledger, the database rows and
// the agent logs of the pods involved.
func (o *Outcome) Report(vs []Violation) string {
	var b strings.Builder
	exceptions, violations := Exceptions(vs)
	fmt.Fprintf(&b, "=== schedule seed %d (key %s, files in %s): %d violation(s), %d documented exception(s); reproduce: make chaos SEED=%d SCHEDULES=1\n",
		o.Plan.Seed, o.Key, o.Dir, len(violations), len(exceptions), o.Plan.Seed)
	for _, v := range vs {
		label := "VIOLATION"
		if v.Exception {
			label = "EXCEPTION"
		}
		fmt.Fprintf(&b, "%s %s\n  %s\n", label, v.Kind, strings.ReplaceAll(v.Text, "\n", "\n  "))
	}
	b.WriteString("--- plan\n")
	b.WriteString(o.Plan.String())
	b.WriteString("--- events (! = injected fault)\n")
	for _, e := range o.Events {
		b.WriteString(e.String() + "\n")
	}
	if len(o.Pauses) > 0 {
		b.WriteString("--- the owner's pauses of the key (database times)\n")
		for _, f := range o.Pauses {
			b.WriteString(f.String() + "\n")
		}
		for _, s := range PausedSpans(o.Pauses) {
			b.WriteString(s.String() + "\n")
		}
	}
	b.WriteString("--- jobs\n")
	for _, j := range o.Jobs {
		fmt.Fprintf(&b, "%s %s window %s: %s after %d pod(s)\n", j.Cluster, j.Name, unitKey(strconv.Itoa(j.Window), j.Index), j.Result, j.Pods)
	}
	runs, _ := o.Runs()
	b.WriteString("--- runs\n")
	for _, r := range runs {
		b.WriteString(r.String() + "\n")
	}
	b.WriteString("--- ledger\n" + o.Ledger)
	b.WriteString("--- database rows\n" + o.Rows)
	involved := map[string]bool{}
	for _, v := range vs {
		for _, p := range v.Pods {
			involved[p] = true
		}
	}
	for _, pr := range o.Pods {
		if !involved[pr.Cluster+"/"+pr.Name] {
			continue
		}
		log, err := os.ReadFile(pr.AgentLog)
		if err != nil {
			log = []byte(err.Error())
		}
		fmt.Fprintf(&b, "--- agent log of %s/%s (sidecar started %d times)\n%s", pr.Cluster, pr.Name, pr.SidecarStarts, tail(string(log), 80))
	}
	return b.String()
}

// tail keeps the last n lines of s.
func tail(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[... %d lines]\n", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "")
}

// checkPauses holds the schedule to (f).
func (o *Outcome) checkPauses(runs []Run) []Violation {
	var vs []Violation
	add := func(kind string, pods []string, format string, args ...any) {
		vs = append(vs, Violation{Kind: kind, Text: fmt.Sprintf(format, args...), Pods: pods})
	}
	var flips []string
	for _, f := range o.Pauses {
		flips = append(flips, f.String())
	}
	spans := PausedSpans(o.Pauses)
	for _, g := range o.DistinctGrants() {
		for _, s := range spans {
			if s.holds(g.GrantedAt, g.Token) {
				add("f: a run was granted while the key was paused", o.podsOwning(g.Owner),
					"%s, its check in the span the key was surely %s\n  the owner's flips:\n    %s", g, s, strings.Join(flips, "\n    "))
				break
			}
		}
	}

	var firstSent time.Time
	if len(o.Pauses) > 0 {
		firstSent = o.Pauses[0].Sent
	}
	ranIn := map[string]Run{}
	for _, r := range runs {
		ranIn[r.Cluster+"/"+r.Pod] = r
	}
	for _, pr := range o.Pods {
		id := pr.Cluster + "/" + pr.Name
		if d, ok := pausedSkip(pr); ok && (firstSent.IsZero() || d.At.Before(firstSent)) {
			add("f: a pod skipped because of a pause never set", []string{id},
				"pod %s decided at %s %q, before the owner sent any pause (first at %s)", id, d.At.Format("15:04:05.000"), d.Reason, timeOrNever(firstSent))
		}
		d, ok := firstDecision(pr)
		if !ok || !d.pausedSkip() {
			continue
		}
		// What the app container did follows the pod's first decision: it
		// starts once a decision is published, and a restarted sidecar
		// keeps a skip.
		if r, ran := ranIn[id]; ran {
			add("f: the app ran in a pod that skipped because of a pause", []string{id},
				"pod %s decided %q at %s, yet its app ran: %s", id, d.Reason, d.At.Format("15:04:05.000"), r)
		}
		if pr.AppRan && pr.AppCode != 0 && pr.DeletedWhy == "" && !o.Overran && !o.hitBy(pr, KillApp) {
			add("f: a pod that skipped because of a pause did not exit as a skip", []string{id},
				"pod %s decided %q at %s, but its app container exited %d, not 0: its Job does not succeed", id, d.Reason, d.At.Format("15:04:05.000"), pr.AppCode)
		}
	}
	vs = append(vs, o.runsStoppedByAPause(runs)...)
	return vs
}

// runsStoppedByAPause finds the Jobs completed by a pod that skipped
// because of a pause (its exit 0 was the Job's first success) while
// another of their pods ran: the Job controller deleted that pod, and a
// run already going was stopped by the pause. (A pod of the owner's Job
// waits for a live owner rather than skip, for this reason.)
func (o *Outcome) runsStoppedByAPause(runs []Run) []Violation {
	var vs []Violation
	for _, j := range o.Jobs {
		if j.Result != "succeeded" {
			continue
		}
		var pods []PodRecord
		for _, pr := range o.Pods {
			if pr.Cluster == j.Cluster && pr.Job == j.Name && pr.Window == j.Window && pr.Index == j.Index {
				pods = append(pods, pr)
			}
		}
		var completer *PodRecord
		for i, pr := range pods {
			if pr.AppRan && pr.AppCode == 0 && !pr.Ended.IsZero() && (completer == nil || pr.Ended.Before(completer.Ended)) {
				completer = &pods[i]
			}
		}
		if completer == nil {
			continue
		}
		d, ok := firstDecision(*completer)
		if !ok || !d.pausedSkip() {
			continue
		}
		for _, pr := range pods {
			if pr.Name == completer.Name || pr.DeletedWhy != "job complete" {
				continue
			}
			for _, r := range runs {
				// Going when the Job completed: its app's end, SIGTERMed
				// on the deletion, is no earlier.
				if r.Cluster == pr.Cluster && r.Pod == pr.Name && !r.Success() && r.Start.Before(completer.Ended) && !r.End.Before(completer.Ended) {
					vs = append(vs, Violation{Kind: "f: a run was stopped by a pause",
						Pods: []string{completer.Cluster + "/" + completer.Name, pr.Cluster + "/" + pr.Name},
						Text: fmt.Sprintf("pod %s of Job %s decided %q at %s and exited 0 at %s, completing its Job, whose controller deleted pod %s while its run went on:\n  %s",
							completer.Name, j.Name, d.Reason, d.At.Format("15:04:05.000"), completer.Ended.Format("15:04:05.000"), pr.Name, r)})
				}
			}
		}
	}
	return vs
}

// DistinctGrants are o.Grants without the rows' grants the grant log has
// too.
func (o *Outcome) DistinctGrants() []Grant {
	var gs []Grant
	seen := map[string]bool{}
	for _, g := range o.Grants {
		id := fmt.Sprintf("%t %s %d %d", g.Lease, g.Key, g.Token, g.GrantedAt.UnixMicro())
		if !seen[id] {
			seen[id] = true
			gs = append(gs, g)
		}
	}
	return gs
}

// pausedIn tells that a pod of unit u skipped because of a pause.
func (o *Outcome) pausedIn(u unit) bool {
	for _, pr := range o.Pods {
		if pr.Window == u.window && pr.Index == u.index {
			if _, ok := pausedSkip(pr); ok {
				return true
			}
		}
	}
	return false
}

// PausedSkips counts the pods that skipped because of a pause.
func (o *Outcome) PausedSkips() int {
	n := 0
	for _, pr := range o.Pods {
		if _, ok := pausedSkip(pr); ok {
			n++
		}
	}
	return n
}

// podsOwning are the pods whose owner string is owner.
func (o *Outcome) podsOwning(owner string) []string {
	var ps []string
	for _, pr := range o.Pods {
		if strings.HasSuffix(owner, "/"+pr.Name) {
			ps = append(ps, pr.Cluster+"/"+pr.Name)
		}
	}
	return ps
}

// hitBy tells that the nemesis injected a fault of kind into pod.
func (o *Outcome) hitBy(pod PodRecord, kind Kind) bool {
	return slices.ContainsFunc(o.Events, func(e Event) bool {
		return e.Fault && e.Kind == string(kind) && e.Cluster == pod.Cluster && e.Pod == pod.Name
	})
}

func timeOrNever(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Format("15:04:05.000")
}

// loggedDecision is one decision line of an agent log.
type loggedDecision struct {
	At     time.Time
	Action string
	Reason string
	Token  int64
}

// pausedSkip: the database answered the pod's claim or lease "paused"
// with the harness's pause, as the agent's reason quotes it ("skipped:
// window ... of <key>: paused by chaos-owner until ...", spelt by
// store.PauseText).
func (d loggedDecision) pausedSkip() bool {
	return d.Action == "skip" && strings.HasPrefix(d.Reason, "skipped: ") && strings.Contains(d.Reason, ": paused by "+pauseBy+" until ")
}

// loggedDecisions are the decision lines of pod's agent log, in order.
func loggedDecisions(pr PodRecord) []loggedDecision {
	b, err := os.ReadFile(pr.AgentLog)
	if err != nil {
		return nil
	}
	var ds []loggedDecision
	for _, line := range strings.Split(string(b), "\n") {
		var l struct {
			Time   time.Time `json:"time"`
			Msg    string    `json:"msg"`
			Action string    `json:"action"`
			Reason string    `json:"reason"`
			Token  int64     `json:"token"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "decision" {
			ds = append(ds, loggedDecision{At: l.Time, Action: l.Action, Reason: l.Reason, Token: l.Token})
		}
	}
	return ds
}

// firstDecision is the first decision pod's sidecars published: the one
// its app container acted on.
func firstDecision(pr PodRecord) (loggedDecision, bool) {
	ds := loggedDecisions(pr)
	if len(ds) == 0 {
		return loggedDecision{}, false
	}
	return ds[0], true
}

// pausedSkip is pod's first decision to skip because of a pause, if any.
func pausedSkip(pr PodRecord) (loggedDecision, bool) {
	for _, d := range loggedDecisions(pr) {
		if d.pausedSkip() {
			return d, true
		}
	}
	return loggedDecision{}, false
}
