package lock_test

// Hostile review of issue 18's claim and ledger changes: a claim the row it
// reads refuses is answered from that read, without the row lock, and the
// ledger's and the views' commits do not wait for the WAL flush.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dislock/dislock/lockagent/lock"
)

// The owner of a window fails while standbys of other Jobs and retry pods
// of the owner's own Job claim it as fast as they can, as waiting agents
// do. The refusals answered from a snapshot taken before the failure
// committed must not let two of them take the window, must not hand out a
// token that is not larger than the failed owner's, and must never refuse
// one of them naming a failed owner: an agent told "failed" skips, and a
// standby or a retry that skips a window nobody ran breaks invariant 2.
func TestHostile18RacingTakeoversOfAFailingOwnerHaveOneWinner(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		const claimers, rounds = 6, 15
		s := openStore(t, dsn, claimers+1)
		key := uniqueKey(t)
		for round := range rounds {
			w := windowAt(round)
			o := owner("dc-a", fmt.Sprintf("report-%d", round), "pod-a")
			first := mustClaim(t, s, key, w, o, false, ttl, lock.Claimed)

			type result struct {
				who     lock.Owner
				claim   lock.Claim
				won     bool
				refused []lock.Window
				err     error
			}
			var winner atomic.Pointer[string]
			results := make([]result, claimers)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range claimers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := &results[i]
					standby := i%2 == 0
					r.who = owner(fmt.Sprintf("dc-%d", i), fmt.Sprintf("standby-%d", i), "pod")
					if !standby {
						r.who = o
						r.who.Pod = fmt.Sprintf("retry-%d", i)
					}
					<-start
					// Claim until this claimer won or has been refused by
					// the winner itself: by then every snapshot it takes
					// is past the failure.
					for n := 0; n < 2000; n++ {
						c, err := s.ClaimWindow(ctx, lock.ClaimRequest{Key: key, Window: w, Index: lock.NotIndexed, Owner: r.who, TTL: ttl, Standby: standby})
						switch {
						case err == nil:
							r.claim, r.won = c, true
							name := r.who.WindowOwner()
							winner.CompareAndSwap(nil, &name)
							return
						case !errors.Is(err, lock.ErrWindowTaken):
							r.err = err
							return
						}
						r.refused = append(r.refused, c.Window)
						if win := winner.Load(); win != nil && c.Window.Owner == *win {
							return
						}
					}
					r.err = errors.New("never refused by the winner, nor won")
				}()
			}
			close(start)
			if _, err := s.Finish(ctx, key, w, lock.NotIndexed, first.Window.Token, lock.StateFailed, ptr(1)); err != nil {
				t.Fatalf("round %d: the owner's failure: %v", round, err)
			}
			wg.Wait()

			won := 0
			for _, r := range results {
				if r.err != nil {
					t.Fatalf("round %d: claimer %s: %v", round, r.who.WindowOwner(), r.err)
				}
				if r.won {
					won++
					if r.claim.Outcome != lock.TookOver || r.claim.Window.Token <= first.Window.Token {
						t.Errorf("round %d: %s won with outcome %q token %d; want %q with a token above the failed owner's %d",
							round, r.who.WindowOwner(), r.claim.Outcome, r.claim.Window.Token, lock.TookOver, first.Window.Token)
					}
				}
				for _, seen := range r.refused {
					if seen.State != lock.StateRunning {
						t.Errorf("round %d: %s was refused naming %s in state %s: its agent would skip a window nobody ran",
							round, r.who.WindowOwner(), seen.Owner, seen.State)
					}
				}
			}
			if won != 1 {
				t.Fatalf("round %d: %d claimers took the window after its owner failed, want exactly 1", round, won)
			}
			row, err := s.GetWindow(ctx, key, w, lock.NotIndexed)
			if err != nil || row.Owner != *winner.Load() || row.State != lock.StateRunning {
				t.Fatalf("round %d: the database holds %+v (%v), the winner was %s", round, row, err, *winner.Load())
			}
		}
	})
}

// The ledger's and the views' transactions turn synchronous_commit off for
// themselves. Through PgBouncer's transaction pooling the next transaction
// on the same server connection is another client's lock write: had the
// setting outlived its transaction, that claim would be acknowledged before
// it is on disk. The commit guard of every lock write reads the session's
// setting, so a claim made right after a decision and a view on the one
// connection a pool of one has must be acknowledged as durable.
func TestHostile18HistoryWritesLeaveTheNextClaimDurable(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := openStore(t, dsn, 1)
		key := uniqueKey(t)
		o := owner("dc-a", "report-1", "pod-a")
		view := lock.View{Schedule: "* * * * *", TimeZone: "UTC", Mode: "schedule", LeaseTTL: "30s"}
		for i := range 10 {
			w := windowAt(i)
			if _, err := s.RecordView(ctx, key, o.Cluster, view, lock.DefaultViewRecency); err != nil {
				t.Fatalf("recording the view: %v", err)
			}
			if err := s.RecordDecision(ctx, lock.Decision{Key: key, Window: w, Cluster: o.Cluster, Job: o.Job, Pod: o.Pod, Action: lock.ActionRun}); err != nil {
				t.Fatalf("recording the decision: %v", err)
			}
			c, err := claim(t, s, key, w, o, false, ttl)
			if err != nil {
				t.Fatalf("window %d: a claim right after the ledger's and the view's writes: %v (ErrUncertainCommit: %v)", i, err, errors.Is(err, lock.ErrUncertainCommit))
			}
			if c.Outcome != lock.Claimed {
				t.Fatalf("window %d: outcome %q, want %q", i, c.Outcome, lock.Claimed)
			}
			// A refusal is answered by the same statement's read branch:
			// it must also not run with the setting left over.
			mustBeTaken(t, s, key, w, owner("dc-b", "other", "pod-b"), false, o.WindowOwner())
			if err := s.RecordDecision(ctx, lock.Decision{Key: key, Window: w, Cluster: "dc-b", Job: "other", Pod: "pod-b", Action: lock.ActionSkip}); err != nil {
				t.Fatalf("recording the refusal: %v", err)
			}
			if _, _, err := s.Heartbeat(ctx, key, w, lock.NotIndexed, c.Window.Token, ttl); err != nil {
				t.Fatalf("window %d: a heartbeat right after the ledger's write: %v", i, err)
			}
		}
	})
}
