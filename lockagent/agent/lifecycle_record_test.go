package agent_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/pgtest"
)

// The kubelet restarts a SIGKILLed sidecar; if the app ends a moment later,
// the pod ends and the restarted sidecar is stopped at once — possibly before
// the Go runtime let it install its signal handler, which kills it without a
// word. A success the pod ends on must therefore already be in the database:
// the app container exits only once the agent recorded it. Otherwise the
// window stays running, lapses, and a standby runs it again (invariant 1;
// found by the fault schedules, seeds 13000007 and 20261290).
func TestTheAppContainerExitsOnlyOnceItsSuccessIsRecorded(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		j := newJob(t, dsn, "schedule,lease", 3*time.Second)
		j.standby = true
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.5, 0)})
		j.awaitRuns(t, "dc-a's app to start", 1)
		a.agent.Process.Kill() // SIGKILL / OOM kill while the app runs
		<-a.agentDone
		dir := protocol.Dir(a.dir)
		await(t, "the app to end and its wrapper to report", 10*time.Second, func() bool {
			r, err := dir.ReadResults()
			return err == nil && len(r) == 1
		})
		a.startAgent() // the kubelet restarts the sidecar
		a.waitWrapper()
		// The pod ends now: the kubelet stops the sidecar, which may die
		// of the signal before it can handle it.
		a.agent.Process.Kill()
		<-a.agentDone
		w, err := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
		if err != nil || w.State != store.StateSucceeded {
			t.Fatalf("VIOLATION (invariant 1): the app container exited %d while its window was %+v (%v): a standby may run it again\nagent:\n%s\nwrapper:\n%s",
				a.exit, w, err, a.agentLog, a.wrapperLog)
		}
		if a.exit != 0 {
			t.Fatalf("the app container exited %d, want 0:\n%s", a.exit, a.wrapperLog)
		}
	})
}

// The wait for the record is bounded: with the sidecar dead for good, the app
// container exits once the safety deadline passed, and the Job ends
// (invariant 4). A failing second container ends the wait too: its failure
// is recorded when the pod stops, as every failure is.
func TestTheWaitForTheRecordEnds(t *testing.T) {
	t.Run("the sidecar stays dead", func(t *testing.T) {
		j := newJob(t, bouncerDSN(t), "schedule", 3*time.Second)
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.5, 0)})
		j.awaitRuns(t, "dc-a's app to start", 1)
		a.agent.Process.Kill()
		<-a.agentDone
		a.waitWrapper()
		if a.exit != 0 || !strings.Contains(a.wrapperLog.String(), "stopped waiting for the agent to record the success") {
			t.Fatalf("the app container exited %d; want 0 after saying why it stopped waiting:\n%s", a.exit, a.wrapperLog)
		}
	})
	t.Run("another container failed", func(t *testing.T) {
		j := newJob(t, bouncerDSN(t), "schedule", 3*time.Second)
		j.extra = append(j.extra, contract.EnvAppContainers+"=app,other")
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.5, 0)})
		other := exec.Command(filepath.Join(a.dir, protocol.BinPath), "exec", "--name", "other", "--", "/bin/sh", "-c", "exit 3")
		other.Env = a.env
		if err := other.Run(); other.ProcessState == nil || other.ProcessState.ExitCode() != 3 {
			t.Fatalf("the other container: %v", err)
		}
		a.waitWrapper()
		if a.exit != 0 || !strings.Contains(a.wrapperLog.String(), "container other failed") {
			t.Fatalf("the app container exited %d; want 0 without waiting for a record:\n%s", a.exit, a.wrapperLog)
		}
		a.stopAgent()
		w, err := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
		if err != nil || w.State != store.StateFailed {
			t.Fatalf("window %+v (%v); want failed", w, err)
		}
	})
	t.Run("the pod is deleted", func(t *testing.T) {
		bn := ownBouncer(t, "record-wait-sigterm")
		j := newJob(t, bn.DSN(), "schedule", 30*time.Second)
		a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.2, 0)})
		j.awaitRuns(t, "dc-a's app to start", 1)
		if err := bn.Pause(); err != nil { // the agent cannot record
			t.Fatal(err)
		}
		t.Cleanup(func() { bn.Resume() })
		await(t, "the wrapper to wait for the record", 10*time.Second, func() bool {
			return strings.Contains(a.wrapperLog.String(), "waiting for the agent to record the success")
		})
		if err := a.wrapper.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		a.waitWrapper()
		if a.exit != 0 || !strings.Contains(a.wrapperLog.String(), "while waiting for the agent to record the success") {
			t.Fatalf("the app container exited %d after SIGTERM; want 0 (the app had succeeded) and why:\n%s", a.exit, a.wrapperLog)
		}
	})
}

