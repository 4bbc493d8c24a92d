package hapg_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/hapg"
)

// attemptTimeout bounds one connection plus statement of a probe.
const attemptTimeout = 2 * time.Second

// execOnce connects to dsn and runs one statement.
func execOnce(ctx context.Context, dsn, sql string, args ...any) error {
	return hapg.WithConn(ctx, dsn, attemptTimeout, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	})
}

// queryOne connects to dsn and scans the single row of query into dest.
func queryOne(ctx context.Context, dsn, query string, dest ...any) error {
	return hapg.WithConn(ctx, dsn, attemptTimeout, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, query).Scan(dest...)
	})
}

// retryUntil repeats f until it succeeds or ctx ends, and returns when it
// first succeeded.
func retryUntil(ctx context.Context, f func() error) (time.Time, error) {
	for {
		err := f()
		if err == nil {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%w; last error: %w", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// timeline is the timeline of the WAL the server at dsn writes now.
func timeline(ctx context.Context, t *testing.T, dsn string) int64 {
	t.Helper()
	var hex string
	if err := queryOne(ctx, dsn, "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)", &hex); err != nil {
		t.Fatalf("reading the timeline: %v", err)
	}
	tl, err := strconv.ParseInt(hex, 16, 64)
	if err != nil {
		t.Fatalf("timeline %q: %v", hex, err)
	}
	return tl
}

type target struct{ name, dsn string }

// targets are the ways to reach the primary: HAProxy, the multi-host DSN and
// every data centre's bouncer.
func targets(c *hapg.Cluster) []target {
	ts := []target{{"haproxy", c.HAProxyDSN()}, {"multi-host", c.MultiHostDSN()}}
	for _, dc := range c.DCs() {
		ts = append(ts, target{"bouncer-" + dc, c.BouncerDSN(dc)})
	}
	return ts
}

func TestSyncClusterFailover(t *testing.T) {
	c := hapg.New(t, hapg.Options{Name: "sync"})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	syncStandby, err := c.SyncStandby(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if syncStandby == "" || syncStandby == leader {
		t.Fatalf("leader %s, sync standby %q: want another node as sync standby", leader, syncStandby)
	}
	var names string
	if err := queryOne(ctx, c.NodeDSN(leader), "SHOW synchronous_standby_names", &names); err != nil {
		t.Fatal(err)
	}
	if strings.Trim(names, `"`) != syncStandby {
		t.Fatalf("synchronous_standby_names on leader %s is %q, want %s", leader, names, syncStandby)
	}
	t.Logf("leader %s, sync standby %s (synchronous_standby_names = %s)", leader, syncStandby, names)

	// The lock store migrates through a bouncer as it does against pgtest.
	db, err := store.Open(ctx, c.BouncerDSN("a"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(ctx, db); err != nil {
		t.Fatalf("migrating through bouncer a: %v", err)
	}
	db.Close()

	newLeader := failoverAndRejoin(ctx, t, c)
	if newLeader != syncStandby {
		t.Errorf("new leader %s, want the sync standby %s: only it may be promoted in synchronous mode", newLeader, syncStandby)
	}
}

func TestAsyncTwoNodeFailover(t *testing.T) {
	c := hapg.New(t, hapg.Options{Name: "async2", Nodes: 2, Async: true})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	if got := strings.Join(c.Nodes(), ","); got != "pg-a,pg-b" {
		t.Fatalf("nodes %s, want pg-a,pg-b", got)
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := c.SyncStandby(ctx); err != nil || s != "" {
		t.Fatalf("sync standby %q (%v) in asynchronous mode, want none", s, err)
	}
	var names string
	if err := queryOne(ctx, c.NodeDSN(leader), "SHOW synchronous_standby_names", &names); err != nil || names != "" {
		t.Fatalf("synchronous_standby_names on leader %s is %q (%v), want empty", leader, names, err)
	}
	failoverAndRejoin(ctx, t, c)
}

// failoverAndRejoin writes through every target, kills the leader, waits
// for a successor and for a write through every target to succeed again
// (logging how long each took), restarts the old leader and waits until it
// streams from the new one. It returns the new leader.
func failoverAndRejoin(ctx context.Context, t *testing.T, c *hapg.Cluster) string {
	t.Helper()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ts := targets(c)
	if err := execOnce(ctx, c.HAProxyDSN(), "CREATE TABLE probe (via text, phase text)"); err != nil {
		t.Fatal(err)
	}
	for _, tg := range ts {
		if err := execOnce(ctx, tg.dsn, "INSERT INTO probe VALUES ($1, 'before')", tg.name); err != nil {
			t.Fatalf("writing through %s: %v", tg.name, err)
		}
	}
	tlBefore := timeline(ctx, t, c.NodeDSN(leader))

	// The data centre of the leader is lost. Every path is written to from
	// the moment of the kill until a write succeeds.
	killed := time.Now()
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	const writeBound = 30 * time.Second
	firstWrite := make([]time.Duration, len(ts))
	writeErr := make([]error, len(ts))
	var wg sync.WaitGroup
	for i, tg := range ts {
		wg.Go(func() {
			wctx, cancel := context.WithDeadline(ctx, killed.Add(writeBound))
			defer cancel()
			at, err := retryUntil(wctx, func() error {
				return execOnce(wctx, tg.dsn, "INSERT INTO probe VALUES ($1, 'after')", tg.name)
			})
			firstWrite[i], writeErr[i] = at.Sub(killed), err
		})
	}
	newLeader, err := c.WaitLeader(ctx, leader)
	if err != nil {
		t.Fatal(err)
	}
	elected := time.Since(killed)
	wg.Wait()
	t.Logf("kill %s -> %s primary: %v", leader, newLeader, elected.Round(time.Millisecond))
	for i, tg := range ts {
		if writeErr[i] != nil {
			t.Errorf("no write through %s within %v of the kill: %v", tg.name, writeBound, writeErr[i])
			continue
		}
		t.Logf("kill -> first write through %s: %v", tg.name, firstWrite[i].Round(time.Millisecond))
	}
	if t.Failed() {
		t.FailNow()
	}
	if tl := timeline(ctx, t, c.NodeDSN(newLeader)); tl <= tlBefore {
		t.Errorf("timeline on %s is %d, want more than %d (the old primary's)", newLeader, tl, tlBefore)
	}
	// Every write acknowledged before the kill survived: guaranteed in
	// synchronous mode, and in asynchronous mode the replica was idle and
	// caught up.
	var before int
	if err := queryOne(ctx, c.NodeDSN(newLeader), "SELECT count(*) FROM probe WHERE phase = 'before'", &before); err != nil {
		t.Fatal(err)
	}
	if before != len(ts) {
		t.Errorf("%d rows written before the kill on the new leader, want %d", before, len(ts))
	}

	// The lost data centre comes back and rejoins as a replica.
	restarted := time.Now()
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitSync(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart %s -> streaming from %s: %v", leader, newLeader, time.Since(restarted).Round(time.Millisecond))
	var inRecovery bool
	var after int
	if err := queryOne(ctx, c.NodeDSN(leader),
		"SELECT pg_is_in_recovery(), (SELECT count(*) FROM probe WHERE phase = 'after')", &inRecovery, &after); err != nil {
		t.Fatal(err)
	}
	if !inRecovery || after < len(ts) {
		t.Errorf("rejoined %s: in recovery %v with %d rows written after the kill; want a replica with at least %d",
			leader, inRecovery, after, len(ts))
	}
	if l, err := c.Leader(ctx); err != nil || l != newLeader {
		t.Errorf("leader after the rejoin: %q, %v; want %s", l, err, newLeader)
	}
	return newLeader
}

func TestAsyncPairLosesCommitsOnFailover(t *testing.T) {
	p := hapg.NewAsyncPair(t, hapg.PairOptions{Name: "async"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	if err := execOnce(ctx, p.PrimaryDSN(), "CREATE TABLE probe (phase text)"); err != nil {
		t.Fatal(err)
	}
	if err := execOnce(ctx, p.PrimaryDSN(), "INSERT INTO probe VALUES ('before')"); err != nil {
		t.Fatal(err)
	}
	if err := p.PauseReplication(ctx); err != nil {
		t.Fatal(err)
	}
	// Acknowledged by the primary (it waits for no standby), never sent.
	if err := execOnce(ctx, p.PrimaryDSN(), "INSERT INTO probe VALUES ('after')"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := queryOne(ctx, p.PrimaryDSN(), "SELECT count(*) FROM probe", &n); err != nil || n != 2 {
		t.Fatalf("the primary has %d rows (%v), want 2", n, err)
	}
	if err := p.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	if err := execOnce(ctx, p.PrimaryDSN(), "SELECT 1"); err == nil {
		t.Fatal("the killed primary still answers")
	}
	if err := p.ResumeAndPromote(ctx); err != nil {
		t.Fatal(err)
	}
	var phases []string
	err := func() error {
		conn, err := pgx.Connect(ctx, p.StandbyDSN())
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		rows, err := conn.Query(ctx, "SELECT phase FROM probe ORDER BY phase")
		if err != nil {
			return err
		}
		phases, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	}()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(phases, ",") != "before" {
		t.Fatalf("the promoted standby has rows %q, want only the one committed before the pause", phases)
	}
	if err := execOnce(ctx, p.StandbyDSN(), "INSERT INTO probe VALUES ('promoted')"); err != nil {
		t.Fatalf("writing to the promoted standby: %v", err)
	}
	var inRecovery bool
	if err := queryOne(ctx, p.SuperuserDSN(hapg.PairStandby), "SELECT pg_is_in_recovery()", &inRecovery); err != nil || inRecovery {
		t.Fatalf("promoted standby: in recovery %v (%v)", inRecovery, err)
	}
}
