package e2e

// The stories beyond "every window once": a short run that ends before the
// other cluster's pod even starts, a lease run that outlasts its period,
// manual runs, and an image whose container has no command. Each makes its
// Jobs the way the CronJob controller does, for windows it chooses, from a
// suspended CronJob (or runs kubectl as an operator would), instead of
// waiting for minute ticks.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/images"
)

// jobTimeout bounds the wait for one Job to finish.
const jobTimeout = 3 * time.Minute

// slowNodeGate holds a pod back from its node: a gated pod starts exactly as
// late as one on a node whose kubelet is slow, and nothing else changes.
// (An init container that sleeps would not do: the webhook injects the
// agent as the first init container, so the agent would decide before the
// sleep.)
const slowNodeGate = "e2e.dislock.io/slow-node"

func TestShortRunIsNotRepeatedByAClusterWhosePodStartsAfterItEnded(t *testing.T) {
	e := Need(t)
	const name, late = "short", 10 * time.Second
	a, b := e.DCs[0], e.DCs[1]
	cjs := suspendedEverywhere(t, e, name, "schedule", Ledger{Work: time.Second})
	tick := time.Now().UTC().Truncate(time.Minute)
	w := tick.Format(time.RFC3339)
	job := createTick(t, e, cjs, tick, func(dc *DC, j *batchv1.Job) {
		if dc == b {
			j.Spec.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: slowNodeGate}}
		}
	})
	podA := completeJob(t, a, job)
	// The slow cluster's pod starts once the run is over, at least `late`
	// after the other cluster's pod (start times are whole seconds).
	time.Sleep(time.Until(podA.Status.StartTime.Add(late + time.Second)))
	ungate(t, b, job)
	podB := completeJob(t, b, job)

	runs := runsOf(t, e, name)
	if len(runs) != 1 || runs[0].Window != w || runs[0].Cluster != a.Name {
		t.Fatalf("window %s: ledger %v, want exactly one run, by %s", w, runs, a.Name)
	}
	if msg := AgentMessage(&podA); !strings.Contains(msg, "ran window "+w) || !strings.Contains(msg, "succeeded") {
		t.Errorf("%s ran window %s, but its agent's termination message is %q", a.Name, w, msg)
	}
	msg := AgentMessage(&podB)
	if !strings.HasPrefix(msg, "skip:") || !strings.Contains(msg, "cluster "+a.Name) || !strings.Contains(msg, "state succeeded") {
		t.Errorf("%s's late pod: termination message %q, want a skip naming cluster %s and the window's state succeeded", b.Name, msg, a.Name)
	}
	gap := podB.Status.StartTime.Sub(podA.Status.StartTime.Time)
	if gap < late {
		t.Errorf("%s's pod started %v after %s's, want at least %v", b.Name, gap, a.Name, late)
	}
	t.Logf("window %s: %s ran it (1 s of work, finished %s); %s's pod started %v after %s's and skipped: %q",
		w, a.Name, fmtTime(runs[0].Finished), b.Name, gap, a.Name, msg)
}

