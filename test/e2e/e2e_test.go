package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// suiteBegun is when the test binary started, for the suite's wall time.
var suiteBegun = time.Now()

func TestMain(m *testing.M) {
	code := Main(m, Options{})
	fmt.Fprintf(os.Stderr, "e2e: suite wall time %v\n", time.Since(suiteBegun).Round(time.Second))
	os.Exit(code)
}

// scheduledAnnotation is where the CronJob controller writes the tick a
// Job is for.
const scheduledAnnotation = "batch.kubernetes.io/cronjob-scheduled-timestamp"

// applyEverywhere creates the CronJob in every data centre (each with its
// own PgBouncer for the ledger) and deletes it when the test ends.
func applyEverywhere(t *testing.T, e *Env, name, schedule, mode string, l Ledger) {
	t.Helper()
	ctx := context.Background()
	for _, dc := range e.DCs {
		l := l
		l.DSN = dc.BouncerDSN()
		if _, err := dc.Client.BatchV1().CronJobs(Namespace).Create(ctx, LedgerCronJob(dc.Name, name, schedule, mode, l), metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: creating CronJob %s: %v", dc.Name, name, err)
		}
	}
	t.Cleanup(func() {
		bg := metav1.DeletePropagationBackground
		for _, dc := range e.DCs {
			_ = dc.Client.BatchV1().CronJobs(Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg})
		}
	})
}

// clearOfMinuteBoundary returns once the next minute boundary is at least
// margin away, so that CronJobs created now in every data centre all see
// the same next tick.
func clearOfMinuteBoundary(margin time.Duration) {
	next := time.Now().Truncate(time.Minute).Add(time.Minute)
	if time.Until(next) < margin {
		time.Sleep(time.Until(next) + time.Second)
	}
}

// windowJobs maps each DC to its Jobs of the CronJob by scheduled window
// (UTC, RFC 3339).
func windowJobs(t *testing.T, e *Env, cronJob string) map[string]map[string]batchv1.Job {
	t.Helper()
	out := map[string]map[string]batchv1.Job{}
	for _, dc := range e.DCs {
		jobs, err := dc.Jobs(context.Background(), cronJob)
		if err != nil {
			t.Fatalf("%s: listing Jobs: %v", dc.Name, err)
		}
		out[dc.Name] = map[string]batchv1.Job{}
		for _, j := range jobs {
			ts, err := time.Parse(time.RFC3339, j.Annotations[scheduledAnnotation])
			if err != nil {
				t.Fatalf("%s: Job %s: annotation %s: %v", dc.Name, j.Name, scheduledAnnotation, err)
			}
			out[dc.Name][ts.UTC().Format(time.RFC3339)] = j
		}
	}
	return out
}

func TestTwoClustersOneCronJobEveryMinuteThreeWindowsThreeRuns(t *testing.T) {
	e := Need(t)
	ctx := context.Background()
	const name = "report"
	clearOfMinuteBoundary(10 * time.Second)
	created := time.Now()
	applyEverywhere(t, e, name, "* * * * *", "schedule", Ledger{Work: 2 * time.Second})
	first := created.Truncate(time.Minute).Add(time.Minute)
	var windows []string
	for i := range 3 {
		windows = append(windows, first.Add(time.Duration(i)*time.Minute).UTC().Format(time.RFC3339))
	}
	t.Logf("CronJob %s/%s (* * * * *, mode schedule) applied to %d clusters; watching windows %v", Namespace, name, len(e.DCs), windows)

	// Every cluster's CronJob controller creates a Job for every window, and
	// every one of those Jobs must finish: the winner's after its run, the
	// others' after their agents decided to skip.
	var jobs map[string]map[string]batchv1.Job
	deadline := first.Add(time.Duration(len(windows))*time.Minute + 90*time.Second)
	for {
		jobs = windowJobs(t, e, name)
		pending := []string{}
		for _, dc := range e.DCs {
			for _, w := range windows {
				j, ok := jobs[dc.Name][w]
				if done, _ := Finished(&j); !ok || !done {
					pending = append(pending, dc.Name+" "+w)
				}
			}
		}
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Jobs not finished by %s: %v", deadline.Format(time.TimeOnly), pending)
		}
		time.Sleep(time.Second)
	}

	byWindow := runsByWindow(t, e, name)
	for w, rs := range byWindow {
		if len(rs) > 1 {
			t.Errorf("window %s ran %d times: %+v", w, len(rs), rs)
		}
	}
	var latencies []time.Duration
	for _, w := range windows {
		rs := byWindow[w]
		if len(rs) != 1 {
			t.Errorf("window %s ran %d times across %d clusters, want exactly once", w, len(rs), len(e.DCs))
			continue
		}
		winner := rs[0].Cluster
		for _, dc := range e.DCs {
			j := jobs[dc.Name][w]
			if _, complete := Finished(&j); !complete {
				t.Errorf("%s: Job %s of window %s failed; every cluster's Job must complete", dc.Name, j.Name, w)
			}
			pods, err := dc.Pods(ctx, j.Name)
			if err != nil || len(pods) != 1 {
				t.Errorf("%s: pods of Job %s: %d (%v), want 1", dc.Name, j.Name, len(pods), err)
				continue
			}
			msg := AgentMessage(&pods[0])
			if dc.Name == winner {
				// The agent's last word is the recorded outcome.
				if !strings.Contains(msg, "ran window "+w) || !strings.Contains(msg, "succeeded") {
					t.Errorf("%s ran window %s but its agent's termination message is %q", dc.Name, w, msg)
				}
				if claimed := rs[0].ClaimedAt; claimed != nil {
					latencies = append(latencies, claimed.Sub(j.CreationTimestamp.Time))
				}
				continue
			}
			if !strings.HasPrefix(msg, "skip:") || !strings.Contains(msg, "cluster "+winner) {
				t.Errorf("%s skipped window %s; its agent's termination message %q should say it skipped and that cluster %s ran it", dc.Name, w, msg, winner)
			}
		}
		t.Logf("window %s: ran once, in %s (token %d); the other cluster's Job completed without running", w, winner, rs[0].Token)
	}
	if len(latencies) > 0 {
		sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
		t.Logf("Job created → window claimed (API server's creation second to the database's claim time): min %v, max %v",
			latencies[0].Round(time.Millisecond), latencies[len(latencies)-1].Round(time.Millisecond))
	}
	parts, total := e.RSS()
	var names []string
	for n := range parts {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, " %s %d MiB;", n, parts[n]>>10)
	}
	t.Logf("RSS of the whole %d-DC setup: %d MiB (%s)", len(e.DCs), total>>10, strings.TrimSuffix(b.String(), ";"))
	if out, err := e.Dislock("windows", "--key", Namespace+"/"+name, "--limit", "5"); err == nil {
		t.Logf("dislock windows --key %s/%s:\n%s", Namespace, name, out)
	}
}

