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
		f := newLedgerFixture(t, dsn, store.ActionSkip)
		skip := func(cluster string) {
			t.Helper()
			// While another session holds the row, a write that waited
			// for it would end at its lock timeout, in an error.
			if err := f.s.RecordDecision(f.ctx, f.decision(cluster, store.ActionSkip)); err != nil {
				t.Fatalf("recording %s's skip: %v", cluster, err)
			}
		}
		// The row's version: a write makes a new one.
		version := func() string {
			t.Helper()
			var v string
			if err := f.su.QueryRow(f.ctx, "SELECT xmin::text FROM dislock.key_stats WHERE lock_key = $1", f.key).Scan(&v); err != nil {
				t.Fatal(err)
			}
			return v
		}

		f.lastDecidedAgo(t, "1 hour")
		skip("dc-b")
		f.mustBeMarked(t, "after a skip of its window")
		marked := version()
		skip("dc-c")
		if v := version(); v != marked {
			t.Fatalf("a second skip of window %s wrote the key's statistics again (version %s → %s)", f.w, marked, v)
		}

		f.lastDecidedAgo(t, "1 hour")
		tx, err := f.su.Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(f.ctx, "SELECT 1 FROM dislock.key_stats WHERE lock_key = $1 FOR UPDATE", f.key); err != nil {
			t.Fatal(err)
		}
		skip("dc-b")
		if err := tx.Rollback(f.ctx); err != nil {
			t.Fatal(err)
		}
		skip("dc-c")
		f.mustBeMarked(t, "after a skip once the lock was released")
		var rows, counted int64
		if err := f.su.QueryRow(f.ctx, `SELECT (SELECT count(*) FROM dislock.decisions WHERE lock_key = $1 AND action = 'skip'),
			(SELECT coalesce(sum(n), 0) FROM dislock.decision_counts WHERE lock_key = $1 AND action = 'skip')`, f.key).Scan(&rows, &counted); err != nil {
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
		f := newLedgerFixture(t, dsn, store.ActionSkip)
		f.lastDecidedAgo(t, "3 days")
		tx, err := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN()).Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(f.ctx)
		if _, err := tx.Exec(f.ctx, "DELETE FROM dislock.key_stats WHERE lock_key = $1", f.key); err != nil {
			t.Fatal(err)
		}
		skipped := f.blockedWrite(t, f.decision("dc-b", store.ActionSkip), "the skip waiting for the row the retention deletes")
		if err := tx.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-skipped; err != nil {
			t.Fatalf("the skip: %v", err)
		}
		f.mustBeMarked(t, "after a skip met the retention's deletion")
	})
}

// A ledger write locks its key's statistics before its (key, cluster,
// action) count, the order in which every older agent's write locks them:
// in the other order an older and a newer agent writing the same key at
// once could each hold what the other waits for, and both rows be lost at
// their lock timeouts.
func TestALedgerWriteLocksTheKeysStatisticsBeforeItsCount(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		f := newLedgerFixture(t, dsn, store.ActionRun)
		tx, err := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN()).Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(f.ctx)
		if _, err := tx.Exec(f.ctx, "SELECT 1 FROM dislock.decision_counts WHERE lock_key = $1 FOR UPDATE", f.key); err != nil {
			t.Fatal(err)
		}
		wrote := f.blockedWrite(t, f.decision("dc-a", store.ActionRun), "the write waiting for its count")
		probe, err := f.su.Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = probe.Exec(f.ctx, "SELECT 1 FROM dislock.key_stats WHERE lock_key = $1 FOR UPDATE NOWAIT", f.key)
		_ = probe.Rollback(f.ctx)
		if err == nil {
			t.Fatal("a ledger write waiting for its count had not locked its key's statistics: it takes the two locks in the other order than older agents")
		}
		if err := tx.Rollback(f.ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-wrote; err != nil {
			t.Fatalf("the write, once the count was free: %v", err)
		}
	})
}

// ledgerFixture is a key whose first decision (cluster dc-a's) is in the
// ledger, for window w, which began a minute ago by the database's clock.
type ledgerFixture struct {
	ctx context.Context
	s   *store.Store
	su  *pgx.Conn // a superuser's
	key string
	w   time.Time
}

func newLedgerFixture(t *testing.T, dsn string, first store.Action) ledgerFixture {
	t.Helper()
	f := ledgerFixture{ctx: context.Background(), s: storetest.Open(t, dsn, 1),
		su: storetest.RawConn(t, pgtest.Need(t).SuperuserDSN()), key: storetest.UniqueKey(t)}
	now, err := f.s.Now(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	f.w = now.Add(-time.Minute).Truncate(time.Minute)
	if err := f.s.RecordDecision(f.ctx, f.decision("dc-a", first)); err != nil {
		t.Fatal(err)
	}
	return f
}

// decision is cluster's decision a of the key's window.
func (f ledgerFixture) decision(cluster string, a store.Action) store.Decision {
	return store.Decision{Key: f.key, Window: f.w, Index: store.NotIndexed, Cluster: cluster, Job: "j", Pod: "p-" + cluster,
		Action: a, Reason: "a test's " + string(a)}
}

// lastDecidedAgo sets the key's statistics to say it was last decided ago
// (an interval) by the database's clock.
func (f ledgerFixture) lastDecidedAgo(t *testing.T, ago string) {
	t.Helper()
	if _, err := f.su.Exec(f.ctx, "UPDATE dislock.key_stats SET last_decided = now() - $2::interval WHERE lock_key = $1", f.key, ago); err != nil {
		t.Fatal(err)
	}
}

// mustBeMarked fails unless the key's statistics say it was decided at or
// after its window's start.
func (f ledgerFixture) mustBeMarked(t *testing.T, when string) {
	t.Helper()
	var last time.Time
	if err := f.su.QueryRow(f.ctx, "SELECT last_decided FROM dislock.key_stats WHERE lock_key = $1", f.key).Scan(&last); err != nil {
		t.Fatalf("the key's statistics %s: %v", when, err)
	}
	if last.Before(f.w) {
		t.Fatalf("%s of window %s the key's statistics say it was last decided at %s", when, f.w, last)
	}
}

// blockedWrite sends d's ledger write as RecordDecision does but without
// its lock timeout (on a connection of its own, so that it waits as long
// as it must), returns once it waits for a lock, and delivers its result
// on the channel.
func (f ledgerFixture) blockedWrite(t *testing.T, d store.Decision, what string) <-chan error {
	t.Helper()
	conn := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN())
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(f.ctx, store.RecordDecisionSQL, d.Key, d.Window, d.Index, d.Cluster, d.Job, d.Pod,
			string(d.Action), d.Reason, d.Token, nil, store.DurationBuckets)
		done <- err
	}()
	storetest.AwaitCond(t, what, func() bool {
		var waiting bool
		err := f.su.QueryRow(f.ctx, "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1",
			int64(conn.PgConn().PID())).Scan(&waiting)
		return err == nil && waiting
	})
	return done
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
