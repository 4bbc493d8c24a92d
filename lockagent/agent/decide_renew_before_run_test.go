package agent_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/gateway"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/gatewaytest"
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
	release := holdLocked(t, `SELECT 1 FROM dislock.leases WHERE lock_key = $1 FOR UPDATE`, j.key)
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
		err = s.Handle().Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%dislock.acquire_lease(%'
			AND query NOT LIKE '%pg_stat_activity%'`).Scan(&n)
		return err == nil && n > 0
	})
	// Past the claim's safety deadline (TTL − TTL/3 after it was sent),
	// within its liveness (TTL).
	await(t, "the database clock past the claim's safety deadline", 15*time.Second, func() bool {
		var past bool
		return s.Handle().Pool.QueryRow(ctx, `SELECT now() > $1`, claimed.Add(ttl*3/4)).Scan(&past) == nil && past
	})
	release()
	if code := a.finish(); code != 0 || a.decision().Action != protocol.ActionRun {
		t.Fatalf("dc-a exited %d, decision %+v:\n%s", code, a.decision(), a.agentLog)
	}
}

// A claim that queued in its lock gateway longer than the lease's margin —
// a herd's claims do — reaches its pod with the deadline counted from when
// the claim started on the database, not from when the pod sent it: the
// pod runs without first renewing behind the same herd, and its deadline
// still ends before the database's expiry.
func TestAClaimThatQueuedInTheGatewayRunsWithoutRenewingFirst(t *testing.T) {
	const ttl = 3 * time.Second // a deadline ttl − margin = 2 s after the claim starts
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			j := newJob(t, tg.DSN, "schedule", ttl)
			ns, _, _ := strings.Cut(j.key, "/")
			var mu sync.Mutex
			var renewedAt []int64 // CLOCK_MONOTONIC ns of each renewal's answer
			gw := gatewaytest.Start(t, j.dsn, gateway.Config{Cluster: "dc-a", DecisionConns: 1,
				Observe: func(call, answer string, _ time.Duration) {
					if call == "renew" {
						mu.Lock()
						renewedAt = append(renewedAt, protocol.MonotonicNow())
						mu.Unlock()
					}
				}})
			j.gateways = map[string]*gatewaytest.Gateway{"dc-a": gw}
			// Another call holds the gateway's one decision connection,
			// stuck on the views' lock, so the pod's claim queues.
			ctx := context.Background()
			release := holdLocked(t, "LOCK TABLE dislock.views IN EXCLUSIVE MODE")
			c := gw.Client(t, ns)
			stuck := make(chan error, 1)
			go func() {
				_, err := c.RecordView(ctx, ns+"/other", "dc-a", store.View{Schedule: "* * * * *"}, time.Hour)
				stuck <- err
			}()
			awaitGatewayLane(t, gw, gateway.LaneStats{Running: 1})
			po := j.sidecar(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.2, 0)})
			po.startWrapper()
			awaitGatewayLane(t, gw, gateway.LaneStats{Queued: 1, Running: 1})
			queuedAt := protocol.MonotonicNow()
			// The claim waits in the queue past ttl − margin.
			time.Sleep(ttl)
			release()
			if err := <-stuck; err != nil {
				t.Fatal(err)
			}
			if code := po.finish(); code != 0 {
				t.Fatalf("the app's container exited %d:\n%s\n%s", code, po.agentLog, po.wrapperLog)
			}
			d := po.decision()
			if d.Action != protocol.ActionRun {
				t.Fatalf("decision %+v, want run", d)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, at := range renewedAt {
				if at < d.DecidedAt {
					t.Errorf("the pod renewed %s before it decided to run, behind the queue its claim waited in", time.Duration(d.DecidedAt-at))
				}
			}
			if d.DecidedAt-queuedAt < int64(ttl-ttl/3) {
				t.Fatalf("the claim was answered %s after it queued, within the deadline a claim earns: the story proves nothing", time.Duration(d.DecidedAt-queuedAt))
			}
		})
	}
}

// awaitGatewayLane waits until gw's decisions lane is doing exactly want.
func awaitGatewayLane(t *testing.T, gw *gatewaytest.Gateway, want gateway.LaneStats) {
	t.Helper()
	await(t, fmt.Sprintf("the gateway's decisions lane at %+v", want), 30*time.Second, func() bool {
		return gw.Server.Lanes()["decisions"] == want
	})
}

// holdLocked runs statement as the superuser in a transaction it keeps
// open, so that what the statement locks stays locked until release (or
// the test's end) rolls it back.
func holdLocked(t *testing.T, statement string, args ...any) (release func()) {
	t.Helper()
	ctx := context.Background()
	su, err := pgx.Connect(ctx, pgtest.Need(t).SuperuserDSN())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := su.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, statement, args...); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = tx.Rollback(ctx)
			_ = su.Close(ctx)
		})
	}
	t.Cleanup(release)
	return release
}
