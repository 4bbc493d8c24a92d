package inject

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

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/window"
)

// fuzzCronJob builds an opted-in CronJob from fuzzed annotation values; an
// empty value leaves the annotation out (except the mode, which opts in).
// shape's bits make the job template Indexed, set parallelism 2, set
// completions 3, and choose podReplacementPolicy TerminatingOrFailed.
func fuzzCronJob(mode, ttl, standby, catchup, appStart, entrypoint, key, schedule, tz string, shape uint8) *batchv1.CronJob {
	ann := map[string]string{contract.AnnotationMode: mode}
	for k, v := range map[string]string{contract.AnnotationLeaseTTL: ttl, contract.AnnotationStandby: standby,
		contract.AnnotationCatchup: catchup, contract.AnnotationAppStartTimeout: appStart, contract.AnnotationEntrypoint: entrypoint,
		contract.AnnotationKey: key} {
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
// comes back byte for byte when taken apart by strip and injected again
// (so a copy of it passes the forged-injection check), has its key in the
// Job's own namespace whatever the annotations say, wraps every app
// container, and its CronJob passes ValidateCronJob.
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
		checkKey(t, out, st, job.Namespace)
		got := toJSON(t, out)
		stripped, recovered := strip(out)
		if mk := InjectionMarker(stripped); mk != nil {
			t.Fatalf("strip left %s", mk)
		}
		fresh, _, err := Inject(stripped, cj, opts, recovered)
		if err != nil {
			t.Fatalf("injecting the stripped Job: %v", err)
		}
		if !bytes.Equal(toJSON(t, fresh), got) {
			t.Fatalf("Inject(strip(Inject(x))) differs from Inject(x):\n%s\n%s", got, toJSON(t, fresh))
		}
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
		if errs := ValidateCronJob(cj, Options{}); len(errs) > 0 {
			t.Fatalf("Inject accepted a Job of a CronJob ValidateCronJob refuses: %v", errs.ToAggregate())
		}
	})
}

// FuzzForgedInjection edits one part of a real injection with fuzzed text.
// Inject refuses the Job unless the edit changed nothing the injection is
// made of: whatever it lets through has exactly the webhook's sidecar and
// volume, and the key of the Job's own namespace. An edit of the sidecar,
// the volume or the status passes only if it changed nothing at all.
func FuzzForgedInjection(f *testing.F) {
	f.Add(uint8(0), uint8(1), "team-b/report")
	f.Add(uint8(0), uint8(1), "team/report")
	f.Add(uint8(1), uint8(0), "evil.example/agent")
	f.Add(uint8(2), uint8(0), "DISLOCK_SHARED_DIR")
	f.Add(uint8(2), uint8(1), "LOG_LEVEL")
	f.Add(uint8(3), uint8(0), `{"version":1,"mode":"schedule,lease","key":"team-b/report"}`)
	f.Add(uint8(4), uint8(3), "/app/other")
	f.Add(uint8(4), uint8(0), "/usr/local/bin/dislock-agent")
	f.Add(uint8(5), uint8(1), "exec")
	f.Add(uint8(6), uint8(0), "Memory")
	f.Add(uint8(7), uint8(0), "agent")
	opts := goldenOptions()
	cj, legit := injectedCase(f, map[string]string{contract.AnnotationMode: "schedule,lease"})
	want := toJSON(f, legit)
	wantSidecar := toJSON(f, legit.Spec.Template.Spec.InitContainers[0])
	wantVolume := toJSON(f, legit.Spec.Template.Spec.Volumes)
	f.Fuzz(func(t *testing.T, op, at uint8, text string) {
		job := legit.DeepCopy()
		pod := &job.Spec.Template.Spec
		sc := &pod.InitContainers[0]
		app := &pod.Containers[0]
		injectionOnly := true // the edit touches only what the webhook adds
		switch op % 8 {
		case 0:
			sc.Env[int(at)%len(sc.Env)].Value = text
		case 1:
			sc.Image = text
		case 2:
			c := sc
			if at%2 == 1 {
				c, injectionOnly = app, false
			}
			c.Env = append(c.Env, corev1.EnvVar{Name: text, Value: "x"})
		case 3:
			job.Annotations[StatusAnnotation] = text
		case 4:
			app.Command[int(at)%len(app.Command)] = text
			injectionOnly = false
		case 5:
			sc.Command[int(at)%len(sc.Command)] = text
		case 6:
			pod.Volumes[0].EmptyDir.Medium = corev1.StorageMedium(text)
		case 7:
			sc.Name = text
		}
		out, st, err := Inject(job, cj, opts, nil)
		if err != nil {
			if out != nil || st != nil || err.Error() == "" {
				t.Fatalf("Inject returned %v, %v with its error %v", out, st, err)
			}
			return
		}
		checkKey(t, out, st, "team")
		if !bytes.Equal(toJSON(t, out.Spec.Template.Spec.InitContainers[0]), wantSidecar) || !bytes.Equal(toJSON(t, out.Spec.Template.Spec.Volumes), wantVolume) {
			t.Fatalf("a sidecar or volume the webhook did not make passed:\n%s", toJSON(t, out.Spec.Template.Spec))
		}
		if injectionOnly && !bytes.Equal(toJSON(t, out), want) {
			t.Fatalf("an edited injection passed:\n%s", toJSON(t, out))
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
		for _, e := range ValidateCronJob(cj, Options{}) {
			if e.Field == "" || e.Error() == "" {
				t.Fatalf("problem without a field or text: %#v", e)
			}
		}
	})
}
