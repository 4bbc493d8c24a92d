package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/hapg"
)

// The database's primary is lost while jobs run, on a real Patroni cluster
// (synchronous_mode, three nodes, a PgBouncer per data centre in front of
// HAProxy), with real agent and wrapper processes.
func TestPrimaryLostWhileJobsRun(t *testing.T) {
	c := hapg.New(t, hapg.Options{Name: "agent", Logf: t.Logf})
	ctx := context.Background()
	for deadline := time.Now().Add(time.Minute); ; {
		s, err := store.Open(ctx, c.HAProxyDSN(), store.Options{MaxConns: 1})
		if err == nil {
			_, err = migrate.Up(ctx, s)
			s.Close()
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("migrating: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	leader := func() (name, dc string) {
		t.Helper()
		name, err := c.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return name, strings.TrimPrefix(name, "pg-")
	}
	other := func(dc string) string {
		for _, d := range c.DCs() {
			if d != dc {
				return d
			}
		}
		panic("one data centre")
	}
	dsnOf := func(dc string) []string { return []string{"DISLOCK_DATABASE_URL=" + c.BouncerDSN(dc)} }

	// A failover shorter than the lease's margin: the running job keeps its
	// window and lease and finishes; a cluster that asks after the failover
	// finds the window taken — the claim survived — and skips.
	t.Run("a job keeps running through a failover", func(t *testing.T) {
		j := job{key: uniqueKey(t), mode: "schedule,lease", ttl: 30 * time.Second, ledger: filepath.Join(t.TempDir(), "ledger")}
		node, dc := leader()
		a := j.start(t, podSpec{cluster: "dc-" + dc, window: tick0, app: app(12, 0), env: dsnOf(dc)})
		j.awaitRuns(t, "the app to start", 1)
		if err := c.Kill(node); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		if _, err := c.WaitLeader(ctx, node); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s killed; a new primary after %s", node, time.Since(killed).Round(time.Millisecond))
		b := j.start(t, podSpec{cluster: "dc-" + other(dc), window: tick0, app: app(0.1, 0), env: dsnOf(other(dc))})
		if code := b.finish(); code != 0 || b.decision().Action != protocol.ActionSkip {
			t.Fatalf("the other cluster after the failover: exit %d, decision %+v", code, b.decision())
		}
		if code := a.finish(); code != 0 || a.decision().Action != protocol.ActionRun {
			t.Fatalf("the running job: exit %d, decision %+v\n%s", code, a.decision(), a.agentLog)
		}
		runs := readLedger(t, j.ledger)
		assertNoOverlap(t, runs)
		if len(runs) != 1 {
			t.Fatalf("runs: %+v", runs)
		}
		w, err := openStore(t, c.HAProxyDSN()).GetWindow(ctx, j.key, tick0, store.NotIndexed)
		if err != nil || w.State != store.StateSucceeded || w.Cluster != "dc-"+dc {
			t.Fatalf("window after the failover: %+v %v", w, err)
		}
		if err := c.Restart(node); err != nil {
			t.Fatal(err)
		}
		waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := c.WaitSync(waitCtx); err != nil {
			t.Fatal(err)
		}
	})

	// The data centre that hosts the primary also hosts the running job, and
	// is lost whole: node, PgBouncer, PostgreSQL. The other data centre's
	// standby takes the window over on the promoted primary: exactly one
	// successful run.
	t.Run("a standby runs the window of a data centre lost with the primary", func(t *testing.T) {
		j := job{key: uniqueKey(t), mode: "schedule", ttl: 6 * time.Second, standby: true, ledger: filepath.Join(t.TempDir(), "ledger")}
		node, dc := leader()
		a := j.start(t, podSpec{cluster: "dc-" + dc, window: tick0, app: app(60, 0), env: dsnOf(dc)})
		j.awaitRuns(t, "the owner's app to start", 1)
		b := j.start(t, podSpec{cluster: "dc-" + other(dc), window: tick0, app: app(0.5, 0), env: dsnOf(other(dc))})
		await(t, "the standby to wait", 20*time.Second, func() bool { return strings.Contains(b.agentLog.String(), "waiting: standby") })

		a.lose()
		if err := c.Bouncer(dc).Stop(); err != nil {
			t.Fatal(err)
		}
		if err := c.Kill(node); err != nil {
			t.Fatal(err)
		}
		if code := b.finish(); code != 0 || b.decision().Action != protocol.ActionRun {
			t.Fatalf("the standby: exit %d, decision %+v\n%s", code, b.decision(), b.agentLog)
		}
		runs := readLedger(t, j.ledger)
		var succeeded []run
		for _, r := range runs {
			if r.stop != 0 {
				succeeded = append(succeeded, r)
			}
		}
		if len(runs) != 2 || len(succeeded) != 1 || succeeded[0].cluster != "dc-"+other(dc) {
			t.Fatalf("want the lost owner's unfinished run and one successful run by the standby, got %+v", runs)
		}
		if succeeded[0].token <= runs[0].token {
			t.Fatalf("the standby's token %d is not above the lost owner's %d", succeeded[0].token, runs[0].token)
		}
		w, err := openStore(t, c.HAProxyDSN()).GetWindow(ctx, j.key, tick0, store.NotIndexed)
		if err != nil || w.State != store.StateSucceeded || w.Cluster != "dc-"+other(dc) {
			t.Fatalf("window: %+v %v", w, err)
		}
	})
}

// lose is the pod's node lost: the sidecar, the wrapper and the app die at
// once, and nothing they would do on the way out happens.
func (po *pod) lose() {
	po.t.Helper()
	if po.wrapper != nil && po.wrapper.Process != nil {
		pid := po.wrapper.Process.Pid
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
		for _, f := range tasks {
			b, _ := os.ReadFile(f)
			for _, s := range strings.Fields(string(b)) {
				if child, err := strconv.Atoi(s); err == nil {
					_ = syscall.Kill(-child, syscall.SIGKILL) // the app's process group
					_ = syscall.Kill(child, syscall.SIGKILL)
				}
			}
		}
	}
	po.kill()
}