func TestLeaseRunLongerThanItsPeriodIsNotOverlappedByTheNextWindow(t *testing.T) {
	e := Need(t)
	const name, work = "long", 25 * time.Second
	key := Namespace + "/" + name
	cjs := suspendedEverywhere(t, e, name, "schedule,lease", Ledger{Work: work})
	first := time.Now().UTC().Truncate(time.Minute).Add(-2 * time.Minute)
	w := func(i int) string { return first.Add(time.Duration(i) * time.Minute).Format(time.RFC3339) }

	long := createTick(t, e, cjs, first, nil)
	await(t, jobTimeout, "the run of window "+w(0), func() bool { return len(runsOf(t, e, name)) > 0 })
	// The next tick comes while that run still works, as when every run
	// takes longer than the period.
	next := createTick(t, e, cjs, first.Add(time.Minute), nil)
	var nextMsgs []string
	for _, dc := range e.DCs {
		pod := completeJob(t, dc, next)
		nextMsgs = append(nextMsgs, dc.Name+": "+AgentMessage(&pod))
	}
	for _, dc := range e.DCs {
		completeJob(t, dc, long)
	}
	// The tick after the long run ended runs as usual (and briefly).
	after := createTick(t, e, cjs, first.Add(2*time.Minute), func(_ *DC, j *batchv1.Job) {
		setEnv(&j.Spec.Template, "LEDGER_SLEEP", "1s")
	})
	for _, dc := range e.DCs {
		completeJob(t, dc, after)
	}

	runs := runsOf(t, e, name)
	if o := Overlaps(runs); len(o) > 0 {
		t.Errorf("runs overlap: %v", o)
	}
	if len(runs) != 2 || runs[0].Window != w(0) || runs[1].Window != w(2) {
		t.Fatalf("ledger %v, want one run of window %s and one of %s, none of %s", runs, w(0), w(2), w(1))
	}
	if got := windowsOf(t, e, name)[w(1)].State; got != store.StateSkipped {
		t.Errorf("dislock windows: window %s is %q, want %s", w(1), got, store.StateSkipped)
	}
	// The cluster that claimed the window names the lease's holder; the
	// other found the window taken. Both skipped.
	holder := fmt.Sprintf("lease %s held by %s/", key, runs[0].Cluster)
	named := 0
	for _, m := range nextMsgs {
		_, msg, _ := strings.Cut(m, ": ")
		if !strings.HasPrefix(msg, "skip:") {
			t.Errorf("window %s: %s, want a skip", w(1), m)
		}
		if strings.Contains(msg, holder) && strings.Contains(msg, "an earlier run is still going") {
			named++
		}
	}
	if named != 1 {
		t.Errorf("window %s: %d termination messages name the lease held by the run of %s (%q), want 1: %v", w(1), named, w(0), holder, nextMsgs)
	}
	t.Logf("window %s ran in %s for %v (%s to %s); window %s, created while it ran, skipped (%s); window %s ran in %s from %s",
		w(0), runs[0].Cluster, work, fmtTime(&runs[0].Started), fmtTime(runs[0].Finished), w(1), strings.Join(nextMsgs, "; "), w(2), runs[1].Cluster, fmtTime(&runs[1].Started))
}

