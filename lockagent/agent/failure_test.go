package agent_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

// The database goes away (PgBouncer stopped, or PostgreSQL itself) for
// longer than the TTL mid-run: the app is stopped before the lease could
// expire, and once the database is back nothing runs twice.
func TestDatabaseLostMidRunStopsTheAppBeforeExpiry(t *testing.T) {
	for _, lose := range []string{"pgbouncer", "postgres"} {
		t.Run(lose, func(t *testing.T) {
			srv := pgtest.New(t, pgtest.Options{Name: "lost-" + lose})
			j := newJob(t, srv.BouncerDSN(), "schedule,lease", 3*time.Second)
			a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(60, 0)})
			j.awaitRuns(t, "the app to start", 1)
			token := a.decision().Token
			stop, start := srv.StopBouncer, srv.StartBouncer
			if lose == "postgres" {
				stop, start = func() error { return srv.StopPostgres("immediate") }, srv.StartPostgres
			}
			lostAt := time.Now()
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			a.waitWrapper()
			if a.exit != 143 {
				t.Fatalf("wrapper exited %d, want 143:\n%s", a.exit, a.wrapperLog)
			}
			if err := start(); err != nil {
				t.Fatal(err)
			}
			a.stopAgent()
			if !strings.Contains(a.terminationMessage(), "failed") {
				t.Fatalf("termination message %q", a.terminationMessage())
			}

			// Measured by the database: the lease's expiry (from the last
			// successful renewal) was still ahead when the app stopped, or
			// the agent released it at the end; either way dc-a's window is
			// recorded failed, and no other cluster runs the same window.
			s := openStore(t, j.dsn)
			w, err := s.GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
			if err != nil || w.State != store.StateFailed || w.Cluster != "dc-a" {
				t.Fatalf("window after the outage: %+v %v", w, err)
			}
			b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(0, 0)})
			if b.finish() != 0 || b.decision().Action != protocol.ActionSkip {
				t.Fatalf("dc-b after the outage: %+v", b.decision())
			}
			runs := readLedger(t, j.ledger)
			if len(runs) != 1 || runs[0].token != token {
				t.Fatalf("ledger: %+v", runs)
			}
			// With ttl 3s the safety deadline is 2s after the last renewal
			// was sent; the database would expire the lease 3s after it.
			t.Logf("app stopped %s after the database went away (ttl %s)", time.Unix(0, runs[0].stop).Sub(lostAt).Round(time.Millisecond), j.ttl)
		})
	}
}

