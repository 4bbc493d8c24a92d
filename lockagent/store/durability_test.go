package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/test/pgtest"
)

// Every token carries the epoch (the WAL timeline) in its high bits, so a
// failover, which always starts a higher timeline, can never hand out a
// smaller token than one already used downstream (test/hapg shows the
// failover itself).
func TestTokensCarryTheTimeline(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		key := storetest.UniqueKey(t)
		var last int64
		for i := range 5 {
			c := storetest.MustClaim(t, s, key, storetest.WindowAt(i), storetest.Owner("dc-a", "job", "pod"), false, ttl, store.Claimed)
			if epoch, _ := store.TokenEpoch(c.Window.Token); epoch != 1 {
				t.Fatalf("token %d is in epoch %d, want 1 (the timeline of a fresh cluster)", c.Window.Token, epoch)
			}
			if c.Window.Token <= last {
				t.Fatalf("token %d after %d", c.Window.Token, last)
			}
			last = c.Window.Token
		}
		g, err := s.AcquireLease(context.Background(), key, storetest.Owner("dc-a", "job", "pod"), ttl)
		if err != nil {
			t.Fatal(err)
		}
		if g.Lease.Token <= last {
			t.Fatalf("lease token %d after window token %d", g.Lease.Token, last)
		}
	})
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
	storetest.Open(t, srv.DirectDSN(), 1) // migrate while commits still return
	// A standby that never connects. A restart, not a reload, so that every
	// process (the checkpointer tells backends whether to wait) has it.
	if _, err := storetest.Superuser(t, srv).Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = 'standby_in_dc_b'`); err != nil {
		t.Fatal(err)
	}
	if err := srv.StopPostgres("fast"); err != nil {
		t.Fatal(err)
	}
	if err := srv.StartPostgres(); err != nil {
		t.Fatal(err)
	}
	su := storetest.Superuser(t, srv)
	// The test's own writes must not wait for the missing standby.
	if _, err := su.Exec(ctx, `SET synchronous_commit = local`); err != nil {
		t.Fatal(err)
	}
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			s, err := store.Open(ctx, tg.DSN, store.Options{MaxConns: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			awaitReachable(t, s) // PgBouncer drops its connections from before the restart
			key := storetest.UniqueKey(t)

			// The agent's own timeout: the commit keeps waiting, unseen.
			short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			_, err = s.ClaimWindow(short, store.ClaimRequest{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed, Owner: storetest.Owner("dc-a", "job", "pod"), TTL: ttl})
			cancel()
			if !errors.Is(err, store.ErrUnavailable) {
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
			req := store.ClaimRequest{Key: key, Window: storetest.WindowAt(1), Index: store.NotIndexed, Owner: storetest.Owner("dc-a", "job", "pod"), TTL: ttl}
			claimErr := make(chan error, 1)
			go func() {
				_, err := s.ClaimWindow(ctx, req)
				claimErr <- err
			}()
			cancelWaiters(t, su)
			if err := <-claimErr; !errors.Is(err, store.ErrUncertainCommit) || !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("claim whose synchronous wait was cancelled: %v, want ErrUncertainCommit (retryable)", err)
			}
			if err := su.QueryRow(ctx, `SELECT count(*) FROM dislock.windows WHERE lock_key = $1 AND window_start = $2`, key, storetest.WindowAt(1)).Scan(&visible); err != nil || visible != 1 {
				t.Fatalf("the cancelled commit is not visible locally (%d rows, %v): the hazard this guards against did not happen", visible, err)
			}
			go func() {
				_, err := s.AcquireLease(ctx, key, storetest.Owner("dc-a", "job", "pod"), ttl)
				claimErr <- err
			}()
			cancelWaiters(t, su)
			if err := <-claimErr; !errors.Is(err, store.ErrUncertainCommit) {
				t.Fatalf("lease whose synchronous wait was cancelled: %v, want ErrUncertainCommit", err)
			}

			// A role default that skips the wait altogether is no better.
			withRoleSetting(t, srv, su, tg.DSN, "synchronous_commit", "local", func(s *store.Store) {
				_, err := s.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: storetest.WindowAt(2), Index: store.NotIndexed, Owner: storetest.Owner("dc-a", "job", "pod"), TTL: ttl})
				if !errors.Is(err, store.ErrUncertainCommit) || !strings.Contains(err.Error(), "synchronous_commit = local") {
					t.Fatalf("claim under synchronous_commit = local with a synchronous standby configured: %v, want ErrUncertainCommit naming the setting", err)
				}
			})
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

// withRoleSetting runs fn with a fresh Store through dsn while the
// application role has a default setting (ALTER ROLE … SET), then resets it.
// Server connections from before are closed, so that PgBouncer's new ones
// pick the default up.
func withRoleSetting(t *testing.T, srv *pgtest.Server, su *pgx.Conn, dsn, name, value string, fn func(s *store.Store)) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	role := pgx.Identifier{cfg.User}.Sanitize()
	reconnect := func() {
		if _, err := su.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1 AND pid <> pg_backend_pid()`, cfg.User); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := su.Exec(ctx, `ALTER ROLE `+role+` SET `+name+` = '`+value+`'`); err != nil {
		t.Fatal(err)
	}
	reconnect()
	defer func() {
		if _, err := su.Exec(ctx, `ALTER ROLE `+role+` RESET `+name); err != nil {
			t.Fatal(err)
		}
		reconnect()
	}()
	s, err := store.Open(ctx, dsn, store.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	awaitReachable(t, s) // PgBouncer notices its closed server connections on first use
	fn(s)
}