// A wrapper whose app exited 0 may stay alive — its container Running — until
// the agent wrote `recorded`. What that wait must not make possible, each of
// which it did at first: a pod that never ends, an app run twice in one pod,
// leftovers acting after the lease is released, a container crash-looping
// after its success, a pod deletion kept waiting.

// reviewContainer is one more wrapped app container of a pod, named as the
// webhook names it (DISLOCK_CONTAINER_NAME).
type reviewContainer struct {
	cmd  *exec.Cmd
	log  *harness.Buffer
	done chan struct{}
	exit int
}

func (po *pod) startContainer(name, script string, env ...string) *reviewContainer {
	po.t.Helper()
	c := &reviewContainer{log: &harness.Buffer{}, done: make(chan struct{})}
	c.cmd = exec.Command(filepath.Join(po.dir, protocol.BinPath), "exec", "--", "/bin/sh", "-c", script)
	c.cmd.Env = append(append(append([]string{}, po.env...), contract.EnvContainerName+"="+name), env...)
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	c.cmd.WaitDelay = time.Second // a killed wrapper's orphans may hold its output open
	if err := c.cmd.Start(); err != nil {
		po.t.Fatalf("starting container %s: %v", name, err)
	}
	go func() {
		c.cmd.Wait()
		c.exit = c.cmd.ProcessState.ExitCode()
		close(c.done)
	}()
	po.t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
		}
		if po.t.Failed() {
			po.t.Logf("container %s log:\n%s", name, c.log)
		}
	})
	return c
}

func (c *reviewContainer) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-c.done:
		return c.exit
	case <-time.After(within):
		t.Fatalf("container still running after %s:\n%s", within, c.log)
		return -1
	}
}

// runsOf counts the ledger's runs of one ledger name that reached their end.
func runsOf(t *testing.T, ledger, cluster string) (ended int) {
	for _, r := range readLedger(t, ledger) {
		if r.cluster == cluster && r.stop != 0 {
			ended++
		}
	}
	return ended
}

const waitingLine = "waiting for the agent to record the success"

// A two-container pod, restartPolicy OnFailure. Container "other"
// finishes its work in 0.2 s; "app" takes longer. Before the change "other"
// exited 0 and was Terminated/Completed: nothing restarts a completed
// container. Now its wrapper keeps it Running for as long as "app" runs
// (allSucceeded needs every container), so anything that restarts a
// *running* container restarts it: a livenessProbe that fails once its app
// is gone (the kubelet kills it — SIGTERM, the wrapper exits 0 — and, the
// policy not being Never, starts it again regardless of the exit code), an
// in-place resize with resizePolicy RestartContainer, an OOM kill. The
// restarted wrapper finds the old "run" decision, no revocation yet (the
// pod's run is not over), clears its earlier success (MarkStarted) and runs
// the app AGAIN: two runs of "other" in one window, both to a successful end.
func TestOnlyTheLastAppContainerToFinishWaitsForTheRecord(t *testing.T) {
	j := newJob(t, bouncerDSN(t), "schedule", 3*time.Second)
	j.standby = true
	j.extra = append(j.extra, contract.EnvAppContainers+"=app,other")
	a := j.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(4, 0)})
	other := a.startContainer("other", app(0.2, 0), "CLUSTER=dc-a-other")
	// Only the last container to finish waits for the record: other ends
	// at once, as it always did, and is never restarted while it waits.
	if code := other.wait(t, 10*time.Second); code != 0 || strings.Contains(other.log.String(), waitingLine) {
		t.Fatalf("container other exited %d (want 0, without waiting while app runs):\n%s", code, other.log)
	}
	a.waitWrapper()
	a.stopAgent()
	if n := runsOf(t, j.ledger, "dc-a-other"); n != 1 {
		t.Fatalf("container other's app reached its end %d times, want 1", n)
	}
	w, err := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
	if err != nil || w.State != store.StateSucceeded {
		t.Fatalf("window %+v (%v), want succeeded", w, err)
	}
}

