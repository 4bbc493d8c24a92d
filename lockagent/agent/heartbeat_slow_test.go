package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/test/pgtest"
)

// A renewal slower than the agent's 5 s call bound (it queued behind a
// herd, or a commit held its row) but answered before the safety deadline
// counts: the agent waits for it instead of giving it up and sending it
// again, which would put it back at the end of the queue and, for a
// renewal already running, cost PgBouncer its server connection. With a
// TTL of 24 s a heartbeat goes out 8 s after the last renewal and may take
// until the safety deadline 8 s later; here its row is held for 6.5 s.
func TestARenewalSlowerThanTheCallBoundButInsideTheDeadlineIsWaitedFor(t *testing.T) {
	j := newJob(t, bouncerDSN(t), "schedule", 24*time.Second)
	a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(16, 0)})
	j.awaitRuns(t, "the app to start", 1)
	ctx := context.Background()
	su, err := pgx.Connect(ctx, pgtest.Need(t).SuperuserDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(ctx)
	tx, err := su.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back below
	if _, err := tx.Exec(ctx, `SELECT 1 FROM dislock.windows WHERE lock_key = $1 AND window_start = $2 FOR UPDATE`, j.key, tick0); err != nil {
		t.Fatal(err)
	}
	watch := openStore(t, pgtest.Need(t).DirectDSN())
	await(t, "the heartbeat to wait for the held row", 15*time.Second, func() bool {
		var n int
		err := watch.Handle().Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%dislock.renew(%' AND query NOT LIKE '%pg_stat_activity%'`).Scan(&n)
		return err == nil && n > 0
	})
	time.Sleep(6500 * time.Millisecond) // the slow renewal: longer than the 5 s call bound
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if code := a.finish(); code != 0 || a.decision().Action != protocol.ActionRun {
		t.Fatalf("dc-a exited %d, decision %+v:\n%s", code, a.decision(), a.agentLog)
	}
	for _, line := range strings.Split(a.agentLog.String(), "\n") {
		if strings.Contains(line, "heartbeat failed") || strings.Contains(line, "revok") {
			t.Fatalf("the slow renewal was given up on: %s\n%s", line, a.agentLog)
		}
	}
	if runs := readLedger(t, j.ledger); len(runs) != 1 {
		t.Fatalf("ledger %+v", runs)
	}
}
