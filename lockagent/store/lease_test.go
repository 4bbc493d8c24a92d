package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/pause"
	"github.com/dislock/dislock/test/pgtest"
)

func TestLeaseHasOneHolderAndTheSamePodReenters(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 4)
		ctx := context.Background()
		key := storetest.UniqueKey(t)
		a := storetest.Owner("dc-a", "job-a", "pod-a")

		g, err := s.AcquireLease(ctx, key, a, ttl)
		if err != nil || g.Reentered {
			t.Fatalf("acquire: %+v, %v", g, err)
		}
		if got := g.Lease.ExpireAt.Sub(g.Lease.AcquiredAt); got != ttl {
			t.Fatalf("expire_at - acquired_at = %s, want %s", got, ttl)
		}
		// A restarted sidecar of the same pod re-enters and keeps its token.
		again, err := s.AcquireLease(ctx, key, a, ttl)
		if err != nil || !again.Reentered || again.Lease.Token != g.Lease.Token {
			t.Fatalf("re-entry: %+v, %v (first token %d)", again, err, g.Lease.Token)
		}
		// Another Job is refused and told who holds it.
		held, err := s.AcquireLease(ctx, key, storetest.Owner("dc-b", "job-b", "pod-b"), ttl)
		if !errors.Is(err, store.ErrLeaseHeld) || held.Lease.Owner != a.LeaseOwner() {
			t.Fatalf("other job: %+v, %v", held, err)
		}
		// A retry pod of the same Job is refused too, and can tell it must wait.
		retry := a
		retry.Pod = "pod-a-2"
		held, err = s.AcquireLease(ctx, key, retry, ttl)
		if !errors.Is(err, store.ErrLeaseHeld) || !retry.SameJob(held.Lease.Owner) {
			t.Fatalf("retry pod: %+v, %v", held, err)
		}
		if (storetest.Owner("dc-b", "job-a", "pod-a")).SameJob(held.Lease.Owner) {
			t.Fatal("a Job of the same name in another cluster counted as the same Job")
		}
		// Released: the next holder gets a larger token.
		if ok, err := s.ReleaseLease(ctx, key, g.Lease.Token); err != nil || !ok {
			t.Fatalf("release: %v %v", ok, err)
		}
		next, err := s.AcquireLease(ctx, key, retry, ttl)
		if err != nil || next.Lease.Token <= g.Lease.Token {
			t.Fatalf("after release: %+v, %v", next, err)
		}
	})
}

func TestRenewFailsAfterExpiryOrTakeover(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 4)
		ctx := context.Background()
		a, b := storetest.Owner("dc-a", "job-a", "pod-a"), storetest.Owner("dc-b", "job-b", "pod-b")
		short := 300 * time.Millisecond

		t.Run("renewal extends a live lease", func(t *testing.T) {
			key := storetest.UniqueKey(t)
			g, err := s.AcquireLease(ctx, key, a, short)
			if err != nil {
				t.Fatal(err)
			}
			exp, dbNow, err := s.RenewLease(ctx, key, g.Lease.Token, ttl)
			if err != nil || exp.Sub(dbNow) != ttl {
				t.Fatalf("renew: expire %s at %s, %v", exp, dbNow, err)
			}
		})

		t.Run("expired, nobody else came: renew still fails", func(t *testing.T) {
			key := storetest.UniqueKey(t)
			g, err := s.AcquireLease(ctx, key, a, short)
			if err != nil {
				t.Fatal(err)
			}
			storetest.AwaitDBPast(t, s, g.Lease.ExpireAt)
			if _, _, err := s.RenewLease(ctx, key, g.Lease.Token, ttl); !errors.Is(err, store.ErrLeaseLost) {
				t.Fatalf("renew after expiry: %v, want ErrLeaseLost", err)
			}
		})

		t.Run("expired and taken over: renew and release fail, token moves on", func(t *testing.T) {
			key := storetest.UniqueKey(t)
			g, err := s.AcquireLease(ctx, key, a, short)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.AcquireLease(ctx, key, b, ttl); !errors.Is(err, store.ErrLeaseHeld) {
				t.Fatalf("before expiry: %v, want ErrLeaseHeld", err)
			}
			storetest.AwaitDBPast(t, s, g.Lease.ExpireAt)
			took, err := s.AcquireLease(ctx, key, b, ttl)
			if err != nil || took.Reentered || took.Lease.Token <= g.Lease.Token {
				t.Fatalf("takeover: %+v, %v", took, err)
			}
			if _, _, err := s.RenewLease(ctx, key, g.Lease.Token, ttl); !errors.Is(err, store.ErrLeaseLost) {
				t.Fatalf("old holder's renew: %v, want ErrLeaseLost", err)
			}
			if ok, err := s.ReleaseLease(ctx, key, g.Lease.Token); err != nil || ok {
				t.Fatalf("old holder's release: released=%v err=%v; it must not remove the new holder's lease", ok, err)
			}
			if l, _, err := s.GetLease(ctx, key); err != nil || l.Owner != b.LeaseOwner() {
				t.Fatalf("lease after stale release: %+v %v", l, err)
			}
		})
	})
}

