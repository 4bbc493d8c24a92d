package agent_test

// dislock.io/prefer-cluster: a pod of another cluster claims a window only
// from its start + the grace, by the database's clock, so the preferred
// cluster runs every window it reaches in time and another cluster runs the
// rest, still once. Directly and through PgBouncer.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

// preferGrace is the grace of these stories: long enough that a pod
// started after another, on a loaded machine, is still inside it.
const preferGrace = 5 * time.Second

// preferring is j with dc-b preferred.
func preferring(j job) job {
	j.extra = append(j.extra, contract.EnvPreferCluster+"=dc-b", contract.EnvPreferGrace+"="+preferGrace.String())
	return j
}

// nowWindow is a window that starts now, so that the grace lies ahead.
func nowWindow() time.Time { return time.Now().UTC().Truncate(time.Second) }

// indexEnv is the environment of an Indexed Job's pod of index i.
func indexEnv(cluster string, i int) []string {
	return []string{fmt.Sprintf("%s=%d", contract.EnvJobIndex, i), contract.EnvCompletions + "=2", fmt.Sprintf("CLUSTER=%s-index-%d", cluster, i)}
}

func TestThePreferredClusterRunsAWindowItReachesWithinTheGraceThoughAnotherStartedFirst(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		for _, tc := range []struct {
			name, mode string
			standby    bool
			index      int // -1: not Indexed
		}{
			{name: "schedule", mode: "schedule", index: -1},
			{name: "schedule,lease", mode: "schedule,lease", index: -1},
			// dc-a waits out the grace, then waits as dc-b's standby
			// until dc-b's run succeeded.
			{name: "standby", mode: "schedule", standby: true, index: -1},
			{name: "an index of an Indexed Job", mode: "schedule,lease", index: 1},
		} {
			t.Run(tc.name, func(t *testing.T) {
				j := preferring(newJob(t, dsn, tc.mode, 5*time.Second))
				j.standby = tc.standby
				w := nowWindow()
				pa := podSpec{cluster: "dc-a", window: w, app: app(0, 0)}
				// dc-b's app outlasts the grace, so that the standby
				// finds it running.
				pb := podSpec{cluster: "dc-b", window: w, app: app(float64(preferGrace/time.Second)+1, 0)}
				if tc.index >= 0 {
					pa.env, pb.env = indexEnv("dc-a", tc.index), indexEnv("dc-b", tc.index)
				}
				a := j.start(t, pa)
				if !strings.Contains(a.agentLog.String(), "cluster dc-b is preferred for this job") {
					t.Fatalf("dc-a's agent did not wait for the preferred cluster:\n%s", a.agentLog)
				}
				if msg := a.terminationMessage(); !strings.HasPrefix(msg, "waiting: cluster dc-b is preferred") {
					t.Errorf("dc-a's termination message while it waits is %q, want it to say why", msg)
				}
				b := j.start(t, pb)
				if code := b.finish(); code != 0 || b.decision().Action != protocol.ActionRun {
					t.Fatalf("dc-b (preferred): exit %d, decision %+v", code, b.decision())
				}
				if code := a.finish(); code != 0 || a.decision().Action != protocol.ActionSkip || !strings.Contains(a.decision().Reason, "dc-b") {
					t.Fatalf("dc-a: exit %d, decision %+v; want a skip naming dc-b", code, a.decision())
				}
				if runs := readLedger(t, j.ledger); len(runs) != 1 || !strings.HasPrefix(runs[0].cluster, "dc-b") {
					t.Fatalf("runs %+v, want dc-b's alone", runs)
				}
			})
		}
	})
}

func TestWithoutThePreferredClusterAnotherRunsTheWindowOnceTheGraceHasPassedByDatabaseTime(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		j := preferring(newJob(t, dsn, "schedule", 5*time.Second))
		w := nowWindow()
		a := j.start(t, podSpec{cluster: "dc-a", window: w, app: app(0, 0)})
		if code := a.finish(); code != 0 || a.decision().Action != protocol.ActionRun {
			t.Fatalf("dc-a: exit %d, decision %+v", code, a.decision())
		}
		got, err := openStore(t, dsn).GetWindow(context.Background(), j.key, w, store.NotIndexed)
		if err != nil {
			t.Fatal(err)
		}
		// The claim comes the grace after the window's start, and at most
		// the agent's spread (a tenth of the grace) and a pod's start later.
		from := w.Add(preferGrace)
		if got.Cluster != "dc-a" || got.ClaimedAt.Before(from) || got.ClaimedAt.After(from.Add(preferGrace/10+5*time.Second)) {
			t.Fatalf("window claimed by %s at %s by database time; want dc-a, from %s (start + grace) on",
				got.Cluster, got.ClaimedAt.Format(time.RFC3339Nano), from.Format(time.RFC3339Nano))
		}
		t.Logf("claimed %v after the window's start (grace %v)", got.ClaimedAt.Sub(w).Round(time.Millisecond), preferGrace)
	})
}

// The grace runs by the database's clock: with the database an hour ahead
// of this machine, a window that starts now by this machine's clock began
// an hour ago by the database's, and the other cluster claims it at once.
// With the database an hour behind, the window lies an hour in the
// database's future, and the pod still waits no longer than the grace.
func TestTheGraceRunsByTheDatabasesClockAndNeverLongerThanItself(t *testing.T) {
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		env, err := pgtest.FakeClockEnv(skew)
		if err != nil {
			pgtest.Missing(t, err)
		}
		srv := pgtest.New(t, pgtest.Options{Name: fmt.Sprintf("prefer%+d", int(skew.Hours())), PostgresEnv: env})
		for _, tg := range srv.Targets() {
			t.Run(fmt.Sprintf("database clock %+v/%s", skew, tg.Name), func(t *testing.T) {
				j := preferring(newJob(t, tg.DSN, "schedule", 5*time.Second))
				begun := time.Now()
				a := j.start(t, podSpec{cluster: "dc-a", window: nowWindow(), app: app(0, 0)})
				if code := a.finish(); code != 0 || a.decision().Action != protocol.ActionRun {
					t.Fatalf("dc-a: exit %d, decision %+v", code, a.decision())
				}
				waited := strings.Contains(a.agentLog.String(), "is preferred for this job")
				switch took := time.Since(begun); {
				case skew > 0 && waited:
					t.Errorf("the agent waited for the preferred cluster though the window began an hour ago by database time:\n%s", a.agentLog)
				case skew < 0 && (!waited || took > preferGrace+preferGrace/10+30*time.Second):
					t.Errorf("the agent decided %v after it started (waited: %t); want it to wait the grace, %v, and no longer", took, waited, preferGrace)
				}
			})
		}
	}
}

// A manual run has no window: the preference does not hold it up.
func TestAManualRunIgnoresThePreferredCluster(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		j := preferring(newJob(t, dsn, "schedule,lease", 5*time.Second))
		a := j.start(t, podSpec{cluster: "dc-a", app: app(0, 0)})
		if code := a.finish(); code != 0 || a.decision().Action != protocol.ActionRun {
			t.Fatalf("dc-a's manual run: exit %d, decision %+v", code, a.decision())
		}
		if strings.Contains(a.agentLog.String(), "is preferred") {
			t.Errorf("a manual run waited for the preferred cluster:\n%s", a.agentLog)
		}
	})
}
