package gateway_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/gateway"
	"github.com/dislock/dislock/lockagent/gateway/client"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/gatewaytest"
	"github.com/dislock/dislock/test/pgtest"
)

// Through the gateway every answer means what the database's does: a
// refusal carries the holder and matches the store's error, so the agent
// decides as it would on its own connection.
func TestAnswersKeepTheirMeaningAcrossTheGateway(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			migrated(t, tg.DSN)
			gwA := gatewaytest.Start(t, tg.DSN, gateway.Config{Cluster: "dc-a"})
			gwB := gatewaytest.Start(t, tg.DSN, gateway.Config{Cluster: "dc-b"})
			ns := namespace()
			key := ns + "/report"
			a, b := gwA.Client(t, ns), gwB.Client(t, ns)
			ctx := context.Background()
			won, err := a.ClaimWindow(ctx, claimRequest(key, owner("dc-a", ns, "pa")))
			if err != nil || won.Outcome != store.Claimed || won.Window.Token <= 0 {
				t.Fatalf("first claim: %+v, %v", won, err)
			}
			lost, err := b.ClaimWindow(ctx, claimRequest(key, owner("dc-b", ns, "pb")))
			if !errors.Is(err, store.ErrWindowTaken) || lost.Window.Owner != won.Window.Owner || lost.Window.Cluster != "dc-a" {
				t.Fatalf("second cluster's claim: %+v, %v; want ErrWindowTaken naming dc-a's owner", lost, err)
			}
			again, err := a.ClaimWindow(ctx, claimRequest(key, owner("dc-a", ns, "pa")))
			if err != nil || again.Outcome != store.Reentered || again.Window.Token != won.Window.Token {
				t.Fatalf("the same pod again: %+v, %v; want re-entry with token %d", again, err, won.Window.Token)
			}
			stale := claimRequest(key, owner("dc-a", ns, "pa"))
			stale.Window, stale.MaxLate = tick.Add(-24*time.Hour), time.Minute
			if c, err := a.ClaimWindow(ctx, stale); !errors.Is(err, store.ErrWindowStale) || c.DBTime.IsZero() {
				t.Fatalf("a stale window: %+v, %v; want ErrWindowStale with the database time", c, err)
			}
			grant, err := a.AcquireLease(ctx, key, owner("dc-a", ns, "pa"), time.Minute)
			if err != nil || grant.Lease.Token <= won.Window.Token {
				t.Fatalf("lease: %+v, %v", grant, err)
			}
			held, err := b.AcquireLease(ctx, key, owner("dc-b", ns, "pb"), time.Minute)
			if !errors.Is(err, store.ErrLeaseHeld) || held.Lease.Owner != grant.Lease.Owner {
				t.Fatalf("another cluster's lease: %+v, %v; want ErrLeaseHeld naming the holder", held, err)
			}
			if _, err := a.Renew(ctx, store.Renewal{LeaseKey: key, LeaseToken: grant.Lease.Token + 1, TTL: time.Minute}); !errors.Is(err, store.ErrLeaseLost) {
				t.Fatalf("renewing a lease not held: %v, want ErrLeaseLost", err)
			}
			if _, _, err := a.WindowAt(ctx, key, tick.Add(time.Minute), store.NotIndexed); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("reading a window nobody claimed: %v, want ErrNotFound", err)
			}
			r, err := a.Renew(ctx, store.Renewal{Key: key, Window: tick, Index: store.NotIndexed, WindowToken: won.Window.Token,
				LeaseKey: key, LeaseToken: grant.Lease.Token, TTL: time.Minute})
			if err != nil || !r.WindowUntil.After(won.Window.AliveUntil) || r.LeaseUntil.IsZero() {
				t.Fatalf("renewal: %+v, %v", r, err)
			}
			if ok, err := a.ReleaseLease(ctx, key, grant.Lease.Token); !ok || err != nil {
				t.Fatalf("release: %v, %v", ok, err)
			}
			code := 0
			if _, err := a.Finish(ctx, key, tick, store.NotIndexed, won.Window.Token, store.StateSucceeded, &code); err != nil {
				t.Fatal(err)
			}
			if _, _, err := a.Heartbeat(ctx, key, tick, store.NotIndexed, won.Window.Token, time.Minute); !errors.Is(err, store.ErrWindowLost) {
				t.Fatalf("a heartbeat after the outcome: %v, want ErrWindowLost", err)
			}
			if err := a.RecordDecision(ctx, store.Decision{Key: key, Window: tick, Index: store.NotIndexed, Cluster: "dc-a", Job: "report-1", Pod: "pa",
				Action: store.ActionSucceeded, Reason: "exit 0", Token: won.Window.Token, Duration: 3 * time.Second}); err != nil {
				t.Fatal(err)
			}
			now, err := a.Now(ctx)
			if err != nil || now.Before(won.DBTime) {
				t.Fatalf("the database's clock: %v, %v (the claim's %v)", now, err, won.DBTime)
			}
		})
	}
}

