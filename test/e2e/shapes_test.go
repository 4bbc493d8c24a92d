package e2e

// The Job shapes: a Job whose pod is replaced while the old one still
// terminates (a drained node), and an Indexed Job, whose completion indexes
// each claim a window of their own. Both come from the Job controller
// itself, on real kubelets: the replacement is the one it creates under
// podReplacementPolicy TerminatingOrFailed, the indexes are the ones it
// hands out.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/store"
)

// sameJobWaiting is in the agent's log line when another pod of its Job
// owns the window and is alive.
const sameJobWaiting = "another pod of this Job owns the window and is alive"

func TestADrainedNodesPodIsReplacedWhileItTerminatesAndTheWindowStillRunsOnceWithoutOverlap(t *testing.T) {
	// The old pod's app takes shutdown to stop after SIGTERM, so its pod is
	// Terminating that long: longer than the Job controller and the
	// scheduler take to start the replacement.
	const name, work, shutdown = "drained", 20 * time.Second, 30 * time.Second
	s := newStory(t, name, "schedule", false)
	e, ctx, key, a, b, cjs, tick, w := s.e, context.Background(), s.key, s.a, s.b, s.cjs, s.tick, s.w
	drained := SpareNode(t, e, a, a.Name+"-drained")

	// The run starts on the node about to be drained: while the Job's first
	// pod is scheduled, that node is the only one taking pods.
	Cordon(t, a, drained.Name(), false)
	Cordon(t, a, a.Node.Name(), true)
	t.Cleanup(func() { Cordon(t, a, a.Node.Name(), false) })
	// The user's choice in dc-a's CronJob (the Job controller's own
	// default): a replacement while the old pod terminates.
	cjA := choosePodReplacementPolicy(t, a, cjs[a.Name], tick, batchv1.TerminatingOrFailed)
	jobA := createTickIn(t, a, cjA, tick, func(j *batchv1.Job) {
		setEnv(&j.Spec.Template, "LEDGER_SLEEP", work.String())
		setEnv(&j.Spec.Template, "LEDGER_SHUTDOWN", shutdown.String())
		j.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To(int64(2 * shutdown / time.Second))
		// The Job controller counts the evicted pod as failed at once; one
		// retry is allowed.
		j.Spec.BackoffLimit = ptr.To(int32(1))
	})
	if got := jobA.Spec.PodReplacementPolicy; got == nil || *got != batchv1.TerminatingOrFailed {
		t.Errorf("%s: the admitted Job's podReplacementPolicy is %v, want the user's %s kept", a.Name, ptrString(got), batchv1.TerminatingOrFailed)
	}
	var old corev1.Pod
	await(t, jobTimeout, a.Name+"'s first pod to be scheduled", func() bool {
		old = podOf(t, a, jobA.Name)
		return old.Spec.NodeName != ""
	})
	if old.Spec.NodeName != drained.Name() {
		t.Fatalf("%s: pod %s was scheduled to %s, want %s", a.Name, old.Name, old.Spec.NodeName, drained.Name())
	}
	Cordon(t, a, a.Node.Name(), false)
	awaitOwner(t, e, key, tick, a.Name)
	await(t, jobTimeout, a.Name+"'s app to start", func() bool { return len(runsOf(t, e, name)) > 0 })

	// dc-b's Job for the same tick leaves podReplacementPolicy unset, as
	// most do: the webhook sets Failed.
	jobB := createTickIn(t, b, cjs[b.Name], tick, nil)
	if got := jobB.Spec.PodReplacementPolicy; got == nil || *got != batchv1.Failed {
		t.Errorf("%s: the admitted Job's podReplacementPolicy is %v, want %s set by the webhook", b.Name, ptrString(got), batchv1.Failed)
	}

	// kubectl drain: cordon, then evict through the Eviction API, which
	// deletes the pod with its own termination grace.
	drainedAt, err := e.DBNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	Cordon(t, a, drained.Name(), true)
	evict(t, a, old.Name)

	finishedA := awaitFinished(t, a, jobA.Name)
	finishedB, podB := finishJob(t, b, jobB.Name)
	if _, complete := Finished(finishedA); !complete || finishedA.Status.Succeeded != 1 || finishedA.Status.Failed != 1 {
		t.Errorf("%s: Job %s: complete %v, %d pod(s) succeeded, %d failed; want Complete with the evicted pod failed and its replacement succeeded",
			a.Name, jobA.Name, complete, finishedA.Status.Succeeded, finishedA.Status.Failed)
	}
	if _, complete := Finished(finishedB); !complete {
		t.Errorf("%s: Job %s failed, want Complete", b.Name, jobB.Name)
	}

	// The apps' own ledger: the evicted run, stopped by the drain, then the
	// replacement's, which started only after it ended.
	runs := runsOf(t, e, name)
	if len(runs) != 2 || runs[0].Pod != old.Name || runs[1].Cluster != a.Name || runs[1].Pod == old.Name {
		t.Fatalf("ledger %v, want the run of %s's evicted pod %s, then its replacement's", runs, a.Name, old.Name)
	}
	evicted, replaced := runs[0], runs[1]
	if o := Overlaps(runs); len(o) > 0 {
		t.Errorf("the replacement ran while the evicted pod's app still ran: %v", o)
	}
	if evicted.Window != w || replaced.Window != w {
		t.Errorf("runs of windows %q and %q, want both of %s", evicted.Window, replaced.Window, w)
	}
	if evicted.ExitCode == nil || *evicted.ExitCode != 143 || replaced.ExitCode == nil || *replaced.ExitCode != 0 {
		t.Errorf("the evicted run exited %s and the replacement's %s, want 143 (stopped by SIGTERM), then 0", fmtInt(evicted.ExitCode), fmtInt(replaced.ExitCode))
	}
	if replaced.Token <= evicted.Token {
		t.Errorf("the replacement's fencing token %d is not above the evicted run's %d", replaced.Token, evicted.Token)
	}
	if !evicted.Started.Before(drainedAt) {
		t.Errorf("the evicted run started at %s, not before the drain at %s", fmtTime(&evicted.Started), fmtTime(&drainedAt))
	}

	// The database: the window ends succeeded, taken over by the
	// replacement after the evicted run recorded its end.
	row, ok, err := e.WindowRow(ctx, key, tick)
	if err != nil || !ok {
		t.Fatalf("window %s of %s: %v (found %v)", w, key, err, ok)
	}
	if row.State != string(store.StateSucceeded) || row.Cluster != a.Name || !strings.HasSuffix(row.Owner, "/"+replaced.Pod) || row.Token != replaced.Token {
		t.Errorf("window %s: %s, owned by %s with token %d; want succeeded, owned by the replacement %s with its token %d",
			w, row.State, row.Owner, row.Token, replaced.Pod, replaced.Token)
	}
	if evicted.Finished != nil && row.ClaimedAt.Before(*evicted.Finished) {
		t.Errorf("the replacement took the window over at %s, before the evicted run ended at %s", fmtTime(&row.ClaimedAt), fmtTime(evicted.Finished))
	}

	// The replacement really came while the old pod terminated: it was put
	// on the node that stayed, and its agent waited for the evicted pod.
	var replacement *corev1.Pod
	for _, p := range podsNow(t, a, jobA.Name) {
		if p.Name == replaced.Pod {
			replacement = &p
		}
	}
	if replacement == nil {
		t.Fatalf("%s: the replacement pod %s is gone", a.Name, replaced.Pod)
	}
	if replacement.Spec.NodeName != a.Node.Name() {
		t.Errorf("%s: the replacement ran on %s, want %s (the drained node is cordoned)", a.Name, replacement.Spec.NodeName, a.Node.Name())
	}
	wantSucceeded(t, a, replacement, w)
	agentLog, _ := ContainerLog(a.Node, replacement.Name, "dislock-agent")
	waited, ok := findLine(agentLog, sameJobWaiting)
	if !ok {
		t.Errorf("%s: the replacement's agent never waited for the evicted pod (%q): it came after the old pod ended, and this run did not show a replacement while the old pod terminates", a.Name, sameJobWaiting)
	} else if offset, _, err := e.ClockOffset(ctx); err == nil && evicted.Finished != nil && !waited.At.Add(offset).Before(*evicted.Finished) {
		t.Errorf("%s: the replacement's agent began to wait at %s, not before the evicted run ended at %s", a.Name, fmtTime(&waited.At), fmtTime(evicted.Finished))
	}

	// The other data centre skipped; only one run succeeded anywhere.
	if msg := AgentMessage(&podB); !strings.HasPrefix(msg, "skip:") || !strings.Contains(msg, "cluster "+a.Name) {
		t.Errorf("%s's termination message %q, want a skip naming cluster %s", b.Name, msg, a.Name)
	}
	succeeded := 0
	for _, r := range runs {
		if r.ExitCode != nil && *r.ExitCode == 0 {
			succeeded++
		}
	}
	if succeeded != 1 {
		t.Errorf("window %s: %d successful runs, want exactly 1: %v", w, succeeded, runs)
	}
	t.Logf("window %s: %s's pod %s ran on %s from %s; drained at %s; its app shut down until %s (exit %s, token %d); "+
		"the replacement %s on %s waited from %s and took over at %s (token %d), ran %s–%s, exit %s; %s skipped: %q",
		w, a.Name, old.Name, drained.Name(), fmtTime(&evicted.Started), fmtTime(&drainedAt), fmtTime(evicted.Finished), fmtInt(evicted.ExitCode), evicted.Token,
		replacement.Name, replacement.Spec.NodeName, fmtTime(&waited.At), fmtTime(&row.ClaimedAt), replaced.Token,
		fmtTime(&replaced.Started), fmtTime(replaced.Finished), fmtInt(replaced.ExitCode), b.Name, AgentMessage(&podB))
}

