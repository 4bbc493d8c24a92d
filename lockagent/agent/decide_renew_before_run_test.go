package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

// The lease's grant waited on its row (a commit held it) past the claim's
// safety deadline, though not past its liveness: the agent renews both
// before it runs, and that renewal must get a call's time although the
// deadline is gone, or the pod never decides.
func TestARunWhoseDeadlineWasUsedUpWaitingRenewsBeforeItRuns(t *testing.T) {
	const ttl = 6 * time.Second
	j := newJob(t, bouncerDSN(t), "schedule,lease", ttl)
	ctx := context.Background()
	// An earlier run's lease, released: the row exists, and its lock can be
	// held.
	s := openStore(t, j.dsn)
	ns, _, _ := strings.Cut(j.key, "/")
	earlier := store.Owner{Cluster: "dc-b", Namespace: ns, Job: "earlier", JobUID: "uid-earlier", Pod: "earlier-pod"}
	g, err := s.AcquireLease(ctx, j.key, earlier, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReleaseLease(ctx, j.key, g.Lease.Token); err != nil {
		t.Fatal(err)
	}
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
	if _, err := tx.Exec(ctx, `SELECT 1 FROM dislock.leases WHERE lock_key = $1 FOR UPDATE`, j.key); err != nil {
		t.Fatal(err)
	}
	// Started as j.start does, without waiting for a decision: there is
	// none while the lease waits.
	a := j.sidecar(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.2, 0)})
	a.startWrapper()
	var claimed time.Time
	await(t, "dc-a's claim, and its lease waiting for the held row", 15*time.Second, func() bool {
		w, err := s.GetWindow(ctx, j.key, tick0, store.NotIndexed)
		if err != nil {
			return false
		}
		claimed = w.ClaimedAt
		var n int
		err = s.Handle().Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%dislock.leases%'
			AND query NOT LIKE '%pg_stat_activity%'`).Scan(&n)
		return err == nil && n > 0
	})
	// Past the claim's safety deadline (TTL − TTL/3 after it was sent),
	// within its liveness (TTL).
	await(t, "the database clock past the claim's safety deadline", 15*time.Second, func() bool {
		var past bool
		return s.Handle().Pool.QueryRow(ctx, `SELECT now() > $1`, claimed.Add(ttl*3/4)).Scan(&past) == nil && past
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if code := a.finish(); code != 0 || a.decision().Action != protocol.ActionRun {
		t.Fatalf("dc-a exited %d, decision %+v:\n%s", code, a.decision(), a.agentLog)
	}
}
