package inject

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/test/tlstest"
	"github.com/dislock/dislock/webhook/internal/injecttest"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files in testdata/inject")

const goldenDir = "testdata/inject"

// goldenOptions are the options every golden file was made with.
func goldenOptions() Options {
	return Options{ClusterName: injecttest.ClusterName, AgentImage: injecttest.AgentImage}
}

// caseOptions are the options the golden case c is injected with.
func caseOptions(c injecttest.Case) Options {
	o := goldenOptions()
	if c.DatabaseCAAndPodMetadata {
		withDatabaseCAAndPodMetadata(&o)
	}
	return o
}

// testCA stands for --database-ca-file's content: injection only asks
// whether there is one.
var testCA = []byte("-----BEGIN CERTIFICATE-----\n(the database's CA)\n-----END CERTIFICATE-----\n")

// withDatabaseCAAndPodMetadata are the options of a cluster whose database
// has a private CA and whose sidecars need a label (a NetworkPolicy's) and
// an annotation (a mesh's).
func withDatabaseCAAndPodMetadata(o *Options) {
	o.DatabaseCA = testCA
	o.PodLabels = map[string]string{"egress.corp/pgbouncer": "allow", "team": "platform"}
	o.PodAnnotations = map[string]string{"sidecar.istio.io/inject": "false"}
}

// TestInjectGolden compares Inject's output with the golden files (rewrite
// them with -update) and re-injects every output, which must come back
// unchanged: the webhook may be called again (reinvocationPolicy IfNeeded).
func TestInjectGolden(t *testing.T) {
	inputs, err := filepath.Glob(filepath.Join(goldenDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".yaml")
		if strings.HasSuffix(name, ".injected") {
			continue
		}
		if !slices.ContainsFunc(injecttest.Cases, func(c injecttest.Case) bool { return c.Name == name }) {
			t.Errorf("%s is not in injecttest.Cases", in)
		}
	}

	for _, tc := range injecttest.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			cj, job := injecttest.ReadCase(t, filepath.Join(goldenDir, tc.Name+".yaml"))
			before := injecttest.ToYAML(t, job)

			out, st, err := Inject(job, cj, caseOptions(tc), tc.Entrypoints)
			if err != nil {
				t.Fatalf("Inject: %v", err)
			}
			if !bytes.Equal(injecttest.ToYAML(t, job), before) {
				t.Error("Inject modified its input")
			}
			got := injecttest.ToYAML(t, out)
			golden := filepath.Join(goldenDir, tc.Name+".injected.yaml")
			if *updateGolden {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./webhook -run TestInjectGolden -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("output differs from %s (rerun with -update and review the diff):\n%s", golden, injecttest.LineDiff(string(want), string(got)))
			}

			checkInjected(t, out, st)
			checkAgentReadsItsEnv(t, out, st)

			again, st2, err := Inject(out, cj, caseOptions(tc), nil)
			if err != nil {
				t.Fatalf("re-injecting: %v", err)
			}
			if !bytes.Equal(injecttest.ToYAML(t, again), got) {
				t.Errorf("re-injecting changed the Job:\n%s", injecttest.LineDiff(string(got), string(injecttest.ToYAML(t, again))))
			}
			if !reflect.DeepEqual(st2, st) {
				t.Errorf("re-injecting: status %+v, want %+v", st2, st)
			}
			if need, err := NeedsEntrypoint(out, cj); err != nil || len(need) != 0 {
				t.Errorf("NeedsEntrypoint(injected) = %v, %v; want nothing", need, err)
			}
			if errs := ValidateCronJob(cj, Options{}); len(errs) != 0 {
				t.Errorf("the case's CronJob does not validate: %v", errs)
			}
		})
	}
}

