package webhook

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/spec"
	"github.com/dislock/dislock/lockagent/window"
)

// fuzzCronJob builds an opted-in CronJob from fuzzed annotation values; an
// empty value leaves the annotation out (except the mode, which opts in).
// shape's bits make the job template Indexed, set parallelism 2, set
// completions 3, and choose podReplacementPolicy TerminatingOrFailed.
func fuzzCronJob(mode, ttl, standby, catchup, appStart, entrypoint, key, schedule, tz string, shape uint8) *batchv1.CronJob {
	ann := map[string]string{spec.AnnotationMode: mode}
	for k, v := range map[string]string{spec.AnnotationLeaseTTL: ttl, spec.AnnotationStandby: standby,
		spec.AnnotationCatchup: catchup, spec.AnnotationAppStartTimeout: appStart, spec.AnnotationEntrypoint: entrypoint,
		spec.AnnotationKey: key} {
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
	js := &cj.Spec.JobTemplate.Spec
	if shape&1 != 0 {
		js.CompletionMode = ptr.To(batchv1.IndexedCompletion)
	}
	if shape&2 != 0 {
		js.Parallelism = ptr.To(int32(2))
	}
	if shape&4 != 0 {
		js.Completions = ptr.To(int32(3))
	}
	if shape&8 != 0 {
		js.PodReplacementPolicy = ptr.To(batchv1.TerminatingOrFailed)
	}
	return cj
}

var fuzzSeeds = []struct {
	mode, ttl, standby, catchup, appStart, entrypoint, key, jobName, schedule, tz, stamp string
	manual, resolved                                                                     bool
	shape                                                                                uint8
}{
	{mode: "schedule", jobName: "report-29936880", schedule: "0 * * * *", stamp: "2026-12-02T12:00:00Z"},
	{mode: "schedule,lease", ttl: "45s", standby: "true", catchup: "10m", appStart: "30m", key: "billing", jobName: "report-x", schedule: "30 3 * * *", tz: "Europe/Berlin", resolved: true},
	{mode: "lease", ttl: "5", appStart: "5s", entrypoint: `["/run"]`, jobName: "report-rerun", schedule: "@every 5m", manual: true},
	{mode: "sometimes", standby: "maybe", catchup: "-1s", entrypoint: "[]", key: "Bad/Key", jobName: "", schedule: "", tz: "Local", shape: 6},
	{mode: " lease , schedule ", ttl: "1h", appStart: "24h", jobName: "report-0946684800", schedule: "0 0 30 2 *", stamp: "2026-03-29T03:00:00+02:00", shape: 15},
	{mode: "schedule", jobName: "report-29936880", schedule: "TZ=UTC * * * *", tz: "../../etc/passwd", stamp: "not a time", shape: 8},
}

// FuzzInject: Inject never panics; whatever it accepts re-injects unchanged,
// wraps every app container, and its CronJob passes ValidateCronJob.
func FuzzInject(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s.mode, s.ttl, s.standby, s.catchup, s.appStart, s.entrypoint, s.key, s.jobName, s.schedule, s.tz, s.stamp, s.manual, s.resolved, s.shape)
	}
	opts := goldenOptions()
	f.Fuzz(func(t *testing.T, mode, ttl, standby, catchup, appStart, entrypoint, key, jobName, schedule, tz, stamp string, manual, resolved bool, shape uint8) {
		cj := fuzzCronJob(mode, ttl, standby, catchup, appStart, entrypoint, key, schedule, tz, shape)
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
		// JSON, not YAML: a fuzzed name may hold characters YAML refuses.
		before := toJSON(t, job)

		out, st, err := Inject(job, cj, opts, entrypoints)
		if !bytes.Equal(toJSON(t, job), before) {
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
		// The API server validates the name after mutating admission; only
		// a Job it would store ever gets a pod.
		if jobName == "" || len(validation.IsDNS1123Subdomain(jobName)) == 0 {
			checkAgentReadsItsEnv(t, out, st)
		}
		for _, c := range out.Spec.Template.Spec.Containers {
			if !slices.Equal(c.Command[:len(WrapperPrefix)], WrapperPrefix) || slices.Contains(c.Command[len(WrapperPrefix):], "") {
				t.Fatalf("container %s: command %q", c.Name, c.Command)
			}
		}
		got := toJSON(t, out)
		again, st2, err := Inject(out, cj, opts, nil)
		if err != nil {
			t.Fatalf("re-injecting: %v", err)
		}
		if !bytes.Equal(toJSON(t, again), got) {
			t.Fatalf("re-injecting changed the Job:\n%s\n%s", got, toJSON(t, again))
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

func toJSON(t testing.TB, obj any) []byte {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzValidateCronJob: ValidateCronJob never panics, and every problem it
// reports names a field and says something.
func FuzzValidateCronJob(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s.mode, s.ttl, s.standby, s.catchup, s.appStart, s.entrypoint, s.key, s.schedule, s.tz, s.stamp, s.jobName, s.shape)
	}
	f.Fuzz(func(t *testing.T, mode, ttl, standby, catchup, appStart, entrypoint, key, schedule, tz, otherKey, otherValue string, shape uint8) {
		cj := fuzzCronJob(mode, ttl, standby, catchup, appStart, entrypoint, key, schedule, tz, shape)
		// An arbitrary extra annotation, on the template so that it wins.
		cj.Spec.JobTemplate.Annotations = map[string]string{otherKey: otherValue}
		for _, e := range ValidateCronJob(cj) {
			if e.Field == "" || e.Error() == "" {
				t.Fatalf("problem without a field or text: %#v", e)
			}
		}
	})
}
