package e2e

// A data centre lost together with the database's primary, on a real HA
// PostgreSQL: the story of TestStandbyTakesOverFromADataCentreLostMidRun…
// in an environment of its own whose database is a Patroni cluster
// (Options.HA), one PostgreSQL node per data centre.

import (
	"context"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

func TestAStandbyTakesTheWindowOverOnThePromotedPrimaryWhenTheOwnersDataCentreIsLostWithThePrimary(t *testing.T) {
	begun := time.Now()
	e := New(t, Options{DCs: []string{"ha-a", "ha-b"}, HA: true})
	ctx := context.Background()
	t.Logf("environment with the Patroni cluster up in %v", time.Since(begun).Round(time.Millisecond))

	// The data centre whose PostgreSQL node is the primary owns the window:
	// its Job is created first, and the other's only once it owns the
	// window (ownerRunsStandbyWaits), so the other can only wait as a
	// standby. Nothing moves the primary meanwhile; it is checked again
	// right before the loss.
	lead, err := e.LeaderDC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := storyIn(t, e, "standby-primary-lost", "schedule", true)
	if lead != s.a {
		s.a, s.b = s.b, s.a
	}
	a, b, w := s.a, s.b, s.w
	primary := a.PostgresNode()
	jobB := s.ownerRunsStandbyWaits(t, a.Node)
	if now, err := e.LeaderDC(ctx); err != nil || now != a {
		t.Fatalf("the primary is no longer %s's %s (%v)", a.Name, primary, err)
	}

	// The data centre is lost whole: its node first (kubelet, containerd and
	// the pod SIGKILLed), so that the window's liveness read right after is
	// the last; then its PgBouncer and its PostgreSQL node, the primary.
	killFrom, killedBy, lastAlive := s.killOwnersNode(t, a.Node)
	if err := a.StopBouncer(); err != nil {
		t.Fatalf("%s: stopping PgBouncer: %v", a.Name, err)
	}
	pgKilled := time.Now()
	if err := a.KillPostgres(); err != nil {
		t.Fatalf("%s: killing PostgreSQL node %s: %v", a.Name, primary, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	newPrimary, err := e.HA.WaitLeader(wctx, primary)
	if err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	if newPrimary != b.PostgresNode() {
		t.Errorf("new primary %s, want %s's %s", newPrimary, b.Name, b.PostgresNode())
	}
	await(t, time.Minute, "the new primary to answer through HAProxy", func() bool {
		_, err := e.DBNow(ctx)
		return err == nil
	})
	reachable := time.Now()
	s.awaitTakeover(t)
	row, killed, took := s.wantStandbyTookOver(t, jobB.Name, lastAlive, killedBy)

	// On the promoted primary: the takeover's token was drawn in a later
	// epoch (the new WAL timeline) than the lost owner's, so it is larger.
	killedEpoch, _ := store.TokenEpoch(killed.Token)
	tookEpoch, _ := store.TokenEpoch(took.Token)
	if took.Token <= killed.Token || tookEpoch <= killedEpoch {
		t.Errorf("the takeover's fencing token %d (epoch %d) is not above the lost owner's %d (epoch %d) from a later epoch",
			took.Token, tookEpoch, killed.Token, killedEpoch)
	}
	if row.Token != took.Token {
		t.Errorf("window %s has token %d, the ledger's successful run %d", w, row.Token, took.Token)
	}
	// Exactly one successful run, by the apps' own account and by
	// `dislock windows` through HAProxy.
	succeeded := 0
	for _, r := range runsOf(t, e, s.name) {
		if r.ExitCode != nil && *r.ExitCode == 0 {
			succeeded++
		}
	}
	if succeeded != 1 {
		t.Errorf("ledger: %d successful runs of window %s, want exactly 1", succeeded, w)
	}
	windows := windowRowsOf(t, e, s.name)
	if len(windows) != 1 || windows[0].Start.UTC().Format(time.RFC3339) != w || windows[0].State != store.StateSucceeded ||
		windows[0].Cluster != b.Name || windows[0].Token != took.Token {
		t.Errorf("dislock windows: %+v, want window %s alone, succeeded by %s with token %d", windows, w, b.Name, took.Token)
	}

	claimed := row.ClaimedAt // database clock = this host's clock (one machine)
	t.Logf("window %s: %s (primary %s) ran from %s with token %d (epoch %d); its node was SIGKILLed between %s and %s (liveness until %s), "+
		"its PgBouncer stopped and %s killed at %s; %s primary %v after the kill, answering through HAProxy %v after it; "+
		"%s's standby took over at %s, %v after the PostgreSQL kill (%v after the node kill, %v after the new primary answered), token %d (epoch %d); its run %s–%s succeeded",
		w, a.Name, primary, fmtTime(&killed.Started), killed.Token, killedEpoch, fmtTime(&killFrom), fmtTime(&killedBy), fmtTime(&lastAlive),
		primary, fmtTime(&pgKilled), newPrimary, promoted.Sub(pgKilled).Round(time.Millisecond), reachable.Sub(pgKilled).Round(time.Millisecond),
		b.Name, fmtTime(&claimed), claimed.Sub(pgKilled).Round(time.Millisecond), claimed.Sub(killedBy).Round(time.Millisecond),
		claimed.Sub(reachable).Round(time.Millisecond), took.Token, tookEpoch, fmtTime(&took.Started), fmtTime(took.Finished))
}
