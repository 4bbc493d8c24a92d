package e2e

// The failure stories: a window whose winner's app fails, a data centre lost
// mid-run, and a data centre cut off from the database mid-run. Each makes
// its Jobs the way the CronJob controller does, for a window it chooses, in
// one data centre at a time, so that dc-a is the first to claim.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dislock/dislock/test/node"
)

// failureTTL is the lease and liveness TTL of the failure stories: short, so
// that expiries come soon (the least allowed is 5 s). The agent heartbeats
// every ttl/3 and stops trusting what it holds ttl/3 before it can expire.
const failureTTL = 6 * time.Second

// standbyWaiting starts the agent's log line when it waits as a standby.
const standbyWaiting = "standby: the window's owner is alive"

// story is what every failure story starts from: a suspended ledger
// CronJob named name in both data centres, with the TTL failureTTL, and the
// window of the current minute, for which the story creates Jobs. a is the
// data centre that claims the window first, b the other.
type story struct {
	e         *Env
	name, key string
	a, b      *DC
	cjs       map[string]*batchv1.CronJob
	tick      time.Time
	w         string // tick, RFC 3339
}

// newStory is a story in the shared environment: a is its first data
// centre, b its second.
func newStory(t *testing.T, name, mode string, standby bool) story {
	t.Helper()
	return storyIn(t, Need(t), name, mode, standby)
}

// storyIn is a story in environment e.
func storyIn(t *testing.T, e *Env, name, mode string, standby bool) story {
	t.Helper()
	annotations := map[string]string{"dislock.io/lease-ttl": failureTTL.String()}
	if standby {
		annotations["dislock.io/standby"] = "true"
	}
	tick := time.Now().UTC().Truncate(time.Minute)
	return story{
		e: e, name: name, key: Namespace + "/" + name, a: e.DCs[0], b: e.DCs[1],
		cjs:  suspendedEverywhere(t, e, name, mode, Ledger{Work: 2 * time.Second, Annotations: annotations}),
		tick: tick, w: tick.Format(time.RFC3339),
	}
}

// wantSucceeded checks that the pod's agent says it ran the window and the
// run succeeded.
func wantSucceeded(t *testing.T, dc *DC, pod *corev1.Pod, w string) {
	t.Helper()
	if msg := AgentMessage(pod); !strings.Contains(msg, "ran window "+w) || !strings.Contains(msg, "succeeded") {
		t.Errorf("%s's agent's termination message %q, want window %s run and succeeded", dc.Name, msg, w)
	}
}

func TestStandbyTakesTheWindowOverWhenTheWinnersAppFails(t *testing.T) {
	const name = "standby-fail"
	s := newStory(t, name, "schedule", true)
	e, ctx, key, a, b, cjs, tick, w := s.e, context.Background(), s.key, s.a, s.b, s.cjs, s.tick, s.w

	// dc-a's run works for a while, long enough for dc-b's standby to come
	// up, and then fails.
	jobA := createTickIn(t, a, cjs[a.Name], tick, func(j *batchv1.Job) {
		setEnv(&j.Spec.Template, "LEDGER_SLEEP", "10s")
		setEnv(&j.Spec.Template, "LEDGER_EXIT", "1")
	})
	awaitOwner(t, e, key, tick, a.Name)
	jobB := createTickIn(t, b, cjs[b.Name], tick, nil)
	finishedA, podA := finishJob(t, a, jobA.Name)
	finishedB, podB := finishJob(t, b, jobB.Name)

	if _, complete := Finished(finishedA); complete {
		t.Errorf("%s: Job %s is Complete, want Failed: its app exited 1", a.Name, jobA.Name)
	}
	if _, complete := Finished(finishedB); !complete {
		t.Errorf("%s: Job %s failed, want Complete: the standby's run succeeded", b.Name, jobB.Name)
	}
	row, ok, err := e.WindowRow(ctx, key, tick)
	if err != nil || !ok {
		t.Fatalf("window %s of %s: %v (found %v)", w, key, err, ok)
	}
	if row.State != "succeeded" || row.Cluster != b.Name || row.ExitCode == nil || *row.ExitCode != 0 {
		t.Errorf("window %s: %s owned by %s (exit %s), want succeeded, owned by %s, exit 0", w, row.State, row.Cluster, fmtInt(row.ExitCode), b.Name)
	}
	runs := runsOf(t, e, name)
	if len(runs) != 2 || runs[0].Cluster != a.Name || runs[1].Cluster != b.Name {
		t.Fatalf("ledger %+v, want the failed run in %s, then the successful one in %s", runs, a.Name, b.Name)
	}
	failed, took := runs[0], runs[1]
	if failed.Window != w || took.Window != w {
		t.Errorf("runs of windows %s and %s, want both of %s", failed.Window, took.Window, w)
	}
	if failed.Finished == nil || failed.ExitCode == nil || *failed.ExitCode != 1 || took.ExitCode == nil || *took.ExitCode != 0 {
		t.Fatalf("%s's run ended %s with exit %s, %s's with exit %s: want exit 1, then exit 0",
			a.Name, fmtTime(failed.Finished), fmtInt(failed.ExitCode), b.Name, fmtInt(took.ExitCode))
	}
	if o := Overlaps(runs); len(o) > 0 {
		t.Errorf("runs overlap: %v", o)
	}
	if row.ClaimedAt.Before(*failed.Finished) {
		t.Errorf("%s took the window over at %s, before %s's run ended at %s", b.Name, fmtTime(&row.ClaimedAt), a.Name, fmtTime(failed.Finished))
	}
	if took.Token <= failed.Token {
		t.Errorf("fencing token %d of the takeover is not above the failed run's %d", took.Token, failed.Token)
	}
	if msg := AgentMessage(&podA); !strings.Contains(msg, "ran window "+w) || !strings.Contains(msg, "exit code 1") {
		t.Errorf("%s's agent's termination message %q, want window %s run and failed with exit code 1", a.Name, msg, w)
	}
	wantSucceeded(t, b, &podB, w)
	agentLog, _ := ContainerLog(b.Node, podB.Name, "dislock-agent")
	_, waited := findLine(agentLog, standbyWaiting)
	t.Logf("window %s: %s ran %s–%s and exited 1; %s (standby, waited for the owner: %v) took over at %s, %v after, and ran %s–%s, exit 0; window succeeded, owned by %s",
		w, a.Name, fmtTime(&failed.Started), fmtTime(failed.Finished), b.Name, waited, fmtTime(&row.ClaimedAt),
		row.ClaimedAt.Sub(*failed.Finished).Round(time.Millisecond), fmtTime(&took.Started), fmtTime(took.Finished), row.Cluster)
}

