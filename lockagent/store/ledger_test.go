package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/test/pgtest"
)

// A ledger write goes out as one pipeline and its bounds still hold: a
// write blocked by a lock on the key's statistics gives up after
// LedgerLockTimeout instead of holding its connection (and, through
// PgBouncer, a server connection) for as long as the lock is held; and its
// relaxed commit (synchronous_commit off) stays with its own transaction,
// never reaching the lock statements that follow on the connection.
func TestALedgerWriteKeepsItsBoundsAndItsCommitSetting(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := storetest.Open(t, dsn, 1)
		key := storetest.UniqueKey(t)
		d := store.Decision{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed, Cluster: "dc-a", Job: "j", Pod: "p", Action: store.ActionRun}
		if err := s.RecordDecision(ctx, d); err != nil {
			t.Fatal(err)
		}
		var setting string
		if err := s.Handle().Pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting); err != nil {
			t.Fatal(err)
		}
		if setting != "on" {
			t.Fatalf("synchronous_commit after a ledger write = %q, want on: the ledger's setting leaked out of its transaction", setting)
		}
		holder := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN())
		tx, err := holder.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "SELECT 1 FROM dislock.key_stats WHERE lock_key = $1 FOR UPDATE", key); err != nil {
			t.Fatal(err)
		}
		begun := time.Now()
		err = s.RecordDecision(ctx, d)
		took := time.Since(begun)
		if err == nil {
			t.Fatal("a ledger write went through a lock held on the key's statistics")
		}
		if took >= store.LedgerStatementTimeout {
			t.Fatalf("the blocked ledger write gave up after %s, not at its lock timeout (%s): %v", took, store.LedgerLockTimeout, err)
		}
	})
}

// A skip (or a wait) of a window says its key was decided then, and no
// more: it marks the key's statistics only when they say the key was last
// decided before the window began, and never queues for them behind
// another session. A window skipped everywhere, its key paused, is still
// marked (the missed-window detection would take the key for silent
// otherwise); at the top of the hour the other clusters' skips neither
// write the row again nor wait for its lock, and their own rows and counts
// are recorded all the same.
func TestTheSkipsOfAWindowMarkItsKeyOnceWithoutQueueing(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := storetest.Open(t, dsn, 1)
		su := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN())
		key := storetest.UniqueKey(t)
		now, err := s.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w := now.Add(-time.Minute).Truncate(time.Minute)
		skip := func(cluster string) {
			t.Helper()
			d := store.Decision{Key: key, Window: w, Index: store.NotIndexed, Cluster: cluster, Job: "j", Pod: "p-" + cluster,
				Action: store.ActionSkip, Reason: "the key is paused"}
			// While another session holds the row, a write that waited
			// for it would end at its lock timeout, in an error.
			if err := s.RecordDecision(ctx, d); err != nil {
				t.Fatalf("recording %s's skip: %v", cluster, err)
			}
		}
		// The row as it is: when it says the key was last decided, and
		// the version of it (a write makes a new one).
		row := func() (last time.Time, version string) {
			t.Helper()
			if err := su.QueryRow(ctx, "SELECT last_decided, xmin::text FROM dislock.key_stats WHERE lock_key = $1", key).Scan(&last, &version); err != nil {
				t.Fatal(err)
			}
			return last, version
		}
		lastDecidedBefore := func() {
			t.Helper()
			if _, err := su.Exec(ctx, "UPDATE dislock.key_stats SET last_decided = now() - interval '1 hour' WHERE lock_key = $1", key); err != nil {
				t.Fatal(err)
			}
		}

		skip("dc-a") // the key's first decision makes its row
		lastDecidedBefore()
		skip("dc-b")
		if last, _ := row(); last.Before(w) {
			t.Fatalf("after a skip of window %s the key was last decided at %s: a window skipped everywhere counts as not seen", w, last)
		}
		_, marked := row()
		skip("dc-c")
		if _, v := row(); v != marked {
			t.Fatalf("a second skip of window %s wrote the key's statistics again (version %s → %s)", w, marked, v)
		}

		lastDecidedBefore()
		tx, err := su.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT 1 FROM dislock.key_stats WHERE lock_key = $1 FOR UPDATE", key); err != nil {
			t.Fatal(err)
		}
		skip("dc-b")
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		skip("dc-c")
		if last, _ := row(); last.Before(w) {
			t.Fatalf("a skip of window %s after the lock was released left the key last decided at %s", w, last)
		}
		var rows, counted int64
		if err := su.QueryRow(ctx, `SELECT (SELECT count(*) FROM dislock.decisions WHERE lock_key = $1 AND action = 'skip'),
			(SELECT coalesce(sum(n), 0) FROM dislock.decision_counts WHERE lock_key = $1 AND action = 'skip')`, key).Scan(&rows, &counted); err != nil {
			t.Fatal(err)
		}
		if rows != 5 || counted != 5 {
			t.Fatalf("5 skips recorded: %d ledger rows and %d counted, want 5 and 5", rows, counted)
		}
	})
}

