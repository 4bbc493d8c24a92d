package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/test/previous"
)

// admissionProbeEvery is how often the test asks the API server to admit a
// Job (a dry run, which calls the webhook) while a release rolls.
const admissionProbeEvery = 100 * time.Millisecond

// dc-a runs the previous release, installed with its own chart and images
// (test/previous). `helm upgrade` to the working tree's chart, then `helm
// rollback` to the previous release, are each a rolling update of its
// webhook Deployment (maxSurge 1, maxUnavailable 0: the new replica starts
// beside the old one, which goes once the new one is ready; a second node
// gives it room), around a tick of `* * * * *` CronJobs in both data
// centres. No Job creation is refused meanwhile — neither a dry run of a
// tick's Job every 100 ms through both rolls, which the webhook admits, nor
// the CronJob controller's (no FailedCreate event) — and the tick's window
// runs once. After the rollback, dc-a injects the previous release's agent
// into the Job of another window, which runs once too, with a larger
// fencing token.
func TestHelmUpgradeFromThePreviousReleaseAndRollbackRefuseNoJobWhileCronJobsTick(t *testing.T) {
	e := Need(t)
	dc := e.DCs[0]
	ctx := context.Background()
	spare := spareNode(t, e, dc)
	begun := time.Now()
	installPrevious(t, e, dc, dc.Node, spare)
	t.Logf("the previous release (%s) installed in %s in %v", previous.Commit[:7], dc.Name, time.Since(begun).Round(time.Millisecond))
	// The previous release's pods bind their ports on every interface of
	// the host these nodes share: one still leaving would answer the
	// probes of the next on its ports, so each roll waits for the pods it
	// replaced to be gone, as a user's next step comes later anyway.
	webhookPodsSettled := func() {
		t.Helper()
		await(t, installTimeout, "the webhook's replaced pods to be gone", func() bool {
			pods, err := dc.Client.CoreV1().Pods(WebhookNamespace).List(ctx, metav1.ListOptions{LabelSelector: webhookSelector})
			if err != nil {
				t.Fatal(err)
			}
			return len(pods.Items) == 1 && pods.Items[0].DeletionTimestamp == nil
		})
	}
	values, err := releaseValues(dc, dc.BouncerDSN())
	if err != nil {
		t.Fatal(err)
	}

	const name = "rolling"
	clearOfMinuteBoundary(25 * time.Second)
	applyEverywhere(t, e, name, "* * * * *", "schedule", Ledger{Work: time.Second})
	tick := time.Now().UTC().Truncate(time.Minute).Add(time.Minute)
	// The rolls begin shortly before the tick, so that the CronJob
	// controllers create their Jobs while dc-a's webhook rolls.
	time.Sleep(time.Until(tick.Add(-8 * time.Second)))

	cj, err := dc.Client.BatchV1().CronJobs(Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	probes := probeAdmission(t, dc, cj)
	begun = time.Now()
	if out, err := dc.helmShown(ctx, t.Logf, e.root, dc.BouncerDSN(), append([]string{"upgrade", ReleaseName, filepath.Join(e.root, "charts", "dislock"),
		"--namespace", WebhookNamespace, "--wait", "--timeout", installTimeout.String()}, values...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	upgraded := time.Since(begun)
	webhookPodsSettled()
	if out, err := dc.helmShown(ctx, t.Logf, e.root, "", "rollback", ReleaseName, "--namespace", WebhookNamespace,
		"--wait", "--timeout", installTimeout.String()); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rolled := time.Now()
	n, refused := probes()
	t.Logf("helm upgrade rolled in %v, helm rollback in %v (the tick at %s); %d dry-run Jobs admitted meanwhile",
		upgraded.Round(time.Millisecond), (rolled.Sub(begun) - upgraded).Round(time.Millisecond), tick.Format(time.TimeOnly), n)
	webhookPodsSettled()
	if len(refused) > 0 {
		t.Errorf("%d of %d Job creations were refused while the release rolled, e.g. %s", len(refused), n, refused[0])
	}
	if n == 0 {
		t.Error("no dry-run Job was created while the release rolled")
	}

	// The window after the rollback: the Jobs of the minute before the
	// tick, made as the CronJob controllers make them, at once rather than
	// a minute later.
	earlier := tick.Add(-time.Minute)
	for _, d := range e.DCs {
		cj, err := d.Client.BatchV1().CronJobs(Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		createTickIn(t, d, cj, earlier, nil)
	}
	windows := []string{tick.Format(time.RFC3339), earlier.Format(time.RFC3339)}
	var jobs map[string]map[string]batchv1.Job
	await(t, 3*time.Minute, "every data centre's Jobs of windows "+strings.Join(windows, ", ")+" to finish", func() bool {
		jobs = windowJobs(t, e, Namespace, name)
		for _, byWindow := range jobs {
			for _, w := range windows {
				j, ok := byWindow[w]
				if done, _ := Finished(&j); !ok || !done {
					return false
				}
			}
		}
		return true
	})
	// Every agent decided, run or skip, whichever release injected it: a
	// skip completes its Job too.
	for cluster, byWindow := range jobs {
		for _, w := range windows {
			if j := byWindow[w]; !complete(&j) {
				t.Errorf("%s's Job %s of window %s (agent %s) failed", cluster, j.Name, w, sidecarImage(&j))
			}
		}
	}
	// Job creation times are whole seconds.
	if created := jobs[dc.Name][windows[0]].CreationTimestamp.Time; created.Before(begun.Truncate(time.Second)) || created.After(rolled) {
		t.Errorf("%s's Job of the tick was created at %s, outside the rolls (%s to %s): the test proved nothing about them",
			dc.Name, created.Format(time.TimeOnly), begun.Format(time.TimeOnly), rolled.Format(time.TimeOnly))
	}
	rolledBack := jobs[dc.Name][windows[1]]
	if got := sidecarImage(&rolledBack); got != previous.AgentRef {
		t.Errorf("%s's Job %s after the rollback runs agent image %q, want the previous release's %s", dc.Name, rolledBack.Name, got, previous.AgentRef)
	}
	byWindow := runsByWindow(t, e, Namespace, name)
	for _, w := range windows {
		if len(byWindow[w]) != 1 {
			t.Errorf("window %s ran %d times, want once: %v", w, len(byWindow[w]), byWindow[w])
			continue
		}
		r := byWindow[w][0]
		t.Logf("window %s ran in %s (token %d), its Job there injected with agent %s", w, r.Cluster, r.Token, sidecarImage(ptr.To(jobs[r.Cluster][w])))
	}
	if a, b := byWindow[windows[0]], byWindow[windows[1]]; len(a) == 1 && len(b) == 1 && b[0].Token <= a[0].Token {
		t.Errorf("window %s's token %d is not above window %s's %d", windows[1], b[0].Token, windows[0], a[0].Token)
	}
	for _, dc := range e.DCs {
		events, err := dc.Client.CoreV1().Events(Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=CronJob,involvedObject.name=" + name + ",reason=FailedCreate"})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events.Items {
			t.Errorf("%s: the CronJob controller could not create a Job: %s", dc.Name, ev.Message)
		}
	}
}

func complete(j *batchv1.Job) bool {
	_, ok := Finished(j)
	return ok
}

// sidecarImage is the image of the agent the webhook injected into j.
func sidecarImage(j *batchv1.Job) string {
	for _, c := range j.Spec.Template.Spec.InitContainers {
		if c.Name == sidecarName {
			return c.Image
		}
	}
	return ""
}

// probeAdmission creates in dc, every admissionProbeEvery, a dry run of the
// Job cj's controller would make for the current minute: the API server
// calls the webhook for it as for a tick's Job (a hand-made Job it never
// calls). It goes on until the returned function is called, which says how
// many were created and why those refused were.
func probeAdmission(t *testing.T, dc *DC, cj *batchv1.CronJob) func() (int, []string) {
	t.Helper()
	job := controllerJob(cj, time.Now().UTC().Truncate(time.Minute))
	job.Name = "admission-probe"
	stop, done := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var n int
	var refused []string
	go func() {
		defer close(done)
		tick := time.NewTicker(admissionProbeEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			got, err := dc.Client.BatchV1().Jobs(Namespace).Create(context.Background(), job, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err == nil && !slices.ContainsFunc(got.Spec.Template.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == sidecarName }) {
				err = errors.New("admitted without the sidecar: the webhook was not called")
			}
			mu.Lock()
			n++
			if err != nil {
				refused = append(refused, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), strings.TrimSpace(err.Error())))
			}
			mu.Unlock()
		}
	}()
	var once sync.Once
	finish := func() (int, []string) {
		once.Do(func() { close(stop); <-done })
		mu.Lock()
		defer mu.Unlock()
		return n, refused
	}
	t.Cleanup(func() { finish() })
	return finish
}