// A claim whose pod stopped waiting still runs to its end on the
// gateway's connection, so nothing between the gateway and PostgreSQL sees
// a statement abandoned mid-flight; the pod, which could not know whether
// it won, asks again and re-enters its own claim with the same token.
func TestAClaimWhosePodStoppedWaitingRunsToItsEnd(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			owner0 := migrated(t, tg.DSN)
			gw := gatewaytest.Start(t, tg.DSN, gateway.Config{})
			ns := namespace()
			key := ns + "/report"
			c := gw.Client(t, ns)
			req := claimRequest(key, owner("dc-a", ns, "p"))
			req.View = &store.View{Schedule: "0 * * * *", Mode: "schedule"}
			unblock := blockViews(t, tg.DSN)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := c.ClaimWindow(ctx, req)
				done <- err
			}()
			awaitLane(t, gw, "decisions", gateway.LaneStats{Running: 1}) // the claim started
			cancel()
			if err := <-done; !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("the abandoned claim: %v, want ErrUnavailable", err)
			}
			unblock()
			var row store.Window
			deadline := time.Now().Add(20 * time.Second)
			for {
				w, err := owner0.GetWindow(context.Background(), key, tick, store.NotIndexed)
				if err == nil {
					row = w
					break
				}
				if !errors.Is(err, store.ErrNotFound) || time.Now().After(deadline) {
					t.Fatalf("the abandoned claim's row: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			again, err := c.ClaimWindow(context.Background(), req)
			if err != nil || again.Outcome != store.Reentered || again.Window.Token != row.Token {
				t.Fatalf("asking again: %+v, %v; want re-entry with token %d", again, err, row.Token)
			}
		})
	}
}

// A gateway that does not answer is an unreachable database to the pod:
// ErrUnavailable, which it retries and, past its bound, decides error.
func TestAGatewayThatDoesNotAnswerIsUnavailable(t *testing.T) {
	c, err := client.Dial("https://ns:secret@127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Now(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("%v, want ErrUnavailable", err)
	}
}

// The agent's heartbeat names the lease's key even when its mode takes no
// lease (token 0): through the gateway, as on the database, that renews the
// window alone and succeeds.
func TestARenewalOfAWindowAloneSucceedsThroughTheGateway(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			direct := migrated(t, tg.DSN)
			ctx := context.Background()
			gw := gatewaytest.Start(t, tg.DSN, gateway.Config{Cluster: "dc-a"})
			ns := namespace()
			c := gw.Client(t, ns)
			key := ns + "/report"
			claim, err := c.ClaimWindow(ctx, claimRequest(key, owner("dc-a", ns, "p")))
			if err != nil {
				t.Fatal(err)
			}
			hb := store.Renewal{Key: key, Window: tick, Index: store.NotIndexed, WindowToken: claim.Window.Token, LeaseKey: key, TTL: 30 * time.Second}
			if _, err := direct.Renew(ctx, hb); err != nil {
				t.Fatalf("on the database: %v", err)
			}
			r, err := c.Renew(ctx, hb)
			if err != nil || r.WindowUntil.IsZero() || !r.LeaseUntil.IsZero() {
				t.Fatalf("through the gateway: %+v, %v; want the window renewed alone", r, err)
			}
		})
	}
}

// The gateway speaks HTTP/1.1 only, whatever the caller offers: HTTP/2
// would carry 250 calls at once for one handshake.
func TestTheGatewaySpeaksNoHTTP2(t *testing.T) {
	srv := pgtest.Need(t)
	migrated(t, srv.BouncerDSN())
	gw := gatewaytest.Start(t, srv.BouncerDSN(), gateway.Config{})
	u, err := url.Parse(gw.URL("team"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", u.Host, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // only the protocol is looked at
	if err != nil {
		if strings.Contains(err.Error(), "no application protocol") {
			return // refused outright
		}
		t.Fatal(err)
	}
	defer conn.Close()
	if p := conn.ConnectionState().NegotiatedProtocol; p == "h2" {
		t.Fatalf("a caller offering only h2 got %q", p)
	}
}
