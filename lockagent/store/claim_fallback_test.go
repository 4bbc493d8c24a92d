package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/test/pgtest"
)

// A claim the locked path refuses reads the owner with a second statement,
// and the owner may fail in between: the claim must then be tried again,
// never reported as "taken by an owner who failed", on which a standby (or
// a retry of the owner's Job) skips a window nobody ran to success. Each
// round holds the row locked while a standby's claim queues on it, hands
// the row to another live owner and queues that owner's failure behind
// the standby, so that the standby's locked path refuses and its read sees
// the failure (1 to 3 rounds in 10 did, before the fix).
func TestARefusalNeverNamesAnOwnerWhoFailed(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := storetest.Open(t, dsn, 2)
		hits := 0
		for round := range 10 {
			key := storetest.UniqueKey(t)
			a := storetest.Owner("dc-a", "report", "pod-a")
			first := storetest.MustClaim(t, s, key, storetest.WindowAt(0), a, false, ttl, store.Claimed)
			if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, first.Window.Token, store.StateFailed, storetest.Ptr(1)); err != nil {
				t.Fatal(err)
			}
			su1, su2, watch := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN()), storetest.RawConn(t, pgtest.Need(t).SuperuserDSN()), storetest.RawConn(t, pgtest.Need(t).SuperuserDSN())
			tx, err := su1.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `SELECT 1 FROM dislock.windows WHERE lock_key=$1 FOR UPDATE`, key); err != nil {
				t.Fatal(err)
			}
			type res struct {
				c   store.Claim
				err error
			}
			done := make(chan res, 1)
			go func() {
				c, err := storetest.Claim(t, s, key, storetest.WindowAt(0), storetest.Owner("dc-c", "standby", "pod-c"), true, ttl)
				done <- res{c, err}
			}()
			waiters := func(n int) {
				for {
					var k int
					err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type='Lock' AND backend_type='client backend' AND pid <> pg_backend_pid()`).Scan(&k)
					if err != nil {
						t.Fatal(err)
					}
					if k >= n {
						return
					}
				}
			}
			waiters(1)
			_, err = tx.Exec(ctx, `UPDATE dislock.windows SET owner='dc-b/ns/other/uid-other/pod-b', cluster='dc-b', pod='pod-b', token=dislock.next_token(), state='running', claimed_at=now(), alive_until=now()+interval '1 hour' WHERE lock_key=$1`, key)
			if err != nil {
				t.Fatal(err)
			}
			fin := make(chan error, 1)
			go func() {
				_, err := su2.Exec(ctx, `UPDATE dislock.windows SET state='failed', finished_at=now() WHERE lock_key=$1`, key)
				fin <- err
			}()
			waiters(2)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if err := <-fin; err != nil {
				t.Fatal(err)
			}
			if r.err != nil && !errors.Is(r.err, store.ErrWindowTaken) {
				t.Fatalf("round %d: %v", round, r.err)
			}
			if errors.Is(r.err, store.ErrWindowTaken) && r.c.Window.State == store.StateFailed {
				hits++
				t.Logf("round %d: standby refused naming %s in state %s: %v", round, r.c.Window.Owner, r.c.Window.State, r.err)
			}
		}
		if hits > 0 {
			t.Errorf("%d/10 rounds: a standby was refused naming a failed owner (its agent skips a window nobody ran to success)", hits)
		}
	})
}

// previousReleaseClaim is the claim statement of the previous release
// (test/previous.Commit), without its commit guard: during an
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
func TestRacingTakeoversOfAFailingOwnerHaveOneWinner(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		const claimers, rounds = 6, 15
		s := storetest.Open(t, dsn, claimers+1)
		key := storetest.UniqueKey(t)
		conns := make([]*pgx.Conn, claimers)
		for i := range conns {
			conns[i] = storetest.RawConn(t, dsn)
		}
		for round := range rounds {
			w := storetest.WindowAt(round)
			o := storetest.Owner("dc-a", fmt.Sprintf("report-%d", round), "pod-a")
			first := storetest.MustClaim(t, s, key, w, o, false, ttl, store.Claimed)

			type result struct {
				who     store.Owner
				old     bool
				claim   store.Claim
				won     bool
				refused []store.Window
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
					r.who = storetest.Owner(fmt.Sprintf("dc-%d", i), fmt.Sprintf("standby-%d", i), "pod")
					if !standby {
						r.who = o
						r.who.Pod = fmt.Sprintf("retry-%d", i)
					}
					req := store.ClaimRequest{Key: key, Window: w, Index: store.NotIndexed, Owner: r.who, TTL: ttl, Standby: standby}
					claimOnce := func() (store.Claim, error) { return s.ClaimWindow(ctx, req) }
					if r.old = i%3 == 0; r.old {
						claimOnce = func() (store.Claim, error) { return claimAsPreviousRelease(ctx, s, conns[i], req) }
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
						case !errors.Is(err, store.ErrWindowTaken):
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
			if _, err := s.Finish(ctx, key, w, store.NotIndexed, first.Window.Token, store.StateFailed, storetest.Ptr(1)); err != nil {
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
					if r.claim.Outcome != store.TookOver || r.claim.Window.Token <= first.Window.Token {
						t.Errorf("round %d: %s won with outcome %q token %d; want %q with a token above the failed owner's %d",
							round, r.who.WindowOwner(), r.claim.Outcome, r.claim.Window.Token, store.TookOver, first.Window.Token)
					}
				}
				// The previous release reads the owner in a second
				// statement after a refusal, and may read the failure
				// its refusal did not see (a race of its own, which this
				// release's one-statement refusal closes); only the
				// current statement is held to this.
				for _, seen := range r.refused {
					if !r.old && seen.State != store.StateRunning {
						t.Errorf("round %d: %s was refused naming %s in state %s: its agent would skip a window nobody ran",
							round, r.who.WindowOwner(), seen.Owner, seen.State)
					}
				}
			}
			if won != 1 {
				t.Fatalf("round %d: %d claimers took the window after its owner failed, want exactly 1", round, won)
			}
			row, err := s.GetWindow(ctx, key, w, store.NotIndexed)
			if err != nil || row.Owner != *winner.Load() || row.State != store.StateRunning {
				t.Fatalf("round %d: the database holds %+v (%v), the winner was %s", round, row, err, *winner.Load())
			}
		}
	})
}

// claimAsPreviousRelease claims as an agent of the previous release does:
// its statement, then on no row a read of the owner.
func claimAsPreviousRelease(ctx context.Context, s *store.Store, conn *pgx.Conn, r store.ClaimRequest) (store.Claim, error) {
	var c store.Claim
	var tookOver bool
	err := conn.QueryRow(ctx, previousReleaseClaim, r.Key, r.Window, r.Index, r.Owner.String(), r.Owner.Cluster, r.Owner.Pod,
		r.TTL.Microseconds(), r.Owner.JobPrefix(), r.Standby).Scan(&c.Window.Token, &tookOver)
	switch {
	case err == nil:
		c.Window.Owner, c.Window.State, c.Outcome = r.Owner.String(), store.StateRunning, store.Claimed
		if tookOver {
			c.Outcome = store.TookOver
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
	return c, fmt.Errorf("previous release: %w", store.ErrWindowTaken)
}
