package gateway_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/gateway"
	"github.com/dislock/dislock/lockagent/gateway/client"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/gatewaytest"
	"github.com/dislock/dislock/test/pgtest"
)

// blockViews holds dislock.views locked until the returned func runs: every
// call that writes a view (a decision's first step) waits on the database,
// as it would behind a herd.
func blockViews(t *testing.T, dsn string) (unblock func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE dislock.views IN EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	done := false
	unblock = func() {
		if !done {
			done = true
			_ = tx.Rollback(ctx)
			_ = conn.Close(ctx)
		}
	}
	t.Cleanup(unblock)
	return unblock
}

func recordView(ctx context.Context, c *client.Client, ns string) error {
	_, err := c.RecordView(ctx, ns+"/report", "dc-a", store.View{Schedule: "0 * * * *"}, time.Hour)
	return err
}

// A holder's renewal and outcome never wait behind other pods' decisions:
// with every decision connection stuck and more decisions queued, a
// renewal and a finish complete.
func TestRenewalsDoNotWaitBehindDecisions(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			migrated(t, tg.DSN)
			gw := gatewaytest.Start(t, tg.DSN, gateway.Config{DecisionConns: 2, RenewalConns: 1})
			ns := namespace()
			c := gw.Client(t, ns)
			ctx := context.Background()
			claim, err := c.ClaimWindow(ctx, claimRequest(ns+"/report", owner("dc-a", ns, "p")))
			if err != nil {
				t.Fatal(err)
			}
			unblock := blockViews(t, tg.DSN)
			stuck := make(chan error, 6)
			for range cap(stuck) {
				go func() { stuck <- recordView(ctx, c, ns) }()
			}
			renewCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if _, _, err := c.Heartbeat(renewCtx, ns+"/report", tick, store.NotIndexed, claim.Window.Token, time.Minute); err != nil {
				t.Fatalf("renewal behind stuck decisions: %v", err)
			}
			if _, err := c.Finish(renewCtx, ns+"/report", tick, store.NotIndexed, claim.Window.Token, store.StateSucceeded, new(int)); err != nil {
				t.Fatalf("outcome behind stuck decisions: %v", err)
			}
			select {
			case err := <-stuck:
				t.Fatalf("a decision ended while the views were locked: %v", err)
			default:
			}
			unblock()
			for range cap(stuck) {
				if err := <-stuck; err != nil {
					t.Fatalf("a queued decision, once the views were free: %v", err)
				}
			}
		})
	}
}

// A claim that queued in the gateway says how long it waited before it
// started on the database, and never more than its pod waited for it: the
// pod's safety deadline counts from that start (a herd's claims queue far
// longer than a lease's margin), and counting past it would outlive the
// database's expiry.
func TestAQueuedClaimSaysHowLongItWaitedInTheGateway(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			migrated(t, tg.DSN)
			gw := gatewaytest.Start(t, tg.DSN, gateway.Config{DecisionConns: 1})
			ns := namespace()
			c := gw.Client(t, ns)
			ctx := context.Background()
			unblock := blockViews(t, tg.DSN)
			stuck := make(chan error, 1)
			go func() { stuck <- recordView(ctx, c, ns) }()
			awaitLane(t, gw, "decisions", gateway.LaneStats{Running: 1})
			type answer struct {
				claim    store.Claim
				err      error
				sent, at time.Time
			}
			answered := make(chan answer, 1)
			go func() {
				sent := time.Now()
				claim, err := c.ClaimWindow(ctx, claimRequest(ns+"/report", owner("dc-a", ns, "p")))
				answered <- answer{claim, err, sent, time.Now()}
			}()
			awaitLane(t, gw, "decisions", gateway.LaneStats{Queued: 1, Running: 1})
			queuedAt := time.Now()
			// The claim's time in the queue, long enough to tell from a
			// call's own run.
			time.Sleep(300 * time.Millisecond)
			freedAt := time.Now()
			unblock()
			if err := <-stuck; err != nil {
				t.Fatal(err)
			}
			a := <-answered
			if a.err != nil {
				t.Fatal(a.err)
			}
			if least := freedAt.Sub(queuedAt); a.claim.Waited < least {
				t.Errorf("the claim says it waited %s; it was queued for at least %s", a.claim.Waited, least)
			}
			if most := a.at.Sub(a.sent); a.claim.Waited > most {
				t.Errorf("the claim says it waited %s; its pod waited %s for the answer", a.claim.Waited, most)
			}
			// Unqueued, the next call's wait is its own reading and checking.
			r, err := c.Renew(ctx, store.Renewal{Key: ns + "/report", Window: tick, Index: store.NotIndexed, WindowToken: a.claim.Window.Token, TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if r.Waited >= a.claim.Waited {
				t.Errorf("an unqueued renewal says it waited %s, as long as the queued claim (%s)", r.Waited, a.claim.Waited)
			}
		})
	}
}

