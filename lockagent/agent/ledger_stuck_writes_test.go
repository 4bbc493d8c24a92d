package agent_test

// The ledger's writer shares the agent's pool of two connections with the
// heartbeats: ledger writes that wait must never take a heartbeat's
// connection.

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

// A ledger write the client gives up on closes its connection, which pgx
// drains for up to 15 s before the pool gives the slot back. Two such writes
// in a row (a standby's "wait", then its "takeover") once held both of the
// agent's two connections, and no heartbeat could get one: the standby's own
// run was revoked, in a cluster that reached the database the whole time
// (invariant 2). The server now ends a ledger write that waits for a lock,
// and a pod stops writing the ledger after a write the client gave up on.
//
// What makes ledger writes wait here is a lock on the key's key_stats row,
// held by an owner connection: in production a slow detection or retention
// statement, or a commit waiting for a synchronous standby.
func TestStuckLedgerWritesDoNotStarveAStandbysHeartbeat(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		ttl := 6 * time.Second
		if v, err := time.ParseDuration(os.Getenv("DISLOCK_TEST_STUCK_LEDGER_TTL")); err == nil {
			ttl = v
		}
		j, a, tx := ownerRunningWithItsStatisticsLocked(t, pgtestDirect(t), ttl)
		b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(4, 0)})
		a.kill() // dc-a's node is lost: its liveness lapses after the TTL
		code := b.finish()
		tx.Rollback(ctx)
		w, err := openStore(t, j.dsn).GetWindow(ctx, j.key, tick0, store.NotIndexed)
		if err != nil {
			t.Fatal(err)
		}
		if code != 0 || w.State != store.StateSucceeded {
			d, _ := decisionOf(b)
			var revoked []string
			for _, l := range strings.Split(b.agentLog.String(), "\n") {
				if strings.Contains(l, "revok") || strings.Contains(l, "heartbeat failed") || strings.Contains(l, "ledger") {
					revoked = append(revoked, l)
				}
			}
			t.Errorf("dc-b (standby, healthy, reaching the database all along) took the window over (decision %s) and its run ended with exit %d, window %s: its heartbeats found no free connection while two ledger writes drained\n%s",
				d.Action, code, w.State, strings.Join(revoked, "\n"))
		}
		if d, ok := decisionOf(b); ok && d.Action != protocol.ActionRun {
			t.Logf("dc-b decided %s: %s", d.Action, d.Reason)
		}
	})
}

// ownerRunningWithItsStatisticsLocked starts a standby job whose dc-a pod
// runs a long app, waits for its ledger row, and returns with a
// transaction (rolled back when t ends) holding that row locked, so that
// every later ledger write of the key waits.
func ownerRunningWithItsStatisticsLocked(t *testing.T, dsn string, ttl time.Duration) (job, *pod, pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	j := newJob(t, dsn, "schedule", ttl)
	j.standby = true
	a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(120, 0)})
	j.awaitRuns(t, "dc-a's app", 1)
	raw, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close(context.Background()) })
	await(t, "dc-a's ledger row", 10*time.Second, func() bool {
		var n int
		raw.QueryRow(ctx, `SELECT count(*) FROM dislock.key_stats WHERE lock_key = $1`, j.key).Scan(&n)
		return n == 1
	})
	tx, err := raw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `SELECT 1 FROM dislock.key_stats WHERE lock_key = $1 FOR NO KEY UPDATE`, j.key); err != nil {
		t.Fatal(err)
	}
	return j, a, tx
}

// pgtestDirect is the direct DSN of the package's PostgreSQL (the lock is
// held outside any pooler).
func pgtestDirect(t *testing.T) string { return pgtestNeed(t).DirectDSN() }

var pgtestNeed = pgtest.Need

// The same starvation at the end of a run: a standby took the window over
// (its "wait" and "takeover" ledger writes stuck), its app succeeds at
// once, and its agent cannot record the success (no free connection) nor
// renew the window's liveness. The window lapses, a second standby takes it
// over and runs it again: two runs of one window reach their end
// successfully, and the first pod was never cut off from the database (the
// only case docs/design.md's exception to invariant 1 allows).
func TestStuckLedgerWritesDoNotMakeASecondSuccess(t *testing.T) {
	ctx := context.Background()
	dsn := pgtestNeed(t).DirectDSN()
	j, a, tx := ownerRunningWithItsStatisticsLocked(t, dsn, 6*time.Second)
	b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(0.5, 0)})
	a.kill()
	await(t, "dc-b to take over", 30*time.Second, func() bool {
		d, ok := decisionOf(b)
		return ok && d.Action == protocol.ActionRun
	})
	c := j.start(t, podSpec{cluster: "dc-c", window: tick0, app: app(0.5, 0)})
	codeB := b.finish()
	codeC := c.finish()
	tx.Rollback(ctx)
	dc, _ := decisionOf(c)
	t.Logf("dc-b exit %d (%s); dc-c exit %d, decision %s: %s", codeB, b.terminationMessage(), codeC, dc.Action, dc.Reason)
	if codeB == 0 && codeC == 0 && dc.Action == protocol.ActionRun {
		t.Errorf("window %s ran to success twice (dc-b, then dc-c with a larger token), and dc-b reached the database the whole time: its success could not be recorded because stuck ledger writes held both of its connections",
			tick0.Format(time.RFC3339))
	}
}