// The same restart, one app container. The sidecar was SIGKILLed
// (OOM) during the run and restarted while the database is unreachable for
// a moment, so the record is late; the wrapper waits. A liveness kill +
// OnFailure restart of the waiting container lands before any revocation:
// the app runs a second time with the same token and reaches its end again.
func TestAWaitingContainerRestartedBeforeTheRecordDoesNotRunTheAppAgain(t *testing.T) {
	bn := ownBouncer(t, "review-rerun")
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 9*time.Second) // deadline 6 s after a renewal
	ja := j
	ja.dsn = bn.DSN()
	a := ja.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(1, 0)})
	j.awaitRuns(t, "dc-a's app to start", 1)
	a.agent.Process.Kill()
	<-a.agentDone
	if err := bn.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bn.Start() })
	a.startAgent() // the kubelet restarts the sidecar; it cannot re-enter yet
	await(t, "the wrapper to wait for the record", 10*time.Second, func() bool {
		return strings.Contains(a.wrapperLog.String(), waitingLine)
	})
	a.wrapper.Process.Signal(syscall.SIGTERM) // liveness probe failed
	a.waitWrapper()
	a.startWrapper() // restartPolicy OnFailure: the container starts again
	a.waitWrapper()
	secondExit := a.exit
	if err := bn.Start(); err != nil {
		t.Fatal(err)
	}
	a.stopAgent()
	n := runsOf(t, j.ledger, "dc-a")
	t.Logf("dc-a's app reached its end %d time(s); the restarted container exited %d", n, secondExit)
	if n > 1 {
		t.Fatalf("VIOLATION (invariant 1): dc-a's app ran to its end %d times for one window in one pod:\n%s", n, a.wrapperLog)
	}
}

// The same restart after the agent revoked for its record (the
// database slow at the app's end, so the record takes seconds): the
// restarted container finds `revoked` ("the pod's run is over") and exits 75
// — and, failed under OnFailure, is restarted again and again until the
// Job's backoffLimit fails the Job, although its window succeeded. Before
// the change the container had completed with 0 and was never restarted.
func TestAWaitingContainerRestartedAfterTheRevocationKeepsItsSuccess(t *testing.T) {
	bn := ownBouncer(t, "review-75")
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 9*time.Second)
	ja := j
	ja.dsn = bn.DSN()
	a := ja.start(t, podSpec{cluster: "dc-a", window: tick0, app: app(0.5, 0)})
	j.awaitRuns(t, "dc-a's app to start", 1)
	if err := bn.Pause(); err != nil { // the database is slow at the app's end
		t.Fatal(err)
	}
	t.Cleanup(func() { bn.Resume() })
	await(t, "the agent to start recording", 10*time.Second, func() bool {
		revoked, _ := protocol.Dir(a.dir).Revoked()
		return revoked && strings.Contains(a.wrapperLog.String(), waitingLine)
	})
	a.wrapper.Process.Signal(syscall.SIGTERM) // liveness probe failed
	a.waitWrapper()
	var exits []int
	for range 3 { // restartPolicy OnFailure: the kubelet keeps restarting it
		a.startWrapper()
		a.waitWrapper()
		exits = append(exits, a.exit)
	}
	if err := bn.Resume(); err != nil {
		t.Fatal(err)
	}
	await(t, "the record", 20*time.Second, func() bool { return protocol.Dir(a.dir).Recorded() })
	a.stopAgent()
	w, err := openStore(t, j.dsn).GetWindow(context.Background(), j.key, tick0, store.NotIndexed)
	t.Logf("window %s (%v); restarted container exits %v", w.State, err, exits)
	if w.State == store.StateSucceeded && exits[len(exits)-1] != 0 {
		t.Fatalf("the window succeeded, but the app container, restarted while it waited for the record, now exits %v on every restart (crash loop until backoffLimit fails the Job)", exits)
	}
}

// startWrapperAsPID1 starts the app container's wrapper as PID 1 of a new
// PID namespace, as in a container: when it exits, the kernel kills every
// process left in the namespace (what ends an app's leftovers in a pod).
func (po *pod) startWrapperAsPID1() {
	po.t.Helper()
	po.wrapper = exec.Command(filepath.Join(po.dir, protocol.BinPath), "exec", "--", "/bin/sh", "-c", po.spec.app)
	po.wrapper.Env = po.env
	po.wrapper.Stdout, po.wrapper.Stderr = po.wrapperLog, po.wrapperLog
	po.wrapper.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := po.wrapper.Start(); err != nil {
		po.t.Fatalf("starting the wrapper in a PID namespace: %v", err)
	}
}

