package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dislock/dislock/lockagent/contract"
)

// hourly is the schedule of the CronJobs here.
const hourly = "0 * * * *"

// preferWaiting is what an agent logs while it leaves a window to the
// preferred cluster.
const preferWaiting = "is preferred for this job"

// A CronJob prefers dc-b (dislock.io/prefer-cluster). The Jobs of the last
// five minutes' windows are created in dc-a first, whose agents wait saying
// dc-b is preferred, then in dc-b: every window runs in dc-b, while dc-a's
// pods still wait out the grace (ten minutes here, so that it spans all
// five windows; when it ends they find the windows taken and skip, which
// the agent's tests show). Then dc-b's pod of a window is on a node that is
// down: dc-a's pod runs that window, claiming it from the window's start +
// the grace on, within 5 s of that.
func TestAPreferredClusterRunsItsWindowsThoughAnotherStartsFirstAndLosesOneOnlyWhenItsNodeIsDown(t *testing.T) {
	e := Need(t)
	ctx := context.Background()
	a, b := e.DCs[0], e.DCs[1]
	prefer := func(grace time.Duration) Ledger {
		return Ledger{Annotations: map[string]string{contract.AnnotationPreferCluster: b.Name, contract.AnnotationPreferGrace: grace.String()}}
	}

	const name = "preferred"
	// Hourly: a grace must be shorter than the schedule's period. The test
	// makes the Jobs, for ticks of its choosing.
	cjs := suspendedEverywhereOn(t, e, name, hourly, "schedule", prefer(10*time.Minute))
	now := time.Now().UTC().Truncate(time.Minute)
	var ticks []time.Time
	jobs := map[string][]*batchv1.Job{}
	for i := 4; i >= 0; i-- {
		tick := now.Add(-time.Duration(i) * time.Minute)
		ticks = append(ticks, tick)
		jobs[a.Name] = append(jobs[a.Name], createTickIn(t, a, cjs[a.Name], tick, nil))
	}
	for _, j := range jobs[a.Name] {
		pod := podOf(t, a, j.Name)
		await(t, jobTimeout, a.Name+"'s agent of "+j.Name+" to leave the window to "+b.Name, func() bool {
			lines, _ := ContainerLog(a.Node, pod.Name, sidecarName)
			_, ok := findLine(lines, preferWaiting)
			return ok
		})
	}
	for _, tick := range ticks {
		jobs[b.Name] = append(jobs[b.Name], createTickIn(t, b, cjs[b.Name], tick, nil))
	}
	for i, tick := range ticks {
		ranB := completeJob(t, b, jobs[b.Name][i].Name)
		if msg, w := AgentMessage(&ranB), tick.Format(time.RFC3339); !strings.Contains(msg, "ran window "+w) {
			t.Errorf("%s's agent of window %s: %q, want it to run the window", b.Name, w, msg)
		}
	}
	for _, j := range jobs[a.Name] {
		got, err := a.Client.BatchV1().Jobs(Namespace).Get(ctx, j.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if done, _ := Finished(got); done {
			t.Errorf("%s's Job %s finished within the grace", a.Name, j.Name)
		}
	}
	runs := runsOf(t, e, name)
	if len(runs) != len(ticks) {
		t.Errorf("%d runs, want one per window: %v", len(runs), runs)
	}
	for _, r := range runs {
		if r.Cluster != b.Name {
			t.Errorf("window %s ran in %s, want the preferred %s", r.Window, r.Cluster, b.Name)
		}
	}

	// The grace runs from the window's start, this minute's tick: it ends
	// 15 s from now.
	const down = "preferred-down"
	tick := time.Now().UTC().Truncate(time.Minute)
	grace := time.Since(tick).Round(time.Second) + 15*time.Second
	cjs = suspendedEverywhereOn(t, e, down, hourly, "schedule", prefer(grace))
	doomed := SpareNode(t, e, b, b.Name+"-down")
	if err := doomed.Kill(); err != nil {
		t.Fatal(err)
	}
	createTickIn(t, b, cjs[b.Name], tick, func(j *batchv1.Job) { j.Spec.Template.Spec.NodeName = doomed.Name() })
	jobA := createTickIn(t, a, cjs[a.Name], tick, nil)
	ranA := completeJob(t, a, jobA.Name)
	key := Namespace + "/" + down
	row, ok, err := e.WindowRow(ctx, key, tick)
	if err != nil || !ok {
		t.Fatalf("window %s of %s: %v (found %v)", tick.Format(time.RFC3339), key, err, ok)
	}
	from := tick.Add(grace)
	if row.Cluster != a.Name || row.ClaimedAt.Before(from) || row.ClaimedAt.After(from.Add(5*time.Second)) {
		t.Errorf("window %s claimed by %s at %s; want %s from %s (start + grace %s) to 5 s later; its agent said %q",
			tick.Format(time.RFC3339), row.Cluster, row.ClaimedAt.Format(time.RFC3339Nano), a.Name, from.Format(time.RFC3339Nano), grace, AgentMessage(&ranA))
	}
	t.Logf("with %s's node down, %s claimed window %s %v after its start (grace %v)", b.Name, a.Name, tick.Format(time.TimeOnly),
		row.ClaimedAt.Sub(tick).Round(time.Millisecond), grace)
	if runs := runsOf(t, e, down); len(runs) != 1 || runs[0].Cluster != a.Name {
		t.Errorf("runs %v, want one in %s", runs, a.Name)
	}
}
