package agent_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

var tick0 = time.Now().UTC().Truncate(time.Hour).Add(-2 * time.Hour)

func newJob(t *testing.T, dsn, mode string, ttl time.Duration) job {
	openStore(t, dsn) // migrated
	return job{dsn: dsn, key: uniqueKey(t), mode: mode, ttl: ttl, ledger: filepath.Join(t.TempDir(), "ledger")}
}

// Three clusters start the same window within milliseconds: one runs, two
// skip and complete, and `dislock windows` names the cluster that ran it;
// directly, through PgBouncer, and through each cluster's lock gateway.
func TestThreeClustersOneWindowOneRun(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range append(srv.Targets(), pgtest.Target{Name: "gateway", DSN: srv.BouncerDSN()}) {
		t.Run(tg.Name, func(t *testing.T) {
			windows := 50
			if tg.Name != "pgbouncer" {
				windows = 10
			}
			j := newJob(t, tg.DSN, "schedule", 5*time.Second)
			s := openStore(t, tg.DSN)
			clusters := []string{"dc-a", "dc-b", "dc-c"}
			if tg.Name == "gateway" {
				j = j.throughGateways(t, clusters...)
			}
			for w := range windows {
				tick := tick0.Add(time.Duration(w) * time.Minute)
				pods := make([]*pod, len(clusters))
				var wg sync.WaitGroup
				for i, c := range clusters {
					wg.Go(func() { pods[i] = j.start(t, podSpec{cluster: c, window: tick, app: app(0, 0)}) })
				}
				wg.Wait()
				ran := ""
				for _, p := range pods {
					if code := p.finish(); code != 0 {
						t.Fatalf("window %d: %s's pod exited %d:\n%s", w, p.spec.cluster, code, p.wrapperLog)
					}
					d := p.decision()
					switch d.Action {
					case protocol.ActionRun:
						if ran != "" {
							t.Fatalf("window %d ran in %s and %s", w, ran, p.spec.cluster)
						}
						ran = p.spec.cluster
						if !strings.HasPrefix(p.terminationMessage(), "ran window") || !strings.Contains(p.terminationMessage(), "succeeded") {
							t.Fatalf("winner's termination message: %q", p.terminationMessage())
						}
					case protocol.ActionSkip:
						if !strings.Contains(p.wrapperLog.String(), "already claimed by cluster") {
							t.Fatalf("skip log does not say who ran it:\n%s", p.wrapperLog)
						}
						if !strings.Contains(p.terminationMessage(), "skip: window") {
							t.Fatalf("skipper's termination message: %q", p.terminationMessage())
						}
					default:
						t.Fatalf("decision %+v", d)
					}
				}
				row, err := s.GetWindow(context.Background(), j.key, tick, store.NotIndexed)
				if err != nil || row.State != store.StateSucceeded || row.Cluster != ran {
					t.Fatalf("window %d row %+v (%v); ran in %s", w, row, err, ran)
				}
			}
			if runs := readLedger(t, j.ledger); len(runs) != windows {
				t.Fatalf("%d runs for %d windows: %+v", len(runs), windows, runs)
			}
		})
	}
}

// The article's case: DC-A's 1-second job is long finished when DC-B's pod
// starts; a lease alone would let DC-B run it again, the window does not.
func TestShortJobFinishedBeforeTheOtherClusterStartsIsSkipped(t *testing.T) {
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 5*time.Second)
	a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.2, 0)})
	if a.finish() != 0 || a.decision().Action != protocol.ActionRun {
		t.Fatalf("dc-a: %+v", a.decision())
	}
	b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(0.2, 0)})
	if b.finish() != 0 || b.decision().Action != protocol.ActionSkip || !strings.Contains(b.decision().Reason, "dc-a") {
		t.Fatalf("dc-b: %+v", b.decision())
	}
	if runs := readLedger(t, j.ledger); len(runs) != 1 || runs[0].cluster != "dc-a" {
		t.Fatalf("ledger: %+v", runs)
	}
}

