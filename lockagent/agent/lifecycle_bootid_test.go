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

// R6 with /proc/sys/kernel/random/boot_id unreadable to the agent
// (protocol.BootID returns "", "then boots are not told apart"): the agent
// writes its deadline and decision without a boot id, so after a node
// reboot the wrapper takes the old boot's monotonic deadline (hours ahead)
// at face value and the restarted agent does not notice the reboot either.
// The files below are exactly what such an agent wrote; the decision's TTL
// still tells the wrapper that a deadline hours ahead cannot be this boot's.
func TestWithoutABootIDAnOldDeadlineFurtherAheadThanTheTTLStillCountsAsPassed(t *testing.T) {
	srv := pgtest.Need(t)
	bn, err := srv.AddBouncer(fmt.Sprintf("review2-boot-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	j := newJob(t, srv.BouncerDSN(), "schedule", 2*time.Second)
	j.standby = true
	ja := j
	ja.dsn = bn.DSN()
	a := ja.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(30, 0)})
	await(t, "dc-a's app to start", 10*time.Second, func() bool { return len(readLedger(t, j.ledger)) == 1 })
	a.wrapper.Process.Signal(syscall.SIGTERM)
	a.waitWrapper()
	a.agent.Process.Kill()
	<-a.agentDone
	b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(3, 0)})
	await(t, "dc-b's app to start", 15*time.Second, func() bool { return len(readLedger(t, j.ledger)) == 2 })
	if err := bn.Stop(); err != nil {
		t.Fatal(err)
	}
	// Files of the previous boot, written by an agent that could not read
	// the boot id: no boot id anywhere.
	if err := os.WriteFile(filepath.Join(a.dir, protocol.DeadlineFile), []byte(fmt.Sprintf("%d\n", protocol.MonotonicNow()+int64(time.Hour))), 0o644); err != nil {
		t.Fatal(err)
	}
	d := a.decision()
	d.BootID = ""
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
