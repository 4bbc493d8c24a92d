package inject

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/contract"
)

// validationCronJob is a valid CronJob with the given annotations on its own
// metadata and on its job template.
func validationCronJob(own, tmpl map[string]string) *batchv1.CronJob {
	return &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "report", Annotations: own},
		Spec: batchv1.CronJobSpec{Schedule: "0 * * * *", JobTemplate: batchv1.JobTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: tmpl},
			Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "app", Image: "registry.example/report", Command: []string{"/app/report"}}}}}},
		}},
	}
}

func TestValidateCronJob(t *testing.T) {
	t.Parallel()
	type problem struct {
		typ  field.ErrorType
		path string
		text string // a substring of the error
	}
	tests := []struct {
		name string
		own  map[string]string
		tmpl map[string]string
		edit func(cj *batchv1.CronJob)
		want []problem
	}{
		{name: "a valid schedule-mode CronJob", own: map[string]string{contract.AnnotationMode: "schedule"}},
		{name: "a valid CronJob with every annotation, in a time zone",
			tmpl: map[string]string{contract.AnnotationMode: "schedule,lease", contract.AnnotationKey: "billing",
				contract.AnnotationLeaseTTL: "1m", contract.AnnotationStandby: "true", contract.AnnotationCatchup: "10m",
				contract.AnnotationAppStartTimeout: "30m", contract.AnnotationEntrypoint: `["/app/run"]`},
			edit: func(cj *batchv1.CronJob) { cj.Spec.TimeZone = ptr.To("Europe/Berlin") }},
		{name: "not opted in: nothing is checked",
			own:  map[string]string{"team.example/owner": "billing"},
			edit: func(cj *batchv1.CronJob) { cj.Spec.Schedule = "@every 5m" }},
		{name: "a bad TTL and a bad mode are both named, with value and allowed values",
			own: map[string]string{contract.AnnotationMode: "sometimes", contract.AnnotationLeaseTTL: "5"},
			want: []problem{
				{field.ErrorTypeInvalid, "metadata.annotations[dislock.io/mode]", `Invalid value: "sometimes": is not a valid mode (want "schedule", "lease" or "schedule,lease")`},
				{field.ErrorTypeInvalid, "metadata.annotations[dislock.io/lease-ttl]", `Invalid value: "5": is not a duration (want e.g. "30s", between 5s and 1h)`},
			}},
		{name: "a prefer-grace the catchup leaves no room for is named at the grace",
			own: map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationPreferCluster: "dc-a",
				contract.AnnotationPreferGrace: "5m", contract.AnnotationCatchup: "2m"},
			want: []problem{{field.ErrorTypeInvalid, "metadata.annotations[dislock.io/prefer-grace]",
				`Invalid value: "5m": is not below dislock.io/catchup 2m: every window the preferred cluster leaves would be stale before another cluster may claim it`}}},
		{name: "a prefer-grace not below the schedule's period is named at the grace",
			tmpl: map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationPreferCluster: "dc-a", contract.AnnotationPreferGrace: "1m"},
			edit: func(cj *batchv1.CronJob) { cj.Spec.Schedule = "* * * * *" },
			want: []problem{{field.ErrorTypeInvalid, "spec.jobTemplate.metadata.annotations[dislock.io/prefer-grace]",
				`Invalid value: "1m": is not below the schedule's shortest period, 1m0s: a window the preferred cluster leaves would be claimed elsewhere only after the next one began (want a grace below 1m0s)`}}},
		{name: "the default prefer-grace below an hourly schedule's period",
			own:  map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationPreferCluster: "dc-a"},
			edit: func(cj *batchv1.CronJob) { cj.Spec.Schedule = "0 * * * *" }},
		{name: "an app-start timeout out of range names the bounds",
			own: map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationAppStartTimeout: "48h"},
			want: []problem{{field.ErrorTypeInvalid, "metadata.annotations[dislock.io/app-start-timeout]",
				`Invalid value: "48h": is out of range (want between 30s and 24h)`}}},
		{name: "parallel pods without Indexed would share one window",
			own: map[string]string{contract.AnnotationMode: "schedule"},
			edit: func(cj *batchv1.CronJob) {
				cj.Spec.JobTemplate.Spec.Parallelism = ptr.To(int32(4))
				cj.Spec.JobTemplate.Spec.Completions = ptr.To(int32(8))
			},
			want: []problem{
				{field.ErrorTypeInvalid, "spec.jobTemplate.spec.parallelism", "Invalid value: 4: dislock claims one window per Job, so of 4 pods only one would run (set completionMode: Indexed so that each completion index claims its own window, or set parallelism to 1)"},
				{field.ErrorTypeInvalid, "spec.jobTemplate.spec.completions", "Invalid value: 8:"},
			}},
		{name: "completions alone: later pods would find the window done",
			own:  map[string]string{contract.AnnotationMode: "lease"},
			edit: func(cj *batchv1.CronJob) { cj.Spec.JobTemplate.Spec.Completions = ptr.To(int32(2)) },
			want: []problem{{field.ErrorTypeInvalid, "spec.jobTemplate.spec.completions", "or set completions to 1"}}},
		{name: "an Indexed Job claims one window per index",
			own: map[string]string{contract.AnnotationMode: "schedule"},
			edit: func(cj *batchv1.CronJob) {
				js := &cj.Spec.JobTemplate.Spec
				js.CompletionMode = ptr.To(batchv1.IndexedCompletion)
				js.Parallelism, js.Completions = ptr.To(int32(3)), ptr.To(int32(3))
			}},
		{name: "parallelism and completions of 1 are one pod",
			own: map[string]string{contract.AnnotationMode: "schedule"},
			edit: func(cj *batchv1.CronJob) {
				cj.Spec.JobTemplate.Spec.Parallelism, cj.Spec.JobTemplate.Spec.Completions = ptr.To(int32(1)), ptr.To(int32(1))
			}},
		{name: "a problem in the job template is reported at the template's path",
			own:  map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationLeaseTTL: "30s"},
			tmpl: map[string]string{contract.AnnotationLeaseTTL: "2h"},
			want: []problem{{field.ErrorTypeInvalid, "spec.jobTemplate.metadata.annotations[dislock.io/lease-ttl]", "out of range"}}},
		{name: "the template's valid value overrides the CronJob's bad one",
			own:  map[string]string{contract.AnnotationMode: "sometimes"},
			tmpl: map[string]string{contract.AnnotationMode: "lease"}},
		{name: "opted in by another annotation but without a mode",
			own:  map[string]string{contract.AnnotationKey: "billing"},
			want: []problem{{field.ErrorTypeRequired, "metadata.annotations[dislock.io/mode]", "is required"}}},
		{name: "an unknown dislock annotation is a typo, with a suggestion",
			own:  map[string]string{contract.AnnotationMode: "lease", "dislock.io/leasettl": "1m"},
			want: []problem{{field.ErrorTypeInvalid, "metadata.annotations[dislock.io/leasettl]", "did you mean dislock.io/lease-ttl?"}}},
		{name: "schedule mode refuses @every, whose ticks differ per cluster",
			own:  map[string]string{contract.AnnotationMode: "schedule"},
			edit: func(cj *batchv1.CronJob) { cj.Spec.Schedule = "@every 5m" },
			want: []problem{{field.ErrorTypeInvalid, "spec.schedule", "@every is not supported"}}},
		{name: "lease mode does not need windows, so @every is fine",
			own:  map[string]string{contract.AnnotationMode: "lease"},
			edit: func(cj *batchv1.CronJob) { cj.Spec.Schedule = "@every 5m" }},
		{name: "schedule mode with an unknown time zone names the time zone, not the schedule",
			own:  map[string]string{contract.AnnotationMode: "schedule,lease"},
			edit: func(cj *batchv1.CronJob) { cj.Spec.TimeZone = ptr.To("Mars/Olympus") },
			want: []problem{{field.ErrorTypeInvalid, "spec.timeZone", `unknown time zone "Mars/Olympus"`}}},
		{name: "schedule mode with TZ= in the schedule",
			own:  map[string]string{contract.AnnotationMode: "schedule"},
			edit: func(cj *batchv1.CronJob) { cj.Spec.Schedule = "CRON_TZ=UTC 0 * * * *" },
			want: []problem{{field.ErrorTypeInvalid, "spec.schedule", "set the CronJob's spec.timeZone instead"}}},
		{name: "a status annotation in the job template would switch injection off",
			own:  map[string]string{contract.AnnotationMode: "schedule"},
			tmpl: map[string]string{StatusAnnotation: "{}"},
			want: []problem{{field.ErrorTypeForbidden, "spec.jobTemplate.metadata.annotations[dislock.io/status]", "only the dislock webhook writes"}}},
		{name: "the job template takes a name dislock adds",
			own: map[string]string{contract.AnnotationMode: "lease"},
			edit: func(cj *batchv1.CronJob) {
				cj.Spec.JobTemplate.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "data"}, {Name: "dislock"}}
				cj.Spec.JobTemplate.Spec.ManualSelector = ptr.To(true)
			},
			want: []problem{
				{field.ErrorTypeInvalid, "spec.jobTemplate.spec.manualSelector", "remove manualSelector"},
				{field.ErrorTypeInvalid, "spec.jobTemplate.spec.template.spec.volumes[1].name", "rename this volume"},
			}},
		{name: "the job template sets dislock's variables or runs dislock-agent itself",
			own: map[string]string{contract.AnnotationMode: "schedule"},
			edit: func(cj *batchv1.CronJob) {
				pod := &cj.Spec.JobTemplate.Spec.Template.Spec
				pod.InitContainers = []corev1.Container{{Name: "helper", Image: "registry.example/dislock-agent",
					Command: []string{"/usr/local/bin/dislock-agent", "agent"}, Env: []corev1.EnvVar{{Name: "DISLOCK_KEY", Value: "team-b/report"}}}}
				// An app container's own DISLOCK_CONTAINER_NAME is replaced by the injection: not a problem.
				pod.Containers[0].Env = []corev1.EnvVar{{Name: "DISLOCK_CONTAINER_NAME", Value: "stale"}, {Name: "DISLOCK_SHARED_DIR", Value: "/tmp"}}
			},
			want: []problem{
				{field.ErrorTypeInvalid, "spec.jobTemplate.spec.template.spec.initContainers[0].env[0].name", `"DISLOCK_KEY": dislock sets the DISLOCK_ variables itself`},
				{field.ErrorTypeInvalid, "spec.jobTemplate.spec.template.spec.initContainers[0].command[0]", "only the sidecar and the wrapped commands dislock injects run dislock-agent"},
				{field.ErrorTypeInvalid, "spec.jobTemplate.spec.template.spec.containers[0].env[1].name", `"DISLOCK_SHARED_DIR"`},
			}},
		{name: "every kind of problem at once",
			own: map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationCatchup: "soon"},
			edit: func(cj *batchv1.CronJob) {
				cj.Spec.Schedule = "@hourly-ish"
				cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Name = "dislock-agent"
			},
			want: []problem{
				{field.ErrorTypeInvalid, "metadata.annotations[dislock.io/catchup]", `"soon": is not a duration`},
				{field.ErrorTypeInvalid, "spec.schedule", `"@hourly-ish"`},
				{field.ErrorTypeInvalid, "spec.jobTemplate.spec.template.spec.containers[0].name", "rename this container"},
			}},
		{name: "a huge bad value is shortened in the message",
			own:  map[string]string{contract.AnnotationMode: "lease", contract.AnnotationEntrypoint: strings.Repeat("x", 5000)},
			want: []problem{{field.ErrorTypeInvalid, "metadata.annotations[dislock.io/entrypoint]", strings.Repeat("x", 120) + `..."`}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cj := validationCronJob(tc.own, tc.tmpl)
			if tc.edit != nil {
				tc.edit(cj)
			}
			errs := ValidateCronJob(cj, Options{})
			if len(errs) != len(tc.want) {
				t.Errorf("got %d problems, want %d:\n%v", len(errs), len(tc.want), errs.ToAggregate())
			}
			for _, w := range tc.want {
				found := false
				for _, e := range errs {
					if e.Type == w.typ && e.Field == w.path && strings.Contains(e.Error(), w.text) {
						found = true
					}
				}
				if !found {
					t.Errorf("no %s problem at %s containing %q in:\n%v", w.typ, w.path, w.text, errs.ToAggregate())
				}
			}
			if len(errs) > 0 && len(errs.ToAggregate().Error()) > 2000 {
				t.Errorf("message too long (%d bytes)", len(errs.ToAggregate().Error()))
			}
		})
	}
	if errs := ValidateCronJob(nil, Options{}); errs != nil {
		t.Errorf("ValidateCronJob(nil, Options{}) = %v", errs)
	}
}