// A skip of a key whose statistics row was last decided long ago waits for
// the row instead of passing it by: it may be the retention's, being
// deleted (the retention takes keys idle for 48 hours or more), and the
// skip makes it again, so that its key keeps its statistics and its
// counts stay reachable by the retention.
func TestASkipRemakesTheStatisticsTheRetentionIsDeleting(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := storetest.Open(t, dsn, 1)
		su := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN())
		key := storetest.UniqueKey(t)
		now, err := s.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w := now.Add(-time.Minute).Truncate(time.Minute)
		d := store.Decision{Key: key, Window: w, Index: store.NotIndexed, Cluster: "dc-a", Job: "j", Pod: "p", Action: store.ActionSkip}
		if err := s.RecordDecision(ctx, d); err != nil {
			t.Fatal(err)
		}
		if _, err := su.Exec(ctx, "UPDATE dislock.key_stats SET last_decided = now() - interval '3 days' WHERE lock_key = $1", key); err != nil {
			t.Fatal(err)
		}
		retention := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN())
		tx, err := retention.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "DELETE FROM dislock.key_stats WHERE lock_key = $1", key); err != nil {
			t.Fatal(err)
		}
		// The skip, without the agent's lock timeout, so that it waits as
		// long as the deletion takes.
		skipper := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN())
		skipped := make(chan error, 1)
		go func() {
			_, err := skipper.Exec(ctx, store.RecordDecisionSQL, key, w, store.NotIndexed,
				"dc-b", "j", "p-b", string(store.ActionSkip), "skipped", int64(0), nil, store.DurationBuckets)
			skipped <- err
		}()
		awaitLockWait(t, su, skipper.PgConn().PID(), "the skip waiting for the row the retention deletes")
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-skipped; err != nil {
			t.Fatalf("the skip: %v", err)
		}
		var last time.Time
		if err := su.QueryRow(ctx, "SELECT last_decided FROM dislock.key_stats WHERE lock_key = $1", key).Scan(&last); err != nil {
			t.Fatalf("the key's statistics after a skip met the retention's deletion: %v", err)
		}
		if last.Before(w) {
			t.Fatalf("the remade statistics say the key was last decided at %s, before window %s", last, w)
		}
	})
}

