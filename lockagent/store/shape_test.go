package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/test/pgtest"
)

// A window is one unit whatever the completion mode: while a CronJob is
// rolled out to completionMode Indexed one data centre at a time, dc-a's
// plain Job claims (key, W, -1) and dc-b's Indexed Job (key, W, 0). Those
// are different rows; without the rule both ran, overlapping.

func claimShape(ctx context.Context, s *store.Store, key string, w time.Time, index int, o store.Owner) (store.Claim, error) {
	return s.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: w, Index: index, Owner: o, TTL: ttl})
}

func TestAWindowClaimedInOneCompletionModeIsRefusedInTheOther(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 4)
		ctx := context.Background()
		plain, indexed := storetest.Owner("dc-a", "job-a", "pod-a"), storetest.Owner("dc-b", "job-b", "pod-b-0")
		for _, tc := range []struct {
			name                 string
			firstIndex, secondAt int
			first, second        store.Owner
		}{
			{"plain first, then an index", store.NotIndexed, 0, plain, indexed},
			{"an index first, then plain", 2, store.NotIndexed, indexed, plain},
		} {
			t.Run(tc.name, func(t *testing.T) {
				key := storetest.UniqueKey(t)
				if _, err := claimShape(ctx, s, key, storetest.WindowAt(0), tc.firstIndex, tc.first); err != nil {
					t.Fatal(err)
				}
				_, err := claimShape(ctx, s, key, storetest.WindowAt(0), tc.secondAt, tc.second)
				if !errors.Is(err, store.ErrCompletionModesDisagree) {
					t.Fatalf("second shape's claim: %v, want ErrCompletionModesDisagree", err)
				}
				for _, want := range []string{"completionMode", tc.first.Cluster, tc.first.WindowOwner()} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("refusal %q does not name %q", err, want)
					}
				}
				// The refused shape left nothing behind; the first shape's other
				// indexes (or its own retry) are untouched by the rule.
				if _, err := s.GetWindow(ctx, key, storetest.WindowAt(0), tc.secondAt); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("refused shape's row: %v, want none", err)
				}
				if tc.firstIndex >= 0 {
					if _, err := claimShape(ctx, s, key, storetest.WindowAt(0), tc.firstIndex+1, tc.first); err != nil {
						t.Fatalf("another index of the first shape: %v", err)
					}
				}
				// Another window of the key may have the other shape (the
				// rollout finished).
				if _, err := claimShape(ctx, s, key, storetest.WindowAt(1), tc.secondAt, tc.second); err != nil {
					t.Fatalf("the next window in the second shape: %v", err)
				}
				// An operator's release of the window lets it run again in
				// either shape.
				if err := s.DeleteWindow(ctx, key, storetest.WindowAt(0)); err != nil {
					t.Fatal(err)
				}
				if _, err := claimShape(ctx, s, key, storetest.WindowAt(0), tc.secondAt, tc.second); err != nil {
					t.Fatalf("after release: %v", err)
				}
			})
		}
	})
}

// oneShapeWins runs, for each of rounds, three plain and three Indexed
// takers at once: try(round, indexed, p) takes the window or lease as
// taker p of its shape, and is refused with one of refusals. Every round
// must have a winner, and all winners of one shape.
func oneShapeWins(t *testing.T, rounds int, try func(round int, indexed bool, p int) error, refusals ...error) {
	t.Helper()
	for i := range rounds {
		var mu sync.Mutex
		won := map[bool]int{}
		var wg sync.WaitGroup
		for p := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				indexed := p%2 == 1
				err := try(i, indexed, p/2)
				switch {
				case err == nil:
					mu.Lock()
					won[indexed]++
					mu.Unlock()
				case slices.ContainsFunc(refusals, func(r error) bool { return errors.Is(err, r) }):
				default:
					t.Errorf("round %d: %v", i, err)
				}
			}()
		}
		wg.Wait()
		if won[true] > 0 && won[false] > 0 || won[true]+won[false] == 0 {
			t.Fatalf("round %d: won by plain takers %d, by indexes %d: want exactly one shape", i, won[false], won[true])
		}
	}
}

// Two first claims of one window in two shapes at the same instant: one
// shape wins every time, however the statements interleave.
func TestConcurrentFirstClaimsOfOneWindowInTwoShapesHaveOneWinner(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 8)
		ctx := context.Background()
		key := storetest.UniqueKey(t)
		oneShapeWins(t, 25, func(round int, indexed bool, p int) error {
			index, o := store.NotIndexed, storetest.Owner("dc-a", fmt.Sprintf("job-a-%d", p), "pod")
			if indexed {
				index, o = p, storetest.Owner("dc-b", "job-b", fmt.Sprintf("pod-%d", p))
			}
			_, err := claimShape(ctx, s, key, storetest.WindowAt(round), index, o)
			return err
		}, store.ErrWindowTaken, store.ErrCompletionModesDisagree)
	})
}