func TestStandbyTakesOverFromADataCentreLostMidRunOnlyAfterItsLivenessExpired(t *testing.T) {
	s := newStory(t, "standby-lost", "schedule", true)
	a, b, w := s.a, s.b, s.w
	doomed := SpareNode(t, s.e, a, a.Name+"-doomed")

	jobB := s.ownerRunsStandbyWaits(t, doomed)
	killFrom, killedBy, lastAlive := s.killOwnersNode(t, doomed)
	s.awaitTakeover(t)
	row, killed, took := s.wantStandbyTookOver(t, jobB.Name, lastAlive, killedBy)
	lastBeat := lastAlive.Add(-failureTTL)
	t.Logf("window %s: %s ran from %s; its node was SIGKILLed (kubelet, containerd, shims, pod) between %s and %s; last heartbeat %s, liveness until %s; "+
		"%s's standby took over at %s: %v after the last heartbeat (ttl %v), %v after the kill; its run %s–%s succeeded",
		w, a.Name, fmtTime(&killed.Started), fmtTime(&killFrom), fmtTime(&killedBy), fmtTime(&lastBeat), fmtTime(&lastAlive),
		b.Name, fmtTime(&row.ClaimedAt), row.ClaimedAt.Sub(lastBeat).Round(time.Millisecond), failureTTL,
		row.ClaimedAt.Sub(killedBy).Round(time.Millisecond), fmtTime(&took.Started), fmtTime(took.Finished))
}

// ownerRunsStandbyWaits creates the window's Job in s.a, its pod on node n
// and its app working for ten minutes; once s.a owns the window and its app
// started, it creates s.b's Job, and returns it once s.b's agent waits as a
// standby.
func (s story) ownerRunsStandbyWaits(t *testing.T, n *node.Node) *batchv1.Job {
	t.Helper()
	createTickIn(t, s.a, s.cjs[s.a.Name], s.tick, func(j *batchv1.Job) {
		setEnv(&j.Spec.Template, "LEDGER_SLEEP", "10m")
		j.Spec.Template.Spec.NodeName = n.Name()
	})
	awaitOwner(t, s.e, s.key, s.tick, s.a.Name)
	await(t, jobTimeout, s.a.Name+"'s app to start", func() bool { return len(runsOf(t, s.e, s.name)) > 0 })
	jobB := createTickIn(t, s.b, s.cjs[s.b.Name], s.tick, nil)
	podB := podOf(t, s.b, jobB.Name)
	await(t, jobTimeout, s.b.Name+"'s agent to wait as a standby", func() bool {
		lines, _ := ContainerLog(s.b.Node, podB.Name, "dislock-agent")
		_, ok := findLine(lines, standbyWaiting)
		return ok
	})
	return jobB
}

