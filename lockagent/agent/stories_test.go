package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

// Regression tests for stories of real pods' lifecycles that broke "at most
// once per window" or "still once while one cluster is healthy". Each runs
// against PostgreSQL directly and through PgBouncer.

func eachTarget(t *testing.T, fn func(t *testing.T, dsn string)) {
	t.Helper()
	for _, tg := range pgtest.Need(t).Targets() {
		t.Run(tg.Name, func(t *testing.T) { fn(t, tg.DSN) })
	}
}

// replacement is another pod of the same Job (the Job controller's retry, or
// a replacement created while the old pod still terminates after a drain).
// Its app writes its own name into the ledger so its run is told apart.
func replacement(p podSpec, name string) podSpec {
	p.podName = name
	p.env = append(p.env, "CLUSTER="+p.cluster+"-"+name)
	return p
}

// Story 1: a second pod of the same Job, started while the first one runs,
// waits (schedule mode, no standby) instead of running alongside with the
// same token; once the first succeeded it skips.
func TestASecondPodOfTheSameJobWaitsAndNeverRunsAlongside(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		t.Run("the first pod succeeds: the second skips", func(t *testing.T) {
			j := newJob(t, dsn, "schedule", 3*time.Second)
			first := podSpec{cluster: "dc-a", window: tick0, jobName: "report-1", podName: "report-1-aaaaa", app: app(1.5, 0)}
			a := j.start(t, first)
			j.awaitRuns(t, "the first pod's app to start", 1)
			b := j.start(t, replacement(first, "report-1-bbbbb"))
			if code := a.finish(); code != 0 {
				t.Fatalf("first pod exited %d", code)
			}
			if code := b.finish(); code != 0 || b.decision().Action != protocol.ActionSkip {
				t.Fatalf("second pod: exit %d, decision %+v", code, b.decision())
			}
			if runs := readLedger(t, j.ledger); len(runs) != 1 {
				t.Fatalf("the window ran %d times, want once: %+v", len(runs), runs)
			}
		})
		t.Run("the first pod fails: the second takes over with a larger token", func(t *testing.T) {
			j := newJob(t, dsn, "schedule", 3*time.Second)
			first := podSpec{cluster: "dc-a", window: tick0, jobName: "report-1", podName: "report-1-aaaaa", app: app(1.5, 1)}
			a := j.start(t, first)
			j.awaitRuns(t, "the first pod's app to start", 1)
			second := replacement(first, "report-1-bbbbb")
			second.app = app(0.2, 0)
			b := j.start(t, second)
			if code := a.finish(); code != 1 {
				t.Fatalf("first pod exited %d", code)
			}
			if code := b.finish(); code != 0 || b.decision().Action != protocol.ActionRun {
				t.Fatalf("second pod: exit %d, decision %+v", code, b.decision())
			}
			runs := readLedger(t, j.ledger)
			if len(runs) != 2 {
				t.Fatalf("want the failed run and its retry: %+v", runs)
			}
			assertNoOverlap(t, runs) // also: the retry's token is larger
			w, err := openStore(t, dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
			if err != nil || w.State != store.StateSucceeded || w.Pod != "report-1-bbbbb" {
				t.Fatalf("window: %+v %v", w, err)
			}
		})
	})
}

// Story 2: a waiting standby whose sidecar is stopped (a probe budget spent,
// a kubelet restart) decides nothing; restarted, it waits again and takes the
// window over when the owner fails.
func TestAStandbyStoppedWhileWaitingDecidesAgainAndTakesOver(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		j := newJob(t, dsn, "schedule", 3*time.Second)
		j.standby = true
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(3, 1)})
		j.awaitRuns(t, "dc-a's app to start", 1)
		b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(0.2, 0)})
		await(t, "dc-b to wait", 10*time.Second, func() bool { return strings.Contains(b.agentLog.String(), "waiting: standby") })

		b.stopAgent() // SIGTERM while waiting
		if _, ok, _ := protocol.Dir(b.dir).ReadDecision(); ok {
			t.Fatalf("a sidecar stopped while waiting wrote a decision:\n%s", b.agentLog)
		}
		if msg := b.terminationMessage(); !strings.HasPrefix(msg, "stopped before a decision") {
			t.Fatalf("termination message %q", msg)
		}
		b.startAgent() // the kubelet restarts it

		if code := a.finish(); code != 1 {
			t.Fatalf("dc-a exited %d", code)
		}
		if code := b.finish(); code != 0 || b.decision().Action != protocol.ActionRun {
			t.Fatalf("dc-b: exit %d, decision %+v", code, b.decision())
		}
		assertNoOverlap(t, readLedger(t, j.ledger))
		w, err := openStore(t, dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
		if err != nil || w.State != store.StateSucceeded || w.Cluster != "dc-b" {
			t.Fatalf("window: %+v %v", w, err)
		}
	})
}

