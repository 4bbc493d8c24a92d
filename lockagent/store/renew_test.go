package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"
)

// A pod holding a window and a lease renews both in one call, each by its
// own token: what is still the pod's is renewed, and what it lost is
// reported so that the pod stops, even when the other half renewed.
func TestRenewExtendsTheWindowAndTheLeaseByTheirOwnTokens(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		key := storetest.UniqueKey(t)
		o := storetest.Owner("dc-a", "job", "pod")
		c := storetest.MustClaim(t, s, key, storetest.WindowAt(0), o, false, storetest.TTL, store.Claimed)
		g, err := s.AcquireLease(ctx, key, o, storetest.TTL)
		if err != nil {
			t.Fatal(err)
		}
		both := store.Renewal{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed, WindowToken: c.Window.Token,
			LeaseKey: key, LeaseToken: g.Lease.Token, TTL: time.Hour}
		r, err := s.Renew(ctx, both)
		if err != nil {
			t.Fatal(err)
		}
		if r.WindowUntil != r.DBTime.Add(time.Hour) || r.LeaseUntil != r.DBTime.Add(time.Hour) {
			t.Fatalf("renewed %+v; want both expiries an hour after the database time", r)
		}
		w, err := s.GetWindow(ctx, key, storetest.WindowAt(0), store.NotIndexed)
		if err != nil || !w.AliveUntil.Equal(r.WindowUntil) {
			t.Fatalf("the window's row: %+v, %v; want alive until %s", w, err, r.WindowUntil)
		}

		// A token that is not the pod's renews nothing.
		stale := both
		stale.WindowToken, stale.LeaseToken = c.Window.Token+1, g.Lease.Token+1
		if _, err := s.Renew(ctx, stale); !errors.Is(err, store.ErrWindowLost) {
			t.Fatalf("renewal by tokens the pod was not granted: %v, want ErrWindowLost", err)
		}
		if w, err := s.GetWindow(ctx, key, storetest.WindowAt(0), store.NotIndexed); err != nil || !w.AliveUntil.Equal(r.WindowUntil) {
			t.Fatalf("after a renewal by another token the window is alive until %s (%v), want %s", w.AliveUntil, err, r.WindowUntil)
		}

		// The window finished: its loss is reported, and the lease, still
		// the pod's, is renewed all the same.
		if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, c.Window.Token, store.StateSucceeded, nil); err != nil {
			t.Fatal(err)
		}
		both.TTL = 2 * time.Hour
		if _, err := s.Renew(ctx, both); !errors.Is(err, store.ErrWindowLost) {
			t.Fatalf("renewing a finished window: %v, want ErrWindowLost", err)
		}
		l, _, err := s.GetLease(ctx, key)
		if err != nil || !l.ExpireAt.After(r.LeaseUntil) {
			t.Fatalf("the lease: %+v, %v; want it renewed past %s", l, err, r.LeaseUntil)
		}
		lease := store.Renewal{LeaseKey: key, LeaseToken: g.Lease.Token, TTL: time.Hour}
		if _, err := s.Renew(ctx, lease); err != nil {
			t.Fatalf("renewing the lease alone: %v", err)
		}
	})
}

// The renewal runs with its owner's rights, past row-level security, so it
// checks the caller's namespace itself: a tenant role renews nothing of
// another namespace, even with the right tokens, and a role in the tenants'
// group with no live namespace (made by hand, or retired) renews nothing at
// all, as the policies show it no row.
func TestARenewalReachesOnlyTheCallersNamespace(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		owner := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		nsA, nsB := storetest.Namespace(t, "renew-a"), storetest.Namespace(t, "renew-b")
		a := storetest.TenantStore(t, dsn, storetest.Provision(t, owner, nsA))
		key := nsB + "/job"
		o := storetest.Owner("dc-a", "job", "pod")
		c := storetest.MustClaim(t, owner, key, storetest.WindowAt(0), o, false, storetest.TTL, store.Claimed)
		g, err := owner.AcquireLease(ctx, key, o, storetest.TTL)
		if err != nil {
			t.Fatal(err)
		}
		foreign := store.Renewal{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed, WindowToken: c.Window.Token,
			LeaseKey: key, LeaseToken: g.Lease.Token, TTL: time.Hour}

		super := storetest.Superuser(t, pgtest.Need(t))
		role := "renew_by_hand_" + nsA[len(nsA)-4:]
		for _, q := range []string{
			"CREATE ROLE " + pgx.Identifier{role}.Sanitize() + " LOGIN PASSWORD 'by-hand' IN ROLE " + tenant.GroupRole,
			"ALTER ROLE " + pgx.Identifier{role}.Sanitize() + " SET search_path = pg_catalog, pg_temp",
		} {
			if _, err := super.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { super.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize()) }) //nolint:errcheck // best effort
		byHand := storetest.TenantStore(t, dsn, tenant.Credential{Role: role, Password: "by-hand"})

		for name, s := range map[string]*store.Store{"a tenant of another namespace": a, "a role in the group without a namespace": byHand} {
			if _, err := s.Renew(ctx, foreign); !errors.Is(err, store.ErrWindowLost) {
				t.Fatalf("%s renewing %s's window and lease: %v, want ErrWindowLost", name, nsB, err)
			}
			lease := foreign
			lease.WindowToken = 0
			if _, err := s.Renew(ctx, lease); !errors.Is(err, store.ErrLeaseLost) {
				t.Fatalf("%s renewing %s's lease: %v, want ErrLeaseLost", name, nsB, err)
			}
		}
		w, err := owner.GetWindow(ctx, key, storetest.WindowAt(0), store.NotIndexed)
		if err != nil || !w.AliveUntil.Equal(c.Window.AliveUntil) {
			t.Fatalf("the window is alive until %s (%v), want %s: someone outside its namespace renewed it", w.AliveUntil, err, c.Window.AliveUntil)
		}
		l, _, err := owner.GetLease(ctx, key)
		if err != nil || !l.ExpireAt.Equal(g.Lease.ExpireAt) {
			t.Fatalf("the lease expires at %s (%v), want %s: someone outside its namespace renewed it", l.ExpireAt, err, g.Lease.ExpireAt)
		}
	})
}
