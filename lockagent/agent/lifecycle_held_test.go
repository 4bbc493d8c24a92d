package agent_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
)

// Pod lifecycles that threaten "at most once per window" and held from the
// start; kept so that they keep holding.

// The sidecar gives the claim up (app-start timeout), is then stopped and
// restarted by the kubelet; the app container finally starts. The revocation
// stands: the late app does not run, and the standby runs the window once.
func TestAGivenUpClaimStaysGivenUpAfterASidecarRestart(t *testing.T) {
	j := newJob(t, bouncerDSN(t), "schedule,lease", 2*time.Second)
	j.standby = true
	j.extra = append(j.extra, contract.EnvAppStartTimeout+"=2s")
	a := j.sidecar(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.2, 0)})
	await(t, "dc-a to give up", 15*time.Second, func() bool { return strings.Contains(a.terminationMessage(), "gave the claim up") })
	a.stopAgent()
	a.startAgent()
	b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(0.2, 0)})
	a.startWrapper()
	if code := a.finish(); code != 75 {
		t.Fatalf("late app container exited %d", code)
	}
	if code := b.finish(); code != 0 || b.decision().Action != protocol.ActionRun {
		t.Fatalf("dc-b %d %+v", code, b.decision())
	}
	if runs := readLedger(t, j.ledger); len(runs) != 1 || runs[0].cluster != "dc-b" {
		t.Fatalf("ledger %+v", runs)
	}
}

// Schedule,lease with standby: the owner's sidecar is SIGKILLed and
// restarted within the safety deadline; it re-enters with the same token, the
// standby keeps waiting and then skips on success: one run, no overlap.
func TestASidecarRestartedWithinItsDeadlineReentersWithTheSameToken(t *testing.T) {
	j := newJob(t, bouncerDSN(t), "schedule,lease", 3*time.Second)
	j.standby = true
	a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(3, 0)})
	j.awaitRuns(t, "dc-a's app", 1)
	b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(0.2, 0)})
	tok := a.decision().Token
	a.agent.Process.Kill()
	<-a.agentDone
	a.startAgent()
	if code := a.finish(); code != 0 {
		t.Fatalf("dc-a exited %d", code)
	}
	if code := b.finish(); code != 0 || b.decision().Action != protocol.ActionSkip {
		t.Fatalf("dc-b %d %+v", code, b.decision())
	}
	w, err := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
	if err != nil || w.State != store.StateSucceeded || a.decision().Token != tok {
		t.Fatalf("window %+v %v", w, err)
	}
	if runs := readLedger(t, j.ledger); len(runs) != 1 {
		t.Fatalf("ledger %+v", runs)
	}
}

// A replacement pod of the same Job races the owner in schedule,lease
// mode; the owner is stopped mid-run like a drained node (app SIGTERMed
// first, then the sidecar). The replacement waits and takes over after the
// failure with a larger token; no overlap.
func TestAReplacementPodWaitsForTheDrainedOwnerInScheduleLeaseMode(t *testing.T) {
	j := newJob(t, bouncerDSN(t), "schedule,lease", 3*time.Second)
	first := podSpec{cluster: "dc-a", window: tick0, jobName: "job-1", podName: "job-1-aaaaa", app: app(5, 0)}
	a := j.start(t, first)
	j.awaitRuns(t, "A's app", 1)
	second := replacement(first, "job-1-bbbbb")
	second.app = app(0.3, 0)
	b := j.start(t, second)
	a.wrapper.Process.Signal(syscall.SIGTERM)
	a.finish()
	if code := b.finish(); code != 0 || b.decision().Action != protocol.ActionRun {
		t.Fatalf("B %d %+v", code, b.decision())
	}
	assertNoOverlap(t, readLedger(t, j.ledger))
}
