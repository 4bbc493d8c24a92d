package agent_test

// Results left in the shared directory by an earlier attempt of the same app
// container (restartPolicy OnFailure) must not pass for the current
// attempt's: a container's new start clears its earlier result.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

// slowStopApp runs like app() but takes stopDelay seconds to stop on SIGTERM
// (flushing, closing connections): well within the wrapper's kill grace.
func slowStopApp(seconds, stopDelay float64) string {
	return fmt.Sprintf(`line() { echo "$1 $CLUSTER ${DISLOCK_WINDOW:-manual} ${DISLOCK_FENCING_TOKEN:-0} $(date +%%s%%N)" >> "$LEDGER"; }
line start
trap 'sleep %g; line stop; exit 143' TERM
sleep %g & wait $!
line stop
exit 0`, stopDelay, seconds)
}

// The first attempt of the app container fails before doing anything (exit
// 1, no ledger line); restartPolicy OnFailure starts it again in the same
// pod, and results/app still holds the first attempt's result.
func failedFirstAttempt(t *testing.T, po *pod, second string) {
	t.Helper()
	po.waitWrapper()
	if po.exit != 1 {
		t.Fatalf("first attempt exited %d, want 1:\n%s", po.exit, po.wrapperLog)
	}
	po.spec.app = second
	po.startWrapper() // the kubelet restarts the app container (OnFailure)
}

// A sidecar stopped while its app runs (as in
// TestASidecarStoppedWhileItsAppRunsStopsTheAppBeforeAStandbyTakesOver),
// in a pod whose app container was restarted by OnFailure: once,
// finishRun revokes and then waits for every started app's result — but
// "has a result" is read from results/<container>, which still holds the
// FIRST attempt's exit 1. So awaitResults settles at once while the second
// attempt is still shutting down inside its kill grace, the window is
// recorded failed, and dc-b's waiting standby takes it over and starts
// while dc-a's app still runs.
func TestAnEarlierAttemptsResultDoesNotLetAStandbyRunAlongside(t *testing.T) {
	const ttl = 12 * time.Second // margin 4s, kill grace 2s
	j := newJob(t, bouncerDSN(t), "schedule", ttl)
	j.standby = true
	a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: "exit 1"})
	failedFirstAttempt(t, a, slowStopApp(30, 1.8))
	j.awaitRuns(t, "dc-a's second attempt to start", 1)
	b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(3, 0)})
	await(t, "dc-b to wait", 10*time.Second, func() bool { return strings.Contains(b.agentLog.String(), "waiting: standby") })
	a.stopAgent() // the sidecar is stopped while its app runs
	a.startAgent()
	a.waitWrapper()
	b.finish()
	a.stopAgent()
	runs := readLedger(t, j.ledger)
	w, _ := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
	t.Logf("ledger %+v; window %s token %d; dc-a termination message %q", runs, w.State, w.Token, a.terminationMessage())
	assertNoOverlap(t, runs)
}

// The same stale result in schedule,lease mode: once, finishRun released the
// key's lease while the second attempt is still stopping, and the next
// window's Job (same cluster) takes the lease and runs: two runs of a key
// overlap although the mode includes lease.
func TestAnEarlierAttemptsResultDoesNotReleaseTheLeaseWhileTheAppRuns(t *testing.T) {
	const ttl = 12 * time.Second
	j := newJob(t, bouncerDSN(t), "schedule,lease", ttl)
	a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: "exit 1"})
	failedFirstAttempt(t, a, slowStopApp(30, 1.8))
	j.awaitRuns(t, "dc-a's second attempt to start", 1)
	a.stopAgent() // the sidecar is stopped while its app runs
	// The next window's Job starts now.
	next := j.start(t, podSpec{cluster: "dc-a", window: tick0.Add(time.Hour), app: app(1, 0),
		env: []string{"CLUSTER=dc-a-next"}})
	a.startAgent()
	a.waitWrapper()
	next.finish()
	a.stopAgent()
	runs := readLedger(t, j.ledger)
	t.Logf("ledger %+v; next window decided %s (%s)", runs, next.decision().Action, next.decision().Reason)
	assertNoOverlap(t, runs)
}