// killOwnersNode SIGKILLs n, the node of s.a's running pod, and returns the
// database clock just before and just after, and the window's liveness as
// read right after: nothing of s.a's run is left to heartbeat, so it is the
// last.
func (s story) killOwnersNode(t *testing.T, n *node.Node) (killFrom, killedBy, lastAlive time.Time) {
	t.Helper()
	ctx := context.Background()
	killFrom, err := s.e.DBNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Kill(); err != nil {
		t.Fatalf("killing %s's node %s: %v", s.a.Name, n.Name(), err)
	}
	killedBy, err = s.e.DBNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	row, ok, err := s.e.WindowRow(ctx, s.key, s.tick)
	if err != nil || !ok {
		t.Fatalf("window %s of %s: %v (found %v)", s.w, s.key, err, ok)
	}
	if row.Cluster != s.a.Name {
		t.Fatalf("%s owned window %s already when first looked at after the kill: the liveness it waited out is unknown", row.Cluster, s.w)
	}
	return killFrom, killedBy, row.AliveUntil
}

// awaitTakeover waits until a data centre other than s.a owns the window.
func (s story) awaitTakeover(t *testing.T) {
	t.Helper()
	await(t, time.Minute, s.b.Name+" to take window "+s.w+" over", func() bool {
		row, ok, err := s.e.WindowRow(context.Background(), s.key, s.tick)
		if err != nil || !ok {
			t.Fatalf("window %s of %s: %v (found %v)", s.w, s.key, err, ok)
		}
		return row.Cluster != s.a.Name
	})
}

// wantStandbyTookOver waits for s.b's Job and checks how a story whose owner
// s.a was lost mid-run (its node dead by killedBy, its window's liveness as
// last read lastAlive) ends: s.b's Job is Complete; the window succeeded,
// owned by s.b, which claimed it no earlier than lastAlive; the ledger has
// s.a's run, then s.b's, started after lastAlive and killedBy, with exit 0;
// s.b's agent says it ran the window. It returns the window's row and the
// two runs.
func (s story) wantStandbyTookOver(t *testing.T, jobB string, lastAlive, killedBy time.Time) (row WindowRow, killed, took Run) {
	t.Helper()
	a, b, w := s.a, s.b, s.w
	finishedB, podB := finishJob(t, b, jobB)
	if _, complete := Finished(finishedB); !complete {
		t.Errorf("%s: Job %s failed, want Complete", b.Name, jobB)
	}
	row, _, err := s.e.WindowRow(context.Background(), s.key, s.tick)
	if err != nil {
		t.Fatal(err)
	}
	if row.State != "succeeded" || row.Cluster != b.Name {
		t.Errorf("window %s: %s owned by %s, want succeeded, owned by %s", w, row.State, row.Cluster, b.Name)
	}
	lastBeat := lastAlive.Add(-failureTTL)
	if row.ClaimedAt.Before(lastAlive) {
		t.Errorf("%s took window %s over at %s, before %s's liveness expired at %s (last heartbeat %s + ttl %v)",
			b.Name, w, fmtTime(&row.ClaimedAt), a.Name, fmtTime(&lastAlive), fmtTime(&lastBeat), failureTTL)
	}
	runs := runsOf(t, s.e, s.name)
	if len(runs) != 2 || runs[0].Cluster != a.Name || runs[1].Cluster != b.Name {
		t.Fatalf("ledger %+v, want %s's killed run, then %s's", runs, a.Name, b.Name)
	}
	killed, took = runs[0], runs[1]
	if took.Started.Before(lastAlive) || !took.Started.After(killedBy) {
		t.Errorf("%s's run started at %s; want it after %s's liveness expired (%s) and after its node was dead (%s)",
			b.Name, fmtTime(&took.Started), a.Name, fmtTime(&lastAlive), fmtTime(&killedBy))
	}
	if took.ExitCode == nil || *took.ExitCode != 0 {
		t.Errorf("%s's run: exit %s, want 0", b.Name, fmtInt(took.ExitCode))
	}
	wantSucceeded(t, b, &podB, w)
	return row, killed, took
}

