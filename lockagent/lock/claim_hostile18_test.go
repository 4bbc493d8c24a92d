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

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/lock"
)

// previousReleaseClaim is the claim statement of the previous release
// (test/skew's previousRelease), without its commit guard: during an
// upgrade its agents run it beside the new statement, against the same
// rows. It always takes the row lock and draws a token before it knows of
// a conflict.
const previousReleaseClaim = `
INSERT INTO dislock.windows AS w
    (lock_key, window_start, job_index, owner, cluster, pod, token, state, claimed_at, alive_until)
VALUES ($1::text, $2::timestamptz, $3::int, $4::text, $5::text, $6::text,
        dislock.next_token(), 'running', now(), now() + $7::bigint * interval '1 microsecond')
ON CONFLICT (lock_key, window_start, job_index) DO UPDATE SET
    token       = CASE WHEN w.owner = EXCLUDED.owner THEN w.token ELSE dislock.next_token() END,
    claimed_at  = CASE WHEN w.owner = EXCLUDED.owner THEN w.claimed_at ELSE EXCLUDED.claimed_at END,
    owner       = EXCLUDED.owner,
    cluster     = EXCLUDED.cluster,
    pod         = EXCLUDED.pod,
    state       = 'running',
    alive_until = EXCLUDED.alive_until,
    finished_at = NULL,
    exit_code   = NULL
WHERE (w.owner = EXCLUDED.owner AND w.state = 'running')
   OR (w.owner <> EXCLUDED.owner
       AND (w.state = 'failed' OR (w.state = 'running' AND w.alive_until <= now()))
       AND (starts_with(w.owner, $8::text) OR $9::boolean))
RETURNING token, claimed_at = now()`

// The owner of a window fails while standbys of other Jobs and retry pods
// of the owner's own Job claim it as fast as they can, as waiting agents
// do, some of them agents of the previous release (version skew). The
// refusals answered from a snapshot taken before the failure committed
// must not let two of them take the window, must not hand out a token that
// is not larger than the failed owner's, and the current statement must
// never refuse one of them naming a failed owner: an agent told "failed"
// skips, and a standby or a retry that skips a window nobody ran breaks
// invariant 2.
func TestHostile18RacingTakeoversOfAFailingOwnerHaveOneWinner(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		const claimers, rounds = 6, 15
		s := openStore(t, dsn, claimers+1)
		key := uniqueKey(t)
		conns := make([]*pgx.Conn, claimers)
		for i := range conns {
			conns[i] = rawConn(t, dsn)
		}
		for round := range rounds {
			w := windowAt(round)
			o := owner("dc-a", fmt.Sprintf("report-%d", round), "pod-a")
			first := mustClaim(t, s, key, w, o, false, ttl, lock.Claimed)

			type result struct {
				who     lock.Owner
				old     bool
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
					req := lock.ClaimRequest{Key: key, Window: w, Index: lock.NotIndexed, Owner: r.who, TTL: ttl, Standby: standby}
					claimOnce := func() (lock.Claim, error) { return s.ClaimWindow(ctx, req) }
					if r.old = i%3 == 0; r.old {
						claimOnce = func() (lock.Claim, error) { return claimAsPreviousRelease(ctx, s, conns[i], req) }
					}
					<-start
					// Claim until this claimer won or has been refused by
					// the winner itself: by then every snapshot it takes
					// is past the failure.
					for n := 0; n < 2000; n++ {
						c, err := claimOnce()
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
				// The previous release reads the owner in a second
				// statement after a refusal, and may read the failure
				// its refusal did not see (a race of its own, which this
				// release's one-statement refusal closes); only the
				// current statement is held to this.
				for _, seen := range r.refused {
					if !r.old && seen.State != lock.StateRunning {
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

// claimAsPreviousRelease claims as an agent of the previous release does:
// its statement, then on no row a read of the owner.
func claimAsPreviousRelease(ctx context.Context, s *lock.Store, conn *pgx.Conn, r lock.ClaimRequest) (lock.Claim, error) {
	var c lock.Claim
	var tookOver bool
	err := conn.QueryRow(ctx, previousReleaseClaim, r.Key, r.Window, r.Index, r.Owner.String(), r.Owner.Cluster, r.Owner.Pod,
		r.TTL.Microseconds(), r.Owner.JobPrefix(), r.Standby).Scan(&c.Window.Token, &tookOver)
	switch {
	case err == nil:
		c.Window.Owner, c.Window.State, c.Outcome = r.Owner.String(), lock.StateRunning, lock.Claimed
		if tookOver {
			c.Outcome = lock.TookOver
		}
		return c, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return c, err
	}
	w, err := s.GetWindow(ctx, r.Key, r.Window, r.Index)
	if err != nil {
		return c, err
	}
	c.Window = w
	return c, fmt.Errorf("previous release: %w", lock.ErrWindowTaken)
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