// Lease mode. The app exits 0 but leaves a process of its group
// behind (a backgrounded helper still flushing). In a pod the wrapper is
// PID 1: when it exits, the kernel kills everything left in the container.
// Before the change it exited as soon as the app did, i.e. before the agent
// (which polls for the results every 100 ms, then writes the database) could
// release the lease. Now it exits only after it saw `recorded`, which the
// agent writes AFTER releasing the lease: the app's leftovers provably
// outlive the lease, and a pod waiting for that lease (here the Job's
// replacement pod, which waits for the lease rather than skip) takes it and
// runs while they still act (invariant 1: no two runs of a key overlap
// when the mode includes lease).
func TestTheAppsLeftoverProcessesDieBeforeTheLeaseIsReleased(t *testing.T) {
	if exec.Command("unshare", "-p", "-f", "true").Run() != nil {
		harness.Lacking(t, "needs PID namespaces (unshare -p)")
	}
	j := newJob(t, bouncerDSN(t), "lease", 1*time.Second) // a waiting pod polls every 100 ms
	// As the webhook renders it (explicit, so that this test also runs
	// unchanged on the commit before the change, for comparison).
	j.extra = append(j.extra, contract.EnvAppContainers+"=app", contract.EnvContainerName+"=app")
	leftover := filepath.Join(t.TempDir(), "leftover")
	script := `line() { echo "$1 $CLUSTER ${DISLOCK_WINDOW:-manual} ${DISLOCK_FENCING_TOKEN:-0} $(date +%s%N)" >> "$LEDGER"; }
line start
( trap '' TERM; while :; do date +%s%N >> "` + leftover + `"; sleep 0.005; done ) &
sleep 0.5
line stop
exit 0`
	var afterRelease, overlaps int
	const tries = 20
	for i := range tries {
		os.Remove(leftover)
		tick := tick0.Add(time.Duration(i) * time.Minute)
		p := podSpec{cluster: "dc-a", window: tick, app: script}
		a := j.sidecar(t, p)
		a.startWrapperAsPID1()
		await(t, "dc-a's app to start", 10*time.Second, func() bool {
			for _, run := range readLedger(t, j.ledger) {
				if run.cluster == "dc-a" && run.window == tick.Format(time.RFC3339) {
					return true
				}
			}
			return false
		})
		// The Job's replacement pod (same Job) waits for the lease.
		r := j.start(t, replacement(podSpec{cluster: "dc-a", window: tick, app: app(0.3, 0)}, "retry"))
		// The agent logs "recorded" after the release returned: a leftover
		// action stamped later than that line acted without the lease.
		var released int64
		await(t, "dc-a's agent to record and release", 20*time.Second, func() bool {
			released = recordedAt(a.agentLog.String())
			return released != 0 || strings.Contains(a.agentLog.String(), "lease lost")
		})
		if released == 0 { // a missed renewal on a loaded machine (ttl 1s): no run to judge
			a.waitWrapper()
			r.finish()
			a.stopAgent()
			t.Logf("try %d: dc-a lost its lease under load; not counted", i)
			continue
		}
		a.waitWrapper()
		r.finish()
		a.stopAgent()
		var lastLeft int64
		for _, ts := range readLedgerLines(t, leftover) {
			if ts > released {
				afterRelease++
			}
			lastLeft = max(lastLeft, ts)
		}
		t.Logf("try %d: dc-a's leftover process last acted %s after its lease was released", i, time.Duration(lastLeft-released))
		for _, run := range readLedger(t, j.ledger) {
			if run.cluster == "dc-a-retry" && run.window == tick.Format(time.RFC3339) && run.start < lastLeft {
				overlaps++
				t.Logf("window %s: the replacement's run (token %d) started %s before dc-a's leftover process last acted", run.window, run.token, time.Duration(lastLeft-run.start))
			}
		}
	}
	t.Logf("in %d tries: leftover actions after dc-a's lease was released: %d; replacement runs overlapping them: %d", tries, afterRelease, overlaps)
	if afterRelease > 0 {
		t.Fatalf("VIOLATION (invariant 1, lease mode): dc-a's app left a process that kept acting %d time(s) after dc-a's lease was released "+
			"(its wrapper, PID 1, exits only after `recorded`, which comes after the release); a run of the next holder overlapped it %d time(s) in %d tries",
			afterRelease, overlaps, tries)
	}
}

// readLedgerLines reads one nanosecond timestamp per line.
func readLedgerLines(t *testing.T, path string) []int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []int64
	for _, l := range strings.Fields(string(b)) {
		if v, err := strconv.ParseInt(l, 10, 64); err == nil {
			out = append(out, v)
		}
	}
	return out
}

// recordedAt is the wall time (ns) of the agent's "recorded" log line, 0
// before there is one.
func recordedAt(log string) int64 {
	for _, l := range strings.Split(log, "\n") {
		var e struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(l), &e) == nil && e.Msg == "recorded" {
			return e.Time.UnixNano()
		}
	}
	return 0
}

