package gateway_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/gateway"
	"github.com/dislock/dislock/lockagent/gateway/client"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/gatewaytest"
	"github.com/dislock/dislock/test/pgtest"
)

// A namespace's pods reach only their own namespace's locks: every call
// that names a key of another namespace, an owner of another namespace or
// a cluster the gateway does not serve is refused as ErrForbidden before it
// reaches the database, and nothing of the other namespace changes.
func TestANamespaceReachesOnlyItsOwnKeys(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			owner0 := migrated(t, tg.DSN)
			gw := gatewaytest.Start(t, tg.DSN, gateway.Config{Cluster: "dc-a"})
			victim, attacker := namespace(), namespace()
			ctx := context.Background()
			key := victim + "/report"
			held, err := gw.Client(t, victim).ClaimWindow(ctx, claimRequest(key, owner("dc-a", victim, "p1")))
			if err != nil {
				t.Fatal(err)
			}
			c := gw.Client(t, attacker)
			mine := owner("dc-a", attacker, "p2")
			calls := map[string]func() error{
				"claim another's key": func() error {
					_, err := c.ClaimWindow(ctx, claimRequest(key, mine))
					return err
				},
				"claim as another's owner": func() error {
					_, err := c.ClaimWindow(ctx, claimRequest(attacker+"/report", owner("dc-a", victim, "p2")))
					return err
				},
				"claim as another cluster": func() error {
					_, err := c.ClaimWindow(ctx, claimRequest(attacker+"/report", owner("dc-b", attacker, "p2")))
					return err
				},
				"claim a key that is only the prefix": func() error {
					_, err := c.ClaimWindow(ctx, claimRequest(attacker+"/", mine))
					return err
				},
				"claim a key whose namespace merely starts alike": func() error {
					_, err := c.ClaimWindow(ctx, claimRequest(attacker+"x/report", owner("dc-a", attacker+"x", "p2")))
					return err
				},
				"read another's window": func() error {
					_, _, err := c.WindowAt(ctx, key, tick, store.NotIndexed)
					return err
				},
				"take another's lease": func() error {
					_, err := c.AcquireLease(ctx, key, mine, 30*time.Second)
					return err
				},
				"renew another's window": func() error {
					_, err := c.Renew(ctx, store.Renewal{Key: key, Window: tick, Index: store.NotIndexed, WindowToken: held.Window.Token, TTL: time.Hour})
					return err
				},
				"renew another's lease": func() error {
					_, err := c.Renew(ctx, store.Renewal{LeaseKey: key, LeaseToken: 1, TTL: time.Hour})
					return err
				},
				"finish another's window": func() error {
					_, err := c.Finish(ctx, key, tick, store.NotIndexed, held.Window.Token, store.StateFailed, nil)
					return err
				},
				"release another's lease": func() error {
					_, err := c.ReleaseLease(ctx, key, 1)
					return err
				},
				"record another's view": func() error {
					_, err := c.RecordView(ctx, key, "dc-a", store.View{Schedule: "0 * * * *"}, time.Hour)
					return err
				},
				"record a view as another cluster": func() error {
					_, err := c.RecordView(ctx, attacker+"/report", "dc-b", store.View{Schedule: "0 * * * *"}, time.Hour)
					return err
				},
				"record another's decision": func() error {
					return c.RecordDecision(ctx, store.Decision{Key: key, Cluster: "dc-a", Job: "j", Pod: "p", Action: store.ActionSkip, Reason: "forged"})
				},
			}
			for name, call := range calls {
				err := call()
				if !errors.Is(err, store.ErrForbidden) {
					t.Errorf("%s: %v, want ErrForbidden", name, err)
				}
			}
			row, err := owner0.GetWindow(ctx, key, tick, store.NotIndexed)
			if err != nil || row.Owner != held.Window.Owner || row.State != store.StateRunning || !row.AliveUntil.Equal(held.Window.AliveUntil) {
				t.Fatalf("the victim's window changed: %+v (%v), claimed %+v", row, err, held.Window)
			}
			if _, _, err := owner0.GetLease(ctx, key); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("the victim's key got a lease: %v", err)
			}
		})
	}
}

// A call without the namespace's current credential is refused, and the
// answer names the Secret it comes from without echoing the credential.
func TestACallWithoutTheNamespacesCredentialIsRefused(t *testing.T) {
	srv := pgtest.Need(t)
	migrated(t, srv.BouncerDSN())
	gw := gatewaytest.Start(t, srv.BouncerDSN(), gateway.Config{})
	ns := namespace()
	for name, secret := range map[string]string{
		"another namespace's": gatewaytest.Secret(namespace()),
		"a guessed one":       "hunter2",
	} {
		c, err := client.Dial(gw.URLWith(ns, secret))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.ClaimWindow(context.Background(), claimRequest(ns+"/report", owner("dc-a", ns, "p")))
		if !errors.Is(err, store.ErrForbidden) || errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s credential: %v, want ErrForbidden", name, err)
		}
		if err != nil && (strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "Secret")) {
			t.Errorf("%s credential: the answer %q echoes the credential or does not name the Secret", name, err)
		}
		c.Close()
	}
}