// Story 3: the winner's app container never starts (image pull failing). The
// sidecar gives the claim up after the app-start timeout, a standby runs the
// window, and a wrapper that arrives after the give-up does not start.
func TestAWinnerWhoseAppNeverStartsGivesTheWindowUp(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		for _, mode := range []string{"schedule", "schedule,lease"} {
			t.Run(mode, func(t *testing.T) {
				j := newJob(t, dsn, mode, 3*time.Second)
				j.standby = true
				j.extra = append(j.extra, contract.EnvAppStartTimeout+"=2s")
				a := j.sidecar(t, podSpec{cluster: "dc-a", window: tick0, app: app(0, 0)})
				await(t, "dc-a to win", 10*time.Second, func() bool {
					d, ok, _ := protocol.Dir(a.dir).ReadDecision()
					return ok && d.Action == protocol.ActionRun
				})
				b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(0.2, 0)})
				if code := b.finish(); code != 0 || b.decision().Action != protocol.ActionRun {
					t.Fatalf("dc-b: exit %d, decision %+v\n%s", code, b.decision(), a.agentLog)
				}
				// dc-a writes its message after the give-up's database
				// writes, which are what let dc-b run.
				await(t, "dc-a's termination message to name the app-start timeout", 10*time.Second, func() bool {
					return strings.Contains(a.terminationMessage(), "app-start timeout")
				})
				// The image finally arrives: the app must not start now.
				a.startWrapper()
				if code := a.finish(); code != 75 {
					t.Fatalf("a wrapper after the give-up exited %d, want 75", code)
				}
				runs := readLedger(t, j.ledger)
				if len(runs) != 1 || runs[0].cluster != "dc-b" {
					t.Fatalf("ledger %+v, want one run by dc-b", runs)
				}
			})
		}
	})
}

// Story 4: a sidecar restarted after an "error" decision tries the database
// again instead of resuming the error.
func TestASidecarRestartedAfterAnErrorDecidesAgain(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		j := newJob(t, dsn, "schedule", 3*time.Second)
		p := j.sidecar(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.2, 0)})
		await(t, "a decision", 10*time.Second, func() bool { _, ok, _ := protocol.Dir(p.dir).ReadDecision(); return ok })
		// What a sidecar that decided "error" leaves behind.
		p.agent.Process.Signal(syscall.SIGKILL)
		<-p.agentDone
		if err := os.Remove(filepath.Join(p.dir, protocol.DecisionFile)); err != nil {
			t.Fatal(err)
		}
		if err := protocol.Dir(p.dir).WriteDecision(protocol.Decision{Action: protocol.ActionError, Key: j.key, Reason: "could not decide: database unavailable"}); err != nil {
			t.Fatal(err)
		}
		p.startAgent()
		await(t, "the error to be decided again", 10*time.Second, func() bool {
			d, ok, _ := protocol.Dir(p.dir).ReadDecision()
			return ok && d.Action == protocol.ActionRun
		})
		p.startWrapper()
		if code := p.finish(); code != 0 {
			t.Fatalf("exit %d", code)
		}
		if runs := readLedger(t, j.ledger); len(runs) != 1 {
			t.Fatalf("ledger %+v", runs)
		}
	})
}

// Story 5: clusters whose CronJobs differ (here: one has no time zone) are
// told so in the decision, the termination message and the log.
func TestClustersThatDisagreeAreTold(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		j := newJob(t, dsn, "schedule", 3*time.Second)
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0, 0), env: []string{contract.EnvSchedule + "=0 2 * * *", contract.EnvTimeZone + "=Europe/Berlin"}})
		if a.finish() != 0 {
			t.Fatal("dc-a failed")
		}
		// dc-b's tick of the same schedule is another instant: it runs too.
		b := j.start(t, podSpec{cluster: "dc-b", window: tick0.Add(time.Hour), app: app(0, 0), env: []string{contract.EnvSchedule + "=0 2 * * *"}})
		if b.finish() != 0 {
			t.Fatal("dc-b failed")
		}
		want := `cluster dc-a has timeZone "" here, "Europe/Berlin" there`
		for what, got := range map[string]string{"decision": b.decision().Reason, "termination message": b.terminationMessage(), "log": b.agentLog.String()} {
			if !strings.Contains(got, "clusters disagree") || (what != "log" && !strings.Contains(got, want)) {
				t.Fatalf("%s of dc-b does not report the disagreement (%s):\n%s", what, want, got)
			}
		}
		if strings.Contains(a.decision().Reason, "clusters disagree") {
			t.Fatalf("dc-a claimed first and saw no other view: %s", a.decision().Reason)
		}
	})
}

// Indexed Jobs: each completion index runs once across two clusters.
func TestEachIndexOfAnIndexedJobRunsOnceAcrossClusters(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		j := newJob(t, dsn, "schedule", 3*time.Second)
		var pods []*pod
		for _, cluster := range []string{"dc-a", "dc-b"} {
			for i := range 3 {
				p := podSpec{cluster: cluster, window: tick0, podName: fmt.Sprintf("%s-%d", cluster, i), app: app(0.3, 0),
					env: []string{contract.EnvJobIndex + "=" + fmt.Sprint(i), fmt.Sprintf("CLUSTER=%s-index-%d", cluster, i)}}
				pods = append(pods, j.start(t, p))
			}
		}
		for _, p := range pods {
			if code := p.finish(); code != 0 {
				t.Fatalf("%s exited %d", p.spec.podName, code)
			}
		}
		ran := map[string]int{}
		for _, r := range readLedger(t, j.ledger) {
			_, index, _ := strings.Cut(r.cluster, "-index-")
			ran[index]++
		}
		if len(ran) != 3 || ran["0"] != 1 || ran["1"] != 1 || ran["2"] != 1 {
			t.Fatalf("runs per index %v, want each of 0, 1, 2 once", ran)
		}
	})
}
