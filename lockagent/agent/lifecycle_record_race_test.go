package agent_test

// Recording a finished run races the claim's liveness. What a hostile review
// of the steady record retry proved at first: a success lost because the
// record gave up at the stop timeout, well before the claim lapsed; a
// started file of no app container holding the record back while the claim
// was renewed for ever; a failed app's leftovers running on after its
// failure was recorded.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/spec"
	"github.com/dislock/dislock/test/pgtest"
)

// With the default TTL (30 s) the claim outlives the stop timeout (20 s): a
// record that gave up at the stop timeout slept through a database back 5 s
// before the lapse, and the standby ran the window again. The record now
// goes on until the claim can no longer be alive, and the app container
// waits for it as long.
func TestASuccessIsRecordedWhenTheDatabaseReturnsAfterTheStopTimeoutButBeforeTheLapse(t *testing.T) {
	bn := ownBouncer(t, "record-after-stop-timeout")
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 30*time.Second)
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
	await(t, "dc-a's claim to have less than 5 s left", 40*time.Second, func() bool {
		w, now, err := s.WindowAt(context.Background(), j.key, tick0, lock.NotIndexed)
		if err != nil || w.State != lock.StateRunning {
			t.Fatalf("dc-a's window while its bouncer is down: %+v (%v)", w, err)
		}
		left = w.AliveUntil.Sub(now)
		return left < 5*time.Second
	})
	if err := bn.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("dc-a's bouncer back with %s of the claim left, more than 20 s after the app ended", left.Round(time.Millisecond))
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
}

// A started file of a name that is no app container of the pod (an app
// touched it) does not hold the record back: the failure is recorded and
// the claim no longer renewed, instead of renewed for ever as "unsettled".
func TestAStartedFileOfNoAppContainerDoesNotHoldTheRecordBack(t *testing.T) {
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 6*time.Second)
	a := j.start(t, podSpec{cluster: "dc-a", window: tick0, agentArgs: []string{"--stop-timeout=2s"},
		app: `touch "$DISLOCK_SHARED_DIR/started/ghost"; sleep 0.3; exit 1`,
		env: []string{spec.EnvRestartPolicy + "=" + spec.RestartNever}})
	a.waitWrapper()
	s := openStore(t, j.dsn)
	await(t, "the failure recorded while the sidecar runs", 20*time.Second, func() bool {
		w, err := s.GetWindow(context.Background(), j.key, tick0, lock.NotIndexed)
		return err == nil && w.State == lock.StateFailed
	})
	a.stopAgent()
}

// A failed app's leftovers (a process it put in the background) are stopped
// before its result is out: under restartPolicy Never the agent records the
// failure at once, and another pod may take the window while they would
// still act.
func TestAFailedAppsLeftoversAreStoppedBeforeItsFailureIsRecorded(t *testing.T) {
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 6*time.Second)
	pidFile := filepath.Join(t.TempDir(), "leftover.pid")
	a := j.start(t, podSpec{cluster: "dc-a", window: tick0,
		app: `sleep 300 >/dev/null 2>&1 & echo $! > "` + pidFile + `"; sleep 0.2; exit 1`,
		env: []string{spec.EnvRestartPolicy + "=" + spec.RestartNever}})
	a.waitWrapper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// The wrapper is not PID 1 here, so nothing but its kill stops it; a
	// killed process stays a zombie until its new parent reaps it.
	if alive(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("the failed app's background process %d still runs after its wrapper reported and exited", pid)
	}
	a.stopAgent()
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
