package lock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/test/pgtest"
)

// A claim the locked path refuses reads the owner with a second statement,
// and the owner may fail in between: the claim must then be tried again,
// never reported as "taken by an owner who failed", on which a standby (or
// a retry of the owner's Job) skips a window nobody ran to success. Each
// round holds the row locked while a standby's claim queues on it, hands
// the row to another live owner and queues that owner's failure behind
// the standby, so that the standby's locked path refuses and its read sees
// the failure. Found by the hostile review of issue 18 (1 to 3 rounds in
// 10 before the fix).
func TestARefusalNeverNamesAnOwnerWhoFailed(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := openStore(t, dsn, 2)
		hits := 0
		for round := range 10 {
			key := uniqueKey(t)
			a := owner("dc-a", "report", "pod-a")
			first := mustClaim(t, s, key, window0, a, false, ttl, lock.Claimed)
			if _, err := s.Finish(ctx, key, window0, lock.NotIndexed, first.Window.Token, lock.StateFailed, ptr(1)); err != nil {
				t.Fatal(err)
			}
			su1, su2, watch := rawConn(t, pgtest.Need(t).SuperuserDSN()), rawConn(t, pgtest.Need(t).SuperuserDSN()), rawConn(t, pgtest.Need(t).SuperuserDSN())
			tx, err := su1.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `SELECT 1 FROM dislock.windows WHERE lock_key=$1 FOR UPDATE`, key); err != nil {
				t.Fatal(err)
			}
			type res struct {
				c   lock.Claim
				err error
			}
			done := make(chan res, 1)
			go func() {
				c, err := claim(t, s, key, window0, owner("dc-c", "standby", "pod-c"), true, ttl)
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
			if r.err != nil && !errors.Is(r.err, lock.ErrWindowTaken) {
				t.Fatalf("round %d: %v", round, r.err)
			}
			if errors.Is(r.err, lock.ErrWindowTaken) && r.c.Window.State == lock.StateFailed {
				hits++
				t.Logf("round %d: standby refused naming %s in state %s: %v", round, r.c.Window.Owner, r.c.Window.State, r.err)
			}
		}
		if hits > 0 {
			t.Errorf("%d/10 rounds: a standby was refused naming a failed owner (its agent skips a window nobody ran to success)", hits)
		}
	})
}