// A ledger write locks its key's statistics before its (key, cluster,
// action) count, the order in which every older agent's write locks them:
// in the other order an older and a newer agent writing the same key at
// once could each hold what the other waits for, and both rows be lost at
// their lock timeouts.
func TestALedgerWriteLocksTheKeysStatisticsBeforeItsCount(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := storetest.Open(t, dsn, 1)
		su := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN())
		key := storetest.UniqueKey(t)
		d := store.Decision{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed, Cluster: "dc-a", Job: "j", Pod: "p", Action: store.ActionRun}
		if err := s.RecordDecision(ctx, d); err != nil {
			t.Fatal(err)
		}
		holder := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN())
		tx, err := holder.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "SELECT 1 FROM dislock.decision_counts WHERE lock_key = $1 FOR UPDATE", key); err != nil {
			t.Fatal(err)
		}
		writer := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN())
		wrote := make(chan error, 1)
		go func() {
			_, err := writer.Exec(ctx, store.RecordDecisionSQL, key, storetest.WindowAt(1), store.NotIndexed,
				"dc-a", "j", "p", string(store.ActionRun), "claimed", int64(1), nil, store.DurationBuckets)
			wrote <- err
		}()
		awaitLockWait(t, su, writer.PgConn().PID(), "the write waiting for its count")
		probe, err := su.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = probe.Exec(ctx, "SELECT 1 FROM dislock.key_stats WHERE lock_key = $1 FOR UPDATE NOWAIT", key)
		_ = probe.Rollback(ctx)
		if err == nil {
			t.Fatal("a ledger write waiting for its count had not locked its key's statistics: it takes the two locks in the other order than older agents")
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-wrote; err != nil {
			t.Fatalf("the write, once the count was free: %v", err)
		}
	})
}

// awaitLockWait waits until backend pid waits for a lock.
func awaitLockWait(t *testing.T, conn *pgx.Conn, pid uint32, what string) {
	t.Helper()
	storetest.AwaitCond(t, what, func() bool {
		var waiting bool
		err := conn.QueryRow(context.Background(), "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", int64(pid)).Scan(&waiting)
		return err == nil && waiting
	})
}

// The ledger's and the views' transactions turn synchronous_commit off for
// themselves. Through PgBouncer's transaction pooling the next transaction
// on the same server connection is another client's lock write: had the
// setting outlived its transaction, that claim would be acknowledged before
// it is on disk. The commit guard of every lock write reads the session's
// setting, so a claim made right after a decision and a view on the one
// connection a pool of one has must be acknowledged as durable.
func TestHistoryWritesLeaveTheNextClaimDurable(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := storetest.Open(t, dsn, 1)
		key := storetest.UniqueKey(t)
		o := storetest.Owner("dc-a", "report-1", "pod-a")
		view := store.View{Schedule: "* * * * *", TimeZone: "UTC", Mode: "schedule", LeaseTTL: "30s"}
		for i := range 10 {
			w := storetest.WindowAt(i)
			if _, err := s.RecordView(ctx, key, o.Cluster, view, store.DefaultViewRecency); err != nil {
				t.Fatalf("recording the view: %v", err)
			}
			if err := s.RecordDecision(ctx, store.Decision{Key: key, Window: w, Cluster: o.Cluster, Job: o.Job, Pod: o.Pod, Action: store.ActionRun}); err != nil {
				t.Fatalf("recording the decision: %v", err)
			}
			c, err := storetest.Claim(t, s, key, w, o, false, ttl)
			if err != nil {
				t.Fatalf("window %d: a claim right after the ledger's and the view's writes: %v (ErrUncertainCommit: %v)", i, err, errors.Is(err, store.ErrUncertainCommit))
			}
			if c.Outcome != store.Claimed {
				t.Fatalf("window %d: outcome %q, want %q", i, c.Outcome, store.Claimed)
			}
			// A refusal is answered by the same statement's read branch:
			// it must also not run with the setting left over.
			storetest.MustBeTaken(t, s, key, w, storetest.Owner("dc-b", "other", "pod-b"), false, o.WindowOwner())
			if err := s.RecordDecision(ctx, store.Decision{Key: key, Window: w, Cluster: "dc-b", Job: "other", Pod: "pod-b", Action: store.ActionSkip}); err != nil {
				t.Fatalf("recording the refusal: %v", err)
			}
			if _, _, err := s.Heartbeat(ctx, key, w, store.NotIndexed, c.Window.Token, ttl); err != nil {
				t.Fatalf("window %d: a heartbeat right after the ledger's write: %v", i, err)
			}
		}
	})
}
