package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/ledger"
)

// retainedTables are the tables retention deletes old rows of that a
// tenant may write, each with its age column.
var retainedTables = []struct{ table, age string }{
	{"windows", "window_start"},
	{"views", "seen_at"},
	{"decisions", "decided_at"},
	{"key_stats", "last_decided"},
	{"decision_counts", ""}, // goes with its key's key_stats row
}

// writeOldRows writes, through c (the owner, or the tenant of the key's
// namespace: every statement is one a tenant may run on its own rows), a
// row of key 400 days old in each table of retainedTables.
func writeOldRows(t *testing.T, c *pgx.Conn, key string) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO dislock.windows (lock_key, window_start, owner, cluster, pod, token, state, claimed_at, alive_until, finished_at, exit_code)
		 SELECT $1::text, t, 'dc-a/ns/job/uid/pod', 'dc-a', 'pod', dislock.next_token(), 'succeeded', t, t, t, 0
		 FROM (SELECT date_trunc('minute', now() - interval '400 days') AS t) o`,
		`INSERT INTO dislock.views (lock_key, cluster, view, seen_at, changed_at)
		 VALUES ($1::text, 'dc-a', '{"schedule":"0 2 * * *","mode":"schedule"}', now() - interval '400 days', now() - interval '400 days')`,
		`INSERT INTO dislock.decisions (lock_key, window_start, cluster, job, pod, action, reason, decided_at)
		 VALUES ($1::text, date_trunc('minute', now() - interval '400 days'), 'dc-a', 'job', 'pod', 'succeeded', 'old', now() - interval '400 days')`,
		`INSERT INTO dislock.key_stats (lock_key, first_seen, last_decided) VALUES ($1::text, now() - interval '401 days', now() - interval '400 days')`,
		`INSERT INTO dislock.decision_counts (lock_key, cluster, action, n) VALUES ($1::text, 'dc-a', 'succeeded', 1)`,
	} {
		if _, err := c.Exec(ctx, q, key); err != nil {
			t.Fatalf("writing an old row of %s: %v\n%s", key, err, q)
		}
	}
}

// rowsLeft counts, as the owner, the rows of key in each table of
// retainedTables.
func rowsLeft(t *testing.T, owner *pgx.Conn, key string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, r := range retainedTables {
		var n int
		if err := owner.QueryRow(context.Background(), `SELECT count(*) FROM dislock.`+r.table+` WHERE lock_key = $1::text`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		out[r.table] = n
	}
	return out
}

// awaitRowLocked waits until another session holds key's row of table
// locked: the owner's FOR UPDATE NOWAIT fails with SQLSTATE 55P03.
func awaitRowLocked(t *testing.T, owner *pgx.Conn, table, key string) {
	t.Helper()
	ctx := context.Background()
	storetest.AwaitCond(t, fmt.Sprintf("the tenant holding its row of dislock.%s locked", table), func() bool {
		tx, err := owner.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a probe
		_, err = tx.Exec(ctx, `SELECT 1 FROM dislock.`+table+` WHERE lock_key = $1::text FOR UPDATE NOWAIT`, key)
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && pgErr.Code == "55P03"
	})
}

// A tenant may write rows of its own namespace as old as it likes and hold
// them locked: an open transaction that updated them (until PgBouncer's
// idle_transaction_timeout, if set), or one statement that locks them and
// then sleeps. Retention used to wait for that lock without bound, on
// every table it deletes from, holding meanwhile the locks it had taken on
// every other namespace's old rows, and the leader's maintenance loop with
// it (no more retention, no disagreement reports). Now it skips the rows
// another session holds, deletes every other namespace's old rows within
// its bound, and deletes the skipped ones at a later run once they are let
// go.
func TestRetentionIsNotBlockedByATenantsLockedRow(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		ownerConn := storetest.RawConn(t, dsn)
		nsA, nsB := storetest.Namespace(t, "keeper"), storetest.Namespace(t, "bystander")
		cred := storetest.Provision(t, own, nsA)
		asTenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, cred))
		var mine, theirs string // each case's keys
		locked := []string{"windows", "views", "key_stats", "decision_counts"}

		retain := func(t *testing.T) int64 {
			t.Helper()
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			start := time.Now()
			n, err := ledger.DeleteOldWindows(rctx, own, store.DefaultRetention)
			if took := time.Since(start); err != nil || took > ledger.RetentionStatementTimeout {
				t.Fatalf("retention: %d windows, %v, after %s; want it done within %s", n, err, took, ledger.RetentionStatementTimeout)
			}
			return n
		}
		check := func(t *testing.T, what string, mineWant int) {
			t.Helper()
			for _, r := range retainedTables {
				want := 0
				for _, l := range locked {
					if l == r.table {
						want = mineWant
					}
				}
				if got := rowsLeft(t, ownerConn, mine)[r.table]; got != want {
					t.Errorf("%s: %d rows of the tenant's old key in dislock.%s, want %d", what, got, r.table, want)
				}
				if got := rowsLeft(t, ownerConn, theirs)[r.table]; got != 0 {
					t.Errorf("%s: %d rows of the other namespace's old key in dislock.%s, want them deleted", what, got, r.table)
				}
			}
		}

		t.Run("an open transaction that updated them", func(t *testing.T) {
			mine, theirs = nsA+"/updated", nsB+"/updated"
			writeOldRows(t, asTenant, mine)
			writeOldRows(t, ownerConn, theirs)
			tx, err := asTenant.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // let go below
			for _, q := range []string{
				`UPDATE dislock.windows SET finished_at = finished_at WHERE lock_key = $1::text`,
				`UPDATE dislock.views SET seen_at = seen_at WHERE lock_key = $1::text`,
				`UPDATE dislock.key_stats SET last_decided = last_decided WHERE lock_key = $1::text`,
				`UPDATE dislock.decision_counts SET n = n WHERE lock_key = $1::text`,
			} {
				if tag, err := tx.Exec(ctx, q, mine); err != nil || tag.RowsAffected() != 1 {
					t.Fatalf("the tenant locking its own row: %v, %v", tag, err)
				}
			}
			for _, table := range locked {
				awaitRowLocked(t, ownerConn, table, mine)
			}
			if n := retain(t); n < 1 {
				t.Errorf("retention deleted %d windows, want at least the other namespace's", n)
			}
			check(t, "while the tenant holds its rows", 1)
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			retain(t)
			check(t, "once the tenant let go", 0)
		})

		t.Run("one statement that locks them and sleeps", func(t *testing.T) {
			mine, theirs = nsA+"/selected", nsB+"/selected"
			writeOldRows(t, asTenant, mine)
			writeOldRows(t, ownerConn, theirs)
			sleeping := make(chan error, 1)
			go func() {
				_, err := asTenant.Exec(ctx, `WITH w AS (SELECT 1 FROM dislock.windows WHERE lock_key = $1::text FOR UPDATE),
					v AS (SELECT 1 FROM dislock.views WHERE lock_key = $1::text FOR UPDATE),
					k AS (SELECT 1 FROM dislock.key_stats WHERE lock_key = $1::text FOR UPDATE),
					c AS (SELECT 1 FROM dislock.decision_counts WHERE lock_key = $1::text FOR UPDATE)
					SELECT pg_sleep(120) FROM w, v, k, c`, mine)
				sleeping <- err
			}()
			for _, table := range locked {
				awaitRowLocked(t, ownerConn, table, mine)
			}
			retain(t)
			check(t, "while the tenant's statement holds its rows", 1)
			// The tenant ends its own statement (any role may cancel its
			// own sessions').
			canceller := storetest.RawConn(t, storetest.TenantDSN(t, dsn, cred))
			if _, err := canceller.Exec(ctx, `SELECT pg_cancel_backend(pid) FROM pg_stat_activity
				WHERE usename = current_user AND pid <> pg_backend_pid() AND query LIKE '%pg_sleep(120)%'`); err != nil {
				t.Fatal(err)
			}
			if err := <-sleeping; err == nil || !strings.Contains(err.Error(), "57014") {
				t.Fatalf("the tenant's statement: %v, want it cancelled", err)
			}
			retain(t)
			check(t, "once the tenant let go", 0)
		})
	})
}

// Retention forgets a window's shape with its rows: dislock.window_units
// does not grow by a row per tick for ever.
func TestRetentionForgetsTheShapesOfTheWindowsItDeletes(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		now, err := s.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		key := storetest.UniqueKey(t)
		old := now.Add(-100 * time.Hour).Truncate(time.Minute)
		c, err := storetest.Claim(t, s, key, old, storetest.Owner("dc-a", "job-a", "pod-a"), false, storetest.TTL)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Finish(ctx, key, old, store.NotIndexed, c.Window.Token, store.StateSucceeded, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := ledger.DeleteOldWindows(ctx, s, store.MinRetention); err != nil {
			t.Fatal(err)
		}
		var windows, units int
		if err := s.Handle().Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM dislock.windows WHERE lock_key = $1),
			(SELECT count(*) FROM dislock.window_units WHERE lock_key = $1)`, key).Scan(&windows, &units); err != nil {
			t.Fatal(err)
		}
		if windows != 0 || units != 0 {
			t.Fatalf("after retention: %d window rows and %d shapes of a window 100 h old; want none", windows, units)
		}
	})
}