// Past its bound a lane's queue refuses a call at once as unavailable (the
// pod retries later, as it does when the database is down), and a call
// whose pod stopped waiting before it started never runs.
func TestAFullQueueRefusesAtOnce(t *testing.T) {
	srv := pgtest.Need(t)
	migrated(t, srv.BouncerDSN())
	gw := gatewaytest.Start(t, srv.BouncerDSN(), gateway.Config{DecisionConns: 1, MaxQueued: 2, MaxQueuedPerNamespace: 2})
	ns := namespace()
	c := gw.Client(t, ns)
	ctx := context.Background()
	unblock := blockViews(t, srv.BouncerDSN())
	running := make(chan error, 1)
	go func() { running <- recordView(ctx, c, ns) }()
	// The first call holds the one connection; two more fill the queue,
	// one of them from a pod that stops waiting.
	awaitLane(t, gw, "decisions", gateway.LaneStats{Running: 1})
	leaveCtx, leave := context.WithCancel(ctx)
	left := make(chan error, 1)
	queued := make(chan error, 1)
	go func() { left <- recordView(leaveCtx, c, ns) }()
	go func() { queued <- recordView(ctx, c, ns) }()
	awaitLane(t, gw, "decisions", gateway.LaneStats{Queued: 2, Running: 1})
	start := time.Now()
	if err := recordView(ctx, c, ns); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a call past the queue: %v, want ErrUnavailable", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("a call past the queue waited %s before its refusal", waited)
	}
	leave()
	if err := <-left; !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("the call whose pod left: %v", err)
	}
	awaitLane(t, gw, "decisions", gateway.LaneStats{Queued: 1, Running: 1})
	unblock()
	for _, ch := range []chan error{running, queued} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
}

// A namespace whose renewals wait on a row its old database role keeps
// locked in an open transaction holds at most all of the renewal
// connections but one: another namespace's heartbeats go on.
func TestANamespaceStuckOnItsOwnRowLockDoesNotStallOthersRenewals(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			owner0 := migrated(t, tg.DSN)
			ctx := context.Background()
			gw := gatewaytest.Start(t, tg.DSN, gateway.Config{RenewalConns: 2})
			stuck, other := namespace(), namespace()
			sc, oc := gw.Client(t, stuck), gw.Client(t, other)
			grant, err := sc.AcquireLease(ctx, stuck+"/x", owner("dc-a", stuck, "p"), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			claim, err := oc.ClaimWindow(ctx, claimRequest(other+"/report", owner("dc-a", other, "p")))
			if err != nil {
				t.Fatal(err)
			}
			// The stuck namespace's own role, from before the gateway.
			cred, err := tenant.Provision(ctx, owner0, "dc-a", stuck)
			if err != nil {
				t.Fatal(err)
			}
			tdsn, err := tenant.DSN(tg.DSN, cred)
			if err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.Connect(ctx, tdsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // ends the lock
			if _, err := tx.Exec(ctx, "SELECT 1 FROM dislock.leases WHERE lock_key = $1 FOR UPDATE", stuck+"/x"); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				go func() {
					_, _ = sc.Renew(ctx, store.Renewal{LeaseKey: stuck + "/x", LeaseToken: grant.Lease.Token, TTL: time.Hour})
				}()
			}
			// The stuck namespace's three renewals: one running, two waiting.
			awaitLane(t, gw, "renewals", gateway.LaneStats{Queued: 2, Running: 1})
			for i := range 3 {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, _, err := oc.Heartbeat(cctx, other+"/report", tick, store.NotIndexed, claim.Window.Token, 30*time.Second)
				cancel()
				if err != nil {
					t.Fatalf("the other namespace's heartbeat %d while the stuck one waits on its own row: %v", i, err)
				}
			}
		})
	}
}

// On a schema older than migrate.ExpiriesNeverMoveBack a call the pod gave
// up on could land after its next one and move the expiry back, so the
// gateway says no call waited: the pod counts its deadline from when it
// sent the call, as it does without a gateway.
func TestOnASchemaThatMayMoveExpiriesBackNoWaitIsCounted(t *testing.T) {
	t.Parallel() // its own server: the shared one stays at the current schema
	srv := pgtest.New(t, pgtest.Options{Name: "gateway-schema"})
	st := migrated(t, srv.DirectDSN())
	ctx := context.Background()
	if _, err := st.Handle().Pool.Exec(ctx, `DELETE FROM dislock.schema_migrations WHERE version >= $1`, migrate.ExpiriesNeverMoveBack); err != nil {
		t.Fatal(err)
	}
	gw := gatewaytest.Start(t, srv.BouncerDSN(), gateway.Config{})
	ns := namespace()
	c := gw.Client(t, ns)
	claim, err := c.ClaimWindow(ctx, claimRequest(ns+"/report", owner("dc-a", ns, "p")))
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Renew(ctx, store.Renewal{Key: ns + "/report", Window: tick, Index: store.NotIndexed, WindowToken: claim.Window.Token, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Waited != 0 || r.Waited != 0 {
		t.Fatalf("on schema %d the claim says it waited %s and the renewal %s; want nothing counted", migrate.ExpiriesNeverMoveBack-1, claim.Waited, r.Waited)
	}
}
