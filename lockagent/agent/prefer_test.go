package agent_test

// dislock.io/prefer-cluster: a pod of another cluster claims a window only
// from its start + the grace, by the database's clock, so the preferred
// cluster runs every window it reaches in time and another cluster runs the
// rest, still once. Directly and through PgBouncer.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
)

// preferGrace is the grace of these stories: long enough that a pod
// started a second after another is well inside it.
const preferGrace = 3 * time.Second

// preferring is j with dc-b preferred.
func preferring(j job) job {
	j.extra = append(j.extra, contract.EnvPreferCluster+"=dc-b", contract.EnvPreferGrace+"="+preferGrace.String())
	return j
}

// nowWindow is a window that starts now, so that the grace lies ahead.
func nowWindow() time.Time { return time.Now().UTC().Truncate(time.Second) }

func TestThePreferredClusterRunsAWindowItReachesWithinTheGraceThoughAnotherStartedFirst(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		for _, mode := range []string{"schedule", "lease", "schedule,lease"} {
			t.Run(mode, func(t *testing.T) {
				j := preferring(newJob(t, dsn, mode, 5*time.Second))
				w := nowWindow()
				a := j.start(t, podSpec{cluster: "dc-a", window: w, app: app(0, 0)})
				if !strings.Contains(a.agentLog.String(), "cluster dc-b is preferred for this job") {
					t.Fatalf("dc-a's agent did not wait for the preferred cluster:\n%s", a.agentLog)
				}
				if msg := a.terminationMessage(); !strings.HasPrefix(msg, "waiting: cluster dc-b is preferred") {
					t.Errorf("dc-a's termination message while it waits is %q, want it to say why", msg)
				}
				// The preferred cluster's pod starts a second later, inside
				// the grace; its app outlasts the grace, so that in lease
				// mode dc-a finds the lease held.
				b := j.start(t, podSpec{cluster: "dc-b", window: w, app: app(float64(preferGrace/time.Second)+1, 0)})
				if code := b.finish(); code != 0 || b.decision().Action != protocol.ActionRun {
					t.Fatalf("dc-b (preferred): exit %d, decision %+v", code, b.decision())
				}
				if code := a.finish(); code != 0 || a.decision().Action != protocol.ActionSkip || !strings.Contains(a.decision().Reason, "dc-b") {
					t.Fatalf("dc-a: exit %d, decision %+v; want a skip naming dc-b", code, a.decision())
				}
				if runs := readLedger(t, j.ledger); len(runs) != 1 || runs[0].cluster != "dc-b" {
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
		// The agent's own wall clock runs a minute fast: it must wait by
		// the database's.
		a := j.start(t, podSpec{cluster: "dc-a", window: w, app: app(0, 0), clock: time.Minute})
		if code := a.finish(); code != 0 || a.decision().Action != protocol.ActionRun {
			t.Fatalf("dc-a: exit %d, decision %+v", code, a.decision())
		}
		got, err := openStore(t, dsn).GetWindow(context.Background(), j.key, w, store.NotIndexed)
		if err != nil {
			t.Fatal(err)
		}
		if from := w.Add(preferGrace); got.Cluster != "dc-a" || got.ClaimedAt.Before(from) {
			t.Fatalf("window claimed by %s at %s by database time; want dc-a, from %s (start + grace) on",
				got.Cluster, got.ClaimedAt.Format(time.RFC3339Nano), from.Format(time.RFC3339Nano))
		}
		t.Logf("claimed %v after the window's start (grace %v)", got.ClaimedAt.Sub(w).Round(time.Millisecond), preferGrace)
	})
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
