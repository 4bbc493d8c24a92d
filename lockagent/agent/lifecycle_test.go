package agent_test

// Pod lifecycles that broke the ownership protocol: each test replays an
// execution, reachable by a real pod's lifecycle, that broke one of the four
// invariants of the design before it was fixed. They run through PgBouncer,
// the production path; the lock statements themselves are tested direct and
// through PgBouncer in package store.

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

func bouncerDSN(t *testing.T) string { return pgtest.Need(t).BouncerDSN() }

func decisionOf(po *pod) (protocol.Decision, bool) {
	d, ok, _ := protocol.Dir(po.dir).ReadDecision()
	return d, ok
}

// A pod that claimed its window and waits for the lease, which another
// pod of its Job still holds (here a pod that is only in the database: its
// replacement started while it terminates). Its sidecar is stopped while it
// waits and restarted by the kubelet. A stop before a decision once recorded
// the claimed window "failed", and the restarted sidecar then found "claimed
// by this pod and is failed" and skipped: the window never ran. The claim is
// now left to lapse, and the restarted sidecar re-enters it.
func TestAPodStoppedWhileWaitingForTheLeaseRunsAfterItsRestart(t *testing.T) {
	j := newJob(t, bouncerDSN(t), "schedule,lease", 3*time.Second)
	s := openStore(t, j.dsn)
	ctx := context.Background()
	spec1 := podSpec{cluster: "dc-a", window: tick0, jobName: "job-1", podName: "job-1-bbbbb", app: app(0.2, 0)}
	old := store.Owner{Cluster: "dc-a", Namespace: strings.SplitN(j.key, "/", 2)[0], Job: "job-1", JobUID: "uid-dc-a-job-1", Pod: "job-1-aaaaa"}
	held, err := s.AcquireLease(ctx, j.key, old, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	p := j.sidecar(t, spec1)
	await(t, "the pod to wait for the lease", 10*time.Second, func() bool {
		return strings.Contains(p.agentLog.String(), "lease must be released or expire first")
	})
	p.stopAgent() // SIGTERM while waiting: decides nothing
	if _, ok := decisionOf(p); ok {
		t.Fatalf("a decision was written on a stop while waiting")
	}
	p.startAgent() // the kubelet restarts the sidecar
	p.startWrapper()
	await(t, "the restarted pod to wait for the lease again", 10*time.Second, func() bool {
		return strings.Count(p.agentLog.String(), "lease must be released or expire first") == 2
	})
	if _, err := s.ReleaseLease(ctx, j.key, held.Lease.Token); err != nil { // the old pod is gone
		t.Fatal(err)
	}
	if code := p.finish(); code != 0 || p.decision().Action != protocol.ActionRun {
		t.Fatalf("after the restart: exit %d, decision %+v", code, p.decision())
	}
	if runs := readLedger(t, j.ledger); len(runs) != 1 {
		t.Fatalf("ledger %+v, want one run", runs)
	}
}

// Schedule mode, standby. dc-a's sidecar receives SIGTERM while its app
// is still running (a sidecar restart while the pod lives: the lifecycle
// story 2 relies on). record() assumes the apps exited: it finds no result,
// records the window "failed" and exits — without writing `revoked`. dc-a's
// app keeps running on its old deadline (up to TTL−margin) and, after the
// kubelet restarts the sidecar, until the wrapper notices the revocation;
// meanwhile dc-b's waiting standby takes the failed window and runs it.
func TestASidecarStoppedWhileItsAppRunsStopsTheAppBeforeAStandbyTakesOver(t *testing.T) {
	j := newJob(t, bouncerDSN(t), "schedule", 3*time.Second)
	j.standby = true
	a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(5, 0)})
	j.awaitRuns(t, "dc-a's app to start", 1)
	b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(1, 0)})
	await(t, "dc-b to wait", 10*time.Second, func() bool { return strings.Contains(b.agentLog.String(), "waiting: standby") })
	a.stopAgent()  // SIGTERM to the sidecar; dc-a's app is still running
	a.startAgent() // the kubelet restarts the sidecar
	a.finish()
	b.finish()
	runs := readLedger(t, j.ledger)
	t.Logf("ledger: %+v", runs)
	t.Logf("dc-a agent log:\n%s", a.agentLog)
	assertNoOverlap(t, runs)
}