func TestManualRunsBypassTheWindowAndTakeTurnsOnTheLease(t *testing.T) {
	e := Need(t)
	const leased, unlocked = "leased", "byhand"
	a, b := e.DCs[0], e.DCs[1]
	suspendedEverywhere(t, e, leased, "schedule,lease", Ledger{Work: 15 * time.Second})
	suspendedEverywhere(t, e, unlocked, "schedule", Ledger{Work: time.Second})

	// Mode schedule: a manual run is not a tick and takes no lock, so it
	// runs in every cluster it is started in.
	for _, dc := range e.DCs {
		createManual(t, dc, unlocked, unlocked+"-"+dc.Name)
	}
	// With the lease: dc-b's manual run while dc-a's works is refused; once
	// dc-a's ended, dc-b's next one runs.
	createManual(t, a, leased, leased+"-1")
	await(t, jobTimeout, "the manual run of "+leased+" in "+a.Name, func() bool { return len(runsOf(t, e, leased)) > 0 })
	createManual(t, b, leased, leased+"-2")
	refused := completeJob(t, b, leased+"-2")
	completeJob(t, a, leased+"-1")
	createManual(t, b, leased, leased+"-3")
	completeJob(t, b, leased+"-3")

	runs := runsOf(t, e, leased)
	if o := Overlaps(runs); len(o) > 0 {
		t.Errorf("%s: manual runs overlap: %v", leased, o)
	}
	if len(runs) != 2 || runs[0].Cluster != a.Name || runs[1].Cluster != b.Name {
		t.Fatalf("%s: ledger %v, want a run in %s, then one in %s", leased, runs, a.Name, b.Name)
	}
	for _, r := range runs {
		if r.Window != "" || r.Token == 0 {
			t.Errorf("%s: run %v, want no window and a lease token", leased, r)
		}
	}
	holder := fmt.Sprintf("lease %s/%s held by %s/", Namespace, leased, a.Name)
	if msg := AgentMessage(&refused); !strings.HasPrefix(msg, "skip:") || !strings.Contains(msg, holder) {
		t.Errorf("%s's manual run while %s's ran: termination message %q, want a skip naming %q", b.Name, a.Name, msg, holder)
	}

	byDC := map[string]Run{}
	for _, r := range runsOf(t, e, unlocked) {
		byDC[r.Cluster] = r
		if r.Window != "" || r.Token != 0 {
			t.Errorf("%s: run %v, want no window and no token (no lock)", unlocked, r)
		}
	}
	for _, dc := range e.DCs {
		pod := completeJob(t, dc, unlocked+"-"+dc.Name)
		if _, ok := byDC[dc.Name]; !ok {
			t.Errorf("%s: the manual run in %s did not run", unlocked, dc.Name)
		}
		if msg, want := AgentMessage(&pod), "ran manual run of "+Namespace+"/"+unlocked; !strings.HasPrefix(msg, want) {
			t.Errorf("%s: %s's termination message %q, want %q…", unlocked, dc.Name, msg, want)
		}
	}
	// Neither took a schedule window: the next tick is still free.
	for _, n := range []string{leased, unlocked} {
		if ws := windowsOf(t, e, n); len(ws) > 0 {
			t.Errorf("dislock windows --key %s/%s: %v, want no window taken by manual runs", Namespace, n, ws)
		}
	}
	t.Logf("%s (schedule,lease): %s ran %s–%s; %s's run meanwhile skipped (%q); %s ran %s–%s. %s (schedule): ran in %d clusters",
		leased, a.Name, fmtTime(&runs[0].Started), fmtTime(runs[0].Finished), b.Name, AgentMessage(&refused),
		b.Name, fmtTime(&runs[1].Started), fmtTime(runs[1].Finished), unlocked, len(byDC))
}

func TestImageWithoutCommandRunsTheEntrypointResolvedFromItsRegistry(t *testing.T) {
	e := Need(t)
	const name = "noentry"
	dc := e.DCs[0]
	ref, entrypoint := serveImage(t, e, dc, images.LedgerRef)
	cj := LedgerCronJob(dc.Name, name, "* * * * *", "schedule", Ledger{DSN: dc.BouncerDSN(), Work: time.Second, Suspend: true})
	app := &cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0]
	app.Image, app.Command = ref, nil
	job, tick := tickHere(t, dc, cj)
	want := append([]string{"/dislock/bin/dislock-agent", "exec", "--"}, entrypoint...)
	if got := job.Spec.Template.Spec.Containers[0].Command; !slices.Equal(got, want) {
		t.Fatalf("the admitted Job's app command is %q, want the image's entrypoint wrapped: %q", got, want)
	}
	ranOnceHere(t, e, dc, job.Name, name, tick)
	t.Logf("image %s (no command in the pod): the Job was admitted running %q; window %s ran in %s", ref, want, tick.Format(time.RFC3339), dc.Name)
}

// tickHere creates the suspended CronJob cj in dc (deleted when the test
// ends) and the Job its controller would make for the current minute, and
// returns the Job as admitted and its tick.
func tickHere(t *testing.T, dc *DC, cj *batchv1.CronJob) (*batchv1.Job, time.Time) {
	t.Helper()
	ctx := context.Background()
	cj, err := dc.Client.BatchV1().CronJobs(Namespace).Create(ctx, cj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("%s: creating CronJob %s: %v", dc.Name, cj.Name, err)
	}
	t.Cleanup(func() { deleteCronJob(dc, cj.Name) })
	tick := time.Now().UTC().Truncate(time.Minute)
	job, err := dc.Client.BatchV1().Jobs(Namespace).Create(ctx, controllerJob(cj, tick), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("%s: creating the Job of %s for %s: %v", dc.Name, cj.Name, tick.Format(time.RFC3339), err)
	}
	return job, tick
}