// standby: the window still gets one successful run when the winner's app
// fails or the winner's DC dies mid-run, and standbys skip once it succeeded.
func TestStandbyTakesTheWindowOverWhenTheWinnerFailsOrDies(t *testing.T) {
	dsn := pgtest.Need(t).BouncerDSN()

	t.Run("winner's app exits 1", func(t *testing.T) {
		j := newJob(t, dsn, "schedule", 3*time.Second)
		j.standby = true
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(2.5, 1)})
		j.awaitRuns(t, "dc-a's app to start", 1)
		// The standby waits longer than its start timeout: that bounds an
		// unreachable database, not waiting for a live owner.
		b := j.startAsync(t, podSpec{cluster: "dc-b", window: tick0, app: app(0, 0), agentArgs: []string{"--start-timeout=1s"}})
		if code := a.finish(); code != 1 {
			t.Fatalf("dc-a exited %d", code)
		}
		bp := <-b
		if code := bp.finish(); code != 0 || bp.decision().Action != protocol.ActionRun {
			t.Fatalf("dc-b: exit %d, %+v", code, bp.decision())
		}
		w, err := openStore(t, dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
		if err != nil || w.State != store.StateSucceeded || w.Cluster != "dc-b" {
			t.Fatalf("window: %+v %v", w, err)
		}
		assertNoOverlap(t, readLedger(t, j.ledger))
	})

	t.Run("winner's sidecar and app killed", func(t *testing.T) {
		j := newJob(t, dsn, "schedule", 3*time.Second)
		j.standby = true
		s := openStore(t, dsn)
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(60, 0)})
		j.awaitRuns(t, "dc-a's app to start", 1)
		b := j.startAsync(t, podSpec{cluster: "dc-b", window: tick0, app: app(0, 0)})
		// dc-a is lost: its sidecar dies. Its wrapper stops the app at the
		// deadline, before the liveness lapses and dc-b may take over.
		a.agent.Process.Signal(syscall.SIGKILL)
		before, err := s.GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
		if err != nil {
			t.Fatal(err)
		}
		a.waitWrapper()
		bp := <-b
		if code := bp.finish(); code != 0 || bp.decision().Action != protocol.ActionRun {
			t.Fatalf("dc-b: exit %d, %+v", code, bp.decision())
		}
		after, err := s.GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
		if err != nil || after.State != store.StateSucceeded || after.Cluster != "dc-b" || !after.ClaimedAt.After(before.AliveUntil.Add(-time.Second)) {
			t.Fatalf("window before %+v, after %+v (%v)", before, after, err)
		}
		assertNoOverlap(t, readLedger(t, j.ledger))
	})

	t.Run("winner succeeds: standbys skip", func(t *testing.T) {
		j := newJob(t, dsn, "schedule", 3*time.Second)
		j.standby = true
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.5, 0)})
		b := j.startAsync(t, podSpec{cluster: "dc-b", window: tick0, app: app(0, 0)})
		c := j.startAsync(t, podSpec{cluster: "dc-c", window: tick0, app: app(0, 0)})
		if a.finish() != 0 {
			t.Fatal("dc-a failed")
		}
		for _, ch := range []<-chan *pod{b, c} {
			p := <-ch
			if p.finish() != 0 || p.decision().Action != protocol.ActionSkip {
				t.Fatalf("%s: %+v", p.spec.cluster, p.decision())
			}
		}
		if runs := readLedger(t, j.ledger); len(runs) != 1 {
			t.Fatalf("ledger: %+v", runs)
		}
	})
}

// startAsync starts a pod whose sidecar may wait (standby) before deciding.
func (j job) startAsync(t *testing.T, p podSpec) <-chan *pod {
	ch := make(chan *pod, 1)
	go func() { ch <- j.start(t, p) }()
	return ch
}

// A pod whose local wall clock is hours off decides exactly like one whose
// clock is right: no decision reads the local clock.
func TestSkewedLocalClocksMakeTheSameDecisions(t *testing.T) {
	dsn := pgtest.Need(t).BouncerDSN()
	var reference []string
	for _, skew := range []time.Duration{0, 5 * time.Hour, -5 * time.Hour} {
		j := newJob(t, dsn, "schedule,lease", 2*time.Second)
		j.standby = true
		var story []string
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.3, 1), clock: skew})
		b := j.startAsync(t, podSpec{cluster: "dc-b", window: tick0, app: app(0.3, 0), clock: skew})
		a.finish()
		bp := <-b
		bp.finish()
		c := j.start(t, podSpec{cluster: "dc-c", window: tick0, app: app(0, 0), clock: skew})
		c.finish()
		next := j.start(t, podSpec{cluster: "dc-c", window: tick0.Add(time.Minute), app: app(0, 0), clock: -skew})
		next.finish()
		for _, p := range []*pod{a, bp, c, next} {
			story = append(story, fmt.Sprintf("%s %s exit %d", p.spec.cluster, p.decision().Action, p.exit))
		}
		if reference == nil {
			reference = story
			continue
		}
		if fmt.Sprint(story) != fmt.Sprint(reference) {
			t.Fatalf("clock %s: %v, without skew: %v", skew, story, reference)
		}
	}
	if fmt.Sprint(reference) != "[dc-a run exit 1 dc-b run exit 0 dc-c skip exit 0 dc-c run exit 0]" {
		t.Fatalf("reference story: %v", reference)
	}
}