// Schedule mode, no standby; the Job's pod uses restartPolicy
// OnFailure. Pod A runs (token t1); its sidecar dies (SIGKILL/OOM) and stays
// down longer than the TTL (restart backoff, or restarted but unable to reach
// the database); the wrapper kills the app at the deadline. A replacement pod
// B of the same Job takes the lapsed window (t2) and fails. A's sidecar comes
// back: resume() calls ClaimWindow, which — B being of the same Job and
// failed — TAKES the window over with a new token t3, and resume() accepts
// that without comparing it with the decision's token. The decision file
// still says run with t1, no `revoked`, and a fresh deadline: the app
// container restarted by the kubelet runs the window with the stale token t1
// after B ran with t2 (invariant 3), and the run succeeds under t1.
func TestASidecarBackAfterItsClaimLapsedNeverRunsTheAppWithAStaleToken(t *testing.T) {
	j := newJob(t, bouncerDSN(t), "schedule", 3*time.Second)
	first := podSpec{cluster: "dc-a", window: tick0, jobName: "job-1", podName: "job-1-aaaaa", app: app(30, 0)}
	a := j.start(t, first)
	j.awaitRuns(t, "A's app to start", 1)
	a.agent.Process.Kill() // sidecar SIGKILLed / OOM-killed
	<-a.agentDone
	a.waitWrapper() // the wrapper stops the app at the deadline
	t.Logf("A's wrapper exited %d after its sidecar died", a.exit)
	second := replacement(first, "job-1-bbbbb")
	second.app = app(0.2, 1)
	b := j.start(t, second)
	if code := b.finish(); code != 1 {
		t.Fatalf("B exited %d", code)
	}
	a.startAgent() // the kubelet finally restarts A's sidecar
	await(t, "A's sidecar to resume", 10*time.Second, func() bool {
		return strings.Contains(a.agentLog.String(), "restarted: resuming")
	})
	await(t, "A's restarted sidecar to revoke its lapsed claim", 10*time.Second, func() bool {
		revoked, _ := protocol.Dir(a.dir).Revoked()
		return revoked
	})
	a.spec.app = app(0.2, 0)
	a.startWrapper() // restartPolicy OnFailure: the app container starts again
	code := a.finish()
	if code != 75 {
		t.Fatalf("A's restarted app container exited %d, want 75 (not run):\n%s", code, a.wrapperLog)
	}
	w, _ := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
	runs := readLedger(t, j.ledger)
	t.Logf("A's second start exited %d with decision token %d; window row %+v; ledger %+v", code, a.decision().Token, w, runs)
	if len(runs) > 2 {
		// successive runs: A(t1), B(t2), A again (t1?)
		last, prev := runs[len(runs)-1], runs[len(runs)-2]
		if last.token <= prev.token {
			t.Fatalf("VIOLATION (invariant 3): run %+v after run %+v carries an older fencing token; the database's token for the window is %d (state %s)",
				last, prev, w.Token, w.State)
		}
	}
}

// Schedule mode, standby. dc-a's app exits 0 while its lease is valid.
// Before the kubelet stops the sidecar, dc-a's database connection drops for
// longer than TTL−margin: the agent revokes (nothing is running any more).
// The database comes back and the sidecar gets its SIGTERM: outcome() turns
// the known, timely success into "failed: the lease was lost during the run"
// and records the window failed — and dc-b's standby runs the window a
// second time. Two successful runs of one window (invariant 1), although
// dc-a's success was known and recordable.
func TestASuccessBeforeARevocationIsRecordedAsASuccess(t *testing.T) {
	bn := ownBouncer(t, "review-r4")
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 3*time.Second)
	j.standby = true
	// The app containers unknown to the agent (a pod injected without the
	// list): it records only at its SIGTERM, and the wrapper does not wait.
	// With them known the success is recorded before the app container
	// exits, and this revocation cannot come between.
	j.extra = append(j.extra, contract.EnvAppContainers+"=")
	ja := j
	ja.dsn = bn.DSN()
	a := ja.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.2, 0)})
	a.waitWrapper()
	if a.exit != 0 {
		t.Fatalf("dc-a's app exited %d", a.exit)
	}
	if err := bn.Stop(); err != nil { // dc-a loses the database for a few seconds
		t.Fatal(err)
	}
	await(t, "dc-a to revoke", 10*time.Second, func() bool { return strings.Contains(a.agentLog.String(), "lease lost: stopping the app") })
	if err := bn.Start(); err != nil {
		t.Fatal(err)
	}
	a.stopAgent() // the kubelet stops the sidecar
	w, _ := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
	t.Logf("after dc-a's record: window %s (termination message %q)", w.State, a.terminationMessage())
	b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(0.2, 0)})
	b.finish()
	runs := readLedger(t, j.ledger)
	if len(runs) > 1 {
		t.Fatalf("VIOLATION (invariant 1): the window ran to a successful end twice: %+v; dc-a recorded %s though its app had exited 0 before the revocation; dc-b decided %s",
			runs, w.State, b.decision().Action)
	}
}

