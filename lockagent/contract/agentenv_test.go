package contract

import (
	"errors"
	"maps"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testPod is what the kubelet resolves the rendered references against.
type testPod struct {
	name        string
	labels      map[string]string
	annotations map[string]string
	databaseURL string // the database Secret's value
}

// podOf is the pod whose facts are e's: the round trip must give them back.
func podOf(e AgentEnv) testPod {
	p := testPod{name: e.PodName, databaseURL: e.DatabaseURL,
		labels:      map[string]string{LabelJobUID: e.JobUID, LabelJobName: e.JobName},
		annotations: map[string]string{}}
	if e.Indexed {
		p.annotations[AnnotationJobCompletionIndex] = strconv.Itoa(e.JobIndex)
	}
	return p
}

// resolve does what the kubelet does with the rendered variables: literal
// values as they are, downward-API field paths read from the pod (in the
// syntax the API server accepts, so a malformed path fails here), and the
// database URL from the Secret.
func resolve(t testing.TB, vars []EnvVar, pod testPod) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, v := range vars {
		if _, dup := out[v.Name]; dup {
			t.Fatalf("%s rendered twice", v.Name)
		}
		switch {
		case v.FieldPath != "" && v.FromDatabaseSecret:
			t.Fatalf("%s has two sources: %+v", v.Name, v)
		case (v.FieldPath != "" || v.FromDatabaseSecret) && v.Value != "":
			t.Fatalf("%s has a value and a reference: %+v", v.Name, v)
		case v.FromDatabaseSecret:
			out[v.Name] = pod.databaseURL
		case v.FieldPath == "metadata.name":
			out[v.Name] = pod.name
		case v.FieldPath != "":
			var from map[string]string
			rest, ok := strings.CutPrefix(v.FieldPath, "metadata.labels['")
			from = pod.labels
			if !ok {
				rest, ok = strings.CutPrefix(v.FieldPath, "metadata.annotations['")
				from = pod.annotations
			}
			key, found := strings.CutSuffix(rest, "']")
			if !ok || !found || strings.ContainsAny(key, "'[]") {
				t.Fatalf("%s: field path %q is not one the downward API reads", v.Name, v.FieldPath)
			}
			out[v.Name] = from[key]
		default:
			out[v.Name] = v.Value
		}
	}
	return out
}

func lookup(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// sameEnv compares two AgentEnvs, windows as instants.
func sameEnv(a, b AgentEnv) bool {
	if !a.Window.Equal(b.Window) {
		return false
	}
	a.Window, b.Window = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}

// validEnv is a complete environment for a scheduled Job.
func validEnv() AgentEnv {
	return AgentEnv{
		Mode: Mode{Schedule: true, Lease: true}, Key: "team-a/nightly-report",
		Window:   time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC),
		Schedule: "0 * * * *", TimeZone: "Europe/Berlin",
		LeaseTTL: 45 * time.Second, Standby: true, Catchup: 10 * time.Minute, AppStartTimeout: 90 * time.Minute,
		AppContainers: []string{"extract", "load"},
		Cluster:       "dc-a", JobName: "nightly-report-29936880", JobUID: "6f1c2f6e-5b1a-4c52-9d0b-1a2b3c4d5e6f",
		PodName: "nightly-report-29936880-x7k2p", DatabaseURL: "postgres://tenant:secret@pg:6432/dislock",
		SharedDir: DefaultSharedDir, TerminationLog: DefaultTerminationLog,
	}
}