func TestRetentionDeletesOnlyOldFinishedWindows(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		key := storetest.UniqueKey(t)
		now, err := s.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		old := now.Add(-40 * 24 * time.Hour).Truncate(time.Minute)
		recent := now.Add(-time.Hour).Truncate(time.Minute)
		a := storetest.Owner("dc-a", "job", "pod")
		done := storetest.MustClaim(t, s, key, old, a, false, storetest.TTL, store.Claimed)
		if _, err := s.Finish(ctx, key, old, store.NotIndexed, done.Window.Token, store.StateSucceeded, storetest.Ptr(0)); err != nil {
			t.Fatal(err)
		}
		alive := old.Add(time.Minute)
		storetest.MustClaim(t, s, key, alive, a, false, time.Hour, store.Claimed) // an old window whose owner is still running
		storetest.MustClaim(t, s, key, recent, a, false, storetest.TTL, store.Claimed)

		if _, err := ledger.DeleteOldWindows(ctx, s, store.MinRetention-time.Minute); err == nil || !strings.Contains(err.Error(), "shorter than 48h0m0s") {
			t.Fatalf("a retention below the minimum: %v, want a refusal naming the bound", err)
		}
		if _, err := ledger.DeleteOldWindows(ctx, s, store.DefaultRetention); err != nil {
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