// Two app containers, restartPolicy Never. Container "other" is
// OOM-killed: on cgroup v2 the kubelet sets memory.oom.group, so the whole
// container dies, its wrapper (PID 1) included, by SIGKILL — no result file.
// Container "app" succeeds and waits for the record. The agent records only
// once EVERY container reported success, and the wrapper stops waiting only
// on `recorded`, a failure RESULT, the deadline or a signal: none comes. The
// agent still heartbeats (nothing failed that it can see), so the deadline
// keeps moving. Before the change "app" exited 0, the pod ended, and the
// agent recorded the window failed at its SIGTERM (no result from other), so
// the Job's next pod, or a standby, took over. Now the pod never ends, the
// Job never ends, and the standby waits for ever (invariant 4).
func TestAContainerKilledWithoutAResultDoesNotKeepThePodAlive(t *testing.T) {
	const ttl = 2 * time.Second
	j := newJob(t, bouncerDSN(t), "schedule", ttl)
	j.standby = true
	j.extra = append(j.extra, contract.EnvAppContainers+"=app,other")
	a := j.sidecar(t, podSpec{cluster: "dc-a", window: tick0, app: app(1, 0)})
	other := a.startContainer("other", app(30, 0), "CLUSTER=dc-a-other")
	a.startWrapper()
	await(t, "both apps to start", 10*time.Second, func() bool { return len(readLedger(t, j.ledger)) == 2 })
	other.cmd.Process.Kill() // OOM kill of container other (memory.oom.group: PID 1 too)
	other.wait(t, 10*time.Second)
	b := j.sidecar(t, podSpec{cluster: "dc-b", window: tick0, app: app(0.3, 0)})
	b.startWrapper()
	// Invariant 4: no pod waits past the owner's end + TTLs. Give it far more.
	limit := 10 * ttl
	done := make(chan struct{})
	go func() { a.wrapper.Wait(); close(done) }()
	select {
	case <-done:
		t.Logf("app container exited %d", a.wrapper.ProcessState.ExitCode())
		return
	case <-time.After(limit):
	}
	_, bDecided := decisionOf(b)
	t.Fatalf("VIOLATION (invariant 4): %s after container other was killed, container app (its app ended 0 after 1 s) still waits for the record, "+
		"so the pod cannot end; the agent keeps the claim alive (dc-b's standby decided: %t). Wrapper log:\n%s", limit, bDecided, lastLines(a.wrapperLog.String(), 3))
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// The pod is deleted (a drain) while the app runs: the kubelet
// sends SIGTERM once, the wrapper forwards it, and the app shuts down
// cleanly with exit 0. The wrapper then waits for the record — but the
// terminating signal that is supposed to end that wait was already consumed
// by forwarding, so with the agent unable to record (database unreachable
// from this node) it waits until the safety deadline, up to 2/3 of the TTL
// (TTL up to 1 h), past the pod's terminationGracePeriodSeconds: the kubelet
// SIGKILLs it (exit 137 instead of 0). Modelled: TTL 30 s, grace 3 s.
func TestASIGTERMForwardedToTheAppEndsTheWaitForTheRecord(t *testing.T) {
	bn := ownBouncer(t, "review-drain")
	j := newJob(t, pgtest.Need(t).BouncerDSN(), "schedule", 30*time.Second)
	ja := j
	ja.dsn = bn.DSN()
	graceful := `line() { echo "$1 $CLUSTER ${DISLOCK_WINDOW:-manual} ${DISLOCK_FENCING_TOKEN:-0} $(date +%s%N)" >> "$LEDGER"; }
line start
trap 'line stop; exit 0' TERM
sleep 30 & wait $!`
	a := ja.start(t, podSpec{cluster: "dc-a", window: tick0, app: graceful})
	j.awaitRuns(t, "dc-a's app to start", 1)
	if err := bn.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bn.Resume() })
	a.wrapper.Process.Signal(syscall.SIGTERM) // the pod is deleted
	const grace = 3 * time.Second
	done := make(chan struct{})
	go func() { a.wrapper.Wait(); close(done) }()
	select {
	case <-done:
		t.Logf("the app container exited %d within the grace period", a.wrapper.ProcessState.ExitCode())
		return
	case <-time.After(grace):
	}
	a.wrapper.Process.Kill() // terminationGracePeriodSeconds is over
	<-done
	t.Fatalf("the app container, SIGTERMed for a pod deletion and whose app exited 0 at once, was still waiting for the record when the grace period ended: "+
		"SIGKILLed (%s; exit 137 in a pod, not 0)\n%s", a.wrapper.ProcessState, lastLines(a.wrapperLog.String(), 2))
}