// Three clusters × eight pods keep taking one lease; at no moment do two of
// them believe they hold it.
func TestContendedLeaseNeverHasTwoLiveHolders(t *testing.T) {
	const clusters, pods, acquisitions = 3, 8, 60
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		key := storetest.UniqueKey(t)
		var holders, granted atomic.Int64
		var lastToken atomic.Int64
		var wg sync.WaitGroup
		for c := range clusters {
			s := storetest.Open(t, dsn, pods)
			for p := range pods {
				o := storetest.Owner(fmt.Sprintf("dc-%d", c), fmt.Sprintf("job-%d", p), "pod")
				wg.Go(func() {
					ctx := context.Background()
					for granted.Load() < acquisitions {
						g, err := s.AcquireLease(ctx, key, o, ttl)
						if errors.Is(err, store.ErrLeaseHeld) {
							time.Sleep(5 * time.Millisecond) // a waiting pod polls; it does not spin
							continue
						}
						if err != nil {
							t.Errorf("acquire: %v", err)
							return
						}
						if n := holders.Add(1); n != 1 {
							t.Errorf("%d holders at once", n)
						}
						if prev := lastToken.Swap(g.Lease.Token); g.Lease.Token <= prev {
							t.Errorf("token %d granted after %d", g.Lease.Token, prev)
						}
						granted.Add(1)
						if _, _, err := s.RenewLease(ctx, key, g.Lease.Token, ttl); err != nil {
							t.Errorf("renew: %v", err)
						}
						holders.Add(-1)
						if ok, err := s.ReleaseLease(ctx, key, g.Lease.Token); err != nil || !ok {
							t.Errorf("release: %v %v", ok, err)
						}
					}
				})
			}
		}
		wg.Wait()
		if granted.Load() < acquisitions {
			t.Fatalf("only %d acquisitions", granted.Load())
		}
	})
}

// This release's agents take a lease in one call (schema 17) and, on a
// database not migrated yet, with schema 16's statements: each answer is
// the same on both, paused or not.
func TestALeaseIsAnsweredAlikeOnSchemas16And17(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "lease16"})
	storetest.Open(t, srv.DirectDSN(), 1) // migrated to this release's schema
	super := storetest.RawConn(t, srv.SuperuserDSN())
	ctx := context.Background()
	exec := func(q string) { t.Helper(); storetest.Exec(t, super, q) }
	scenario := func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		key := storetest.UniqueKey(t)
		a, b := storetest.Owner("dc-a", "job-a", "pod-a"), storetest.Owner("dc-b", "job-b", "pod-b")
		g, err := s.AcquireLease(ctx, key, a, ttl)
		if err != nil || g.Reentered || g.Lease.Owner != a.LeaseOwner() || g.Lease.Token == 0 || !g.Lease.AcquiredAt.Equal(g.DBTime) {
			t.Fatalf("a free lease: %+v, %v", g, err)
		}
		again, err := s.AcquireLease(ctx, key, a, ttl)
		if err != nil || !again.Reentered || again.Lease.Token != g.Lease.Token || !again.Lease.AcquiredAt.Equal(g.Lease.AcquiredAt) {
			t.Fatalf("the holder again: %+v, %v", again, err)
		}
		if held, err := s.AcquireLease(ctx, key, b, ttl); !errors.Is(err, store.ErrLeaseHeld) || held.Lease != again.Lease {
			t.Fatalf("another owner: %+v, %v (holder %+v)", held, err, again.Lease)
		}
		if _, err := pause.Set(ctx, s, pause.Request{Key: key, By: "alice", Reason: "hold on"}); err != nil {
			t.Fatal(err)
		}
		// A pause stops no run: the holder re-enters, and another owner
		// meets the holder, not the pause.
		if again, err := s.AcquireLease(ctx, key, a, ttl); err != nil || !again.Reentered || again.Lease.Token != g.Lease.Token {
			t.Fatalf("the holder while paused: %+v, %v", again, err)
		}
		if _, err := s.AcquireLease(ctx, key, b, ttl); !errors.Is(err, store.ErrLeaseHeld) {
			t.Fatalf("another owner while the holder runs paused: %v", err)
		}
		if ok, err := s.ReleaseLease(ctx, key, g.Lease.Token); err != nil || !ok {
			t.Fatalf("release: %v, %v", ok, err)
		}
		for _, k := range []string{key, key + "#3"} {
			p, err := s.AcquireLease(ctx, k, b, ttl)
			if !errors.Is(err, store.ErrKeyPaused) || !strings.Contains(err.Error(), `paused by alice until resumed ("hold on")`) || p.Lease != (store.Lease{}) {
				t.Fatalf("lease %s while paused: %+v, %v", k, p, err)
			}
		}
		if _, ok, err := pause.Resume(ctx, s, key, "alice"); err != nil || !ok {
			t.Fatal(err)
		}
		if next, err := s.AcquireLease(ctx, key, b, ttl); err != nil || next.Reentered || next.Lease.Token <= g.Lease.Token {
			t.Fatalf("after the resume: %+v, %v", next, err)
		}
	}
	t.Run("schema17", func(t *testing.T) {
		for _, tg := range srv.Targets() {
			t.Run(tg.Name, func(t *testing.T) { scenario(t, tg.DSN) })
		}
	})
	exec(`ALTER FUNCTION dislock.acquire_lease(text, text, bigint) RENAME TO acquire_lease_not_yet`)
	defer exec(`ALTER FUNCTION dislock.acquire_lease_not_yet(text, text, bigint) RENAME TO acquire_lease`)
	t.Run("schema16", func(t *testing.T) {
		for _, tg := range srv.Targets() {
			t.Run(tg.Name, func(t *testing.T) { scenario(t, tg.DSN) })
		}
	})
}