// What ValidateCronJob accepts, Inject accepts for the Jobs the controller
// creates from it, and what it refuses Inject refuses with the same words.
func TestValidateAgreesWithInject(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		own  map[string]string
		edit func(cj *batchv1.CronJob)
	}{
		{name: "valid", own: map[string]string{contract.AnnotationMode: "schedule"}},
		{name: "bad ttl", own: map[string]string{contract.AnnotationMode: "lease", contract.AnnotationLeaseTTL: "5"}},
		{name: "@every", own: map[string]string{contract.AnnotationMode: "schedule"}, edit: func(cj *batchv1.CronJob) { cj.Spec.Schedule = "@every 1m" }},
		{name: "parallel pods", own: map[string]string{contract.AnnotationMode: "schedule"}, edit: func(cj *batchv1.CronJob) {
			cj.Spec.JobTemplate.Spec.Parallelism = ptr.To(int32(2))
		}},
		{name: "indexed", own: map[string]string{contract.AnnotationMode: "schedule"}, edit: func(cj *batchv1.CronJob) {
			cj.Spec.JobTemplate.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
			cj.Spec.JobTemplate.Spec.Parallelism, cj.Spec.JobTemplate.Spec.Completions = ptr.To(int32(2)), ptr.To(int32(4))
		}},
		{name: "mount clash", own: map[string]string{contract.AnnotationMode: "lease"}, edit: func(cj *batchv1.CronJob) {
			cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "x", MountPath: "/dislock/"}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cj := validationCronJob(tc.own, nil)
			if tc.edit != nil {
				tc.edit(cj)
			}
			_, job := errCase(nil, nil)
			job.Spec = *cj.Spec.JobTemplate.Spec.DeepCopy()
			verrs := ValidateCronJob(cj, Options{})
			_, _, err := Inject(job, cj, goldenOptions(), nil)
			if (len(verrs) == 0) != (err == nil) {
				t.Fatalf("ValidateCronJob: %v; Inject: %v", verrs.ToAggregate(), err)
			}
			for _, e := range verrs {
				if !strings.Contains(err.Error(), e.Detail) {
					t.Errorf("Inject's error does not say %q:\n%v", e.Detail, err)
				}
			}
		})
	}
}

