package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/test/pgtest"
)

// Every token carries the epoch (the WAL timeline) in its high bits, so a
// failover, which always starts a higher timeline, can never hand out a
// smaller token than one already used downstream (test/hapg shows the
// failover itself).
func TestTokensCarryTheTimeline(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		s := openStore(t, dsn, 2)
		key := uniqueKey(t)
		var last int64
		for i := range 5 {
			c := mustClaim(t, s, key, windowAt(i), owner("dc-a", "job", "pod"), false, ttl, lock.Claimed)
			if epoch, _ := lock.TokenEpoch(c.Window.Token); epoch != 1 {
				t.Fatalf("token %d is in epoch %d, want 1 (the timeline of a fresh cluster)", c.Window.Token, epoch)
			}
			if c.Window.Token <= last {
				t.Fatalf("token %d after %d", c.Window.Token, last)
			}
			last = c.Window.Token
		}
		g, err := s.AcquireLease(context.Background(), key, owner("dc-a", "job", "pod"), ttl)
		if err != nil {
			t.Fatal(err)
		}
		if g.Lease.Token <= last {
			t.Fatalf("lease token %d after window token %d", g.Lease.Token, last)
		}
	})
}

// A single PostgreSQL has nobody to fail over to: dislock check says so and
// names the setting and the fix, and passes once the operator explicitly
// accepts it.
func TestCheckRefusesAnUnreplicatedDatabase(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		s := openStore(t, dsn, 2)
		fs, err := s.CheckDatabase(context.Background(), lock.CheckOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := byCheck(fs)
		if f := got["replication"]; f.Status != lock.StatusFail || !strings.Contains(f.Detail, "synchronous_standby_names") || !strings.Contains(f.Fix, "synchronous_mode: true") {
			t.Errorf("replication finding: %+v", f)
		}
		for _, c := range []string{"primary", "synchronous_commit", "schema", "tokens"} {
			if got[c].Status != lock.StatusOK {
				t.Errorf("%s: %+v, want ok", c, got[c])
			}
		}
		if !lock.Failed(fs) {
			t.Error("Failed(findings) = false for an unreplicated database")
		}
		fs, err = s.CheckDatabase(context.Background(), lock.CheckOptions{AllowAsync: true})
		if err != nil {
			t.Fatal(err)
		}
		if f := byCheck(fs)["replication"]; f.Status != lock.StatusAccepted || lock.Failed(fs) {
			t.Errorf("with AllowAsync: %+v", fs)
		}
	})
}

func byCheck(fs []lock.Finding) map[string]lock.Finding {
	m := map[string]lock.Finding{}
	for _, f := range fs {
		m[f.Check] = f
	}
	return m
}

// A schema restored into another PostgreSQL cluster starts at timeline 1
// again: check finds that new tokens would be smaller than recorded ones and
// prints the statement that fixes it; after it, tokens grow again.
func TestCheckFindsTokensThatWouldGoBack(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "epoch"})
	ctx := context.Background()
	s := openStore(t, srv.DirectDSN(), 2)
	key := uniqueKey(t)
	c := mustClaim(t, s, key, windowAt(0), owner("dc-a", "job", "pod"), false, ttl, lock.Claimed)
	su := superuser(t, srv)
	restored := int64(5)<<40 + 77 // a token handed out on timeline 5 of the old cluster
	if _, err := su.Exec(ctx, `UPDATE dislock.windows SET token = $1 WHERE lock_key = $2`, restored, key); err != nil {
		t.Fatal(err)
	}
	fs, err := s.CheckDatabase(ctx, lock.CheckOptions{AllowAsync: true})
	if err != nil {
		t.Fatal(err)
	}
	f := byCheck(fs)["tokens"]
	if f.Status != lock.StatusFail || !strings.Contains(f.Detail, "epoch 5") || !strings.HasPrefix(f.Fix, "UPDATE dislock.token_epoch") {
		t.Fatalf("tokens finding: %+v (first token %d)", f, c.Window.Token)
	}
	if _, err := su.Exec(ctx, f.Fix); err != nil {
		t.Fatalf("the printed fix %q: %v", f.Fix, err)
	}
	if fs, _ := s.CheckDatabase(ctx, lock.CheckOptions{AllowAsync: true}); lock.Failed(fs) {
		t.Fatalf("after the fix: %+v", fs)
	}
	next := mustClaim(t, s, key, windowAt(1), owner("dc-a", "job", "pod"), false, ttl, lock.Claimed)
	if next.Window.Token <= restored {
		t.Fatalf("token %d after the fix, not above the restored %d", next.Window.Token, restored)
	}
}