// checkInjected checks what every injected Job must have, whatever the case.
func checkInjected(t testing.TB, out *batchv1.Job, st *Status) {
	t.Helper()
	var fromAnnotation Status
	if err := json.Unmarshal([]byte(out.Annotations[StatusAnnotation]), &fromAnnotation); err != nil {
		t.Fatalf("status annotation: %v", err)
	}
	if st == nil || !reflect.DeepEqual(*st, fromAnnotation) {
		t.Errorf("returned status %+v, annotation says %+v", st, fromAnnotation)
	}
	pod := out.Spec.Template.Spec
	if len(pod.InitContainers) == 0 || pod.InitContainers[0].Name != SidecarName {
		t.Fatalf("initContainers[0] is not %s", SidecarName)
	}
	sc := pod.InitContainers[0]
	if ptr.Deref(sc.RestartPolicy, "") != corev1.ContainerRestartPolicyAlways {
		t.Error("the sidecar is not a native sidecar (restartPolicy Always)")
	}
	if n := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == VolumeName }); n < 0 || pod.Volumes[n].EmptyDir == nil {
		t.Errorf("no emptyDir volume %q", VolumeName)
	}
	var names []string
	for _, c := range pod.Containers {
		if meshProxy(c) {
			checkProxyUntouched(t, c)
			continue
		}
		names = append(names, c.Name)
		if len(c.Command) <= len(WrapperPrefix) || !slices.Equal(c.Command[:len(WrapperPrefix)], WrapperPrefix) {
			t.Errorf("container %s: command %q does not start with %q and a command", c.Name, c.Command, WrapperPrefix)
		}
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
			return reflect.DeepEqual(e, corev1.EnvVar{Name: contract.EnvContainerName, Value: c.Name})
		}) {
			t.Errorf("container %s: no %s=%s", c.Name, contract.EnvContainerName, c.Name)
		}
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return reflect.DeepEqual(m, corev1.VolumeMount{Name: VolumeName, MountPath: SharedDir})
		}) {
			t.Errorf("container %s: %s not mounted at %s", c.Name, VolumeName, SharedDir)
		}
		for _, e := range c.Env {
			if e.Name == contract.EnvDatabaseURL {
				t.Errorf("container %s sees %s; only the sidecar may", c.Name, contract.EnvDatabaseURL)
			}
		}
	}
	if !slices.Equal(names, st.Containers) {
		t.Errorf("status containers %q, want %q", st.Containers, names)
	}
}

// checkProxyUntouched checks that a mesh proxy container was left as the
// mesh made it: not wrapped, no dislock variable, no shared volume.
func checkProxyUntouched(t testing.TB, c corev1.Container) {
	t.Helper()
	if runsAgent(c.Command) || wrapped(c.Command) {
		t.Errorf("mesh proxy %s is wrapped: %q", c.Name, c.Command)
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, envPrefix) {
			t.Errorf("mesh proxy %s has %s", c.Name, e.Name)
		}
	}
	for _, m := range c.VolumeMounts {
		if m.Name == VolumeName {
			t.Errorf("mesh proxy %s mounts %s", c.Name, VolumeName)
		}
	}
}

// checkAgentReadsItsEnv resolves the sidecar's variables as the kubelet
// would for a pod of the Job and parses them as the agent does: what the
// webhook writes, the agent must accept, and read as the webhook meant it.
func checkAgentReadsItsEnv(t testing.TB, out *batchv1.Job, st *Status) {
	t.Helper()
	jobName := out.Name
	if jobName == "" {
		jobName = "generated-x1y2z"
	}
	indexed := ptr.Deref(out.Spec.CompletionMode, batchv1.NonIndexedCompletion) == batchv1.IndexedCompletion
	pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: jobName + "-pod",
		Labels:      map[string]string{UIDLabel: "job-uid", "batch.kubernetes.io/job-name": jobName},
		Annotations: map[string]string{}}}
	if indexed {
		pod.Annotations["batch.kubernetes.io/job-completion-index"] = "2"
	}
	const dsn = "postgres://tenant:pw@pg/dislock"
	env := map[string]string{}
	for _, e := range out.Spec.Template.Spec.InitContainers[0].Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = dsn
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = downward(t, &pod, e.ValueFrom.FieldRef.FieldPath)
		default:
			t.Fatalf("%s: unexpected source %+v", e.Name, e.ValueFrom)
		}
	}
	got, err := contract.ParseAgentEnv(func(k string) string { return env[k] }, contract.ParseOptions{})
	if err != nil {
		t.Fatalf("the agent refuses the injected env: %v", err)
	}
	window := ""
	if !got.Window.IsZero() {
		window = got.Window.Format(time.RFC3339)
	}
	if got.Mode.String() != st.Mode || got.Key != st.Key || window != st.Window ||
		got.Manual != (st.WindowSource == "manual") || got.Indexed != indexed || (indexed && got.JobIndex != 2) ||
		got.Cluster != goldenOptions().ClusterName || got.JobName != jobName || got.JobUID != "job-uid" ||
		got.PodName != pod.Name || got.DatabaseURL != dsn ||
		!slices.Equal(got.AppContainers, st.Containers) || got.RestartPolicy != finalExitsUnder(out) {
		t.Errorf("the agent reads %+v; the webhook meant %+v (indexed %v)", got, st, indexed)
	}
}