func TestAnIndexedJobWithThreeCompletionsInTwoClustersRunsEachIndexOnce(t *testing.T) {
	e := Need(t)
	const name, completions, parallelism = "shards", 3, 2
	// In each cluster two indexes start at once and race the other
	// cluster's for their windows; the third starts once one of them ended
	// and must not find the window done: it is a window of its own.
	cjs := suspendedEverywhere(t, e, name, "schedule", Ledger{Work: 3 * time.Second, Indexed: completions, Parallelism: parallelism})
	tick := time.Now().UTC().Truncate(time.Minute)
	w := tick.Format(time.RFC3339)
	job := createTick(t, e, cjs, tick, nil)

	// What each cluster's pod of each index decided.
	decided := map[int][]string{}
	for _, dc := range e.DCs {
		j := awaitFinished(t, dc, job)
		if _, complete := Finished(j); !complete || j.Status.Succeeded != completions {
			t.Errorf("%s: Job %s: complete %v with %d of %d completions; every cluster's Job must complete", dc.Name, job, complete, j.Status.Succeeded, completions)
		}
		for _, p := range podsOf(t, dc, job, completions) {
			i, err := strconv.Atoi(p.Annotations[batchv1.JobCompletionIndexAnnotation])
			if err != nil {
				t.Fatalf("%s: pod %s: completion index %q: %v", dc.Name, p.Name, p.Annotations[batchv1.JobCompletionIndexAnnotation], err)
			}
			decided[i] = append(decided[i], dc.Name+": "+AgentMessage(&p))
		}
	}

	// The apps' own ledger: each index once.
	ran := map[int]Run{}
	for _, r := range runsOf(t, e, name) {
		if r.Index == nil {
			t.Errorf("run %v recorded no completion index", r)
			continue
		}
		if r.Window != w || r.ExitCode == nil || *r.ExitCode != 0 {
			t.Errorf("run %v, want window %s, exit 0", r, w)
		}
		if first, twice := ran[*r.Index]; twice {
			t.Errorf("index %d ran twice: %v and %v", *r.Index, first, r)
		}
		ran[*r.Index] = r
	}
	// The database: a window per index, succeeded, owned by the run's pod.
	rows := map[int]store.Window{}
	for _, row := range windowRowsOf(t, e, name) {
		if row.Start.UTC().Format(time.RFC3339) == w {
			rows[row.Index] = row
		}
	}
	var story []string
	for i := range completions {
		r, ok := ran[i]
		if !ok {
			t.Errorf("index %d never ran; its pods decided: %v", i, decided[i])
			continue
		}
		if row := rows[i]; row.State != store.StateSucceeded || row.Pod != r.Pod || row.Token != r.Token {
			t.Errorf("window %s index %d: %s, owned by %s with token %d; want succeeded, owned by %s with token %d",
				w, i, row.State, row.Pod, row.Token, r.Pod, r.Token)
		}
		// The cluster that ran the index says so; the other skipped it,
		// naming that cluster.
		ranMsg := fmt.Sprintf("%s: ran window %s of %s/%s with token %d", r.Cluster, w, Namespace, name, r.Token)
		for _, d := range decided[i] {
			skip := !strings.HasPrefix(d, r.Cluster+": ") &&
				strings.Contains(d, "skip: window "+w+" index "+strconv.Itoa(i)) && strings.Contains(d, "cluster "+r.Cluster)
			if !strings.HasPrefix(d, ranMsg) && !skip {
				t.Errorf("index %d ran in %s with token %d; a pod's termination message %q is neither that run nor a skip of the index naming %s", i, r.Cluster, r.Token, d, r.Cluster)
			}
		}
		if len(decided[i]) != len(e.DCs) {
			t.Errorf("index %d: %d pods decided, want one per cluster: %v", i, len(decided[i]), decided[i])
		}
		story = append(story, fmt.Sprintf("index %d ran in %s (token %d)", i, r.Cluster, r.Token))
	}
	if len(rows) != completions {
		t.Errorf("dislock windows: %d rows for window %s, want one per completion index (%d): %v", len(rows), w, completions, rows)
	}
	t.Logf("window %s of an Indexed Job (completions %d, parallelism %d) in %d clusters: %s; every index's other pod skipped, and both Jobs completed",
		w, completions, parallelism, len(e.DCs), strings.Join(story, ", "))
}