// A role default that hides warnings makes every write uncertain (the agent
// retries and fails closed, with the reason); a harmless warning during a
// write is not mistaken for a cut-short wait; and dislock check names the
// setting, and a read-only database, and a standby quorum that is not met.
func TestWeakenedCommitsAreNeverWins(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "guard"})
	ctx := context.Background()
	storetest.Open(t, srv.DirectDSN(), 2) // migrated
	su := storetest.Superuser(t, srv)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			key := storetest.UniqueKey(t)
			withRoleSetting(t, srv, su, tg.DSN, "client_min_messages", "error", func(s *store.Store) {
				_, err := s.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed, Owner: storetest.Owner("dc-a", "job", "pod"), TTL: ttl})
				if !errors.Is(err, store.ErrUncertainCommit) || !strings.Contains(err.Error(), "client_min_messages = error") {
					t.Fatalf("claim under client_min_messages = error: %v, want ErrUncertainCommit naming the setting", err)
				}
				fs, err := check.Database(ctx, s, check.Options{AllowAsync: true})
				if err != nil {
					t.Fatal(err)
				}
				if f := storetest.ByCheck(fs)["role settings"]; f.Status != check.StatusFail || !strings.Contains(f.Detail, "client_min_messages=error for dislock") {
					t.Fatalf("check under a role's client_min_messages = error: %+v", fs)
				}
			})
		})
	}

	if _, err := su.Exec(ctx, `CREATE FUNCTION dislock.warn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE WARNING 'a warning about something else'; RETURN NEW; END $$;
CREATE TRIGGER warn BEFORE INSERT ON dislock.windows FOR EACH ROW EXECUTE FUNCTION dislock.warn()`); err != nil {
		t.Fatal(err)
	}
	// Under lc_messages = C the server's messages are surely English, and a
	// harmless warning is told apart from a cut-short wait; under any other
	// value (C.UTF-8 follows the server's LANGUAGE) every warning counts.
	for _, tc := range []struct {
		lcMessages string
		uncertain  bool
	}{{"C", false}, {"C.UTF-8", true}} {
		withRoleSetting(t, srv, su, srv.DirectDSN(), "lc_messages", tc.lcMessages, func(s *store.Store) {
			c, err := s.ClaimWindow(ctx, store.ClaimRequest{Key: storetest.UniqueKey(t), Window: storetest.WindowAt(0), Index: store.NotIndexed, Owner: storetest.Owner("dc-a", "job", "pod"), TTL: ttl})
			if got := errors.Is(err, store.ErrUncertainCommit); got != tc.uncertain || (!tc.uncertain && (err != nil || c.Outcome != store.Claimed)) {
				t.Fatalf("lc_messages = %s, a claim that drew a harmless warning: %+v %v; want uncertain: %v", tc.lcMessages, c.Outcome, err, tc.uncertain)
			}
		})
	}
	if _, err := su.Exec(ctx, `DROP TRIGGER warn ON dislock.windows`); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		set, reset, check, want string
		async                   bool
	}{
		{`ALTER SYSTEM SET synchronous_commit = off`, `ALTER SYSTEM RESET synchronous_commit`, "synchronous_commit", "before it is on disk", true},
		{`ALTER SYSTEM SET synchronous_standby_names = 'FIRST 2 (b, c)'`, `ALTER SYSTEM RESET synchronous_standby_names`, "replication", "waits for 2 standby(s) but 0 stream", true},
		{`ALTER SYSTEM SET synchronous_standby_names = '2 (b, c)'`, `ALTER SYSTEM RESET synchronous_standby_names`, "replication", "waits for 2 standby(s) but 0 stream", true},
		{`ALTER ROLE dislock SET synchronous_commit = false`, `ALTER ROLE dislock RESET synchronous_commit`, "role settings", "synchronous_commit=false for dislock", true},
		{`ALTER DATABASE dislock SET default_transaction_read_only = on`, `ALTER DATABASE dislock RESET default_transaction_read_only`, "primary", "read-only", false},
	} {
		for _, q := range []string{tc.set, `SELECT pg_reload_conf()`} {
			if _, err := su.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		// A fresh session sees the new settings once the server reloaded.
		var f check.Finding
		storetest.AwaitCond(t, tc.check+" to fail", func() bool {
			fresh, err := store.Open(ctx, srv.DirectDSN(), store.Options{MaxConns: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer fresh.Close()
			fs, err := check.Database(ctx, fresh, check.Options{AllowAsync: tc.async})
			f = storetest.ByCheck(fs)[tc.check]
			return err == nil && f.Status == check.StatusFail
		})
		if !strings.Contains(f.Detail, tc.want) || f.Fix == "" {
			t.Errorf("%s: %+v", tc.set, f)
		}
		for _, q := range []string{tc.reset, `SELECT pg_reload_conf()`} {
			if _, err := su.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
}

// The commit guard is written twice, for as long as agents may meet a
// database before schema 20: in the statements (commitGuard) and in
// dislock.commit_guard(), which the claim and the renewal call. Both answer
// alike for every setting that weakens a commit, in any spelling, and for
// every setting that does not.
func TestTheCommitGuardIsAnsweredAlikeInTheStatementAndTheCall(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "guard-twins"})
	storetest.Open(t, srv.DirectDSN(), 1) // migrated
	su := storetest.Superuser(t, srv)
	ctx := context.Background()
	weakened := 0
	for _, commit := range []string{"on", "off", "false", "0", "local", "remote_write", "remote_apply"} {
		for _, messages := range []string{"notice", "warning", "error", "log", "debug1"} {
			for _, lc := range []string{"C", "POSIX", "C.UTF-8"} {
				tx, err := su.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for name, v := range map[string]string{"synchronous_commit": commit, "client_min_messages": messages, "lc_messages": lc} {
					if _, err := tx.Exec(ctx, "SELECT set_config($1, $2, true)", name, v); err != nil {
						t.Fatal(err)
					}
				}
				var one int
				var stmtWhy, callWhy string
				var stmtEnglish, callEnglish bool
				if err := tx.QueryRow(ctx, store.CommitGuardSQL).Scan(&one, &stmtWhy, &stmtEnglish); err != nil {
					t.Fatal(err)
				}
				if err := tx.QueryRow(ctx, "SELECT * FROM dislock.commit_guard()").Scan(&callWhy, &callEnglish); err != nil {
					t.Fatal(err)
				}
				_ = tx.Rollback(ctx)
				if stmtWhy != callWhy || stmtEnglish != callEnglish {
					t.Errorf("synchronous_commit=%s client_min_messages=%s lc_messages=%s: the statement answers (%q, %v), the call (%q, %v)",
						commit, messages, lc, stmtWhy, stmtEnglish, callWhy, callEnglish)
				}
				if callWhy != "" {
					weakened++
				}
			}
		}
	}
	if weakened == 0 {
		t.Fatal("no setting weakened a commit: the comparison proves nothing")
	}
}