// finalExitsUnder is the restartPolicy the agent must be told: the pod's,
// unless a container's own policy may restart it after a failure.
func finalExitsUnder(job *batchv1.Job) string {
	for _, c := range job.Spec.Template.Spec.Containers {
		if c.RestartPolicy != nil || len(c.RestartPolicyRules) > 0 {
			return ""
		}
	}
	return string(job.Spec.Template.Spec.RestartPolicy)
}

// downward reads a field path of the pod, as the kubelet's downward API does
// for the paths the sidecar uses.
func downward(t testing.TB, pod *corev1.Pod, path string) string {
	t.Helper()
	if path == "metadata.name" {
		return pod.Name
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels['": pod.Labels, "metadata.annotations['": pod.Annotations} {
		if rest, ok := strings.CutPrefix(path, prefix); ok {
			if key, ok := strings.CutSuffix(rest, "']"); ok {
				return m[key]
			}
		}
	}
	t.Fatalf("field path %q is not one the sidecar should use", path)
	return ""
}

// errCase builds a CronJob and its controller's Job for the error table.
func errCase(annotations map[string]string, edit func(cj *batchv1.CronJob, job *batchv1.Job)) (*batchv1.CronJob, *batchv1.Job) {
	tick := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "report", Annotations: annotations},
		Spec: batchv1.CronJobSpec{Schedule: "0 * * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "app", Image: "registry.example/report", Command: []string{"/app/report"}}}}}}}},
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "report-29936880",
			Annotations: map[string]string{"batch.kubernetes.io/cronjob-scheduled-timestamp": tick.Format(time.RFC3339)}},
		Spec: *cj.Spec.JobTemplate.Spec.DeepCopy(),
	}
	if edit != nil {
		edit(cj, job)
	}
	return cj, job
}

