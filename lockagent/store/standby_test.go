package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

func TestStandbyTakesOverOnlyAFailedOrDeadOwnersWindow(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		s := openStore(t, dsn, 4)
		ctx := context.Background()
		a, b := owner("dc-a", "job-a", "pod-a"), owner("dc-b", "job-b", "pod-b")

		t.Run("owner alive and running: standby waits", func(t *testing.T) {
			key := uniqueKey(t)
			mustClaim(t, s, key, window0, a, true, ttl, store.Claimed)
			mustBeTaken(t, s, key, window0, b, true, a.WindowOwner())
		})

		t.Run("owner failed: standby takes over with a new token and the old owner is locked out", func(t *testing.T) {
			key := uniqueKey(t)
			first := mustClaim(t, s, key, window0, a, true, ttl, store.Claimed)
			if _, err := s.Finish(ctx, key, window0, store.NotIndexed, first.Window.Token, store.StateFailed, ptr(1)); err != nil {
				t.Fatal(err)
			}
			// Without standby a failed window still belongs to its owner.
			mustBeTaken(t, s, key, window0, b, false, a.WindowOwner())
			took := mustClaim(t, s, key, window0, b, true, ttl, store.TookOver)
			if took.Window.Token <= first.Window.Token || took.Window.Cluster != "dc-b" || took.Window.FinishedAt != nil || took.Window.ExitCode != nil {
				t.Fatalf("took over row = %+v (first %+v)", took.Window, first.Window)
			}
			if _, _, err := s.Heartbeat(ctx, key, window0, store.NotIndexed, first.Window.Token, ttl); !errors.Is(err, store.ErrWindowLost) {
				t.Fatalf("old owner's heartbeat: %v, want ErrWindowLost", err)
			}
			if _, err := s.Finish(ctx, key, window0, store.NotIndexed, first.Window.Token, store.StateSucceeded, ptr(0)); !errors.Is(err, store.ErrWindowLost) {
				t.Fatalf("old owner's finish: %v, want ErrWindowLost", err)
			}
			if _, err := s.Finish(ctx, key, window0, store.NotIndexed, took.Window.Token, store.StateSucceeded, ptr(0)); err != nil {
				t.Fatal(err)
			}
			// Recording the same outcome again (a retry after a lost reply) is fine.
			if _, err := s.Finish(ctx, key, window0, store.NotIndexed, took.Window.Token, store.StateSucceeded, ptr(0)); err != nil {
				t.Fatalf("repeated finish: %v", err)
			}
		})

		t.Run("owner's liveness lapsed at database time: standby takes over", func(t *testing.T) {
			key := uniqueKey(t)
			first := mustClaim(t, s, key, window0, a, true, 300*time.Millisecond, store.Claimed)
			mustBeTaken(t, s, key, window0, b, true, a.WindowOwner())
			awaitDBPast(t, s, first.Window.AliveUntil)
			mustBeTaken(t, s, key, window0, b, false, a.WindowOwner())
			mustClaim(t, s, key, window0, b, true, ttl, store.TookOver)
		})

		t.Run("heartbeats keep the owner alive", func(t *testing.T) {
			key := uniqueKey(t)
			// Long enough that the standby's claim, sent right after a
			// heartbeat, lands before the renewed liveness lapses even on
			// a loaded machine; three rounds still outlive the first TTL.
			short := 2 * time.Second
			first := mustClaim(t, s, key, window0, a, true, short, store.Claimed)
			until := first.Window.AliveUntil
			for range 3 {
				awaitDBPast(t, s, until.Add(-short/2))
				next, _, err := s.Heartbeat(ctx, key, window0, store.NotIndexed, first.Window.Token, short)
				if err != nil {
					t.Fatal(err)
				}
				if !next.After(until) {
					t.Fatalf("heartbeat moved alive_until from %s to %s", until, next)
				}
				until = next
				mustBeTaken(t, s, key, window0, b, true, a.WindowOwner())
			}
		})

		t.Run("succeeded or skipped windows never change hands", func(t *testing.T) {
			for _, state := range []store.State{store.StateSucceeded, store.StateSkipped} {
				key := uniqueKey(t)
				first := mustClaim(t, s, key, window0, a, true, 200*time.Millisecond, store.Claimed)
				if _, err := s.Finish(ctx, key, window0, store.NotIndexed, first.Window.Token, state, nil); err != nil {
					t.Fatal(err)
				}
				awaitDBPast(t, s, first.Window.AliveUntil)
				mustBeTaken(t, s, key, window0, b, true, a.WindowOwner())
			}
		})
	})
}

func TestTwoStandbysRacingForADeadOwnersWindowYieldOneNewOwner(t *testing.T) {
	const racers = 8
	eachTarget(t, func(t *testing.T, dsn string) {
		s := openStore(t, dsn, racers*2)
		for round := range 10 {
			key := uniqueKey(t)
			dead := mustClaim(t, s, key, window0, owner("dc-a", "job-a", "pod-a"), true, 100*time.Millisecond, store.Claimed)
			awaitDBPast(t, s, dead.Window.AliveUntil)

			var wg sync.WaitGroup
			var mu sync.Mutex
			var winners []string
			start := make(chan struct{})
			for i := range racers * 2 {
				o := owner([]string{"dc-b", "dc-c"}[i%2], fmt.Sprint("job-", i), "pod")
				wg.Go(func() {
					<-start
					c, err := claim(t, s, key, window0, o, true, ttl)
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

func TestRetentionDeletesOnlyOldFinishedWindows(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		s := openStore(t, dsn, 2)
		ctx := context.Background()
		key := uniqueKey(t)
		now, err := s.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		old := now.Add(-40 * 24 * time.Hour).Truncate(time.Minute)
		recent := now.Add(-time.Hour).Truncate(time.Minute)
		a := owner("dc-a", "job", "pod")
		done := mustClaim(t, s, key, old, a, false, ttl, store.Claimed)
		if _, err := s.Finish(ctx, key, old, store.NotIndexed, done.Window.Token, store.StateSucceeded, ptr(0)); err != nil {
			t.Fatal(err)
		}
		alive := old.Add(time.Minute)
		mustClaim(t, s, key, alive, a, false, time.Hour, store.Claimed) // an old window whose owner is still running
		mustClaim(t, s, key, recent, a, false, ttl, store.Claimed)

		if _, err := s.DeleteOldWindows(ctx, store.MinRetention-time.Minute); err == nil || !strings.Contains(err.Error(), "shorter than 48h0m0s") {
			t.Fatalf("a retention below the minimum: %v, want a refusal naming the bound", err)
		}
		if _, err := s.DeleteOldWindows(ctx, store.DefaultRetention); err != nil {
			t.Fatal(err)
		}
		for w, want := range map[time.Time]bool{old: false, alive: true, recent: true} {
			_, err := s.GetWindow(ctx, key, w, store.NotIndexed)
			if exists := err == nil; exists != want {
				t.Errorf("window %s exists=%v after retention, want %v (err %v)", w, exists, want, err)
			}
		}
	})
}