// A window claimed before the rule existed has no recorded shape: the rule
// reads its rows instead.
func TestAWindowClaimedBeforeTheRuleKeepsItsShape(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 4)
		ctx := context.Background()
		key := storetest.UniqueKey(t)
		if _, err := claimShape(ctx, s, key, storetest.WindowAt(0), store.NotIndexed, storetest.Owner("dc-a", "job-a", "pod-a")); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := s.Handle().Pool.QueryRow(ctx, `WITH d AS (DELETE FROM dislock.window_units WHERE lock_key = $1 RETURNING 1) SELECT count(*) FROM d`, key).Scan(&n); err != nil || n != 1 {
			t.Fatalf("forgetting the shape: %d rows, %v", n, err)
		}
		if _, err := claimShape(ctx, s, key, storetest.WindowAt(0), 0, storetest.Owner("dc-b", "job-b", "pod-b")); !errors.Is(err, store.ErrCompletionModesDisagree) {
			t.Fatalf("an index of a window claimed plain before the rule: %v, want ErrCompletionModesDisagree", err)
		}
	})
}

// Leases: a plain Job's "key" and an Indexed Job's "key#i" are never live
// at once (lease mode takes no window, so only the lease can refuse).
func TestALeaseOfOneCompletionModeRefusesTheOther(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 4)
		ctx := context.Background()
		plain, indexed := storetest.Owner("dc-a", "job-a", "pod-a"), storetest.Owner("dc-b", "job-b", "pod-b-0")

		t.Run("plain held: an index is refused until it expires", func(t *testing.T) {
			key := storetest.UniqueKey(t)
			g, err := s.AcquireLease(ctx, key, plain, 300*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.AcquireLease(ctx, key+"#0", indexed, ttl); !errors.Is(err, store.ErrCompletionModesDisagree) || !strings.Contains(err.Error(), plain.LeaseOwner()) {
				t.Fatalf("index lease while the plain lease is live: %v, want ErrCompletionModesDisagree naming %s", err, plain.LeaseOwner())
			}
			storetest.AwaitDBPast(t, s, g.Lease.ExpireAt)
			if _, err := s.AcquireLease(ctx, key+"#0", indexed, ttl); err != nil {
				t.Fatalf("index lease once the plain one expired: %v", err)
			}
		})

		t.Run("an index held: plain is refused, other indexes are not", func(t *testing.T) {
			key := storetest.UniqueKey(t)
			if _, err := s.AcquireLease(ctx, key+"#3", indexed, ttl); err != nil {
				t.Fatal(err)
			}
			if _, err := s.AcquireLease(ctx, key+"#4", storetest.Owner("dc-b", "job-b", "pod-b-4"), ttl); err != nil {
				t.Fatalf("another index: %v", err)
			}
			if _, err := s.AcquireLease(ctx, key, plain, ttl); !errors.Is(err, store.ErrCompletionModesDisagree) {
				t.Fatalf("plain lease while an index's is live: %v, want ErrCompletionModesDisagree", err)
			}
		})

		t.Run("released: the other shape may take it", func(t *testing.T) {
			key := storetest.UniqueKey(t)
			g, err := s.AcquireLease(ctx, key, plain, ttl)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.ReleaseLease(ctx, key, g.Lease.Token); err != nil {
				t.Fatal(err)
			}
			if _, err := s.AcquireLease(ctx, key+"#0", indexed, ttl); err != nil {
				t.Fatalf("index lease after the plain one was released: %v", err)
			}
		})
	})
}

func TestConcurrentLeasesOfTwoShapesHaveOneShapeLive(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 8)
		ctx := context.Background()
		key := storetest.UniqueKey(t)
		oneShapeWins(t, 25, func(round int, indexed bool, p int) error {
			lk, o := fmt.Sprintf("%s-%d", key, round), storetest.Owner("dc-a", fmt.Sprintf("job-a-%d", p), "pod")
			if indexed {
				lk, o = fmt.Sprintf("%s#%d", lk, p), storetest.Owner("dc-b", "job-b", fmt.Sprintf("pod-%d", p))
			}
			_, err := s.AcquireLease(ctx, lk, o, ttl)
			return err
		}, store.ErrLeaseHeld, store.ErrCompletionModesDisagree)
	})
}