func TestInjectRefuses(t *testing.T) {
	t.Parallel()
	schedule := map[string]string{contract.AnnotationMode: "schedule"}
	tests := []struct {
		name        string
		annotations map[string]string
		edit        func(cj *batchv1.CronJob, job *batchv1.Job)
		opts        *Options
		entrypoints map[string][]string
		wantIs      error
		want        []string // substrings of the error, all required
	}{
		{
			name: "every bad annotation is listed with its value and the allowed values",
			annotations: map[string]string{contract.AnnotationMode: "sometimes", contract.AnnotationLeaseTTL: "5",
				contract.AnnotationCatchup: "-1m", contract.AnnotationKey: "Bad_Key", "dislock.io/standbye": "true"},
			want: []string{
				`annotation dislock.io/mode: "sometimes" is not a valid mode (want "schedule", "lease" or "schedule,lease")`,
				`annotation dislock.io/lease-ttl: "5" is not a duration (want e.g. "30s", between 5s and 1h)`,
				`annotation dislock.io/catchup: "-1m"`,
				`annotation dislock.io/key: "Bad_Key"`,
				`did you mean dislock.io/standby?`,
			},
		},
		{
			name:        "a key without a mode is an error, not an unlocked Job",
			annotations: map[string]string{contract.AnnotationKey: "report"},
			want:        []string{"annotation dislock.io/mode is required"},
		},
		{
			name:        "a container without a command or a known entrypoint is named with the fix",
			annotations: schedule,
			edit: func(cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.Containers = append(job.Spec.Template.Spec.Containers,
					corev1.Container{Name: "bare", Image: "registry.example/bare"},
					corev1.Container{Name: "resolved", Image: "registry.example/resolved"})
			},
			entrypoints: map[string][]string{"resolved": {"/run"}, "bare": {}},
			want:        []string{`container "bare" has no command`, "set the container's command, or the annotation dislock.io/entrypoint"},
		},
		{
			name:        "annotation and entrypoint problems are reported together",
			annotations: map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationLeaseTTL: "2h"},
			edit: func(cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.Containers[0].Command = nil
			},
			want: []string{`annotation dislock.io/lease-ttl: "2h" is out of range`, `container "app" has no command`},
		},
		{
			name:        "a bad dislock.io/entrypoint is reported once, not per container",
			annotations: map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationEntrypoint: "/app/run"},
			edit: func(cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.Containers[0].Command = nil
			},
			want: []string{`annotation dislock.io/entrypoint: "/app/run" is not a JSON array of strings`},
		},
		{
			name:        "no dislock annotation anywhere: not opted in",
			annotations: map[string]string{"team.example/owner": "billing"},
			wantIs:      ErrNotOptedIn,
		},
		{
			name:        "only a status annotation, copied into the template by hand, is refused rather than trusted",
			annotations: nil,
			edit: func(cj *batchv1.CronJob, job *batchv1.Job) {
				job.Annotations[StatusAnnotation] = `{"version":1}`
			},
			wantIs: ErrForgedInjection,
			want: []string{"the Job looks injected by dislock (metadata.annotations[dislock.io/status] is set)",
				"neither it nor its CronJob opts in", "remove the dislock-agent init container and the dislock.io/status annotation"},
		},
		{
			name:        "a status annotation without the sidecar does not switch the lock off",
			annotations: schedule,
			edit: func(cj *batchv1.CronJob, job *batchv1.Job) {
				job.Annotations[StatusAnnotation] = `{"version":1,"mode":"schedule"}`
			},
			wantIs: ErrForgedInjection,
			want: []string{"the Job looks injected by dislock (metadata.annotations[dislock.io/status] is set)",
				`spec.template.spec.containers[0].command[0] is "/app/report"; dislock injects "/dislock/bin/dislock-agent"`,
				"remove the dislock-agent init container and the dislock.io/status annotation"},
		},
		{
			name:        "a malformed scheduled timestamp is not guessed around",
			annotations: schedule,
			edit: func(cj *batchv1.CronJob, job *batchv1.Job) {
				job.Annotations["batch.kubernetes.io/cronjob-scheduled-timestamp"] = "yesterday"
			},
			want: []string{`batch.kubernetes.io/cronjob-scheduled-timestamp: "yesterday" is not an RFC 3339 time`},
		},
		{
			name:        "schedule mode with @every, whose ticks differ per cluster",
			annotations: schedule,
			edit:        func(cj *batchv1.CronJob, job *batchv1.Job) { cj.Spec.Schedule = "@every 5m" },
			want:        []string{"CronJob report: spec.schedule", "@every is not supported"},
		},
		{
			name:        "no window from the Job, and a schedule that cannot give one",
			annotations: map[string]string{contract.AnnotationMode: "lease"},
			edit: func(cj *batchv1.CronJob, job *batchv1.Job) {
				delete(job.Annotations, "batch.kubernetes.io/cronjob-scheduled-timestamp")
				job.Name = "report-by-hand"
				cj.Spec.TimeZone = ptr.To("Mars/Olympus")
			},
			want: []string{`job "report-by-hand" has no window`, `unknown time zone "Mars/Olympus"`},
		},
		{
			name:        "parallel pods of a Job that is not Indexed would share one window",
			annotations: schedule,
			edit: func(cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Parallelism, job.Spec.Completions = ptr.To(int32(3)), ptr.To(int32(5))
			},
			want: []string{
				"spec.parallelism: Invalid value: 3: dislock claims one window per Job, so of 3 pods only one would run (set completionMode: Indexed so that each completion index claims its own window, or set parallelism to 1)",
				"spec.completions: Invalid value: 5:", "or set completions to 1",
			},
		},
		{
			name:        "a mount where dislock mounts its volume",
			annotations: schedule,
			edit: func(cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/dislock/data"}}
			},
			want: []string{`spec.template.spec.containers[0].volumeMounts[0].mountPath: Invalid value: "/dislock/data"`},
		},
		{
			name:        "names dislock adds, taken by hand, are a forged injection",
			annotations: schedule,
			edit: func(cj *batchv1.CronJob, job *batchv1.Job) {
				pod := &job.Spec.Template.Spec
				pod.Volumes = []corev1.Volume{{Name: "dislock"}}
				pod.InitContainers = []corev1.Container{{Name: "dislock-agent", Image: "x"}}
				pod.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/dislock/data"}}
			},
			wantIs: ErrForgedInjection,
			want: []string{
				`the Job looks injected by dislock (spec.template.spec.initContainers[0] is named "dislock-agent")`,
				`spec.template.spec.containers[0].volumeMounts[0].mountPath: Invalid value: "/dislock/data"`,
			},
		},
		{
			name:        "a DISLOCK_ variable of the user's is a forged injection",
			annotations: schedule,
			edit: func(cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "DISLOCK_SHARED_DIR", Value: "/tmp"}}
			},
			wantIs: ErrForgedInjection,
			want: []string{
				`(spec.template.spec.containers[0].env[DISLOCK_SHARED_DIR] is set), but dislock never injects that`,
			},
		},
		{
			name:        "a manual selector leaves the agent without its Job's UID",
			annotations: schedule,
			edit:        func(cj *batchv1.CronJob, job *batchv1.Job) { job.Spec.ManualSelector = ptr.To(true) },
			want:        []string{"spec.manualSelector", "batch.kubernetes.io/controller-uid"},
		},
		{
			name:        "options without a cluster name or image",
			annotations: schedule,
			opts:        &Options{},
			want:        []string{"invalid webhook options", "--cluster-name", "--agent-image"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cj, job := errCase(tc.annotations, tc.edit)
			opts := goldenOptions()
			if tc.opts != nil {
				opts = *tc.opts
			}
			out, st, err := Inject(job, cj, opts, tc.entrypoints)
			if err == nil {
				t.Fatalf("Inject succeeded; want an error\n%s", injecttest.ToYAML(t, out))
			}
			if out != nil || st != nil {
				t.Error("Inject returned a Job or status with its error")
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("error %v, want %v", err, tc.wantIs)
			}
			if tc.wantIs == nil && errors.Is(err, ErrNotOptedIn) {
				t.Errorf("error %v is ErrNotOptedIn", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
			if strings.Contains(err.Error(), `"resolved"`) {
				t.Errorf("error names a container whose entrypoint was resolved:\n%v", err)
			}
		})
	}
}