// What the webhook renders, the pod resolves and the agent parses is what
// the webhook meant, for every shape of run.
func TestAgentEnvRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(e *AgentEnv)
		// want is e after the round trip when it differs (a fact only the
		// pod knew).
		want func(e *AgentEnv)
	}{
		{name: "a scheduled window with every option", edit: func(e *AgentEnv) {}},
		{name: "a missed-after", edit: func(e *AgentEnv) { e.MissedAfter = 3 * time.Hour }},
		{name: "a preferred cluster", edit: func(e *AgentEnv) { e.PreferCluster, e.PreferGrace = "dc-b", 20*time.Second }},
		{name: "defaults", edit: func(e *AgentEnv) {
			e.Mode, e.Standby, e.Catchup, e.TimeZone = Mode{Lease: true}, false, 0, ""
			e.LeaseTTL, e.AppStartTimeout = DefaultLeaseTTL, DefaultAppStartTimeout
		}},
		{name: "the window computed by the agent from the schedule", edit: func(e *AgentEnv) { e.Window = time.Time{} }},
		{name: "a manual run keeps its schedule", edit: func(e *AgentEnv) { e.Window, e.Manual = time.Time{}, true }},
		{name: "a manual run of a CronJob without a schedule", edit: func(e *AgentEnv) {
			e.Window, e.Manual, e.Schedule = time.Time{}, true, ""
		}},
		{name: "an Indexed Job's pod reads its own index", edit: func(e *AgentEnv) { e.Indexed, e.JobIndex = true, 7 }},
		{name: "index 0 is an index", edit: func(e *AgentEnv) { e.Indexed, e.JobIndex = true, 0 }},
		{name: "a Job admitted without a name reads it from its pod's label",
			edit: func(e *AgentEnv) { e.JobName = "" },
			want: func(e *AgentEnv) { e.JobName = "nightly-report-from-label" }},
		{name: "durations with several units", edit: func(e *AgentEnv) {
			e.LeaseTTL, e.Catchup, e.AppStartTimeout = 90*time.Second, 25*time.Hour/2, 23*time.Hour+59*time.Minute
		}},
		{name: "the bounds are inclusive", edit: func(e *AgentEnv) {
			e.LeaseTTL, e.Catchup, e.AppStartTimeout = MaxLeaseTTL, MaxCatchup, MinAppStartTimeout
		}},
		{name: "a pod with a classic mesh sidecar", edit: func(e *AgentEnv) {
			e.RestartPolicy = RestartNever
			e.ProxyQuit = []string{"http://127.0.0.1:15020/quitquitquit", "http://localhost:4191/shutdown"}
		}},
		{name: "restartPolicy OnFailure", edit: func(e *AgentEnv) { e.RestartPolicy = RestartOnFailure }},
		{name: "a shared directory and termination log of its own", edit: func(e *AgentEnv) {
			e.SharedDir, e.TerminationLog = "/run/dislock", "/run/dislock/termination"
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := validEnv()
			tc.edit(&e)
			pod := podOf(e)
			want := e
			if tc.want != nil {
				tc.want(&want)
				pod.labels[LabelJobName] = want.JobName
			}
			vars := e.Render()
			got, err := ParseAgentEnv(lookup(resolve(t, vars, pod)), ParseOptions{})
			if err != nil {
				t.Fatalf("parsing the rendered env: %v\n%+v", err, vars)
			}
			if !sameEnv(got, want) {
				t.Fatalf("round trip gave\n%+v\nwant\n%+v\nrendered %+v", got, want, vars)
			}
		})
	}
}

