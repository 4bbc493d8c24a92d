package e2e

import (
	"context"
	"fmt"
	"net/url"
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

// applyEverywhere creates the CronJob in Namespace in every data centre
// (each with its own PgBouncer for the ledger) and deletes it when the test
// ends.
func applyEverywhere(t *testing.T, e *Env, name, schedule, mode string, l Ledger) {
	t.Helper()
	applyEverywhereIn(t, e, Namespace, name, schedule, mode, l)
}

// applyEverywhereIn is applyEverywhere for a namespace of Teams.
func applyEverywhereIn(t *testing.T, e *Env, namespace, name, schedule, mode string, l Ledger) {
	t.Helper()
	ctx := context.Background()
	for _, dc := range e.DCs {
		l := l
		l.DSN = dc.BouncerDSN()
		cj := LedgerCronJob(dc.Name, name, schedule, mode, l)
		cj.Namespace = namespace
		if _, err := dc.Client.BatchV1().CronJobs(namespace).Create(ctx, cj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: creating CronJob %s/%s: %v", dc.Name, namespace, name, err)
		}
	}
	t.Cleanup(func() {
		bg := metav1.DeletePropagationBackground
		for _, dc := range e.DCs {
			_ = dc.Client.BatchV1().CronJobs(namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg})
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

// windowJobs maps each DC to its Jobs of the namespace's CronJob by
// scheduled window (UTC, RFC 3339).
func windowJobs(t *testing.T, e *Env, namespace, cronJob string) map[string]map[string]batchv1.Job {
	t.Helper()
	out := map[string]map[string]batchv1.Job{}
	for _, dc := range e.DCs {
		jobs, err := dc.JobsIn(context.Background(), namespace, cronJob)
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

// Two teams have a CronJob of the same name in every cluster: each
// namespace's is a key of its own, run once a window, by agents that lock
// with their namespace's own database role.
func TestTwoClustersTwoTeamsOneCronJobNameEveryMinuteThreeWindowsOnceEach(t *testing.T) {
	e := Need(t)
	const name = "report"
	clearOfMinuteBoundary(10 * time.Second)
	created := time.Now()
	for _, team := range Teams {
		applyEverywhereIn(t, e, team, name, "* * * * *", "schedule", Ledger{Work: 2 * time.Second})
	}
	first := created.Truncate(time.Minute).Add(time.Minute)
	var windows []string
	for i := range 3 {
		windows = append(windows, first.Add(time.Duration(i)*time.Minute).UTC().Format(time.RFC3339))
	}
	t.Logf("CronJob %s (* * * * *, mode schedule) applied to namespaces %v of %d clusters; watching windows %v", name, Teams, len(e.DCs), windows)

	// Every cluster's CronJob controller creates a Job for every window, and
	// every one of those Jobs must finish: the winner's after its run, the
	// others' after their agents decided to skip.
	jobs := map[string]map[string]map[string]batchv1.Job{} // team → DC → window
	deadline := first.Add(time.Duration(len(windows))*time.Minute + 90*time.Second)
	for {
		pending := []string{}
		for _, team := range Teams {
			jobs[team] = windowJobs(t, e, team, name)
			for _, dc := range e.DCs {
				for _, w := range windows {
					j, ok := jobs[team][dc.Name][w]
					if done, _ := Finished(&j); !ok || !done {
						pending = append(pending, dc.Name+" "+team+" "+w)
					}
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

	var latencies []time.Duration
	for _, team := range Teams {
		latencies = append(latencies, onceEachWindow(t, e, team, name, windows, jobs[team])...)
	}
	if len(latencies) > 0 {
		sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
		t.Logf("Job created → window claimed (API server's creation second to the database's claim time): min %v, max %v",
			latencies[0].Round(time.Millisecond), latencies[len(latencies)-1].Round(time.Millisecond))
	}
	if !e.opts.HA {
		ownRoles(t, e)
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

// onceEachWindow checks that each window of the namespace's CronJob ran
// exactly once across the clusters, that every cluster's Job completed, and
// that each agent's last word says what it did; it returns the winners'
// latencies from Job creation to the window's claim.
func onceEachWindow(t *testing.T, e *Env, namespace, name string, windows []string, jobs map[string]map[string]batchv1.Job) []time.Duration {
	t.Helper()
	var latencies []time.Duration
	byWindow := runsByWindow(t, e, namespace, name)
	for _, w := range windows {
		rs := byWindow[w]
		if len(rs) != 1 {
			t.Errorf("%s: window %s ran %d times across %d clusters, want exactly once", namespace, w, len(rs), len(e.DCs))
			continue
		}
		winner := rs[0].Cluster
		for _, dc := range e.DCs {
			j := jobs[dc.Name][w]
			if _, complete := Finished(&j); !complete {
				t.Errorf("%s: Job %s/%s of window %s failed; every cluster's Job must complete", dc.Name, namespace, j.Name, w)
			}
			pods, err := dc.PodsIn(context.Background(), namespace, j.Name)
			if err != nil || len(pods) != 1 {
				t.Errorf("%s: pods of Job %s/%s: %d (%v), want 1", dc.Name, namespace, j.Name, len(pods), err)
				continue
			}
			msg := AgentMessage(&pods[0])
			if dc.Name == winner {
				// The agent's last word is the recorded outcome.
				if !strings.Contains(msg, "ran window "+w) || !strings.Contains(msg, "succeeded") {
					t.Errorf("%s ran window %s of %s/%s but its agent's termination message is %q", dc.Name, w, namespace, name, msg)
				}
				if claimed := rs[0].ClaimedAt; claimed != nil {
					latencies = append(latencies, claimed.Sub(j.CreationTimestamp.Time))
				}
				continue
			}
			if !strings.HasPrefix(msg, "skip:") || !strings.Contains(msg, "cluster "+winner) {
				t.Errorf("%s skipped window %s of %s/%s; its agent's termination message %q should say it skipped and that cluster %s ran it",
					dc.Name, w, namespace, name, msg, winner)
			}
		}
		t.Logf("%s/%s window %s: ran once, in %s (token %d); the other cluster's Job completed without running", namespace, name, w, winner, rs[0].Token)
	}
	return latencies
}

// ownRoles checks that the agents of every team in every cluster lock with
// that namespace's own database role: the namespace's Secret holds the role
// the webhook provisioned for that namespace and cluster, no two share one,
// and none is the owner's.
func ownRoles(t *testing.T, e *Env) {
	t.Helper()
	ctx := context.Background()
	owner, err := url.Parse(e.dsn())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, dc := range e.DCs {
		for _, team := range Teams {
			secret, err := dc.Client.CoreV1().Secrets(team).Get(ctx, DBSecretName, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("%s: %v", dc.Name, err)
			}
			u, err := url.Parse(string(secret.Data["url"]))
			if err != nil {
				t.Fatalf("%s: the Secret of %s holds no URL: %v", dc.Name, team, err)
			}
			role := u.User.Username()
			var provisioned string
			if err := e.queryRow(ctx, `SELECT role_name FROM dislock.tenants
WHERE cluster = $1 AND namespace = $2 AND superseded_at IS NULL AND retired_at IS NULL`, []any{dc.Name, team}, &provisioned); err != nil {
				t.Fatalf("%s: the provisioned role of %s: %v", dc.Name, team, err)
			}
			where := dc.Name + " " + team
			switch {
			case role == owner.User.Username():
				t.Errorf("%s: the namespace's Secret holds the owner's role %s", where, role)
			case role != provisioned:
				t.Errorf("%s: the namespace's Secret holds role %s, the webhook provisioned %s", where, role, provisioned)
			case seen[role] != "":
				t.Errorf("%s and %s share role %s", where, seen[role], role)
			}
			seen[role] = where
		}
	}
	t.Logf("roles: %v", seen)
}

// runsByWindow reads the ledger rows of the runs of a namespace's CronJob
// (its pods are named after it) by window, and fails the test for any
// window that ran twice.
func runsByWindow(t *testing.T, e *Env, namespace, cronJob string) map[string][]Run {
	t.Helper()
	runs, err := e.Runs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	byWindow := map[string][]Run{}
	for _, r := range runs {
		if r.Namespace == namespace && strings.HasPrefix(r.Pod, cronJob+"-") {
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
		unfinished := 0
		var failed []string
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
					failed = append(failed, dc.Name+"/"+j.Name)
				}
			}
		}
		if unfinished == 0 {
			if len(failed) > 0 {
				t.Errorf("%d Jobs failed (%v); every cluster's Job must complete (their pods are at the end of the state below)", len(failed), failed)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Jobs not finished after %v", unfinished, 10*time.Minute)
		}
		time.Sleep(time.Second)
	}
	t.Logf("all %d Jobs finished %v after the first was created", windows*len(e.DCs), time.Since(begun).Round(time.Second))

	byWindow := runsByWindow(t, e, Namespace, name)
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
