package agent_test

import (
	"context"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/pgtest"
)

// Manual runs (kubectl create job --from=cronjob/x) are not schedule ticks:
// they bypass the window but still honour the lease.
func TestManualRunsBypassTheWindowAndHonourTheLease(t *testing.T) {
	dsn := pgtest.Need(t).BouncerDSN()

	t.Run("schedule mode: runs in every cluster", func(t *testing.T) {
		j := newJob(t, dsn, "schedule", 5*time.Second)
		for _, c := range []string{"dc-a", "dc-b"} {
			p := j.start(t, podSpec{cluster: c, app: app(0, 0)})
			if p.finish() != 0 || p.decision().Action != protocol.ActionRun || !strings.Contains(p.decision().Reason, "manual run") {
				t.Fatalf("%s: %+v", c, p.decision())
			}
		}
		if runs := readLedger(t, j.ledger); len(runs) != 2 {
			t.Fatalf("ledger: %+v", runs)
		}
	})

	t.Run("lease mode: skips while another cluster holds the lease", func(t *testing.T) {
		j := newJob(t, dsn, "lease", 5*time.Second)
		a := j.start(t, podSpec{cluster: "dc-a", app: app(2, 0)})
		j.awaitRuns(t, "dc-a's app to start", 1)
		b := j.start(t, podSpec{cluster: "dc-b", app: app(0, 0)})
		if b.finish() != 0 || b.decision().Action != protocol.ActionSkip {
			t.Fatalf("dc-b: %+v", b.decision())
		}
		a.finish()
		if runs := readLedger(t, j.ledger); len(runs) != 1 {
			t.Fatalf("ledger: %+v", runs)
		}
	})
}

// A pod that starts long after its window (catchup exceeded) skips as stale.
func TestCatchupSkipsAStaleWindow(t *testing.T) {
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 5*time.Second)
	j.catchup = "10m"
	stale := j.start(t, podSpec{cluster: "dc-a", window: time.Now().Add(-time.Hour).Truncate(time.Minute), app: app(0, 0)})
	if stale.finish() != 0 || stale.decision().Action != protocol.ActionSkip || !strings.Contains(stale.decision().Reason, "stale") {
		t.Fatalf("an hour late: %+v", stale.decision())
	}
	fresh := j.start(t, podSpec{cluster: "dc-a", window: time.Now().Add(-time.Minute).Truncate(time.Minute), app: app(0, 0)})
	if fresh.finish() != 0 || fresh.decision().Action != protocol.ActionRun {
		t.Fatalf("a minute late: %+v", fresh.decision())
	}
}

// A window older than any retention allows is never claimed, catchup or not:
// its record may be gone, and claiming it again would run it twice.
func TestAWindowOlderThanRetentionAllowsIsSkippedAsStale(t *testing.T) {
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 5*time.Second)
	old := j.start(t, podSpec{cluster: "dc-a", window: time.Now().Add(-store.MinRetention).Truncate(time.Minute), app: app(0, 0)})
	if old.finish() != 0 || old.decision().Action != protocol.ActionSkip || !strings.Contains(old.decision().Reason, "deleted by retention") {
		t.Fatalf("a window %s old: %+v", store.MinRetention, old.decision())
	}
	if runs := readLedger(t, j.ledger); len(runs) != 0 {
		t.Fatalf("ran: %+v", runs)
	}
}

// Fail closed: with no database the app never runs and the container fails
// (exit 75), so the Job retries by its backoffLimit.
func TestUnreachableDatabaseFailsClosed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	j := job{dsn: "postgres://dislock:pw@" + addr + "/dislock?connect_timeout=1", key: uniqueKey(t), mode: "schedule", ttl: 5 * time.Second, ledger: t.TempDir() + "/ledger"}
	p := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0, 0), agentArgs: []string{"--start-timeout=2s"}})
	if code := p.finish(); code != 75 {
		t.Fatalf("wrapper exited %d, want 75", code)
	}
	d := p.decision()
	if d.Action != protocol.ActionError || !strings.Contains(d.Reason, addr) {
		t.Fatalf("decision %+v does not name the database %s", d, addr)
	}
	if !strings.HasPrefix(p.terminationMessage(), "error: could not decide") {
		t.Fatalf("termination message %q", p.terminationMessage())
	}
	if runs := readLedger(t, j.ledger); len(runs) != 0 {
		t.Fatalf("the app ran: %+v", runs)
	}
}

// restartPolicy OnFailure: the kubelet restarts the app container in the same
// pod after its exit 75, and its wrapper reads the decision again. Once the
// database answers, the agent's new decision lets that restart run, exactly
// once, instead of failing with the same error until the backoffLimit.
func TestAnAppRestartedAfterAnErrorDecisionRunsOnceTheDatabaseAnswers(t *testing.T) {
	bouncer, err := url.Parse(pgtest.Need(t).BouncerDSN())
	if err != nil {
		t.Fatal(err)
	}
	db := openStore(t, bouncer.String())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyAddr := l.Addr().String()
	l.Close() // nothing listens: the database is unreachable
	dsn := *bouncer
	dsn.Host = proxyAddr
	q := dsn.Query()
	q.Set("connect_timeout", "1")
	dsn.RawQuery = q.Encode()
	// The webhook names each app container; a restarted container reports
	// under the same name, replacing its earlier result.
	j := job{dsn: dsn.String(), key: uniqueKey(t), mode: "schedule", ttl: 5 * time.Second, ledger: t.TempDir() + "/ledger",
		extra: []string{contract.EnvContainerName + "=app"}}
	p := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0, 0), agentArgs: []string{"--start-timeout=2s"}})
	p.waitWrapper()
	if p.exit != 75 || p.decision().Action != protocol.ActionError {
		t.Fatalf("first start: exit %d, decision %+v", p.exit, p.decision())
	}

	harness.Forward(t, proxyAddr, bouncer.Host) // the database is back
	await(t, "a decision after the error", 90*time.Second, func() bool { return p.decision().Action != protocol.ActionError })
	if d := p.decision(); d.Action != protocol.ActionRun {
		t.Fatalf("decision after the database came back: %+v", d)
	}
	p.startWrapper()
	if code := p.finish(); code != 0 {
		t.Fatalf("restarted app container exited %d:\n%s\n%s", code, p.wrapperLog, p.agentLog)
	}
	if runs := readLedger(t, j.ledger); len(runs) != 1 {
		t.Fatalf("the app ran %d times, want once: %+v", len(runs), runs)
	}
	w, err := db.GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
	if err != nil || w.State != store.StateSucceeded {
		t.Fatalf("window after the run: %+v %v", w, err)
	}
}

// A misconfigured sidecar says what is wrong instead of running unlocked.
func TestBadConfigurationIsAnErrorDecisionNamingTheVariable(t *testing.T) {
	j := job{dsn: pgtest.Need(t).BouncerDSN(), key: "no-namespace", mode: "sometimes", ttl: 5 * time.Second, ledger: t.TempDir() + "/ledger"}
	p := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0, 0)})
	if code := p.finish(); code != 75 {
		t.Fatalf("wrapper exited %d, want 75", code)
	}
	for _, want := range []string{"DISLOCK_MODE", "sometimes", "DISLOCK_KEY", "no-namespace"} {
		if !strings.Contains(p.decision().Reason, want) {
			t.Errorf("reason %q does not mention %q", p.decision().Reason, want)
		}
	}
}
