package agent_test

// Recording a finished run races the claim's liveness: a success is
// recorded however late the database returns before the lapse; a started
// file of no app container does not hold the record back while the claim
// is renewed for ever; a failed app's leftovers do not run on after its
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

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

// A success is recorded if the database comes back at all before the claim
// lapses, however briefly and however late: dc-a's own bouncer goes away
// while its app runs and comes back shortly before the claim's liveness
// lapses, and standby dc-b must then skip.
//
//   - The record was retried with a growing backoff, capped at a heartbeat
//     interval: a database back for the claim's last few hundred
//     milliseconds was slept through (found by the fault schedules, seeds
//     30000151 and 50000411: PostgreSQL restarted, then PgBouncer refused
//     logins for its server_login_retry). With ttl 9 s and 1.2 s left the
//     old backoff, 3 s apart by then, missed about two times in three.
//   - Then the record was retried every 100 ms, but gave up at the stop
//     timeout (20 s), while with the default ttl (30 s) the claim lives
//     longer.
func TestASuccessIsRecordedWhenTheDatabaseReturnsBeforeTheClaimLapses(t *testing.T) {
	for _, tc := range []struct {
		name string
		ttl  time.Duration
		left time.Duration // of the claim's liveness when the bouncer is back
	}{
		{"shortly before the lapse", 9 * time.Second, 1200 * time.Millisecond},
		{"after the stop timeout", 30 * time.Second, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bn := ownBouncer(t, "record-late")
			j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", tc.ttl)
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
			await(t, fmt.Sprintf("dc-a's claim to have less than %s left", tc.left), tc.ttl+10*time.Second, func() bool {
				w, now, err := s.WindowAt(context.Background(), j.key, tick0, store.NotIndexed)
				if err != nil || w.State != store.StateRunning {
					t.Fatalf("dc-a's window while its bouncer is down: %+v (%v)", w, err)
				}
				left = w.AliveUntil.Sub(now)
				return left < tc.left
			})
			if err := bn.Start(); err != nil {
				t.Fatal(err)
			}
			t.Logf("dc-a's bouncer back with %s of the claim left (ttl %s)", left.Round(time.Millisecond), tc.ttl)
			bp := <-b
			if code := bp.finish(); code != 0 || bp.decision().Action != protocol.ActionSkip {
				t.Fatalf("VIOLATION (invariant 1): standby dc-b decided %+v (exit %d) after dc-a's app succeeded\ndc-a agent:\n%s",
					bp.decision(), code, a.agentLog)
			}
			a.waitWrapper()
			a.stopAgent()
			w, err := s.GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
			if err != nil || w.State != store.StateSucceeded || w.Token != token {
				t.Fatalf("window %+v (%v); want succeeded with dc-a's token %d", w, err, token)
			}
			if runs := readLedger(t, j.ledger); len(runs) != 1 {
				t.Fatalf("ledger: %+v", runs)
			}
		})
	}
}

// A started file of a name that is no app container of the pod (an app
// touched it) does not hold the record back: the failure is recorded and
// the claim no longer renewed, instead of renewed for ever as "unsettled".
func TestAStartedFileOfNoAppContainerDoesNotHoldTheRecordBack(t *testing.T) {
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 6*time.Second)
	a := j.start(t, podSpec{cluster: "dc-a", window: tick0, agentArgs: []string{"--stop-timeout=2s"},
		app: `touch "$DISLOCK_SHARED_DIR/started/ghost"; sleep 0.3; exit 1`,
		env: []string{contract.EnvRestartPolicy + "=" + contract.RestartNever}})
	a.waitWrapper()
	s := openStore(t, j.dsn)
	await(t, "the failure recorded while the sidecar runs", 20*time.Second, func() bool {
		w, err := s.GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
		return err == nil && w.State == store.StateFailed
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
		env: []string{contract.EnvRestartPolicy + "=" + contract.RestartNever}})
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
