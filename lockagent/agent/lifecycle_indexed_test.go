package agent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
)

// Indexed Job, schedule,lease, standby, two healthy clusters. With a lease
// per key (as it once was) rather than per (key, index): dc-a's index 0 holds it while it runs.
// dc-b's pod for index 1 claims window/index 1 first (a fresh claim, not a
// takeover), finds the lease held by another Job and — taking it for "an
// earlier run still going" — marks window/index 1 SKIPPED. dc-a's pod for
// index 1 then finds it skipped and skips too. Index 1 of this window never
// runs anywhere, though standby is on and every cluster is healthy
// (invariant 2; docs: "each index runs once across clusters").
func TestEachIndexOfAnIndexedJobHasItsOwnLease(t *testing.T) {
	j := newJob(t, bouncerDSN(t), "schedule,lease", 3*time.Second)
	j.standby = true
	a0 := j.start(t, podSpec{cluster: "dc-a", window: tick0, jobName: "job-a", podName: "job-a-0", app: app(3, 0),
		env: []string{contract.EnvJobIndex + "=0", "CLUSTER=dc-a-index-0"}})
	j.awaitRuns(t, "dc-a index 0 to run", 1)
	b1 := j.start(t, podSpec{cluster: "dc-b", window: tick0, jobName: "job-b", podName: "job-b-1", app: app(0.2, 0),
		env: []string{contract.EnvJobIndex + "=1", "CLUSTER=dc-b-index-1"}})
	a1 := j.start(t, podSpec{cluster: "dc-a", window: tick0, jobName: "job-a", podName: "job-a-1", app: app(0.2, 0),
		env: []string{contract.EnvJobIndex + "=1", "CLUSTER=dc-a-index-1"}})
	a0.finish()
	b1.finish()
	a1.finish()
	w1, err := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, 1)
	ran := map[string]int{}
	for _, r := range readLedger(t, j.ledger) {
		ran[r.cluster]++
	}
	t.Logf("runs %v; dc-b index 1: %s %q; dc-a index 1: %s %q; window index 1 %+v %v",
		ran, b1.decision().Action, b1.decision().Reason, a1.decision().Action, a1.decision().Reason, w1, err)
	if ran["dc-a-index-1"]+ran["dc-b-index-1"] != 1 || w1.State != store.StateSucceeded {
		t.Fatalf("VIOLATION (invariant 2): index 1 of the window ran %d times (window state %s) with standby on and both clusters healthy",
			ran["dc-a-index-1"]+ran["dc-b-index-1"], w1.State)
	}
}

// A CronJob rolled out with completionMode Indexed in dc-b while dc-a still
// runs it plain. dc-a's pod claimed (key, W, -1) and lease "key"; dc-b's
// index 0 claimed (key, W, 0) and lease "key#0": different rows and leases,
// so both ran, and in schedule,lease they overlapped. Whichever shape comes
// second skips, and says the clusters disagree on completionMode.
func TestAPlainAndAnIndexedPodOfOneWindowNeverBothRun(t *testing.T) {
	for _, mode := range []string{"schedule", "schedule,lease", "lease"} {
		for _, indexedFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, indexed first %t", mode, indexedFirst), func(t *testing.T) {
				j := newJob(t, bouncerDSN(t), mode, 3*time.Second)
				plain := podSpec{cluster: "dc-a", window: tick0, jobName: "job-a", podName: "job-a-x", app: app(2, 0),
					env: []string{"CLUSTER=dc-a"}}
				indexed := podSpec{cluster: "dc-b", window: tick0, jobName: "job-b", podName: "job-b-0", app: app(2, 0),
					env: []string{contract.EnvJobIndex + "=0", contract.EnvCompletions + "=2", "CLUSTER=dc-b"}}
				first, second := plain, indexed
				if indexedFirst {
					first, second = indexed, plain
				}
				p1 := j.start(t, first)
				j.awaitRuns(t, first.cluster+" to run", 1)
				p2 := j.start(t, second)
				p1.finish()
				p2.finish()
				runs := readLedger(t, j.ledger)
				d := p2.decision()
				t.Logf("runs %+v; %s decided %s %q", runs, second.cluster, d.Action, d.Reason)
				if len(runs) != 1 || runs[0].cluster != first.cluster {
					t.Fatalf("VIOLATION (invariant 1): the window ran %d times (%+v), want once, in %s", len(runs), runs, first.cluster)
				}
				if d.Action != protocol.ActionSkip || !strings.Contains(d.Reason, "completionMode") || !strings.Contains(p2.terminationMessage(), "completionMode") {
					t.Fatalf("%s decided %s %q (termination message %q), want a skip naming completionMode",
						second.cluster, d.Action, d.Reason, p2.terminationMessage())
				}
			})
		}
	}
}