// Tenants: the rule holds for a namespace's own role through PgBouncer,
// and says nothing about another namespace's windows (row-level security
// refuses the row, as it would without the rule).
func TestATenantsClaimInTheOtherCompletionModeIsRefusedAndLearnsNothingOfOtherNamespaces(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 4)
		ctx := context.Background()
		mine, theirs := storetest.Namespace(t, "mine"), storetest.Namespace(t, "theirs")
		asTenant := storetest.TenantStore(t, dsn, storetest.Provision(t, s, mine))
		a := store.Owner{Cluster: "dc-a", Namespace: mine, Job: "job", JobUID: "uid", Pod: "pod"}
		if _, err := claimShape(ctx, asTenant, mine+"/report", storetest.WindowAt(0), store.NotIndexed, a); err != nil {
			t.Fatal(err)
		}
		if _, err := claimShape(ctx, asTenant, mine+"/report", storetest.WindowAt(0), 0, a); !errors.Is(err, store.ErrCompletionModesDisagree) {
			t.Fatalf("tenant's second shape: %v, want ErrCompletionModesDisagree", err)
		}
		if _, err := claimShape(ctx, s, theirs+"/report", storetest.WindowAt(0), store.NotIndexed, storetest.Owner("dc-a", "job", "pod")); err != nil {
			t.Fatal(err)
		}
		_, err := claimShape(ctx, asTenant, theirs+"/report", storetest.WindowAt(0), 0, a)
		if !errors.Is(err, store.ErrForbidden) || strings.Contains(err.Error(), "completionMode") {
			t.Fatalf("tenant's claim in another namespace: %v, want ErrForbidden that says nothing of its shape", err)
		}
	})
}

// Agents older than the completionMode field write views without it: during
// a rolling upgrade the same Indexed Job is no disagreement, in the agent's
// warning or in the webhook's report; a real one is both.
func TestAViewWithoutACompletionModeDisagreesWithNone(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		old := store.View{Schedule: "0 * * * *", TimeZone: "UTC", Mode: "schedule", LeaseTTL: "30s"}
		indexed, plain := old, old
		indexed.CompletionMode, indexed.Completions = store.CompletionModeIndexed, 3
		plain.CompletionMode = store.CompletionModeNonIndexed
		if d := indexed.Diff(old); len(d) > 0 {
			t.Errorf("an Indexed Job's view next to an older agent's: %v, want no difference", d)
		}
		if d := indexed.Diff(plain); len(d) != 1 || !strings.Contains(d[0], "completionMode") {
			t.Errorf("Indexed next to NonIndexed: %v, want completionMode", d)
		}
		upgrading, disagreeing := storetest.UniqueKey(t), storetest.UniqueKey(t)
		for _, r := range []struct {
			key, cluster string
			v            store.View
		}{{upgrading, "dc-a", old}, {upgrading, "dc-b", indexed}, {disagreeing, "dc-a", plain}, {disagreeing, "dc-b", indexed}} {
			if _, err := s.RecordView(ctx, r.key, r.cluster, r.v, store.DefaultViewRecency); err != nil {
				t.Fatal(err)
			}
		}
		views, err := s.ListDisagreements(ctx, store.DefaultViewRecency)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, v := range views {
			got[v.Key]++
		}
		if got[upgrading] != 0 || got[disagreeing] != 2 {
			t.Fatalf("disagreements listed %v; want none of %s (an older agent's view) and both views of %s", got, upgrading, disagreeing)
		}
	})
}

// A renewal of "key" that began before its expiry but waited on the row
// lock past it (another statement on the row, e.g. a commit waiting for the
// synchronous standby) must fail: "key#0" may have been granted meanwhile,
// having read "key" as expired. Judged at statement start, it succeeded and
// left both shapes live.
func TestARenewalThatWaitedPastTheExpiryDoesNotReviveTheOtherShapesRival(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 4)
		ctx := context.Background()
		key := storetest.UniqueKey(t)
		g, err := s.AcquireLease(ctx, key, storetest.Owner("dc-a", "job-a", "pod-a"), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		blocker := storetest.RawConn(t, dsn)
		tx, err := blocker.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // committed below
		if _, err := tx.Exec(ctx, `SELECT 1 FROM dislock.leases WHERE lock_key = $1 FOR UPDATE`, key); err != nil {
			t.Fatal(err)
		}
		renewed := make(chan error, 1)
		go func() {
			_, _, err := s.RenewLease(ctx, key, g.Lease.Token, 30*time.Second)
			renewed <- err
		}()
		watcher := storetest.RawConn(t, pgtest.Need(t).DirectDSN())
		storetest.AwaitCond(t, "the renewal to wait on the row lock", func() bool {
			var n int
			err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%dislock.renew_guarded(%'`).Scan(&n)
			return err == nil && n > 0
		})
		storetest.AwaitDBPast(t, s, g.Lease.ExpireAt)
		if _, err := s.AcquireLease(ctx, key+"#0", storetest.Owner("dc-b", "job-b", "pod-b-0"), 30*time.Second); err != nil {
			t.Fatalf("index lease once the plain one expired: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-renewed; !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("the late renewal: %v, want ErrLeaseLost (both shapes would be live)", err)
		}
	})
}
