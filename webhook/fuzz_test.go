package webhook

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dislock/dislock/lockagent/spec"
	"github.com/dislock/dislock/lockagent/window"
)

// fuzzCronJob builds an opted-in CronJob from fuzzed annotation values; an
// empty value leaves the annotation out (except the mode, which opts in).
func fuzzCronJob(mode, ttl, standby, catchup, entrypoint, key, schedule, tz string) *batchv1.CronJob {
	ann := map[string]string{spec.AnnotationMode: mode}
	for k, v := range map[string]string{spec.AnnotationLeaseTTL: ttl, spec.AnnotationStandby: standby,
		spec.AnnotationCatchup: catchup, spec.AnnotationEntrypoint: entrypoint, spec.AnnotationKey: key} {
		if v != "" {
			ann[k] = v
		}
	}
	cj := validationCronJob(ann, nil)
	cj.Spec.Schedule = schedule
	if tz != "" {
		cj.Spec.TimeZone = &tz
	}
	// One container with a command, one without (it needs dislock.io/entrypoint
	// or a resolved entrypoint).
	cj.Spec.JobTemplate.Spec.Template.Spec.Containers = append(cj.Spec.JobTemplate.Spec.Template.Spec.Containers,
		corev1.Container{Name: "bare", Image: "registry.example/bare", Args: []string{"--x"}})
	return cj
}

var fuzzSeeds = []struct {
	mode, ttl, standby, catchup, entrypoint, key, jobName, schedule, tz, stamp string
	manual, resolved                                                           bool
}{
	{mode: "schedule", jobName: "report-29936880", schedule: "0 * * * *", stamp: "2026-12-02T12:00:00Z"},
	{mode: "schedule,lease", ttl: "45s", standby: "true", catchup: "10m", key: "billing", jobName: "report-x", schedule: "30 3 * * *", tz: "Europe/Berlin", resolved: true},
	{mode: "lease", ttl: "5", entrypoint: `["/run"]`, jobName: "report-rerun", schedule: "@every 5m", manual: true},
	{mode: "sometimes", standby: "maybe", catchup: "-1s", entrypoint: "[]", key: "Bad/Key", jobName: "", schedule: "", tz: "Local"},
	{mode: " lease , schedule ", ttl: "1h", jobName: "report-0946684800", schedule: "0 0 30 2 *", stamp: "2026-03-29T03:00:00+02:00"},
	{mode: "schedule", jobName: "report-29936880", schedule: "TZ=UTC * * * *", tz: "../../etc/passwd", stamp: "not a time"},
}

// FuzzInject: Inject never panics; whatever it accepts re-injects unchanged,
// wraps every app container, and its CronJob passes ValidateCronJob.
func FuzzInject(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s.mode, s.ttl, s.standby, s.catchup, s.entrypoint, s.key, s.jobName, s.schedule, s.tz, s.stamp, s.manual, s.resolved)
	}
	opts := goldenOptions()
	f.Fuzz(func(t *testing.T, mode, ttl, standby, catchup, entrypoint, key, jobName, schedule, tz, stamp string, manual, resolved bool) {
		cj := fuzzCronJob(mode, ttl, standby, catchup, entrypoint, key, schedule, tz)
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: jobName, Annotations: map[string]string{}},
			Spec:       *cj.Spec.JobTemplate.Spec.DeepCopy(),
		}
		if stamp != "" {
			job.Annotations[window.ScheduledTimestampAnnotation] = stamp
		}
		if manual {
			job.Annotations[window.InstantiateAnnotation] = window.InstantiateManual
		}
		var entrypoints map[string][]string
		if resolved {
			entrypoints = map[string][]string{"bare": {"/usr/bin/bare"}}
		}
		before := toYAML(t, job)

		out, st, err := Inject(job, cj, opts, entrypoints)
		if !bytes.Equal(toYAML(t, job), before) {
			t.Fatal("Inject modified its input")
		}
		if err != nil {
			if out != nil || st != nil {
				t.Fatal("a Job or status returned with an error")
			}
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		checkInjected(t, out, st)
		for _, c := range out.Spec.Template.Spec.Containers {
			if !slices.Equal(c.Command[:len(WrapperPrefix)], WrapperPrefix) || slices.Contains(c.Command[len(WrapperPrefix):], "") {
				t.Fatalf("container %s: command %q", c.Name, c.Command)
			}
		}
		got := toYAML(t, out)
		again, st2, err := Inject(out, cj, opts, nil)
		if err != nil {
			t.Fatalf("re-injecting: %v", err)
		}
		if !bytes.Equal(toYAML(t, again), got) {
			t.Fatalf("re-injecting changed the Job:\n%s", lineDiff(string(got), string(toYAML(t, again))))
		}
		b1, _ := json.Marshal(st)
		b2, _ := json.Marshal(st2)
		if !bytes.Equal(b1, b2) {
			t.Fatalf("re-injecting: status %s, want %s", b2, b1)
		}
		if errs := ValidateCronJob(cj); len(errs) > 0 {
			t.Fatalf("Inject accepted a Job of a CronJob ValidateCronJob refuses: %v", errs.ToAggregate())
		}
	})
}

// FuzzValidateCronJob: ValidateCronJob never panics, and every problem it
// reports names a field and says something.
func FuzzValidateCronJob(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s.mode, s.ttl, s.standby, s.catchup, s.entrypoint, s.key, s.schedule, s.tz, s.stamp, s.jobName)
	}
	f.Fuzz(func(t *testing.T, mode, ttl, standby, catchup, entrypoint, key, schedule, tz, otherKey, otherValue string) {
		cj := fuzzCronJob(mode, ttl, standby, catchup, entrypoint, key, schedule, tz)
		// An arbitrary extra annotation, on the template so that it wins.
		cj.Spec.JobTemplate.Annotations = map[string]string{otherKey: otherValue}
		for _, e := range ValidateCronJob(cj) {
			if e.Field == "" || e.Error() == "" {
				t.Fatalf("problem without a field or text: %#v", e)
			}
		}
	})
}
