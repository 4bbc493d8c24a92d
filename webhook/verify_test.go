package webhook

import (
	"bytes"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/contract"
)

// injectedCase is errCase's Job injected with goldenOptions, and its CronJob.
func injectedCase(t testing.TB, annotations map[string]string) (*batchv1.CronJob, *batchv1.Job) {
	t.Helper()
	cj, job := errCase(annotations, nil)
	out, _, err := Inject(job, cj, goldenOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cj, out
}

func envIndex(t testing.TB, c *corev1.Container, name string) int {
	t.Helper()
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	if i < 0 {
		t.Fatalf("container %s has no %s", c.Name, name)
	}
	return i
}

// Every golden injection, taken apart by strip and injected again, comes back
// byte for byte; and passed to Inject as it is (a reinvocation, or a copy
// made with kubectl get -o yaml | kubectl create -f -) it comes back
// unchanged, through its JSON as the API server sends it.
func TestAnInjectedJobIsItsOwnInjection(t *testing.T) {
	t.Parallel()
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cj, job := readCase(t, filepath.Join(goldenDir, tc.name+".yaml"))
			out, st, err := Inject(job, cj, tc.options(), tc.entrypoints)
			if err != nil {
				t.Fatal(err)
			}
			want := toJSON(t, out)

			stripped, entrypoints := strip(out)
			if mk := injectionMarker(stripped); mk != nil {
				t.Errorf("strip left %s", mk)
			}
			again, st2, err := Inject(stripped, cj, tc.options(), entrypoints)
			if err != nil {
				t.Fatalf("injecting the stripped Job: %v", err)
			}
			if got := toJSON(t, again); !bytes.Equal(got, want) {
				t.Errorf("Inject(strip(Inject(x))) differs from Inject(x):\n%s", lineDiff(string(toYAML(t, out)), string(toYAML(t, again))))
			}
			if st2.Key != st.Key {
				t.Errorf("key %s, want %s", st2.Key, st.Key)
			}

			_, copied := asRequest(t, out)
			kept, _, err := Inject(copied, cj, tc.options(), nil)
			if err != nil {
				t.Fatalf("a copy of the injected Job: %v", err)
			}
			if got := toJSON(t, kept); !bytes.Equal(got, want) {
				t.Errorf("a copy of the injected Job was changed")
			}
		})
	}
}

