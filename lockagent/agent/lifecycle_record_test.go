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