// ranOnceHere waits for dc's Job of cronJob's window tick to complete and
// checks that its app ran the window, once, there.
func ranOnceHere(t *testing.T, e *Env, dc *DC, job, cronJob string, tick time.Time) {
	t.Helper()
	pod := completeJob(t, dc, job)
	w := tick.Format(time.RFC3339)
	if msg := AgentMessage(&pod); !strings.Contains(msg, "ran window "+w) || !strings.Contains(msg, "succeeded") {
		t.Errorf("agent's termination message %q, want window %s run and succeeded", msg, w)
	}
	runs := runsOf(t, e, cronJob)
	if len(runs) != 1 || runs[0].Window != w || runs[0].Cluster != dc.Name {
		t.Fatalf("ledger %v, want one run of window %s in %s", runs, w, dc.Name)
	}
}

// suspendedEverywhere applies a suspended ledger CronJob to every data
// centre (the test makes its Jobs) and returns each one's stored copy, by
// data centre, for the Jobs' controller references.
func suspendedEverywhere(t *testing.T, e *Env, name, mode string, l Ledger) map[string]*batchv1.CronJob {
	t.Helper()
	return suspendedEverywhereOn(t, e, name, "* * * * *", mode, l)
}

// suspendedEverywhereOn is suspendedEverywhere with another schedule than
// every minute.
func suspendedEverywhereOn(t *testing.T, e *Env, name, schedule, mode string, l Ledger) map[string]*batchv1.CronJob {
	t.Helper()
	l.Suspend = true
	applyEverywhere(t, e, name, schedule, mode, l)
	out := map[string]*batchv1.CronJob{}
	for _, dc := range e.DCs {
		cj, err := dc.Client.BatchV1().CronJobs(Namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", dc.Name, err)
		}
		out[dc.Name] = cj
	}
	return out
}

// createTick creates in every data centre the Job its CronJob controller
// makes for tick, after edit (when not nil) changed that data centre's copy,
// and returns the Job's name, which is the same everywhere.
func createTick(t *testing.T, e *Env, cjs map[string]*batchv1.CronJob, tick time.Time, edit func(*DC, *batchv1.Job)) string {
	t.Helper()
	var job *batchv1.Job
	for _, dc := range e.DCs {
		job = createTickIn(t, dc, cjs[dc.Name], tick, func(j *batchv1.Job) {
			if edit != nil {
				edit(dc, j)
			}
		})
	}
	return job.Name
}

