package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
)

func TestStandbyTakesOverOnlyAFailedOrDeadOwnersWindow(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 4)
		ctx := context.Background()
		a, b := storetest.Owner("dc-a", "job-a", "pod-a"), storetest.Owner("dc-b", "job-b", "pod-b")

		t.Run("owner alive and running: standby waits", func(t *testing.T) {
			key := storetest.UniqueKey(t)
			storetest.MustClaim(t, s, key, storetest.WindowAt(0), a, true, ttl, store.Claimed)
			storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), b, true, a.WindowOwner())
		})

		t.Run("owner failed: standby takes over with a new token and the old owner is locked out", func(t *testing.T) {
			key := storetest.UniqueKey(t)
			first := storetest.MustClaim(t, s, key, storetest.WindowAt(0), a, true, ttl, store.Claimed)
			if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, first.Window.Token, store.StateFailed, storetest.Ptr(1)); err != nil {
				t.Fatal(err)
			}
			// Without standby a failed window still belongs to its owner.
			storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), b, false, a.WindowOwner())
			took := storetest.MustClaim(t, s, key, storetest.WindowAt(0), b, true, ttl, store.TookOver)
			if took.Window.Token <= first.Window.Token || took.Window.Cluster != "dc-b" || took.Window.FinishedAt != nil || took.Window.ExitCode != nil {
				t.Fatalf("took over row = %+v (first %+v)", took.Window, first.Window)
			}
			if _, _, err := s.Heartbeat(ctx, key, storetest.WindowAt(0), store.NotIndexed, first.Window.Token, ttl); !errors.Is(err, store.ErrWindowLost) {
				t.Fatalf("old owner's heartbeat: %v, want ErrWindowLost", err)
			}
			if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, first.Window.Token, store.StateSucceeded, storetest.Ptr(0)); !errors.Is(err, store.ErrWindowLost) {
				t.Fatalf("old owner's finish: %v, want ErrWindowLost", err)
			}
			if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, took.Window.Token, store.StateSucceeded, storetest.Ptr(0)); err != nil {
				t.Fatal(err)
			}
			// Recording the same outcome again (a retry after a lost reply) is fine.
			if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, took.Window.Token, store.StateSucceeded, storetest.Ptr(0)); err != nil {
				t.Fatalf("repeated finish: %v", err)
			}
		})

		t.Run("owner's liveness lapsed at database time: standby takes over", func(t *testing.T) {
			key := storetest.UniqueKey(t)
			first := storetest.MustClaim(t, s, key, storetest.WindowAt(0), a, true, 300*time.Millisecond, store.Claimed)
			storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), b, true, a.WindowOwner())
			storetest.AwaitDBPast(t, s, first.Window.AliveUntil)
			storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), b, false, a.WindowOwner())
			storetest.MustClaim(t, s, key, storetest.WindowAt(0), b, true, ttl, store.TookOver)
		})

		t.Run("heartbeats keep the owner alive", func(t *testing.T) {
			key := storetest.UniqueKey(t)
			// Long enough that the standby's claim, sent right after a
			// heartbeat, lands before the renewed liveness lapses even on
			// a loaded machine; three rounds still outlive the first TTL.
			short := 2 * time.Second
			first := storetest.MustClaim(t, s, key, storetest.WindowAt(0), a, true, short, store.Claimed)
			until := first.Window.AliveUntil
			for range 3 {
				storetest.AwaitDBPast(t, s, until.Add(-short/2))
				next, _, err := s.Heartbeat(ctx, key, storetest.WindowAt(0), store.NotIndexed, first.Window.Token, short)
				if err != nil {
					t.Fatal(err)
				}
				if !next.After(until) {
					t.Fatalf("heartbeat moved alive_until from %s to %s", until, next)
				}
				until = next
				storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), b, true, a.WindowOwner())
			}
		})

		t.Run("succeeded or skipped windows never change hands", func(t *testing.T) {
			for _, state := range []store.State{store.StateSucceeded, store.StateSkipped} {
				key := storetest.UniqueKey(t)
				first := storetest.MustClaim(t, s, key, storetest.WindowAt(0), a, true, 200*time.Millisecond, store.Claimed)
				if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, first.Window.Token, state, nil); err != nil {
					t.Fatal(err)
				}
				storetest.AwaitDBPast(t, s, first.Window.AliveUntil)
				storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), b, true, a.WindowOwner())
			}
		})
	})
}

func TestTwoStandbysRacingForADeadOwnersWindowYieldOneNewOwner(t *testing.T) {
	const racers = 8
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, racers*2)
		for round := range 10 {
			key := storetest.UniqueKey(t)
			dead := storetest.MustClaim(t, s, key, storetest.WindowAt(0), storetest.Owner("dc-a", "job-a", "pod-a"), true, 100*time.Millisecond, store.Claimed)
			storetest.AwaitDBPast(t, s, dead.Window.AliveUntil)

			var wg sync.WaitGroup
			var mu sync.Mutex
			var winners []string
			start := make(chan struct{})
			for i := range racers * 2 {
				o := storetest.Owner([]string{"dc-b", "dc-c"}[i%2], fmt.Sprint("job-", i), "pod")
				wg.Go(func() {
					<-start
					c, err := storetest.Claim(t, s, key, storetest.WindowAt(0), o, true, ttl)
					switch {
					case err == nil:
						mu.Lock()
						winners = append(winners, fmt.Sprintf("%s (%s)", o.WindowOwner(), c.Outcome))
						mu.Unlock()
					case !errors.Is(err, store.ErrWindowTaken):
						t.Errorf("claim: %v", err)
					}
				})
			}
			close(start)
			wg.Wait()
			if len(winners) != 1 {
				t.Fatalf("round %d: %d new owners %v, want exactly one", round, len(winners), winners)
			}
		}
	})
}
