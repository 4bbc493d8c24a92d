package gateway_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/gateway"
	"github.com/dislock/dislock/lockagent/gateway/client"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/gatewaytest"
	"github.com/dislock/dislock/test/pgtest"
)

// The gateway takes a namespace's credentials from the database, as the
// webhook mints them: a new one works within a second of its commit, a
// superseded one until it is retired, a retired one no more once the cache
// has let it go, and a made-up one never.
func TestTheGatewayTakesTheCredentialsTheWebhookMints(t *testing.T) {
	srv := pgtest.Need(t)
	owner0 := migrated(t, srv.BouncerDSN())
	ctx := context.Background()
	var reads atomic.Int64
	creds := &gateway.DatabaseCredentials{CacheFor: 200 * time.Millisecond,
		Lookup: func(ctx context.Context, ns string) ([][sha256.Size]byte, error) {
			reads.Add(1)
			return tenant.GatewayDigests(ctx, owner0, "dc-a", ns)
		}}
	gw := gatewaytest.Start(t, srv.BouncerDSN(), gateway.Config{Cluster: "dc-a", Credentials: creds})
	ns := namespace()
	now := func(secret string) error {
		c, err := client.Dial(gw.URLWith(ns, secret))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Now(ctx)
		return err
	}
	awaitAnswer := func(what, secret string, ok bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := now(secret)
			if (err == nil) == ok {
				if !ok && !errors.Is(err, store.ErrForbidden) {
					t.Fatalf("%s: %v, want ErrForbidden", what, err)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v after 10s", what, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	awaitAnswer("before any credential", "made-up", false)
	first, err := tenant.ProvisionGateway(ctx, owner0, "dc-a", ns)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	awaitAnswer("the first credential", first.Secret, true)
	if waited := time.Since(start); waited > 3*time.Second {
		t.Errorf("a new credential worked %s after its commit, want within about a second", waited)
	}
	second, err := tenant.ProvisionGateway(ctx, owner0, "dc-a", ns)
	if err != nil {
		t.Fatal(err)
	}
	awaitAnswer("the second credential", second.Secret, true)
	awaitAnswer("the superseded credential within its grace", first.Secret, true)
	if _, err := tenant.Retire(ctx, owner0, "dc-a", ns, 0); err != nil {
		t.Fatal(err)
	}
	awaitAnswer("the retired credential", first.Secret, false)
	awaitAnswer("the current credential after the retirement", second.Secret, true)
	before := reads.Load()
	for range 20 {
		if err := now("guess"); !errors.Is(err, store.ErrForbidden) {
			t.Fatalf("a guess: %v", err)
		}
	}
	if n := reads.Load() - before; n > 2 {
		t.Errorf("20 guesses within a moment read the database %d times, want at most a read a second", n)
	}
}