// The webhook can know neither the pod nor the credentials: Render writes
// them as references whatever e holds, never as values.
func TestRenderReadsPodFactsFromThePod(t *testing.T) {
	t.Parallel()
	e := validEnv()
	e.Indexed, e.JobIndex = true, 3
	want := map[string]EnvVar{
		EnvJobUID:      {Name: EnvJobUID, FieldPath: "metadata.labels['batch.kubernetes.io/controller-uid']"},
		EnvPodName:     {Name: EnvPodName, FieldPath: "metadata.name"},
		EnvJobIndex:    {Name: EnvJobIndex, FieldPath: "metadata.annotations['batch.kubernetes.io/job-completion-index']"},
		EnvDatabaseURL: {Name: EnvDatabaseURL, FromDatabaseSecret: true},
	}
	var names []string
	for _, v := range e.Render() {
		names = append(names, v.Name)
		if w, ok := want[v.Name]; ok && v != w {
			t.Errorf("%s rendered as %+v, want %+v", v.Name, v, w)
		}
		if strings.Contains(v.Value, "secret") {
			t.Errorf("%s carries the database URL", v.Name)
		}
	}
	wantNames := []string{EnvMode, EnvKey, EnvWindow, EnvSchedule, EnvTimeZone, EnvLeaseTTL, EnvStandby, EnvCatchup,
		EnvAppStartTimeout, EnvCluster, EnvAppContainers, EnvJobName, EnvJobUID, EnvPodName, EnvJobIndex, EnvDatabaseURL}
	if !reflect.DeepEqual(names, wantNames) {
		t.Errorf("rendered %q, want %q", names, wantNames)
	}
	e.Indexed = false
	for _, v := range e.Render() {
		if v.Name == EnvJobIndex {
			t.Error("a Job that is not Indexed gets DISLOCK_JOB_INDEX")
		}
	}
}

func TestRenderSpellsValuesForReaders(t *testing.T) {
	t.Parallel()
	e := validEnv()
	e.LeaseTTL, e.AppStartTimeout, e.Catchup = time.Hour, 10*time.Minute, 90*time.Minute
	got := map[string]string{}
	for _, v := range e.Render() {
		got[v.Name] = v.Value
	}
	for name, want := range map[string]string{EnvWindow: "2026-12-02T12:00:00Z", EnvLeaseTTL: "1h",
		EnvAppStartTimeout: "10m", EnvCatchup: "1h30m", EnvStandby: "true"} {
		if got[name] != want {
			t.Errorf("%s=%q, want %q", name, got[name], want)
		}
	}
	e.Window, e.Manual = time.Time{}, true
	if w := lookup(resolve(t, e.Render(), podOf(e)))(EnvWindow); w != WindowManual {
		t.Errorf("a manual run renders %s=%q, want %q", EnvWindow, w, WindowManual)
	}
}

func TestParseAgentEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		env   map[string]string // over the rendered validEnv; "" removes
		short bool
		want  func(e *AgentEnv) // the parsed env, from validEnv
		errs  []string          // each must appear; nil = valid
	}{
		{name: "the webhook's explicit manual run", env: map[string]string{EnvWindow: "manual"},
			want: func(e *AgentEnv) { e.Window, e.Manual = time.Time{}, true }},
		{name: "no window and a schedule: the agent computes the window", env: map[string]string{EnvWindow: ""},
			want: func(e *AgentEnv) { e.Window = time.Time{} }},
		{name: "no window and no schedule, as older webhooks wrote manual runs", env: map[string]string{EnvWindow: "", EnvSchedule: ""},
			want: func(e *AgentEnv) { e.Window, e.Manual, e.Schedule = time.Time{}, true, "" }},
		{name: "a window with an offset is the same instant in UTC", env: map[string]string{EnvWindow: "2026-12-02T13:00:00+01:00"},
			want: func(e *AgentEnv) {}},
		{name: "defaults for the optional variables",
			env: map[string]string{EnvLeaseTTL: "", EnvStandby: "", EnvCatchup: "", EnvAppStartTimeout: "", EnvSharedDir: "", EnvTerminationLog: ""},
			want: func(e *AgentEnv) {
				e.LeaseTTL, e.Standby, e.Catchup, e.AppStartTimeout = DefaultLeaseTTL, false, 0, DefaultAppStartTimeout
			}},
		{name: "a preferred cluster and its grace", env: map[string]string{EnvPreferCluster: "dc-b", EnvPreferGrace: "1s"},
			want: func(e *AgentEnv) { e.PreferCluster, e.PreferGrace = "dc-b", time.Second }},
		{name: "a prefer grace without its cluster", env: map[string]string{EnvPreferGrace: "20s"},
			errs: []string{`DISLOCK_PREFER_GRACE="20s" needs DISLOCK_PREFER_CLUSTER (the cluster to prefer)`}},
		{name: "a preferred cluster without its grace", env: map[string]string{EnvPreferCluster: "dc-b"},
			errs: []string{`DISLOCK_PREFER_GRACE is not a duration (want e.g. "20s", between 1s and 10m)`}},
		{name: "a preferred cluster in lease mode", env: map[string]string{EnvMode: "lease", EnvStandby: "false", EnvPreferCluster: "dc-b", EnvPreferGrace: "20s"},
			errs: []string{`DISLOCK_PREFER_CLUSTER="dc-b" needs schedule mode`}},
		{name: "a preferred cluster that names none", env: map[string]string{EnvPreferCluster: "dc/b", EnvPreferGrace: "20s"},
			errs: []string{`DISLOCK_PREFER_CLUSTER="dc/b" is not a cluster name`}},
		{name: "a completion index", env: map[string]string{EnvJobIndex: "12"},
			want: func(e *AgentEnv) { e.Indexed, e.JobIndex = true, 12 }},
		{name: "test flag: a lease TTL and app-start timeout of 1s", short: true,
			env:  map[string]string{EnvLeaseTTL: "1s", EnvAppStartTimeout: "1s"},
			want: func(e *AgentEnv) { e.LeaseTTL, e.AppStartTimeout = time.Second, time.Second }},
		{name: "the same TTL without the test flag is out of the annotation's range",
			env:  map[string]string{EnvLeaseTTL: "2s", EnvAppStartTimeout: "1s"},
			errs: []string{`DISLOCK_LEASE_TTL="2s" is out of range (want between 5s and 1h)`, `DISLOCK_APP_START_TIMEOUT="1s" is out of range (want between 30s and 24h)`}},
		{name: "even the test flag keeps a floor", short: true, env: map[string]string{EnvLeaseTTL: "500ms"},
			errs: []string{`DISLOCK_LEASE_TTL="500ms" is out of range (want between 1s and 1h)`}},
		{name: "app containers that are not container names", env: map[string]string{EnvAppContainers: "app,,../x"},
			errs: []string{`DISLOCK_APP_CONTAINERS="app,,../x" is not a comma-separated list of container names (want e.g. "app,report")`}},
		{name: "a restartPolicy a Job cannot have", env: map[string]string{EnvRestartPolicy: "Always"},
			errs: []string{`DISLOCK_RESTART_POLICY="Always" is not a Job pod's restartPolicy (want "Never" or "OnFailure")`}},
		{name: "a proxy quit URL off the pod's loopback", env: map[string]string{EnvProxyQuit: "http://127.0.0.1:15020/quitquitquit,http://10.0.0.1:80/x"},
			errs: []string{`DISLOCK_PROXY_QUIT="http://127.0.0.1:15020/quitquitquit,http://10.0.0.1:80/x" holds "http://10.0.0.1:80/x", which is not on the pod's loopback (want a loopback http URL with a port, e.g. "http://127.0.0.1:15020/quitquitquit")`}},
		{name: "a proxy quit URL without a port", env: map[string]string{EnvProxyQuit: "http://localhost/quitquitquit"},
			errs: []string{`holds "http://localhost/quitquitquit", which has no port`}},
		{name: "a proxy quit URL over https or with user info", env: map[string]string{EnvProxyQuit: "https://127.0.0.1:15020/q"},
			errs: []string{`which is not an http URL`}},
		{name: "a proxy quit URL with a query", env: map[string]string{EnvProxyQuit: "http://127.0.0.1:15020/q?x=1"},
			errs: []string{`which has user info, a query or a fragment`}},
		{name: "too many proxy quit URLs", env: map[string]string{EnvProxyQuit: "http://[::1]:1/a,http://[::1]:2/a,http://[::1]:3/a,http://[::1]:4/a,http://[::1]:5/a"},
			errs: []string{`lists 5 URLs (want at most 4)`}},
		{name: "proxy quit URLs without the app containers", env: map[string]string{EnvProxyQuit: "http://127.0.0.1:15020/quitquitquit", EnvAppContainers: ""},
			errs: []string{`needs DISLOCK_APP_CONTAINERS`}},
		{name: "a lease TTL above the maximum", env: map[string]string{EnvLeaseTTL: "2h"},
			errs: []string{`DISLOCK_LEASE_TTL="2h" is out of range (want between 5s and 1h)`}},
		{name: "a bad mode and key name the variable, the value and the fix",
			env: map[string]string{EnvMode: "sometimes", EnvKey: "no-namespace"},
			errs: []string{`DISLOCK_MODE="sometimes" is not a valid mode (want "schedule", "lease" or "schedule,lease")`,
				`DISLOCK_KEY="no-namespace" is not <namespace>/<name> (want <namespace>/<name>, e.g. "team-a/nightly-report")`}},
		{name: "a key whose namespace is not a namespace name", env: map[string]string{EnvKey: "Team A/report"},
			errs: []string{`DISLOCK_KEY="Team A/report" does not start with a namespace name`}},
		{name: "a key with a second slash", env: map[string]string{EnvKey: "team-a/other/report"},
			errs: []string{`DISLOCK_KEY="team-a/other/report" is not <namespace>/<name>`}},
		{name: "a window that is not a time", env: map[string]string{EnvWindow: "yesterday"},
			errs: []string{`DISLOCK_WINDOW="yesterday" is not a window (want "manual", an RFC 3339 time such as "2026-12-02T12:00:00Z", or empty to compute it from DISLOCK_SCHEDULE)`}},
		{name: "a window before 2000", env: map[string]string{EnvWindow: "0001-01-01T00:00:00Z"},
			errs: []string{`DISLOCK_WINDOW="0001-01-01T00:00:00Z" is outside the supported range`}},
		{name: "standby in lease mode", env: map[string]string{EnvMode: "lease", EnvStandby: "true"},
			errs: []string{`DISLOCK_STANDBY="true" needs schedule mode`}},
		{name: "the empty owner parts and database URL", env: map[string]string{EnvCluster: "", EnvJobName: "", EnvJobUID: "", EnvPodName: "", EnvDatabaseURL: ""},
			errs: []string{"DISLOCK_CLUSTER is empty (want this data centre's name, the webhook's --cluster-name, e.g. dc-a)",
				"DISLOCK_JOB_NAME is empty (the webhook sets it from the pod's label batch.kubernetes.io/job-name",
				"DISLOCK_JOB_UID is empty (the webhook sets it from the pod's label batch.kubernetes.io/controller-uid",
				"DISLOCK_POD_NAME is empty", "DISLOCK_DATABASE_URL is empty"}},
		{name: "a '/' in an owner part", env: map[string]string{EnvCluster: "dc/a", EnvPodName: "a/b"},
			errs: []string{`DISLOCK_CLUSTER="dc/a" is not usable in a lock owner`, `DISLOCK_POD_NAME="a/b" contains '/'`}},
		{name: "every bad value at once, in the order of the contract",
			env: map[string]string{EnvMode: "", EnvLeaseTTL: "30", EnvStandby: "yes", EnvCatchup: "0s",
				EnvAppStartTimeout: "soon", EnvJobIndex: "+1"},
			errs: []string{"DISLOCK_MODE is empty", `DISLOCK_LEASE_TTL="30" is not a duration (want e.g. "30s", between 5s and 1h)`,
				`DISLOCK_STANDBY="yes" is not a boolean (want "true" or "false")`,
				`DISLOCK_CATCHUP="0s" is out of range (want more than 0s and at most 24h, or empty for no limit)`,
				`DISLOCK_APP_START_TIMEOUT="soon" is not a duration (want e.g. "10m", between 30s and 24h)`,
				`DISLOCK_JOB_INDEX="+1" is not a completion index (want 0, 1, 2, ...`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base := validEnv()
			env := resolve(t, base.Render(), podOf(base))
			for k, v := range tc.env {
				if v == "" {
					delete(env, k)
				} else {
					env[k] = v
				}
			}
			got, err := ParseAgentEnv(lookup(env), ParseOptions{AllowShortTTL: tc.short})
			if tc.errs != nil {
				if err == nil {
					t.Fatalf("ParseAgentEnv = %+v, want errors %q", got, tc.errs)
				}
				msg := err.Error()
				last := -1
				for _, w := range tc.errs {
					i := strings.Index(msg, w)
					if i < 0 {
						t.Errorf("error does not contain %q:\n%v", w, err)
					} else if i < last {
						t.Errorf("%q is listed out of order:\n%v", w, err)
					}
					last = max(last, i)
				}
				if strings.Contains(msg, "secret") {
					t.Errorf("an error shows the database URL:\n%v", err)
				}
				var ee *EnvError
				if !errors.As(err, &ee) || !strings.HasPrefix(ee.Name, "DISLOCK_") || ee.Problem == "" {
					t.Errorf("errors are not *EnvError: %#v", err)
				}
				if got.Key != env[EnvKey] || got.SharedDir == "" || got.TerminationLog == "" {
					t.Errorf("on error the agent still needs its key and directories: %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseAgentEnv: %v", err)
			}
			want := base
			tc.want(&want)
			if !sameEnv(got, want) {
				t.Fatalf("ParseAgentEnv =\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// The sidecar accepts exactly the durations the annotations accept: one set
// of bounds, so a CronJob that passes admission never fails in its pods and
// the pods refuse nothing the webhook could write.
func TestEnvAndAnnotationsShareBounds(t *testing.T) {
	t.Parallel()
	durations := []string{"0s", "1s", "4.999s", "5s", "30s", "59m59s", "1h", "1h0m1s", "29s", "30s", "10m", "24h", "24h0m0.001s", "-5s"}
	for _, d := range durations {
		for _, c := range []struct {
			annotation, env string
			// the setting the value needs beside it, in each spelling
			needs, needsEnv map[string]string
		}{
			{annotation: AnnotationLeaseTTL, env: EnvLeaseTTL},
			{annotation: AnnotationCatchup, env: EnvCatchup},
			{annotation: AnnotationAppStartTimeout, env: EnvAppStartTimeout},
			{annotation: AnnotationMissedAfter, env: EnvMissedAfter},
			{annotation: AnnotationPreferGrace, env: EnvPreferGrace,
				needs: map[string]string{AnnotationPreferCluster: "dc-a"}, needsEnv: map[string]string{EnvPreferCluster: "dc-a"}},
		} {
			annotations := map[string]string{AnnotationMode: "schedule", c.annotation: d}
			maps.Copy(annotations, c.needs)
			_, aerr := FromAnnotations(annotations, "team-a", "report")
			base := validEnv()
			env := resolve(t, base.Render(), podOf(base))
			env[c.env] = d
			maps.Copy(env, c.needsEnv)
			_, eerr := ParseAgentEnv(lookup(env), ParseOptions{})
			if (aerr == nil) != (eerr == nil) {
				t.Errorf("%s: annotation %s says %v, env %s says %v", d, c.annotation, aerr, c.env, eerr)
			}
		}
	}
}

func TestEnvErrorShowsLongValuesShortened(t *testing.T) {
	t.Parallel()
	e := &EnvError{Name: EnvSchedule, Value: strings.Repeat("x", 500), Problem: "is bad"}
	if got := e.Error(); len(got) > 200 || !strings.Contains(got, `..."`) {
		t.Errorf("Error() = %q", got)
	}
}

func TestValidClusterName(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{"dc-a": true, "eu_west.1": true, "": false, "dc/a": false, "dc a": false,
		strings.Repeat("a", 63): true, strings.Repeat("a", 64): false, "dc\x7f": false, "dc\xff": false} {
		if got := ValidClusterName(name); got != want {
			t.Errorf("ValidClusterName(%q) = %v, want %v", name, got, want)
		}
	}
}