// Two app containers; one of them never starts (its image cannot be
// pulled). The app-start check is satisfied by any started/* mark, so the
// claim is kept and heartbeated for as long as the pod lives, i.e. forever:
// the waiting standby in dc-b waits past the app-start timeout + TTLs and the
// window never ends (invariant 4; story 3 in a two-container pod).
func TestASecondAppContainerThatNeverStartsGivesTheWindowUp(t *testing.T) {
	j := newJob(t, bouncerDSN(t), "schedule", 2*time.Second)
	j.standby = true
	j.extra = append(j.extra, contract.EnvAppStartTimeout+"=2s", contract.EnvAppContainers+"=one,two", contract.EnvContainerName+"=one")
	a := j.sidecar(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.2, 0)})
	a.startWrapper() // container "one" starts and finishes; container "two" never starts
	a.waitWrapper()
	b := j.sidecar(t, podSpec{cluster: "dc-b", window: tick0, app: app(0.2, 0)})
	limit := 2*time.Second + 3*2*time.Second + 2*time.Second
	deadline := time.Now().Add(limit)
	for _, ok := decisionOf(b); !ok && time.Now().Before(deadline); _, ok = decisionOf(b) {
		time.Sleep(50 * time.Millisecond) // polling for a condition, not waiting out a time
	}
	if _, ok := decisionOf(b); !ok {
		t.Fatalf("VIOLATION (invariant 4): dc-b's standby still waits %s after dc-a's run decision (app-start timeout 2s, ttl 2s): dc-a's second container never started and dc-a keeps the window alive", limit)
	}
}

// The kubelet stops the sidecar the moment the app exits, which is also the
// moment the agent records the success. A slow database at that instant (its
// PgBouncer paused) must not let the SIGTERM cut the recording short: the
// window ends succeeded, not running until it lapses to a standby.
func TestASIGTERMWhileTheSuccessIsBeingRecordedDoesNotLoseIt(t *testing.T) {
	bn := ownBouncer(t, "sigterm-record")
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 5*time.Second)
	ja := j
	ja.dsn = bn.DSN()
	a := ja.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(1, 0)})
	j.awaitRuns(t, "dc-a's app to start", 1)
	if err := bn.Pause(); err != nil {
		t.Fatal(err)
	}
	a.waitWrapper()
	// The agent starts recording with revoking: the run is over.
	await(t, "the agent to start recording", 10*time.Second, func() bool {
		revoked, _ := protocol.Dir(a.dir).Revoked()
		return revoked
	})
	if err := a.agent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := bn.Resume(); err != nil {
		t.Fatal(err)
	}
	<-a.agentDone
	w, err := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
	if err != nil || w.State != store.StateSucceeded {
		t.Fatalf("window after a SIGTERM during the recording: %+v, %v; want succeeded\n%s", w, err, a.agentLog)
	}
}

// A sidecar restarted while its pod cannot reach the database, and stopped
// (the app having succeeded) before it could re-enter its claim, still
// records the success with its earlier process's token once the database
// answers: the decision carries the claims' tokens. It once left the window
// running until it lapsed, and a standby ran it again. (Found by the fault
// schedules.)
func TestARestartedSidecarStoppedBeforeItReenteredStillRecordsTheSuccess(t *testing.T) {
	bn := ownBouncer(t, "resume-record")
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 5*time.Second)
	ja := j
	ja.dsn = bn.DSN()
	a := ja.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(1, 0)})
	j.awaitRuns(t, "dc-a's app to start", 1)
	a.agent.Process.Kill()
	<-a.agentDone
	if err := bn.Stop(); err != nil {
		t.Fatal(err)
	}
	a.startAgent() // the kubelet restarts it; it cannot re-enter yet
	a.waitWrapper()
	if a.exit != 0 {
		t.Fatalf("the app exited %d", a.exit)
	}
	if err := a.agent.Process.Signal(syscall.SIGTERM); err != nil { // the pod ends
		t.Fatal(err)
	}
	if err := bn.Start(); err != nil {
		t.Fatal(err)
	}
	<-a.agentDone
	w, err := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
	if err != nil || w.State != store.StateSucceeded {
		t.Fatalf("window: %+v, %v; want succeeded\n%s", w, err, a.agentLog)
	}
}