func superuser(t *testing.T, srv *pgtest.Server) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), srv.SuperuserDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// With synchronous replication, a commit waits for the standby. Whoever cuts
// that wait short (pg_cancel_backend here; a pooler's query_timeout or a
// client's cancel request alike) leaves the row committed and visible on
// the primary but possibly lost by a failover. The store must report such a
// claim or lease as uncertain — never as won — so the agent tries again
// instead of running. And its own call timeout must not cut the wait: the
// row then stays invisible until the standby confirms it.
func TestACommitTheStandbyNeverConfirmedIsNotAWin(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "syncwait"})
	ctx := context.Background()
	openStore(t, srv.DirectDSN(), 1) // migrate while commits still return
	// A standby that never connects. A restart, not a reload, so that every
	// process (the checkpointer tells backends whether to wait) has it.
	if _, err := superuser(t, srv).Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = 'standby_in_dc_b'`); err != nil {
		t.Fatal(err)
	}
	if err := srv.StopPostgres("fast"); err != nil {
		t.Fatal(err)
	}
	if err := srv.StartPostgres(); err != nil {
		t.Fatal(err)
	}
	su := superuser(t, srv)
	// The test's own writes must not wait for the missing standby.
	if _, err := su.Exec(ctx, `SET synchronous_commit = local`); err != nil {
		t.Fatal(err)
	}
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			s, err := lock.Open(ctx, tg.DSN, lock.Options{MaxConns: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			awaitReachable(t, s) // PgBouncer drops its connections from before the restart
			key := uniqueKey(t)

			// The agent's own timeout: the commit keeps waiting, unseen.
			short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			_, err = s.ClaimWindow(short, lock.ClaimRequest{Key: key, Window: windowAt(0), Index: lock.NotIndexed, Owner: owner("dc-a", "job", "pod"), TTL: ttl})
			cancel()
			if !errors.Is(err, lock.ErrUnavailable) {
				t.Fatalf("claim whose commit waits for the standby: %v, want ErrUnavailable", err)
			}
			t.Logf("claim whose commit waits for the standby: %v", err)
			awaitSyncRepWaiters(t, su, 1)
			var visible int
			if err := su.QueryRow(ctx, `SELECT count(*) FROM dislock.windows WHERE lock_key = $1`, key).Scan(&visible); err != nil || visible != 0 {
				t.Fatalf("claim visible to other sessions while its commit waits: %d rows (%v)", visible, err)
			}
			cancelWaiters(t, su)

			// Someone else cuts the wait short (an operator, a pooler's
			// query_timeout): committed locally, uncertain.
			req := lock.ClaimRequest{Key: key, Window: windowAt(1), Index: lock.NotIndexed, Owner: owner("dc-a", "job", "pod"), TTL: ttl}
			claimErr := make(chan error, 1)
			go func() {
				_, err := s.ClaimWindow(ctx, req)
				claimErr <- err
			}()
			cancelWaiters(t, su)
			if err := <-claimErr; !errors.Is(err, lock.ErrUncertainCommit) || !errors.Is(err, lock.ErrUnavailable) {
				t.Fatalf("claim whose synchronous wait was cancelled: %v, want ErrUncertainCommit (retryable)", err)
			}
			if err := su.QueryRow(ctx, `SELECT count(*) FROM dislock.windows WHERE lock_key = $1 AND window_start = $2`, key, windowAt(1)).Scan(&visible); err != nil || visible != 1 {
				t.Fatalf("the cancelled commit is not visible locally (%d rows, %v): the hazard this guards against did not happen", visible, err)
			}
			go func() {
				_, err := s.AcquireLease(ctx, key, owner("dc-a", "job", "pod"), ttl)
				claimErr <- err
			}()
			cancelWaiters(t, su)
			if err := <-claimErr; !errors.Is(err, lock.ErrUncertainCommit) {
				t.Fatalf("lease whose synchronous wait was cancelled: %v, want ErrUncertainCommit", err)
			}
		})
	}
}

// cancelWaiters waits for a backend waiting for the synchronous standby and
// cancels its wait (pg_cancel_backend, as an operator or a pooler would).
func cancelWaiters(t *testing.T, su *pgx.Conn) {
	t.Helper()
	awaitSyncRepWaiters(t, su, 1)
	if _, err := su.Exec(context.Background(), `SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`); err != nil {
		t.Fatal(err)
	}
	awaitSyncRepWaiters(t, su, 0)
}

// awaitSyncRepWaiters waits until n backends wait for the synchronous standby.
func awaitSyncRepWaiters(t *testing.T, su *pgx.Conn, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got int
		if err := su.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends wait for the synchronous standby, want %d", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
