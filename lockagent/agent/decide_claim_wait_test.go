package agent_test

// A decision's database call is not cut at 5 s but may take the whole
// StartTimeout (2 min by default): a claim held up in the database is
// waited for, and neither a stop nor a lapse while it waits may let the
// window run twice.

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

// heldWindow is a window another Job's pod claimed and failed, so that a
// standby's claim goes through the insert and its conflict path, whose row
// lock an open superuser transaction holds: the claim waits in the
// database as a claim behind a busy row does, for as long as the test
// keeps the transaction open.
type heldWindow struct {
	su     *pgx.Conn // holds the row lock
	tx     pgx.Tx
	txPID  uint32
	watch  *pgx.Conn // watches who waits for it
	failed store.Claim
}

func holdFailedWindow(t *testing.T, j job, w time.Time) *heldWindow {
	t.Helper()
	ctx := context.Background()
	s := openStore(t, j.dsn)
	ns, _, _ := strings.Cut(j.key, "/")
	o := store.Owner{Cluster: "dc-b", Namespace: ns, Job: "other", JobUID: "uid-other", Pod: "other-pod"}
	c, err := s.ClaimWindow(ctx, store.ClaimRequest{Key: j.key, Window: w, Index: store.NotIndexed, Owner: o, TTL: j.ttl})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Finish(ctx, j.key, w, store.NotIndexed, c.Window.Token, store.StateFailed, nil); err != nil {
		t.Fatal(err)
	}
	h := &heldWindow{failed: c}
	for _, conn := range []**pgx.Conn{&h.su, &h.watch} {
		if *conn, err = pgx.Connect(ctx, pgtest.Need(t).SuperuserDSN()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { (*conn).Close(context.Background()) })
	}
	h.txPID = h.su.PgConn().PID()
	if h.tx, err = h.su.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := h.tx.Exec(ctx, `SELECT 1 FROM dislock.windows WHERE lock_key = $1 AND window_start = $2 FOR UPDATE`, j.key, w); err != nil {
		t.Fatal(err)
	}
	return h
}

// awaitWaiters waits until n claims wait for a row lock (the held one, or
// the tuple lock of a claim queued before them), and returns the earliest
// transaction start among them: the now() their claims compute alive_until
// from.
func (h *heldWindow) awaitWaiters(t *testing.T, n int) time.Time {
	t.Helper()
	var xactStart time.Time
	await(t, "claims waiting for the held row lock", 30*time.Second, func() bool {
		var waiting int
		err := h.watch.QueryRow(context.Background(), `SELECT count(*), coalesce(min(xact_start), now()) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%dislock.claim_guarded(%' AND pid <> $1`, int(h.txPID)).Scan(&waiting, &xactStart)
		if err != nil {
			t.Fatal(err)
		}
		return waiting >= n
	})
	return xactStart
}

func (h *heldWindow) release(t *testing.T) {
	t.Helper()
	if err := h.tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A stop signal while the decision's claim waits in the database (now for
// up to StartTimeout, no longer 5 s) writes no decision: the sidecar stops
// promptly, says so in its termination message, and the kubelet's restart
// of it decides afresh and runs the window once.
func TestAStopWhileTheClaimWaitsInTheDatabaseWritesNoDecision(t *testing.T) {
	for _, tg := range pgtest.Need(t).Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			j := newJob(t, tg.DSN, "schedule", 6*time.Second)
			j.standby = true
			h := holdFailedWindow(t, j, tick0)
			po := j.sidecar(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.2, 0)})
			h.awaitWaiters(t, 1)

			// Directly, the abandoned connection's close waits up to 15 s
			// for a server that is busy waiting for the lock (pgx drains
			// it before it lets the pool close): the bound is that, well
			// inside the kubelet's default 30 s grace, not StartTimeout.
			stopped := time.Now()
			if err := po.agent.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-po.agentDone:
			case <-time.After(20 * time.Second):
				t.Fatalf("the agent did not stop within 20s of SIGTERM while its claim waited:\n%s", po.agentLog)
			}
			if code := po.agent.ProcessState.ExitCode(); code != 0 {
				t.Fatalf("agent exited %d after SIGTERM:\n%s", code, po.agentLog)
			}
			if d, ok := decisionOf(po); ok {
				t.Fatalf("a stop before the decision wrote decision %+v after %s", d, time.Since(stopped))
			}
			if msg := po.terminationMessage(); !strings.Contains(msg, "stopped before a decision") {
				t.Fatalf("termination message %q, want it to say the sidecar stopped before deciding", msg)
			}

			// The abandoned claim may still take the window in the
			// database once the lock is released: the restarted sidecar
			// (the same pod) re-enters it or takes it, and runs once.
			h.release(t)
			po.startAgent()
			po.startWrapper()
			if code := po.finish(); code != 0 {
				t.Fatalf("wrapper exited %d:\n%s", code, po.wrapperLog)
			}
			d := po.decision()
			if d.Action != protocol.ActionRun || d.Token <= h.failed.Window.Token {
				t.Fatalf("restarted sidecar decided %+v; want run with a token above the failed owner's %d", d, h.failed.Window.Token)
			}
			runs := readLedger(t, j.ledger)
			if len(runs) != 1 {
				t.Fatalf("%d runs of the window, want 1: %+v", len(runs), runs)
			}
		})
	}
}

// Two standbys' claims wait in the database on a row lock for longer than
// the TTL, then are let through: the first computed alive_until from a
// now() already more than a TTL ago, so it commits a claim that is lapsed
// the moment it is acknowledged, and the other may take it over at once.
// The slow claim must not hand its app a deadline it does not hold: the
// window runs once, never two runs at once, tokens increasing.
func TestAClaimHeldUpPastItsTTLNeverRunsBesideATakeover(t *testing.T) {
	for _, tg := range pgtest.Need(t).Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			j := newJob(t, tg.DSN, "schedule", 6*time.Second)
			j.standby = true
			s := openStore(t, j.dsn)
			h := holdFailedWindow(t, j, tick0)
			a := j.sidecar(t, podSpec{cluster: "dc-a", window: tick0, app: app(1, 0)})
			a.startWrapper()
			c := j.sidecar(t, podSpec{cluster: "dc-c", window: tick0, app: app(1, 0)})
			c.startWrapper()
			since := h.awaitWaiters(t, 2)
			awaitDBClockPast(t, s, since.Add(j.ttl+time.Second))
			h.release(t)

			for _, po := range []*pod{a, c} {
				po.waitWrapper()
				po.stopAgent()
			}
			runs := readLedger(t, j.ledger)
			assertNoOverlap(t, runs)
			if len(runs) != 1 {
				t.Fatalf("%d runs of the window, want exactly 1 (standby): %+v\ndc-a: %s\ndc-c: %s", len(runs), runs, a.terminationMessage(), c.terminationMessage())
			}
			if runs[0].token <= h.failed.Window.Token {
				t.Fatalf("the run's token %d is not above the failed owner's %d", runs[0].token, h.failed.Window.Token)
			}
			row, err := s.GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
			if err != nil || row.State != store.StateSucceeded || row.Token != runs[0].token {
				t.Fatalf("window row %+v (%v); want succeeded with the run's token %d", row, err, runs[0].token)
			}
		})
	}
}

// awaitDBClockPast waits until the database clock is past ts.
func awaitDBClockPast(t *testing.T, s *store.Store, ts time.Time) {
	t.Helper()
	await(t, "the database clock to pass "+ts.Format(time.RFC3339Nano), 60*time.Second, func() bool {
		now, err := s.Now(context.Background())
		return err == nil && now.After(ts)
	})
}
