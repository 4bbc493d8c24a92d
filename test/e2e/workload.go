package e2e

// The workloads the tests apply to every data centre, and reading back what
// happened: the ledger, the Jobs and their pods.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/test/images"
)

// probeMode is a mode the validating webhook refuses, naming it.
const probeMode = "e2e-not-a-mode"

// ProbeCronJob is a CronJob the webhook refuses; created as a dry run, the
// refusal shows that the API server calls the webhook for Namespace.
func ProbeCronJob() *batchv1.CronJob {
	cj := LedgerCronJob("dc-probe", "opt-in-probe", "* * * * *", "", Ledger{})
	cj.Annotations = map[string]string{"dislock.io/mode": probeMode}
	return cj
}

// Ledger tunes the app of a ledger CronJob.
type Ledger struct {
	// DSN is where the app writes the ledger (the DC's PgBouncer).
	DSN string
	// Work is how long each run works before it records its end.
	Work time.Duration
	// Exit is each run's exit code.
	Exit int
	// Shutdown is how long a run goes on after SIGTERM before it stops
	// (exit 143): its pod stays Terminating that long, as one whose app
	// finishes the work in hand does.
	Shutdown time.Duration
	// Indexed, when above 0, makes the Jobs Indexed with that many
	// completions, Parallelism of them at a time (all when 0).
	Indexed, Parallelism int32
	// Annotations are added to the CronJob (dislock.io/lease-ttl, ...).
	Annotations map[string]string
	// Suspend keeps the CronJob controller from creating Jobs.
	Suspend bool
}

// LedgerCronJob is the CronJob the story tests apply to every data centre:
// annotated with dislock.io/mode=mode, its pods use the host network and run
// ledger-app, which records each run. History limits keep every Job the
// tests look at.
func LedgerCronJob(dc, name, schedule, mode string, l Ledger) *batchv1.CronJob {
	annotations := map[string]string{"dislock.io/mode": mode}
	for k, v := range l.Annotations {
		annotations[k] = v
	}
	return &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Annotations: annotations},
		Spec: batchv1.CronJobSpec{
			Schedule:                   schedule,
			Suspend:                    ptr.To(l.Suspend),
			SuccessfulJobsHistoryLimit: ptr.To(int32(100)),
			FailedJobsHistoryLimit:     ptr.To(int32(100)),
			JobTemplate:                batchv1.JobTemplateSpec{Spec: ledgerJob(dc, l)},
		},
	}
}

func ledgerJob(dc string, l Ledger) batchv1.JobSpec {
	js := batchv1.JobSpec{
		BackoffLimit: ptr.To(int32(0)),
		Template:     ledgerPod(dc, l),
	}
	if l.Indexed > 0 {
		js.CompletionMode = ptr.To(batchv1.IndexedCompletion)
		js.Completions, js.Parallelism = ptr.To(l.Indexed), ptr.To(l.Indexed)
		if l.Parallelism > 0 {
			js.Parallelism = ptr.To(l.Parallelism)
		}
	}
	return js
}

func ledgerPod(dc string, l Ledger) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		// Test traffic stays on loopback: the pod reaches the DC's
		// PgBouncer on 127.0.0.1.
		HostNetwork:                   true,
		TerminationGracePeriodSeconds: ptr.To(int64(10)),
		Containers: []corev1.Container{{
			Name:            "app",
			Image:           images.LedgerRef,
			ImagePullPolicy: corev1.PullNever,
			Command:         []string{"ledger-app"},
			Env: []corev1.EnvVar{
				{Name: "LEDGER_DATABASE_URL", Value: l.DSN},
				{Name: "LEDGER_CLUSTER", Value: dc},
				{Name: "LEDGER_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
				{Name: "LEDGER_POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "LEDGER_SLEEP", Value: l.Work.String()},
				{Name: "LEDGER_EXIT", Value: fmt.Sprint(l.Exit)},
				{Name: "LEDGER_SHUTDOWN", Value: l.Shutdown.String()},
			},
		}},
	}}
}