func TestInjectNilArguments(t *testing.T) {
	t.Parallel()
	cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, nil)
	if _, _, err := Inject(nil, cj, goldenOptions(), nil); err == nil {
		t.Error("nil job: no error")
	}
	if _, _, err := Inject(job, nil, goldenOptions(), nil); err == nil {
		t.Error("nil cronJob: no error")
	}
	if _, err := NeedsEntrypoint(nil, cj); err == nil {
		t.Error("NeedsEntrypoint(nil job): no error")
	}
}

// A Job admitted with generateName has no name yet; the sidecar then reads
// it from the label the Job controller puts on its pods.
func TestInjectJobWithoutName(t *testing.T) {
	t.Parallel()
	cj, job := errCase(map[string]string{contract.AnnotationMode: "lease"}, func(cj *batchv1.CronJob, job *batchv1.Job) {
		job.Name, job.GenerateName = "", "report-"
	})
	out, _, err := Inject(job, cj, goldenOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	env := out.Spec.Template.Spec.InitContainers[0].Env
	i := slices.IndexFunc(env, func(e corev1.EnvVar) bool { return e.Name == contract.EnvJobName })
	if i < 0 || env[i].ValueFrom == nil || env[i].ValueFrom.FieldRef.FieldPath != "metadata.labels['batch.kubernetes.io/job-name']" {
		t.Errorf("DISLOCK_JOB_NAME = %+v, want the job-name label", env)
	}
}

// The agent is told the preferred cluster and its grace, the default when
// the CronJob names none.
func TestInjectPassesThePreferredClusterToTheAgent(t *testing.T) {
	t.Parallel()
	for grace, want := range map[string]string{"": "30s", "20s": "20s"} {
		annotations := map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationPreferCluster: "dc-a"}
		if grace != "" {
			annotations[contract.AnnotationPreferGrace] = grace
		}
		cj, job := errCase(annotations, nil)
		out, _, err := Inject(job, cj, goldenOptions(), nil)
		if err != nil {
			t.Fatal(err)
		}
		env := map[string]string{}
		for _, e := range out.Spec.Template.Spec.InitContainers[0].Env {
			env[e.Name] = e.Value
		}
		if env[contract.EnvPreferCluster] != "dc-a" || env[contract.EnvPreferGrace] != want {
			t.Errorf("prefer-grace %q: %s=%q, %s=%q; want dc-a and %s", grace,
				contract.EnvPreferCluster, env[contract.EnvPreferCluster], contract.EnvPreferGrace, env[contract.EnvPreferGrace], want)
		}
	}
}

