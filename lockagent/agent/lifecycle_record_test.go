package agent_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/spec"
	"github.com/dislock/dislock/test/pgtest"
)

// The kubelet restarts a SIGKILLed sidecar; if the app ends a moment later,
// the pod ends and the restarted sidecar is stopped at once — possibly before
// the Go runtime let it install its signal handler, which kills it without a
// word. A success the pod ends on must therefore already be in the database:
// the app container exits only once the agent recorded it. Otherwise the
// window stays running, lapses, and a standby runs it again (invariant 1;
// found by the fault schedules, seeds 13000007 and 20261290).
func TestTheAppContainerExitsOnlyOnceItsSuccessIsRecorded(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		j := newJob(t, dsn, "schedule,lease", 3*time.Second)
		j.standby = true
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.5, 0)})
		j.awaitRuns(t, "dc-a's app to start", 1)
		a.agent.Process.Kill() // SIGKILL / OOM kill while the app runs
		<-a.agentDone
		dir := protocol.Dir(a.dir)
		await(t, "the app to end and its wrapper to report", 10*time.Second, func() bool {
			r, err := dir.ReadResults()
			return err == nil && len(r) == 1
		})
		a.startAgent() // the kubelet restarts the sidecar
		a.waitWrapper()
		// The pod ends now: the kubelet stops the sidecar, which may die
		// of the signal before it can handle it.
		a.agent.Process.Kill()
		<-a.agentDone
		w, err := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, lock.NotIndexed)
		if err != nil || w.State != lock.StateSucceeded {
			t.Fatalf("VIOLATION (invariant 1): the app container exited %d while its window was %+v (%v): a standby may run it again\nagent:\n%s\nwrapper:\n%s",
				a.exit, w, err, a.agentLog, a.wrapperLog)
		}
		if a.exit != 0 {
			t.Fatalf("the app container exited %d, want 0:\n%s", a.exit, a.wrapperLog)
		}
	})
}

// The wait for the record is bounded: with the sidecar dead for good, the app
// container exits once the safety deadline passed, and the Job ends
// (invariant 4). A failing second container ends the wait too: its failure
// is recorded when the pod stops, as every failure is.
func TestTheWaitForTheRecordEnds(t *testing.T) {
	t.Run("the sidecar stays dead", func(t *testing.T) {
		j := newJob(t, bouncerDSN(t), "schedule", 3*time.Second)
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.5, 0)})
		j.awaitRuns(t, "dc-a's app to start", 1)
		a.agent.Process.Kill()
		<-a.agentDone
		a.waitWrapper()
		if a.exit != 0 || !strings.Contains(a.wrapperLog.String(), "stopped waiting for the agent to record the success") {
			t.Fatalf("the app container exited %d; want 0 after saying why it stopped waiting:\n%s", a.exit, a.wrapperLog)
		}
	})
	t.Run("another container failed", func(t *testing.T) {
		j := newJob(t, bouncerDSN(t), "schedule", 3*time.Second)
		j.extra = append(j.extra, spec.EnvAppContainers+"=app,other")
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.5, 0)})
		other := exec.Command(filepath.Join(a.dir, protocol.BinPath), "exec", "--name", "other", "--", "/bin/sh", "-c", "exit 3")
		other.Env = a.env
		if err := other.Run(); other.ProcessState == nil || other.ProcessState.ExitCode() != 3 {
			t.Fatalf("the other container: %v", err)
		}
		a.waitWrapper()
		if a.exit != 0 || !strings.Contains(a.wrapperLog.String(), "container other failed") {
			t.Fatalf("the app container exited %d; want 0 without waiting for a record:\n%s", a.exit, a.wrapperLog)
		}
		a.stopAgent()
		w, err := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, lock.NotIndexed)
		if err != nil || w.State != lock.StateFailed {
			t.Fatalf("window %+v (%v); want failed", w, err)
		}
	})
	t.Run("the pod is deleted", func(t *testing.T) {
		bn := ownBouncer(t, "record-wait-sigterm")
		j := newJob(t, bn.DSN(), "schedule", 30*time.Second)
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.2, 0)})
		j.awaitRuns(t, "dc-a's app to start", 1)
		if err := bn.Pause(); err != nil { // the agent cannot record
			t.Fatal(err)
		}
		t.Cleanup(func() { bn.Resume() })
		await(t, "the wrapper to wait for the record", 10*time.Second, func() bool {
			return strings.Contains(a.wrapperLog.String(), "waiting for the agent to record the success")
		})
		if err := a.wrapper.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		a.waitWrapper()
		if a.exit != 0 || !strings.Contains(a.wrapperLog.String(), "while waiting for the agent to record the success") {
			t.Fatalf("the app container exited %d after SIGTERM; want 0 (the app had succeeded) and why:\n%s", a.exit, a.wrapperLog)
		}
	})
}

// A success is recorded if the database comes back at all before the claim
// lapses, however briefly. The agent retried the record with a growing
// backoff, capped at a heartbeat interval; a database back for the last
// few hundred milliseconds of the claim was slept through, the claim lapsed,
// and a standby ran the window again (invariant 1; found by the fault
// schedules, seeds 30000151 and 50000411: PostgreSQL restarted, then
// PgBouncer refused logins for its server_login_retry). The record is now
// retried every 100 ms while it races the claim.
//
// dc-a's own bouncer goes away while its app runs and comes back once less
// than 1.2 s of the claim's liveness (ttl 9 s) is left: with the old backoff
// (3 s apart by then) the next try fell after the lapse about two times in
// three.
func TestASuccessIsRecordedWhenTheDatabaseReturnsShortlyBeforeTheClaimLapses(t *testing.T) {
	bn := ownBouncer(t, "record-late")
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 9*time.Second)
	j.standby = true
	ja := j
	ja.dsn = bn.DSN()
	a := ja.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(1, 0)})
	j.awaitRuns(t, "dc-a's app to start", 1)
	token := a.decision().Token
	if err := bn.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bn.Start() })
	b := j.startAsync(t, podSpec{cluster: "dc-b", window: tick0, app: app(0, 0)})
	s := openStore(t, j.dsn)
	var left time.Duration
	await(t, "dc-a's claim to have less than 1.2 s left", 15*time.Second, func() bool {
		w, now, err := s.WindowAt(context.Background(), j.key, tick0, lock.NotIndexed)
		if err != nil || w.State != lock.StateRunning {
			t.Fatalf("dc-a's window while its bouncer is down: %+v (%v)", w, err)
		}
		left = w.AliveUntil.Sub(now)
		return left < 1200*time.Millisecond
	})
	if err := bn.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("dc-a's bouncer back with %s of the claim left", left.Round(time.Millisecond))
	bp := <-b
	if code := bp.finish(); code != 0 || bp.decision().Action != protocol.ActionSkip {
		t.Fatalf("VIOLATION (invariant 1): standby dc-b decided %+v (exit %d) after dc-a's app succeeded\ndc-a agent:\n%s",
			bp.decision(), code, a.agentLog)
	}
	a.waitWrapper()
	a.stopAgent()
	w, err := s.GetWindow(context.Background(), j.key, tick0, lock.NotIndexed)
	if err != nil || w.State != lock.StateSucceeded || w.Token != token {
		t.Fatalf("window %+v (%v); want succeeded with dc-a's token %d", w, err, token)
	}
	if runs := readLedger(t, j.ledger); len(runs) != 1 {
		t.Fatalf("ledger: %+v", runs)
	}
}