// Run is one row of the ledger: one time the app ran.
type Run struct {
	Window     string
	Index      *int // the completion index of an Indexed Job's run
	Token      int64
	Cluster    string
	Namespace  string
	Pod        string
	Started    time.Time
	Finished   *time.Time
	ExitCode   *int
	ClaimedAt  *time.Time // the window's claim, from dislock.windows (schedule mode)
	WindowTime time.Time
}

// String is how a failing test shows the run.
func (r Run) String() string {
	index := ""
	if r.Index != nil {
		index = fmt.Sprintf(" index %d", *r.Index)
	}
	return fmt.Sprintf("%s/%s window %q%s token %d %s–%s exit %s", r.Cluster, r.Pod, r.Window, index, r.Token,
		fmtTime(&r.Started), fmtTime(r.Finished), fmtInt(r.ExitCode))
}

// Runs reads the ledger, oldest first, with each run's window claim time.
func (e *Env) Runs(ctx context.Context) ([]Run, error) {
	c, err := pgx.Connect(ctx, e.dsn())
	if err != nil {
		return nil, err
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT l.window_start, l.job_index, l.token, l.cluster, l.namespace, l.pod, l.started_at, l.finished_at, l.exit_code, w.claimed_at
FROM e2e.ledger l LEFT JOIN dislock.windows w ON w.token = l.token
ORDER BY l.started_at, l.id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Run, error) {
		var run Run
		err := r.Scan(&run.Window, &run.Index, &run.Token, &run.Cluster, &run.Namespace, &run.Pod, &run.Started, &run.Finished, &run.ExitCode, &run.ClaimedAt)
		if err == nil && run.Window != "" {
			run.WindowTime, err = time.Parse(time.RFC3339, run.Window)
		}
		return run, err
	})
}

// Overlaps lists each run (of runs, oldest first, as Runs returns them)
// that started before the run before it had finished, or after one that
// never recorded its end: two holders at once.
func Overlaps(runs []Run) []string {
	var out []string
	for i := 1; i < len(runs); i++ {
		prev, r := runs[i-1], runs[i]
		if prev.Finished == nil || r.Started.Before(*prev.Finished) {
			out = append(out, fmt.Sprintf("%v started before %v finished", r, prev))
		}
	}
	return out
}

// Jobs lists the Jobs of a CronJob of Namespace in one data centre.
func (dc *DC) Jobs(ctx context.Context, cronJob string) ([]batchv1.Job, error) {
	return dc.JobsIn(ctx, Namespace, cronJob)
}

// JobsIn lists the Jobs of a CronJob of a namespace in one data centre.
func (dc *DC) JobsIn(ctx context.Context, namespace, cronJob string) ([]batchv1.Job, error) {
	list, err := dc.Client.BatchV1().Jobs(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []batchv1.Job
	for _, j := range list.Items {
		if owner := metav1.GetControllerOf(&j); owner != nil && owner.Kind == "CronJob" && owner.Name == cronJob {
			out = append(out, j)
		}
	}
	return out, nil
}

// Finished reports whether the Job is Complete or Failed, and which.
func Finished(j *batchv1.Job) (done bool, complete bool) {
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return true, true
		case batchv1.JobFailed:
			return true, false
		}
	}
	return false, false
}

// Pods lists the pods of a Job of Namespace.
func (dc *DC) Pods(ctx context.Context, job string) ([]corev1.Pod, error) {
	return dc.PodsIn(ctx, Namespace, job)
}

// PodsIn lists the pods of a Job of a namespace.
func (dc *DC) PodsIn(ctx context.Context, namespace, job string) ([]corev1.Pod, error) {
	list, err := dc.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// AgentMessage is the termination message of a pod's dislock-agent sidecar:
// its decision ("run: ...", "skip: ... owner ...").
func AgentMessage(p *corev1.Pod) string {
	for _, s := range p.Status.InitContainerStatuses {
		if s.Name == "dislock-agent" && s.State.Terminated != nil {
			return strings.TrimSpace(s.State.Terminated.Message)
		}
	}
	return ""
}