func TestCronJobWarnings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		own  map[string]string
		tz   *string
		// shared: the pod template shares its process namespace.
		shared bool
		want   []string // substrings of the one warning; nil = no warning
	}{
		{name: "no time zone: the clusters' controllers may fire at different instants",
			own: map[string]string{contract.AnnotationMode: "schedule"},
			want: []string{"spec.timeZone is not set", "controllers in different zones fire at different instants",
				"the same tick becomes two windows", `Set spec.timeZone to the same zone in every cluster, e.g. "Etc/UTC"`}},
		{name: "an empty time zone is no time zone", own: map[string]string{contract.AnnotationMode: "lease"}, tz: ptr.To(""),
			want: []string{"spec.timeZone is not set"}},
		{name: "a time zone set", own: map[string]string{contract.AnnotationMode: "schedule"}, tz: ptr.To("Etc/UTC")},
		{name: "not opted in", own: map[string]string{"team.example/owner": "billing"}},
		{name: "a shared process namespace: the apps see the sidecar's processes", own: map[string]string{contract.AnnotationMode: "schedule"},
			tz: ptr.To("Etc/UTC"), shared: true,
			want: []string{"shareProcessNamespace is true", "may read this namespace's database credential", "restricted Pod Security Standard"}},
		{name: "a shared process namespace, not opted in", own: map[string]string{"team.example/owner": "billing"}, shared: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cj := validationCronJob(tc.own, nil)
			cj.Spec.TimeZone = tc.tz
			if tc.shared {
				cj.Spec.JobTemplate.Spec.Template.Spec.ShareProcessNamespace = ptr.To(true)
			}
			got := CronJobWarnings(cj)
			if tc.want == nil {
				if len(got) != 0 {
					t.Errorf("warnings %q, want none", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("warnings %q, want one", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got[0], w) {
					t.Errorf("warning does not say %q:\n%s", w, got[0])
				}
			}
		})
	}
	if CronJobWarnings(nil) != nil {
		t.Error("CronJobWarnings(nil) is not empty")
	}
}
