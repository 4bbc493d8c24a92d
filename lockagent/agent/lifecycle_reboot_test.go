package agent_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/test/pgtest"
)

// A node reboot. A pod's emptyDir survives a node reboot, and a Job pod
// with restartPolicy OnFailure has its containers started again in the same
// pod; the startupProbe passes at once (the binary is still installed).
// CLOCK_MONOTONIC starts again at boot, so a deadline from before the reboot
// reads as hours away, and the old "run" decision is still there. Every
// monotonic instant therefore carries the boot it belongs to: the wrapper
// treats a deadline of another boot as passed, and the restarted agent
// revokes a decision of another boot. Where the boot id cannot be read, the
// decision's TTL still tells the wrapper that a deadline further ahead than
// one renewal can give is not of this boot. Here the node comes back before
// its route to the database, while a standby legitimately runs the window.
func TestAfterANodeRebootTheOldDeadlineNoLongerLetsTheAppRun(t *testing.T) {
	for _, tc := range []struct{ name, bootID string }{
		{"with the boot id", "00000000-0000-0000-0000-000000000000"},
		{"without a boot id", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bn := ownBouncer(t, "reboot")
			j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 2*time.Second)
			j.standby = true
			ja := j
			ja.dsn = bn.DSN()
			a := ja.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(30, 0)})
			j.awaitRuns(t, "dc-a's app to start", 1)

			// The node goes down: the app is stopped, the sidecar dies without recording.
			a.wrapper.Process.Signal(syscall.SIGTERM)
			a.waitWrapper()
			a.agent.Process.Kill()
			<-a.agentDone

			// dc-b's standby takes the lapsed window over and runs it.
			b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(3, 0)})
			await(t, "dc-b's app to start", 15*time.Second, func() bool { return len(readLedger(t, j.ledger)) == 2 })

			// The node is back, its network to the database not yet. The
			// files from before the reboot: a deadline and a decision of
			// the old boot, whose monotonic instants now lie hours ahead.
			if err := bn.Stop(); err != nil {
				t.Fatal(err)
			}
			line := strings.TrimSpace(fmt.Sprintf("%d %s", protocol.MonotonicNow()+int64(time.Hour), tc.bootID))
			if err := os.WriteFile(filepath.Join(a.dir, protocol.DeadlineFile), []byte(line+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			d := a.decision()
			d.BootID = tc.bootID
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
			if a.exit != 75 {
				t.Errorf("dc-a's app container after the reboot exited %d, want 75 (not run)", a.exit)
			}
			assertNoOverlap(t, readLedger(t, j.ledger))
		})
	}
}