// evict evicts a pod through the Eviction API, as kubectl drain does: the
// pod is deleted with its own termination grace.
func evict(t *testing.T, dc *DC, pod string) {
	t.Helper()
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: Namespace}}
	if err := dc.Client.PolicyV1().Evictions(Namespace).Evict(context.Background(), ev); err != nil {
		t.Fatalf("%s: evicting pod %s: %v", dc.Name, pod, err)
	}
}

// podsNow lists a Job's pods as they are.
func podsNow(t *testing.T, dc *DC, job string) []corev1.Pod {
	t.Helper()
	pods, err := dc.Pods(context.Background(), job)
	if err != nil {
		t.Fatalf("%s: listing the pods of Job %s: %v", dc.Name, job, err)
	}
	return pods
}

func ptrString[T ~string](p *T) string {
	if p == nil {
		return "unset"
	}
	return string(*p)
}

// choosePodReplacementPolicy sets policy in the CronJob's job template, where
// a user chooses it (the API server defaults every Job's own field before
// the webhook sees it), and returns once the webhook admits the CronJob's
// Jobs with it: a server-side dry run goes through the webhook and stores
// nothing.
func choosePodReplacementPolicy(t *testing.T, dc *DC, cj *batchv1.CronJob, tick time.Time, policy batchv1.PodReplacementPolicy) *batchv1.CronJob {
	t.Helper()
	ctx := context.Background()
	cj = cj.DeepCopy()
	cj.Spec.JobTemplate.Spec.PodReplacementPolicy = ptr.To(policy)
	updated, err := dc.Client.BatchV1().CronJobs(Namespace).Update(ctx, cj, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("%s: choosing podReplacementPolicy %s: %v", dc.Name, policy, err)
	}
	await(t, jobTimeout, dc.Name+"'s webhook to see podReplacementPolicy "+string(policy), func() bool {
		got, err := dc.Client.BatchV1().Jobs(Namespace).Create(ctx, controllerJob(updated, tick), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && got.Spec.PodReplacementPolicy != nil && *got.Spec.PodReplacementPolicy == policy
	})
	return updated
}
