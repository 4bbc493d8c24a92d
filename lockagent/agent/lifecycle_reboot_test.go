package agent_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/test/pgtest"
)

// R6: a node reboot. A pod's emptyDir survives a node reboot, and a Job pod
// with restartPolicy OnFailure has its containers started again in the same
// pod; the startupProbe passes at once (the binary is still installed).
// CLOCK_MONOTONIC starts again at boot, so a deadline from before the reboot
// reads as hours away, and the old "run" decision is still there. Every
// monotonic instant therefore carries the boot it belongs to: the wrapper
// treats a deadline of another boot as passed, and the restarted agent
// revokes a decision of another boot. Here the node comes back before its
// route to the database, while a standby legitimately runs the window.
func TestAfterANodeRebootTheOldDeadlineNoLongerLetsTheAppRun(t *testing.T) {
	srv := pgtest.Need(t)
	bn, err := srv.AddBouncer(fmt.Sprintf("reboot-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	j := newJob(t, srv.BouncerDSN(), "schedule", 2*time.Second)
	j.standby = true
	ja := j
	ja.dsn = bn.DSN()
	a := ja.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(30, 0)})
	await(t, "dc-a's app to start", 10*time.Second, func() bool { return len(readLedger(t, j.ledger)) == 1 })

	// The node goes down: the app is stopped, the sidecar dies without recording.
	a.wrapper.Process.Signal(syscall.SIGTERM)
	a.waitWrapper()
	a.agent.Process.Kill()
	<-a.agentDone

	// dc-b's standby takes the lapsed window over and runs it.
	b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(3, 0)})
	await(t, "dc-b's app to start", 15*time.Second, func() bool { return len(readLedger(t, j.ledger)) == 2 })

	// The node is back, its network to the database not yet.
	if err := bn.Stop(); err != nil {
		t.Fatal(err)
	}
	// What the files from before the reboot look like now: a deadline and a
	// decision of another boot, whose monotonic instants lie hours ahead.
	const oldBoot = "00000000-0000-0000-0000-000000000000"
	if err := os.WriteFile(filepath.Join(a.dir, protocol.DeadlineFile), []byte(fmt.Sprintf("%d %s\n", protocol.MonotonicNow()+int64(time.Hour), oldBoot)), 0o644); err != nil {
		t.Fatal(err)
	}
	d := a.decision()
	d.BootID = oldBoot
	if err := protocol.Dir(a.dir).WriteDecision(d); err != nil {
		t.Fatal(err)
	}
	a.spec.agentArgs = []string{"--start-timeout=4s"}
	a.spec.app = app(1, 0)
	a.startAgent()
	a.awaitProbe()
	a.startWrapper()
	a.waitWrapper()
	b.finish()
	if err := bn.Start(); err != nil {
		t.Fatal(err)
	}
	a.stopAgent()
	runs := readLedger(t, j.ledger)
	t.Logf("ledger %+v; dc-a's restarted wrapper exited %d", runs, a.exit)
	assertNoOverlap(t, runs)
}