func TestALeaseHolderCutOffFromTheDatabaseStopsBeforeItsLeaseExpiresAndOnlyThenTheOtherDataCentreGetsIt(t *testing.T) {
	const name = "lease-cut"
	s := newStory(t, name, "lease", false)
	e, ctx, key, a, b, cjs, tick := s.e, context.Background(), s.key, s.a, s.b, s.cjs, s.tick
	// Whatever happens, dc-a gets its database back for the next test.
	t.Cleanup(func() {
		if err := a.StartBouncer(); err != nil {
			t.Errorf("%s: restarting PgBouncer: %v", a.Name, err)
		}
	})
	jobA := createTickIn(t, a, cjs[a.Name], tick, func(j *batchv1.Job) { setEnv(&j.Spec.Template, "LEDGER_SLEEP", "10m") })
	await(t, jobTimeout, a.Name+"'s app to start", func() bool { return len(runsOf(t, e, name)) > 0 })
	podA := podOf(t, a, jobA.Name)

	// dc-b's CronJob fires (a Job per tick, here every few seconds rather
	// than every minute); while a run elsewhere holds the lease, each skips.
	holder := fmt.Sprintf("lease %s held by %s/", key, a.Name)
	ticks := 0
	fire := func() (corev1.Pod, string) {
		ticks++
		job := createTickIn(t, b, cjs[b.Name], tick.Add(time.Duration(ticks)*time.Minute), nil)
		pod := completeJob(t, b, job.Name)
		return pod, AgentMessage(&pod)
	}
	if _, msg := fire(); !strings.HasPrefix(msg, "skip:") || !strings.Contains(msg, holder) {
		t.Fatalf("%s's Job while %s's run holds the lease: termination message %q, want a skip naming %q", b.Name, a.Name, msg, holder)
	}

	cutAt, err := e.DBNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.StopBouncer(); err != nil {
		t.Fatalf("%s: stopping PgBouncer: %v", a.Name, err)
	}
	// No renewal can reach the database any more: this expiry is final.
	leaseA, ok, err := e.LeaseRow(ctx, key)
	if err != nil || !ok || !strings.HasPrefix(leaseA.Owner, a.Name+"/") {
		t.Fatalf("lease %s after %s lost the database: %+v (found %v, %v), want held by %s", key, a.Name, leaseA, ok, err, a.Name)
	}
	expiry := leaseA.ExpireAt

	var podB corev1.Pod
	skipsAfterCut := 0
	for {
		var msg string
		podB, msg = fire()
		if !strings.HasPrefix(msg, "skip:") {
			break
		}
		skipsAfterCut++
		if !strings.Contains(msg, holder) {
			t.Errorf("%s's Job %s skipped: %q, want the skip to name %q", b.Name, podB.Name, msg, holder)
		}
		if ticks > 20 {
			t.Fatalf("%s's Jobs still skip after %d ticks: %q", b.Name, ticks, msg)
		}
	}

	// dc-a's wrapper stopped the app when its safety deadline passed, and
	// logged it; the app could not record its end in the ledger (no
	// database), so its end is read from the log, stamped by the container
	// runtime on the host clock.
	var appLog []LogLine
	var ended LogLine
	await(t, time.Minute, a.Name+"'s app to end", func() bool {
		appLog, _ = ContainerLog(a.Node, podA.Name, "app")
		ended, ok = findLine(appLog, `"msg":"the command ended"`)
		return ok
	})
	stopping, ok := findLine(appLog, `"level":"ERROR"`)
	if !ok || !strings.Contains(ended.Text, `"revoked":true`) {
		t.Errorf("%s's app log: want the wrapper to have stopped the app because the lease could be lost:\n%v", a.Name, appLog)
	}
	offset, roundTrip, err := e.ClockOffset(ctx)
	if err != nil {
		t.Fatal(err)
	}
	endedDB := ended.At.Add(offset)
	if !endedDB.Before(expiry) {
		t.Errorf("%s's app ended at %s (host clock %s, database clock − host clock = %v ± %v), not before its lease expired at %s",
			a.Name, fmtTime(&endedDB), fmtTime(&ended.At), offset, roundTrip/2, fmtTime(&expiry))
	}

	leaseB, _, err := e.LeaseRow(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(leaseB.Owner, b.Name+"/") || leaseB.AcquiredAt.Before(expiry) {
		t.Errorf("lease %s: held by %s from %s, want %s's run to have acquired it at or after %s's expiry %s",
			key, leaseB.Owner, fmtTime(&leaseB.AcquiredAt), b.Name, a.Name, fmtTime(&expiry))
	}
	runs := runsOf(t, e, name)
	if len(runs) != 2 || runs[0].Cluster != a.Name || runs[1].Cluster != b.Name {
		t.Fatalf("ledger %+v, want %s's cut-off run, then %s's", runs, a.Name, b.Name)
	}
	took := runs[1]
	if !took.Started.After(endedDB) || took.Token != leaseB.Token || took.Token <= leaseA.Token {
		t.Errorf("%s's run (token %d) started at %s; want it after %s's app ended (%s), with the new lease's token %d, above %d",
			b.Name, took.Token, fmtTime(&took.Started), a.Name, fmtTime(&endedDB), leaseB.Token, leaseA.Token)
	}
	wantSucceeded(t, b, &podB, took.Window)
	// The kubelet's record of the app's end, in whole seconds.
	var appEnd *corev1.ContainerStateTerminated
	await(t, time.Minute, a.Name+"'s app container to be reported terminated", func() bool {
		p, err := a.Client.CoreV1().Pods(Namespace).Get(ctx, podA.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.Name == "app" {
				appEnd = c.State.Terminated
			}
		}
		return appEnd != nil
	})
	t.Logf("%s's PgBouncer stopped just after %s; its lease (token %d) expires at %s; its wrapper logged %s at %s and the app ended at %s, %v before expiry "+
		"(container runtime's log time on the host clock; database − host = %v ± %v; the kubelet reports finishedAt %s, exit %d); "+
		"%s's Jobs skipped %d time(s) after the cut; its run acquired the lease at %s, %v after expiry, and started at %s",
		a.Name, fmtTime(&cutAt), leaseA.Token, fmtTime(&expiry), logMsg(stopping.Text), fmtTime(&stopping.At), fmtTime(&endedDB), expiry.Sub(endedDB).Round(time.Millisecond),
		offset, roundTrip/2, appEnd.FinishedAt.Format(time.TimeOnly), appEnd.ExitCode,
		b.Name, skipsAfterCut, fmtTime(&leaseB.AcquiredAt), leaseB.AcquiredAt.Sub(expiry).Round(time.Millisecond), fmtTime(&took.Started))
}

// logMsg is the "msg" of a JSON log line, quoted, or the line.
func logMsg(line string) string {
	var l struct {
		Msg string `json:"msg"`
	}
	if json.Unmarshal([]byte(line), &l) != nil || l.Msg == "" {
		return strconv.Quote(line)
	}
	return strconv.Quote(l.Msg)
}

// awaitOwner waits until the key's window is claimed by the cluster.
func awaitOwner(t *testing.T, e *Env, key string, window time.Time, cluster string) {
	t.Helper()
	await(t, jobTimeout, cluster+" to claim window "+window.Format(time.RFC3339)+" of "+key, func() bool {
		row, ok, err := e.WindowRow(context.Background(), key, window)
		if err != nil {
			t.Fatal(err)
		}
		return ok && row.Cluster == cluster
	})
}

// createTickIn creates in one data centre the Job its CronJob controller
// makes for tick, after edit (when not nil) changed it.
func createTickIn(t *testing.T, dc *DC, cj *batchv1.CronJob, tick time.Time, edit func(*batchv1.Job)) *batchv1.Job {
	t.Helper()
	job := controllerJob(cj, tick)
	if edit != nil {
		edit(job)
	}
	created, err := dc.Client.BatchV1().Jobs(Namespace).Create(context.Background(), job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("%s: creating Job %s: %v", dc.Name, job.Name, err)
	}
	return created
}

// finishJob waits for a Job to finish, Complete or Failed, and returns it
// with its pod (backoffLimit 0: one pod).
func finishJob(t *testing.T, dc *DC, name string) (*batchv1.Job, corev1.Pod) {
	t.Helper()
	return awaitFinished(t, dc, name), podOf(t, dc, name)
}

// awaitFinished waits for a Job to finish, Complete or Failed, and returns
// it.
func awaitFinished(t *testing.T, dc *DC, name string) *batchv1.Job {
	t.Helper()
	var job *batchv1.Job
	await(t, jobTimeout, dc.Name+": Job "+name+" finished", func() bool {
		var err error
		job, err = dc.Client.BatchV1().Jobs(Namespace).Get(context.Background(), name, metav1.GetOptions{})
		done, _ := Finished(job)
		return err == nil && done
	})
	return job
}

// podOf waits for the pod of a Job and returns it.
func podOf(t *testing.T, dc *DC, job string) corev1.Pod {
	t.Helper()
	return podsOf(t, dc, job, 1)[0]
}

// podsOf waits until a Job has n pods and returns them.
func podsOf(t *testing.T, dc *DC, job string, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	await(t, jobTimeout, fmt.Sprintf("%s: the %d pod(s) of Job %s", dc.Name, n, job), func() bool {
		pods, _ = dc.Pods(context.Background(), job)
		return len(pods) == n
	})
	return pods
}