// runsByWindow reads the ledger rows of a CronJob's runs (its pods are named
// after it) by window, and fails the test for any window that ran twice.
func runsByWindow(t *testing.T, e *Env, cronJob string) map[string][]Run {
	t.Helper()
	runs, err := e.Runs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	byWindow := map[string][]Run{}
	for _, r := range runs {
		if strings.HasPrefix(r.Pod, cronJob+"-") {
			byWindow[r.Window] = append(byWindow[r.Window], r)
		}
	}
	for w, rs := range byWindow {
		if len(rs) > 1 {
			var who []string
			for _, r := range rs {
				who = append(who, fmt.Sprintf("%s/%s token %d", r.Cluster, r.Pod, r.Token))
			}
			t.Errorf("window %s ran %d times: %v", w, len(rs), who)
		}
	}
	return byWindow
}

// controllerJob is the Job the CronJob controller creates for a tick: named
// <cronjob>-<minutes since the epoch>, the tick in the scheduled-timestamp
// annotation, controlled by the CronJob, the template's spec.
func controllerJob(cj *batchv1.CronJob, tick time.Time) *batchv1.Job {
	annotations := map[string]string{scheduledAnnotation: tick.Format(time.RFC3339)}
	for k, v := range cj.Spec.JobTemplate.Annotations {
		annotations[k] = v
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name:            fmt.Sprintf("%s-%d", cj.Name, tick.Unix()/60),
			Namespace:       cj.Namespace,
			Labels:          cj.Spec.JobTemplate.Labels,
			Annotations:     annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))},
		},
		Spec: *cj.Spec.JobTemplate.Spec.DeepCopy(),
	}
}

func TestThirtyWindowsCreatedAtOnceInBothClustersRunThirtyTimes(t *testing.T) {
	e := Need(t)
	ctx := context.Background()
	const name, windows = "backlog", 30
	// Suspended: only the Jobs made below run, all at once, as after a
	// controller outage or a burst of ticks.
	applyEverywhere(t, e, name, "* * * * *", "schedule", Ledger{Work: 500 * time.Millisecond, Suspend: true})
	base := time.Now().UTC().Truncate(time.Minute).Add(-2 * windows * time.Minute)
	begun := time.Now()
	errs := make(chan error, len(e.DCs))
	for _, dc := range e.DCs {
		go func() {
			cj, err := dc.Client.BatchV1().CronJobs(Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				errs <- err
				return
			}
			for i := range windows {
				job := controllerJob(cj, base.Add(time.Duration(i)*time.Minute))
				if _, err := dc.Client.BatchV1().Jobs(Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("%s: creating Job %s: %w", dc.Name, job.Name, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range e.DCs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d Jobs created in each of %d clusters in %v", windows, len(e.DCs), time.Since(begun).Round(time.Millisecond))

	deadline := time.Now().Add(10 * time.Minute)
	for {
		unfinished, failed := 0, 0
		for _, dc := range e.DCs {
			jobs, err := dc.Jobs(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			unfinished += windows - len(jobs)
			for _, j := range jobs {
				done, complete := Finished(&j)
				switch {
				case !done:
					unfinished++
				case !complete:
					failed++
				}
			}
		}
		if unfinished == 0 {
			if failed > 0 {
				t.Errorf("%d Jobs failed; every cluster's Job must complete", failed)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Jobs not finished after %v", unfinished, 10*time.Minute)
		}
		time.Sleep(time.Second)
	}
	t.Logf("all %d Jobs finished %v after the first was created", windows*len(e.DCs), time.Since(begun).Round(time.Second))

	byWindow := runsByWindow(t, e, name)
	perDC := map[string]int{}
	for i := range windows {
		w := base.Add(time.Duration(i) * time.Minute).Format(time.RFC3339)
		if len(byWindow[w]) != 1 {
			t.Errorf("window %s ran %d times, want once", w, len(byWindow[w]))
			continue
		}
		perDC[byWindow[w][0].Cluster]++
	}
	t.Logf("%d windows, %d runs; runs per cluster: %v", windows, len(byWindow), perDC)
}