// A Job that carries an injection dislock would not make for it is refused,
// naming where it differs, whatever was forged.
func TestForgedInjectionsAreRefused(t *testing.T) {
	t.Parallel()
	schedule := map[string]string{contract.AnnotationMode: "schedule"}
	sidecarEnv := func(name, value string) func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
		return func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
			sc := &job.Spec.Template.Spec.InitContainers[0]
			sc.Env[envIndex(t, sc, name)].Value = value
		}
	}
	tests := []struct {
		name string
		edit func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job)
		want string // a substring of the error, naming the field
	}{
		{name: "another team's key in the sidecar", edit: sidecarEnv(contract.EnvKey, "team-b/report"),
			want: `spec.template.spec.initContainers[0].env[DISLOCK_KEY].value is "team-b/report"; dislock injects "team/report"`},
		{name: "another team's key in the sidecar and in the status alike",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				sidecarEnv(contract.EnvKey, "team-b/report")(t, cj, job)
				job.Annotations[StatusAnnotation] = strings.Replace(job.Annotations[StatusAnnotation], `"team/report"`, `"team-b/report"`, 1)
			},
			want: `spec.template.spec.initContainers[0].env[DISLOCK_KEY].value is "team-b/report"`},
		{name: "a status naming another key",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				job.Annotations[StatusAnnotation] = strings.Replace(job.Annotations[StatusAnnotation], `"team/report"`, `"team-b/report"`, 1)
			},
			want: `metadata.annotations[dislock.io/status].key is "team-b/report"; dislock injects "team/report"`},
		{name: "a status that is not JSON",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) { job.Annotations[StatusAnnotation] = "yes" },
			want: `metadata.annotations[dislock.io/status] is "yes"; dislock injects`},
		{name: "another mode in the sidecar", edit: sidecarEnv(contract.EnvMode, "lease"),
			want: `env[DISLOCK_MODE].value is "lease"; dislock injects "schedule"`},
		{name: "another cluster in the sidecar", edit: sidecarEnv(contract.EnvCluster, "dc-b"),
			want: `env[DISLOCK_CLUSTER].value is "dc-b"; dislock injects "dc-a"`},
		{name: "another image",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.InitContainers[0].Image = "evil.example/agent:1"
			},
			want: `spec.template.spec.initContainers[0].image is "evil.example/agent:1"; dislock injects "ghcr.io/dislock/dislock:v0.1.0"`},
		{name: "another team's database Secret",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				sc := &job.Spec.Template.Spec.InitContainers[0]
				sc.Env[envIndex(t, sc, contract.EnvDatabaseURL)].ValueFrom.SecretKeyRef.Name = "team-b-db"
			},
			want: `env[DISLOCK_DATABASE_URL].valueFrom.secretKeyRef.name is "team-b-db"; dislock injects "dislock-db"`},
		{name: "a database URL written into the Job",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				sc := &job.Spec.Template.Spec.InitContainers[0]
				sc.Env[envIndex(t, sc, contract.EnvDatabaseURL)] = corev1.EnvVar{Name: contract.EnvDatabaseURL, Value: "postgres://owner@pg/dislock"}
			},
			want: `env[DISLOCK_DATABASE_URL].value is "postgres://owner@pg/dislock"; dislock injects nothing there`},
		{name: "an extra variable on the sidecar",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				sc := &job.Spec.Template.Spec.InitContainers[0]
				sc.Env = append(sc.Env, corev1.EnvVar{Name: contract.EnvSharedDir, Value: "/tmp"})
			},
			want: `spec.template.spec.initContainers[0].env[DISLOCK_SHARED_DIR] is {"name":"DISLOCK_SHARED_DIR", …}; dislock injects nothing there`},
		{name: "another command in the sidecar",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.InitContainers[0].Command = []string{"sh", "-c", "sleep infinity"}
			},
			want: `spec.template.spec.initContainers[0].command[0] is "sh"; dislock injects "dislock-agent"`},
		{name: "a privileged sidecar",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.InitContainers[0].SecurityContext.Privileged = ptr.To(true)
			},
			want: `spec.template.spec.initContainers[0].securityContext.privileged is true; dislock injects false`},
		{name: "no sidecar, the rest of the injection kept",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.InitContainers = nil
			},
			want: `spec.template.spec.initContainers[0] is not set; dislock injects {"name":"dislock-agent", …}`},
		{name: "the sidecar after an init container of the user's",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				pod := &job.Spec.Template.Spec
				pod.InitContainers = append([]corev1.Container{{Name: "fetch", Image: "fetch"}}, pod.InitContainers...)
			},
			want: `spec.template.spec.initContainers[1] is named "dislock-agent" too, which dislock never injects`},
		{name: "a second sidecar",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				pod := &job.Spec.Template.Spec
				second := *pod.InitContainers[0].DeepCopy()
				pod.InitContainers = append(pod.InitContainers, second)
			},
			want: `spec.template.spec.initContainers[1] is named "dislock-agent" too, which dislock never injects`},
		{name: "an extra init container with another team's key",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				pod := &job.Spec.Template.Spec
				pod.InitContainers = append(pod.InitContainers, corev1.Container{Name: "helper", Image: "ghcr.io/dislock/dislock:v0.1.0",
					Args: []string{"agent"}, Env: []corev1.EnvVar{{Name: contract.EnvKey, Value: "team-b/report"}}})
			},
			want: `spec.template.spec.initContainers[1].env[DISLOCK_KEY] is set too, which dislock never injects`},
		{name: "an app command without the wrapper",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.Containers[0].Command = []string{"/app/report"}
			},
			want: `spec.template.spec.containers[0].command[0] is "/app/report"; dislock injects "/dislock/bin/dislock-agent"`},
		{name: "a wrapper pointed at another directory",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.Containers[0].Command = []string{"/dislock/bin/dislock-agent", "exec", "--shared-dir", "/tmp", "--", "/app/report"}
			},
			want: `spec.template.spec.containers[0].command[0] runs dislock-agent too, which dislock never injects`},
		{name: "a wrapper that runs the agent",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				c := &job.Spec.Template.Spec.Containers[0]
				c.Command = append(slices.Clone(WrapperPrefix), "dislock-agent", "agent")
			},
			want: `spec.template.spec.containers[0].command[3] runs dislock-agent too`},
		{name: "an extra app container without the wrapper",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				pod := &job.Spec.Template.Spec
				pod.Containers = append(pod.Containers, corev1.Container{Name: "extra", Image: "busybox", Command: []string{"/bin/sh", "-c", "run anyway"}})
			},
			want: `spec.template.spec.containers[1].command[0] is "/bin/sh"; dislock injects "/dislock/bin/dislock-agent"`},
		{name: "an app container without the shared volume",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.Containers[0].VolumeMounts = nil
			},
			want: `spec.template.spec.containers[0].volumeMounts[0] is not set; dislock injects {"name":"dislock", …}`},
		{name: "the shared volume on the node",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/dislock"}}
			},
			want: `spec.template.spec.volumes[0].emptyDir.sizeLimit is not set; dislock injects "64Mi"`},
		{name: "the injection of a CronJob that does not opt in",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) { cj.Annotations = nil },
			want: `neither it nor its CronJob opts in to dislock`},
		{name: "a sidecar in a Job of a CronJob that does not opt in, without a status",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				cj.Annotations = nil
				delete(job.Annotations, StatusAnnotation)
			},
			want: `(spec.template.spec.initContainers[0] is named "dislock-agent"), but neither it nor its CronJob opts in`},
		{name: "the Job of an Indexed CronJob made not Indexed",
			edit: func(t testing.TB, cj *batchv1.CronJob, job *batchv1.Job) {
				job.Spec.Template.Spec.InitContainers[0].Env = append(job.Spec.Template.Spec.InitContainers[0].Env,
					corev1.EnvVar{Name: contract.EnvJobIndex, ValueFrom: fieldRef(contract.FieldJobCompletionIndex)})
			},
			want: `env[DISLOCK_JOB_INDEX] is {"name":"DISLOCK_JOB_INDEX", …}; dislock injects nothing there`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cj, job := injectedCase(t, schedule)
			tc.edit(t, cj, job)
			out, st, err := Inject(job, cj, goldenOptions(), nil)
			if err == nil {
				t.Fatalf("Inject accepted the forged Job:\n%s", toYAML(t, out))
			}
			if out != nil || st != nil {
				t.Error("a Job or status returned with an error")
			}
			if !errors.Is(err, ErrForgedInjection) {
				t.Errorf("error is not ErrForgedInjection: %v", err)
			}
			for _, w := range []string{tc.want, "the Job looks injected by dislock (",
				"remove the dislock-agent init container and the dislock.io/status annotation", "and let the webhook inject"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

// A Job injected by an older dislock differs from what this one injects, so
// it is refused like any other injection the webhook did not make for it.
func TestAnOlderInjectionIsRefused(t *testing.T) {
	t.Parallel()
	cj, job := readCase(t, "testdata/verify/injected-by-an-older-webhook.yaml")
	_, _, err := Inject(job, cj, goldenOptions(), nil)
	if !errors.Is(err, ErrForgedInjection) || !strings.Contains(err.Error(), `spec.template.spec.initContainers[0].env[8].name is "DISLOCK_CLUSTER"; dislock injects "DISLOCK_APP_START_TIMEOUT"`) {
		t.Fatalf("error %v", err)
	}
}

// The injection now adds dislock.io/injected to the pod template's
// labels. A mutating webhook ordered after dislock that sets the template's
// labels as a whole (a JSON patch "add /spec/template/metadata/labels",
// the shape the mesh test used before this change) drops it; on
// reinvocation dislock finds its own injection changed. Before this change
// that edit passed (the test was rewritten to add the label "next to
// dislock's own label" instead).
func TestALaterWebhookThatSetsTheTemplateLabelsGetsTheInjectedLabelBack(t *testing.T) {
	cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, nil)
	out, _, _, err := InjectInNamespace(job, cj, nil, goldenOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out.Spec.Template.Labels = map[string]string{"sidecar.istio.io/inject": "true"}
	again, _, _, err := InjectInNamespace(out, cj, nil, goldenOptions(), nil)
	if err != nil {
		t.Errorf("a later webhook replacing the pod template's labels gets the Job refused on reinvocation (every Job of the CronJob, in this cluster): %v", err)
		return
	}
	if again.Spec.Template.Labels[InjectedLabel] != InjectedLabelValue {
		t.Errorf("after the reinvocation the pod template has no %s: its pods are never handled by the outcome controller", InjectedLabel)
	}
}

// The Jobs strip gives back carry nothing of the injection, and
// NeedsEntrypoint asks for nothing for an injected Job: its wrapped commands
// say what the entrypoints were.
func TestStrip(t *testing.T) {
	t.Parallel()
	cj, job := errCase(map[string]string{contract.AnnotationMode: "lease"}, func(cj *batchv1.CronJob, job *batchv1.Job) {
		pod := &job.Spec.Template.Spec
		pod.InitContainers = []corev1.Container{{Name: "fetch", Image: "fetch"}}
		pod.Volumes = []corev1.Volume{{Name: "scratch"}}
		pod.Containers = append(pod.Containers, corev1.Container{Name: "bare", Image: "bare", Args: []string{"--x"}})
		// Left as Inject sets it: strip cannot tell a chosen policy from the one Inject chose.
		job.Spec.PodReplacementPolicy = ptr.To(batchv1.Failed)
	})
	out, _, err := Inject(job, cj, goldenOptions(), map[string][]string{"bare": {}})
	if err != nil {
		t.Fatal(err)
	}
	if need, err := NeedsEntrypoint(out, cj); len(need) != 0 || err != nil {
		t.Errorf("NeedsEntrypoint(injected) = %v, %v", need, err)
	}
	got, entrypoints := strip(out)
	if !bytes.Equal(toJSON(t, got), toJSON(t, job)) {
		t.Errorf("strip(Inject(job)) is not job:\n%s", lineDiff(string(toYAML(t, job)), string(toYAML(t, got))))
	}
	if !slices.Equal(entrypoints["app"], []string{"/app/report"}) || entrypoints["bare"] == nil || len(entrypoints["bare"]) != 0 {
		t.Errorf("entrypoints %q", entrypoints)
	}
}

// However its annotations are spelt, a Job's lock key is in the Job's own
// namespace: "<namespace>/<name>" with a name that holds no '/', in the
// status, in DISLOCK_KEY and as the agent reads it.
func TestTheKeyIsAlwaysInTheJobsNamespace(t *testing.T) {
	t.Parallel()
	values := []struct {
		key    string
		wantOK string // the name part when accepted; "" when refused
	}{
		{key: "billing", wantOK: "billing"},
		{key: "  billing\t", wantOK: "billing"},
		{key: "a..b", wantOK: "a..b"},
		{key: "team-b.report", wantOK: "team-b.report"},
		{key: strings.Repeat("a", 253), wantOK: strings.Repeat("a", 253)},
		{key: "team-b/report"},
		{key: "/team-b/report"},
		{key: "../team-b/report"},
		{key: "team/../team-b/report"},
		{key: ".."},
		{key: "."},
		{key: "report/"},
		{key: "team-b\\report"},
		{key: "team-b%2Freport"},
		{key: "team-b\u2215report"}, // division slash
		{key: "team-b\uff0freport"}, // fullwidth solidus
		{key: "team-b\u2044report"}, // fraction slash
		{key: "\uff52\uff45\uff50\uff4f\uff52\uff54"},
		{key: "re\u200bport"},
		{key: "report\n", wantOK: "report"}, // surrounding spaces are ignored
		{key: "re port"},
		{key: "Report"},
		{key: "team-b:report"},
		{key: strings.Repeat("a", 254)},
		{key: strings.Repeat("a/", 200)},
		{key: ""},
		{key: "   "},
	}
	for _, v := range values {
		for _, where := range []string{"CronJob", "job template"} {
			t.Run(where+" "+shown(v.key), func(t *testing.T) {
				t.Parallel()
				cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule,lease"}, nil)
				target := cj.Annotations
				if where == "job template" {
					// The controller copies the template's annotations onto the Job.
					target = job.Annotations
					cj.Annotations[contract.AnnotationKey] = "billing"
				}
				target[contract.AnnotationKey] = v.key
				out, st, err := Inject(job, cj, goldenOptions(), nil)
				if v.wantOK == "" {
					if err == nil {
						t.Fatalf("key %q accepted as %s", v.key, st.Key)
					}
					if !strings.Contains(err.Error(), "annotation dislock.io/key") {
						t.Errorf("the error does not name dislock.io/key: %v", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				checkKey(t, out, st, "team")
				if st.Key != "team/"+v.wantOK {
					t.Errorf("key %s, want team/%s", st.Key, v.wantOK)
				}
			})
		}
	}

	t.Run("a Job whose CronJob is in another namespace is refused", func(t *testing.T) {
		t.Parallel()
		cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, nil)
		cj.Namespace = "team-b"
		if _, _, err := Inject(job, cj, goldenOptions(), nil); err == nil || !strings.Contains(err.Error(), `the Job's namespace "team" is not its CronJob's namespace "team-b"`) {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("a Job admitted without a namespace takes its CronJob's", func(t *testing.T) {
		t.Parallel()
		cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, nil)
		job.Namespace = ""
		out, st, err := Inject(job, cj, goldenOptions(), nil)
		if err != nil {
			t.Fatal(err)
		}
		checkKey(t, out, st, "team")
	})
	t.Run("a CronJob name that is no lock name is refused, not used", func(t *testing.T) {
		t.Parallel()
		cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, nil)
		cj.Name = "team-b/report"
		if _, st, err := Inject(job, cj, goldenOptions(), nil); err == nil {
			t.Fatalf("accepted as %s", st.Key)
		}
	})
}

// checkKey checks that an injected Job's key is in namespace ns, the same
// in the status and in DISLOCK_KEY, and that the agent reads that
// namespace from it.
func checkKey(t testing.TB, out *batchv1.Job, st *Status, ns string) {
	t.Helper()
	name, ok := strings.CutPrefix(st.Key, ns+"/")
	if !ok || name == "" || strings.Contains(name, "/") {
		t.Fatalf("key %q is not %s/<name>", st.Key, ns)
	}
	var sidecars int
	for _, c := range out.Spec.Template.Spec.InitContainers {
		if c.Name != SidecarName {
			continue
		}
		sidecars++
		env := c.Env[envIndex(t, &c, contract.EnvKey)]
		if env.Value != st.Key || env.ValueFrom != nil {
			t.Errorf("DISLOCK_KEY %+v, status key %s", env, st.Key)
		}
		if got := (contract.AgentEnv{Key: env.Value}).Namespace(); got != ns {
			t.Errorf("the agent reads namespace %q from %q", got, env.Value)
		}
	}
	if sidecars != 1 {
		t.Errorf("%d sidecars", sidecars)
	}
}

// The database CA's volume and mount and the webhook's pod labels and
// annotations are part of the injection verify expects: a changed CA
// volume or mount is refused naming it; a label or annotation a later
// webhook dropped is put back, and a value the template holds is the
// author's and stays.
func TestVerifyHoldsTheDatabaseCAAndPodMetadata(t *testing.T) {
	t.Parallel()
	opts := goldenOptions()
	withDatabaseCAAndPodMetadata(&opts)
	schedule := map[string]string{contract.AnnotationMode: "schedule"}
	cj, job := errCase(schedule, nil)
	injected, _, err := Inject(job, cj, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	caVolume := func(j *batchv1.Job) *corev1.Volume {
		vs := j.Spec.Template.Spec.Volumes
		i := slices.IndexFunc(vs, func(v corev1.Volume) bool { return v.Name == DatabaseCAVolumeName })
		if i < 0 {
			t.Fatalf("no %s volume in %v", DatabaseCAVolumeName, vs)
		}
		return &vs[i]
	}
	for _, tc := range []struct {
		name string
		edit func(job *batchv1.Job)
		want string
	}{
		{name: "the CA mount taken off the sidecar",
			edit: func(job *batchv1.Job) {
				sc := &job.Spec.Template.Spec.InitContainers[0]
				sc.VolumeMounts = sc.VolumeMounts[:1]
			},
			want: "spec.template.spec.initContainers[0].volumeMounts[1] is not set; dislock injects"},
		{name: "the CA read from another Secret",
			edit: func(job *batchv1.Job) { caVolume(job).Secret.SecretName = "other-db" },
			want: `secretName is "other-db"; dislock injects "dislock-db"`},
		{name: "the CA volume made writable by mode",
			edit: func(job *batchv1.Job) { caVolume(job).Secret.DefaultMode = ptr.To(int32(0o666)) },
			want: "spec.template.spec.volumes"},
		{name: "the CA mounted into an app container too",
			edit: func(job *batchv1.Job) {
				c := &job.Spec.Template.Spec.Containers[0]
				c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: DatabaseCAVolumeName, MountPath: "/ca"})
			},
			want: "spec.template.spec.containers[0].volumeMounts"},
	} {
		t.Run(tc.name+" is refused", func(t *testing.T) {
			t.Parallel()
			forged := injected.DeepCopy()
			tc.edit(forged)
			_, _, err := Inject(forged, cj, opts, nil)
			if !errors.Is(err, ErrForgedInjection) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrForgedInjection naming %q", err, tc.want)
			}
		})
	}
	t.Run("dropped labels and annotations are put back, a changed value stays", func(t *testing.T) {
		t.Parallel()
		dropped := injected.DeepCopy()
		dropped.Spec.Template.Labels = map[string]string{"team": "payments"}
		dropped.Spec.Template.Annotations = nil
		got, _, err := Inject(dropped, cj, opts, nil)
		if err != nil {
			t.Fatal(err)
		}
		wantLabels := map[string]string{InjectedLabel: InjectedLabelValue, "egress.corp/pgbouncer": "allow", "team": "payments"}
		if !maps.Equal(got.Spec.Template.Labels, wantLabels) {
			t.Errorf("labels %v, want %v", got.Spec.Template.Labels, wantLabels)
		}
		if got.Spec.Template.Annotations["sidecar.istio.io/inject"] != "false" {
			t.Errorf("annotations %v: the mesh annotation was not put back", got.Spec.Template.Annotations)
		}
	})
}

// During a rolling upgrade that adds or removes --database-ca-file, one
// replica may be asked again about a Job the other injected (reinvocation,
// or a copied Job). It refuses it, as it refuses one injected with another
// agent image: the Job's creation fails and the CronJob controller retries
// it, to be injected afresh by whichever replica answers.
func TestAnInjectionWithAnotherCASettingIsRefused(t *testing.T) {
	t.Parallel()
	withCA := goldenOptions()
	withCA.DatabaseCA = testCA
	for _, tc := range []struct {
		name       string
		made, seen Options
	}{
		{"injected with the CA, verified without", withCA, goldenOptions()},
		{"injected without the CA, verified with", goldenOptions(), withCA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, nil)
			out, _, err := Inject(job, cj, tc.made, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = Inject(out, cj, tc.seen, nil)
			if !errors.Is(err, ErrForgedInjection) || !strings.Contains(err.Error(), "volumeMounts[1]") {
				t.Fatalf("error %v, want ErrForgedInjection naming the sidecar's CA mount", err)
			}
		})
	}
}

// A forged injection made by a tenant against a webhook without a CA,
// adding a CA-shaped volume (of any Secret) and its mount to the sidecar,
// is not trusted.
func TestAForgedCAVolumeWithoutTheCAIsRefused(t *testing.T) {
	t.Parallel()
	opts := goldenOptions()
	cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, nil)
	out, _, err := Inject(job, cj, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{opts.DBSecretName, "another-teams-db"} {
		forged := out.DeepCopy()
		pod := &forged.Spec.Template.Spec
		n := len(pod.Volumes)
		pod.Volumes = append(pod.Volumes[:n-1:n-1], databaseCAVolume(secret), pod.Volumes[n-1])
		pod.InitContainers[0].VolumeMounts = append(pod.InitContainers[0].VolumeMounts,
			corev1.VolumeMount{Name: DatabaseCAVolumeName, MountPath: DatabaseCADir, ReadOnly: true})
		if _, _, err := Inject(forged, cj, opts, nil); !errors.Is(err, ErrForgedInjection) {
			t.Errorf("forged CA volume of Secret %q: %v, want ErrForgedInjection", secret, err)
		}
	}
}

// A volume of the user's named like the CA's is left alone by strip and
// refused, naming it, when the webhook adds its own.
func TestAUserVolumeNamedLikeTheCAVolume(t *testing.T) {
	t.Parallel()
	// The name is dislock's with or without a CA: a user's volume of that
	// name in the CA's shape would be taken for the injected one when a
	// reinvocation strips the injection.
	caShaped := databaseCAVolume(goldenOptions().DBSecretName)
	for _, v := range []corev1.Volume{
		{Name: DatabaseCAVolumeName, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		caShaped,
	} {
		cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, func(cj *batchv1.CronJob, job *batchv1.Job) {
			job.Spec.Template.Spec.Volumes = []corev1.Volume{v}
		})
		withCA := goldenOptions()
		withCA.DatabaseCA = testCA
		for name, opts := range map[string]Options{"without a CA": goldenOptions(), "with a CA": withCA} {
			_, _, err := Inject(job, cj, opts, nil)
			if err == nil || !strings.Contains(err.Error(), "spec.template.spec.volumes[0].name") || !strings.Contains(err.Error(), "rename this volume") {
				t.Errorf("%s, a %s volume: error %v, want one naming the volume", name, volumeKind(v), err)
			}
		}
	}
}

// An app container may not mount the CA's volume: it is the sidecar's.
func TestAnAppContainerCannotMountTheCAVolume(t *testing.T) {
	t.Parallel()
	cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, func(cj *batchv1.CronJob, job *batchv1.Job) {
		c := &job.Spec.Template.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: DatabaseCAVolumeName, MountPath: "/ca"})
	})
	withCA := goldenOptions()
	withCA.DatabaseCA = testCA
	_, _, err := Inject(job, cj, withCA, nil)
	if err == nil || !strings.Contains(err.Error(), "spec.template.spec.containers[0].volumeMounts[0].name") || !strings.Contains(err.Error(), "sidecar only") {
		t.Fatalf("error %v, want one naming the mount", err)
	}
}

func volumeKind(v corev1.Volume) string {
	if v.Secret != nil {
		return "CA-shaped secret"
	}
	return "emptyDir"
}