// createManual runs `kubectl create job --from=cronjob/<cronJob> <job>`
// against the data centre, as an operator would.
func createManual(t *testing.T, dc *DC, cronJob, job string) {
	t.Helper()
	if out, err := dc.Kubectl(context.Background(), "--namespace", Namespace, "create", "job", "--from=cronjob/"+cronJob, job); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// completeJob waits for a Job to finish, fails the test unless it is
// Complete, and returns its pod.
func completeJob(t *testing.T, dc *DC, name string) corev1.Pod {
	t.Helper()
	job, pod := finishJob(t, dc, name)
	if _, complete := Finished(job); !complete {
		t.Errorf("%s: Job %s failed; every cluster's Job must complete", dc.Name, name)
	}
	return pod
}

// ungate lets the gated pod of a Job go to its node.
func ungate(t *testing.T, dc *DC, job string) {
	t.Helper()
	pod := podOf(t, dc, job)
	if pod.Status.StartTime != nil {
		t.Fatalf("%s: gated pod %s started at %s", dc.Name, pod.Name, pod.Status.StartTime)
	}
	patch := []byte(`{"spec":{"schedulingGates":null}}`)
	if _, err := dc.Client.CoreV1().Pods(Namespace).Patch(context.Background(), pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("%s: removing the scheduling gate of %s: %v", dc.Name, pod.Name, err)
	}
}

// windowsOf is what `dislock windows --key <namespace>/<cronJob> -o json`
// shows an operator, by window start (RFC 3339, UTC).
func windowsOf(t *testing.T, e *Env, cronJob string) map[string]store.Window {
	t.Helper()
	byStart := map[string]store.Window{}
	for _, w := range windowRowsOf(t, e, cronJob) {
		byStart[w.Start.UTC().Format(time.RFC3339)] = w
	}
	return byStart
}

// windowRowsOf is every row `dislock windows --key <namespace>/<cronJob> -o
// json` shows: an Indexed Job's window has one per completion index.
func windowRowsOf(t *testing.T, e *Env, cronJob string) []store.Window {
	t.Helper()
	out, err := e.Dislock("windows", "--key", Namespace+"/"+cronJob, "-o", "json")
	if err != nil {
		t.Fatalf("dislock windows: %v\n%s", err, out)
	}
	var rows []store.Window
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("dislock windows -o json: %v\n%s", err, out)
	}
	return rows
}

// runsOf reads the ledger's runs of a CronJob (its pods are named after
// it), oldest first.
func runsOf(t *testing.T, e *Env, cronJob string) []Run {
	t.Helper()
	all, err := e.Runs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var runs []Run
	for _, r := range all {
		if strings.HasPrefix(r.Pod, cronJob+"-") {
			runs = append(runs, r)
		}
	}
	return runs
}

// await polls cond until it holds, and fails the test after timeout.
func await(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// setEnv sets a variable of every container of a pod template that has it.
func setEnv(tmpl *corev1.PodTemplateSpec, name, value string) {
	for i := range tmpl.Spec.Containers {
		for j := range tmpl.Spec.Containers[i].Env {
			if env := &tmpl.Spec.Containers[i].Env[j]; env.Name == name {
				env.Value = value
			}
		}
	}
}

func deleteCronJob(dc *DC, name string) {
	bg := metav1.DeletePropagationBackground
	_ = dc.Client.BatchV1().CronJobs(Namespace).Delete(context.Background(), name, metav1.DeleteOptions{PropagationPolicy: &bg})
}

// serveImage serves the test image src from an in-process registry on
// loopback (plain HTTP), under a reference that names the registry, for the
// data centre's webhook to resolve entrypoints from; and imports it under
// that reference into the data centre's containerd, so that the kubelet runs
// it without pulling. It returns the reference and the image's Entrypoint.
func serveImage(t *testing.T, e *Env, dc *DC, src string) (string, []string) {
	t.Helper()
	srcTag, err := name.NewTag(src)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.Image(func() (io.ReadCloser, error) { return os.Open(e.Images.Tarball) }, &srcTag)
	if err != nil {
		t.Fatalf("reading %s from %s: %v", src, e.Images.Tarball, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil || len(cfg.Config.Entrypoint) == 0 {
		t.Fatalf("image %s: config %+v (%v), want an Entrypoint", src, cfg, err)
	}

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	ref, err := name.NewTag(fmt.Sprintf("%s/%s:%s", host, srcTag.RepositoryStr(), srcTag.TagStr()))
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}

	file := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.WriteToFile(file, ref, img); err != nil {
		t.Fatal(err)
	}
	if _, err := dc.Node.Ctr("images", "import", file); err != nil {
		t.Fatalf("%s: %v", dc.Name, err)
	}
	t.Cleanup(func() { _, _ = dc.Node.Ctr("images", "rm", ref.String()) })
	return ref.String(), cfg.Config.Entrypoint
}