func TestInjectUsesOptions(t *testing.T) {
	t.Parallel()
	cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, nil)
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("20Mi")}}
	opts := Options{ClusterName: "dc-b", AgentImage: "registry.example/dislock:v2", AgentImagePullPolicy: corev1.PullAlways,
		DBSecretName: "pg", DBSecretKey: "dsn", AgentResources: res, InstallTimeout: 90 * time.Second}
	out, _, err := Inject(job, cj, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := out.Spec.Template.Spec.InitContainers[0]
	if sc.Image != opts.AgentImage || sc.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image %s %s", sc.Image, sc.ImagePullPolicy)
	}
	if !reflect.DeepEqual(sc.Resources, res) {
		t.Errorf("resources %+v, want %+v", sc.Resources, res)
	}
	if hook := sc.Lifecycle.PostStart.Exec.Command; !slices.Contains(hook, "--wait=1m30s") {
		t.Errorf("postStart hook %q, want it to wait up to the install timeout, 1m30s", hook)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range sc.Env {
		env[e.Name] = e
	}
	if env[contract.EnvCluster].Value != "dc-b" {
		t.Errorf("%s = %q", contract.EnvCluster, env[contract.EnvCluster].Value)
	}
	if ref := env[contract.EnvDatabaseURL].ValueFrom.SecretKeyRef; ref.Name != "pg" || ref.Key != "dsn" {
		t.Errorf("%s from %s/%s, want pg/dsn", contract.EnvDatabaseURL, ref.Name, ref.Key)
	}
	// The caller's options must not share memory with the Job.
	opts.AgentResources.Requests[corev1.ResourceMemory] = resource.MustParse("1Gi")
	if q := sc.Resources.Requests[corev1.ResourceMemory]; q.String() != "20Mi" {
		t.Errorf("the Job's resources changed with the options: %s", q.String())
	}
}