// schedule,lease with a run longer than its period: the next window's pod
// skips while the lease is held, and marks its window skipped.
func TestLongRunHoldsTheLeaseAndTheNextWindowSkips(t *testing.T) {
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule,lease", 3*time.Second)
	long := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(4, 0)})
	j.awaitRuns(t, "the long run to start", 1)
	next := j.start(t, podSpec{cluster: "dc-b", window: tick0.Add(time.Minute), app: app(0, 0)})
	if next.finish() != 0 {
		t.Fatal("next window's pod failed")
	}
	if d := next.decision(); d.Action != protocol.ActionSkip || !strings.Contains(d.Reason, "an earlier run is still going") {
		t.Fatalf("next window: %+v", d)
	}
	if long.finish() != 0 {
		t.Fatal("long run failed")
	}
	s := openStore(t, j.dsn)
	if w, err := s.GetWindow(context.Background(), j.key, tick0.Add(time.Minute), store.NotIndexed); err != nil || w.State != store.StateSkipped {
		t.Fatalf("next window row: %+v %v", w, err)
	}
	// The long run heartbeated through more than one TTL: its lease held.
	runs := readLedger(t, j.ledger)
	if len(runs) != 1 || time.Duration(runs[0].stop-runs[0].start) < 4*time.Second {
		t.Fatalf("ledger: %+v", runs)
	}
}

// The winner's sidecar is SIGKILLed mid-run: nobody renews the lease, and the
// wrapper, enforcing the deadline on its own, stops the app before the lease
// expires at database time. A contender gets the lease only after expiry.
func TestKilledAgentsAppStopsBeforeTheLeaseExpires(t *testing.T) {
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "lease", 3*time.Second)
	s := openStore(t, j.dsn)
	a := j.start(t, podSpec{cluster: "dc-a", podName: "a", jobName: "job-a", app: app(60, 0)})
	j.awaitRuns(t, "dc-a's app to start", 1)
	held, _, err := s.GetLease(context.Background(), j.key)
	if err != nil {
		t.Fatal(err)
	}
	a.agent.Process.Signal(syscall.SIGKILL)
	a.waitWrapper()
	if a.exit != 143 {
		t.Fatalf("dc-a's wrapper exited %d, want 143 (app stopped by SIGTERM):\n%s", a.exit, a.wrapperLog)
	}
	stopped := readLedger(t, j.ledger)[0].stop

	// dc-b keeps trying until it gets the lease; it may only get it after
	// the database expired dc-a's.
	var b *pod
	for b == nil || b.decision().Action != protocol.ActionRun {
		b = j.start(t, podSpec{cluster: "dc-b", podName: fmt.Sprint("b-", time.Now().UnixNano()), app: app(0.1, 0)})
		b.finish()
	}
	l, dbNow, err := s.GetLease(context.Background(), j.key)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token <= held.Token || l.AcquiredAt.Before(held.ExpireAt) {
		t.Fatalf("dc-b's lease %+v (db now %s) was granted before dc-a's %+v expired", l, dbNow, held)
	}
	runs := readLedger(t, j.ledger)
	assertNoOverlap(t, runs)
	// dc-a's app stopped before its lease could expire: the stop is in the
	// ledger before dc-b's start, and the expiry came after the last renewal.
	if runs[1].start < stopped {
		t.Fatalf("dc-b started before dc-a stopped: %+v", runs)
	}
}

// A sidecar that dies and is restarted (the kubelet restarts native
// sidecars) re-enters its own lease with the same token; the app goes on.
func TestRestartedAgentReentersItsOwnLease(t *testing.T) {
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule,lease", 3*time.Second)
	a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(5, 0)})
	j.awaitRuns(t, "the app to start", 1)
	token := a.decision().Token
	a.agent.Process.Signal(syscall.SIGKILL)
	<-a.agentDone
	a.startAgent()
	if code := a.finish(); code != 0 {
		t.Fatalf("app exited %d after the agent restart:\n%s\n%s", code, a.wrapperLog, a.agentLog)
	}
	if !strings.Contains(a.agentLog.String(), "restarted: resuming") {
		t.Fatalf("agent log:\n%s", a.agentLog)
	}
	runs := readLedger(t, j.ledger)
	if len(runs) != 1 || runs[0].token != token || time.Duration(runs[0].stop-runs[0].start) < 5*time.Second {
		t.Fatalf("ledger %+v, token %d", runs, token)
	}
	w, err := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
	if err != nil || w.State != store.StateSucceeded {
		t.Fatalf("window %+v %v", w, err)
	}
}