func TestNeedsEntrypoint(t *testing.T) {
	t.Parallel()
	bare := func(cj *batchv1.CronJob, job *batchv1.Job) {
		job.Spec.Template.Spec.Containers = append(job.Spec.Template.Spec.Containers,
			corev1.Container{Name: "bare", Image: "registry.example/bare"})
	}
	tests := []struct {
		name        string
		annotations map[string]string
		edit        func(cj *batchv1.CronJob, job *batchv1.Job)
		want        []string
		wantErr     error
	}{
		{name: "every container has a command", annotations: map[string]string{contract.AnnotationMode: "lease"}},
		{name: "a container without a command", annotations: map[string]string{contract.AnnotationMode: "lease"}, edit: bare, want: []string{"bare"}},
		{name: "dislock.io/entrypoint covers it", edit: bare,
			annotations: map[string]string{contract.AnnotationMode: "lease", contract.AnnotationEntrypoint: `["/run"]`}},
		{name: "a bad dislock.io/entrypoint: Inject will refuse anyway", edit: bare,
			annotations: map[string]string{contract.AnnotationMode: "lease", contract.AnnotationEntrypoint: `nope`}},
		{name: "not opted in", edit: bare, wantErr: ErrNotOptedIn},
		{name: "already injected", annotations: map[string]string{contract.AnnotationMode: "lease"}, edit: func(cj *batchv1.CronJob, job *batchv1.Job) {
			bare(cj, job)
			job.Annotations[StatusAnnotation] = "{}"
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cj, job := errCase(tc.annotations, tc.edit)
			got, err := NeedsEntrypoint(job, cj)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			var names []string
			for _, c := range got {
				names = append(names, c.Name)
			}
			if !slices.Equal(names, tc.want) {
				t.Errorf("got %q, want %q", names, tc.want)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts Options
		want []string
	}{
		{name: "defaults fill everything but the cluster and image", opts: goldenOptions()},
		{name: "nothing set: both required fields named", opts: Options{},
			want: []string{"cluster name is empty", "agent image is empty"}},
		{name: "every bad field at once", opts: Options{ClusterName: "dc/a", AgentImage: "bad image",
			AgentImagePullPolicy: "Sometimes", DBSecretName: "DB_Secret", DBSecretKey: "a/b",
			AgentResources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}},
			InstallTimeout: -1},
			want: []string{`cluster name "dc/a"`, `agent image "bad image"`, `pull policy "Sometimes"`,
				`secret name "DB_Secret"`, `secret key "a/b"`, "memory request 128Mi is above its limit 64Mi",
				"install timeout -1ns is below 1s"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.opts.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate: no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestWithDefaults(t *testing.T) {
	t.Parallel()
	o := Options{}.WithDefaults()
	if o.DBSecretName != DefaultDBSecretName || o.DBSecretKey != DefaultDBSecretKey ||
		o.AgentImagePullPolicy != DefaultAgentImagePullPolicy ||
		o.InstallTimeout != DefaultInstallTimeout ||
		!reflect.DeepEqual(o.AgentResources, DefaultAgentResources()) {
		t.Errorf("defaults not applied: %+v", o)
	}
}

// The sidecar's gate is a postStart hook that waits for the installed agent
// binary only, which takes seconds: its bound is slack for a slow node, not
// a bound on how long a pod may wait for its decision (a standby waits for
// the owner's whole run, and the wrapper, not the gate, waits for the
// decision). There is no startupProbe, whose budget would restart a waiting
// sidecar and whose period would delay every app start.
func TestDefaultInstallGateOnlyWaitsForTheInstall(t *testing.T) {
	t.Parallel()
	if DefaultInstallTimeout < time.Minute || DefaultInstallTimeout > 10*time.Minute {
		t.Errorf("install timeout %s: want minutes, enough to copy a binary on a slow node and no more", DefaultInstallTimeout)
	}
	cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationStandby: "true"}, nil)
	out, _, err := Inject(job, cj, goldenOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := out.Spec.Template.Spec.InitContainers[0]
	if sc.StartupProbe != nil || sc.LivenessProbe != nil || sc.ReadinessProbe != nil {
		t.Errorf("the sidecar has a probe: startup %+v, liveness %+v, readiness %+v", sc.StartupProbe, sc.LivenessProbe, sc.ReadinessProbe)
	}
	want := []string{"dislock-agent", "probe", "--wait=5m0s"}
	if sc.Lifecycle == nil || sc.Lifecycle.PostStart == nil || sc.Lifecycle.PostStart.Exec == nil ||
		!slices.Equal(sc.Lifecycle.PostStart.Exec.Command, want) || sc.Lifecycle.PreStop != nil {
		t.Errorf("lifecycle %+v, want only a postStart exec of %q", sc.Lifecycle, want)
	}
}

// --pod-labels and --pod-annotations are checked as the API server would
// check them on a pod, at start, each bad entry named with its flag; keys in
// dislock.io/ are dislock's own.
func TestPodLabelsAndAnnotationsAreCheckedAtStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		labels, ann string
		want        []string
	}{
		{name: "good ones", labels: "egress.corp/pgbouncer=allow,team=payments", ann: "a.example.com/note=x=y,sidecar.istio.io/inject=false"},
		{name: "an empty label value is a value", labels: "selected="},
		{name: "a label value with a space", labels: "team=pay ments",
			want: []string{`--pod-labels entry "team=pay ments"`, "a valid label must be"}},
		{name: "a bad label key", labels: "-team=payments",
			want: []string{`--pod-labels entry "-team=payments"`, "name part must consist of"}},
		{name: "a dislock label", labels: "dislock.io/injected=false",
			want: []string{`--pod-labels entry "dislock.io/injected=false"`, "dislock.io/ prefix are dislock's own"}},
		{name: "a dislock annotation", ann: "dislock.io/mode=lease",
			want: []string{`--pod-annotations entry "dislock.io/mode=lease"`, "dislock's own"}},
		{name: "a bad annotation key", ann: "a b=c",
			want: []string{`--pod-annotations entry "a b=c"`}},
		{name: "every bad entry at once", labels: "x=a b,dislock.io/k=v", ann: "dislock.io/status=x",
			want: []string{`"x=a b"`, `"dislock.io/k=v"`, `"dislock.io/status=x"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := goldenOptions()
			for _, f := range []struct {
				flag, value string
				into        *map[string]string
			}{{"--pod-labels", tc.labels, &opts.PodLabels}, {"--pod-annotations", tc.ann, &opts.PodAnnotations}} {
				if f.value != "" {
					if err := PodMetadataFlag(f.flag, f.into)(f.value); err != nil {
						t.Fatal(err)
					}
				}
			}
			err := opts.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v does not contain %q", err, w)
				}
			}
		})
	}
	t.Run("an entry without '=' is refused naming the flag", func(t *testing.T) {
		t.Parallel()
		var m map[string]string
		err := PodMetadataFlag("--pod-labels", &m)("team=a,tier")
		if err == nil || !strings.Contains(err.Error(), `--pod-labels entry "tier" is not key=value`) {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("the flag may be repeated", func(t *testing.T) {
		t.Parallel()
		var m map[string]string
		for _, v := range []string{"a=1", "b=2,c=x=y"} {
			if err := PodMetadataFlag("--pod-labels", &m)(v); err != nil {
				t.Fatal(err)
			}
		}
		if want := map[string]string{"a": "1", "b": "2", "c": "x=y"}; !maps.Equal(m, want) {
			t.Fatalf("%v, want %v", m, want)
		}
	})
}

// --database-ca-file is read at start: a missing file or one without a PEM
// certificate stops the webhook, naming the flag and the path.
func TestReadDatabaseCA(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(good, tlstest.NewCA(t).CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "ca.der")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadDatabaseCA(good); err != nil || !bytes.Contains(b, []byte("BEGIN CERTIFICATE")) {
		t.Fatalf("a good CA: %q, %v", b, err)
	}
	for _, file := range []string{filepath.Join(dir, "missing.crt"), notPEM} {
		_, err := ReadDatabaseCA(file)
		if err == nil || !strings.Contains(err.Error(), "--database-ca-file "+file) {
			t.Errorf("%s: error %v, want one naming the flag and the path", file, err)
		}
	}
}
