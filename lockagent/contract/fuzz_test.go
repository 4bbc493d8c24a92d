package contract

import (
	"reflect"
	"strings"
	"testing"
)

func FuzzFromAnnotations(f *testing.F) {
	f.Add(uint8(0xff), "schedule,lease", "report", "30s", "true", "10m", `["/app/run"]`, "1h", "dislock.io/status", "{}", "team-a", "report")
	f.Add(uint8(0x01), "sometimes", "", "5", "", "", "", "", "dislock.io/leasettl", "30s", "team-a", "report")
	f.Add(uint8(0x07), "lease", "Report/x", "1h0m0s", "yes", "-1s", "null", "29s", "", "", "", "")
	f.Add(uint8(0x3f), " lease , schedule ", "a.b-c", "5s", "FALSE", "24h", `["a", ""]`, "24h0m0s", "example.com/x", "y", "ns", "-bad")
	f.Add(uint8(0x21), "schedule", "", "", "", "", `["\u0000"]`, "", "dislock.io/", "", "team-a", "report")
	f.Add(uint8(0x81), "schedule", "", "", "", "", "", " 30s ", "dislock.io/app-start-timeout", "10s", "team-a", "report")
	f.Add(uint8(0x80), "lease", "", "", "", "", "", "", "dislock.io/proxy-quit", " http://127.0.0.1:15020/quitquitquit, http://localhost:4191/shutdown", "team-a", "report")
	f.Add(uint8(0x80), "lease", "", "", "", "", "", "", "dislock.io/proxy-quit", "NONE", "team-a", "report")
	f.Add(uint8(0x80), "lease", "", "", "", "", "", "", "dislock.io/proxy-quit", "http://10.0.0.1:15020/quitquitquit,,", "team-a", "report")
	f.Add(uint8(0x90), "schedule", "", "", "", "10s", "", "", "dislock.io/prefer-cluster", " dc-a ", "team-a", "report")
	f.Add(uint8(0x90), "lease", "", "", "", "1h", "", "", "dislock.io/prefer-cluster", "dc-a", "team-a", "report")
	f.Add(uint8(0x80), "schedule", "", "", "", "", "", "", "dislock.io/prefer-grace", "20s", "team-a", "report")
	f.Fuzz(func(t *testing.T, present uint8, mode, key, ttl, standby, catchup, entrypoint, appStart, extraKey, extraValue, namespace, cronJobName string) {
		a := map[string]string{}
		for i, kv := range [][2]string{
			{AnnotationMode, mode}, {AnnotationKey, key}, {AnnotationLeaseTTL, ttl},
			{AnnotationStandby, standby}, {AnnotationCatchup, catchup}, {AnnotationEntrypoint, entrypoint},
			{AnnotationAppStartTimeout, appStart},
		} {
			if present&(1<<i) != 0 {
				a[kv[0]] = kv[1]
			}
		}
		if present&(1<<7) != 0 {
			a[extraKey] = extraValue
		}

		s, err := FromAnnotations(a, namespace, cronJobName)
		if err != nil {
			if !reflect.DeepEqual(s, Spec{}) {
				t.Fatalf("FromAnnotations returned %+v with error %v", s, err)
			}
			for _, fe := range FieldErrors(err) {
				if !strings.HasPrefix(fe.Annotation, Prefix) || fe.Problem == "" || fe.Error() == "" {
					t.Fatalf("malformed FieldError %+v", fe)
				}
			}
			return
		}
		if !Enabled(a) {
			t.Fatalf("FromAnnotations accepted %v, which Enabled says does not ask for dislock", a)
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("FromAnnotations(%v) = %+v, which does not validate: %v", a, s, err)
		}
		if k := s.Key(); k != namespace+"/"+s.Name || strings.Count(k, "/") != 1 {
			t.Fatalf("Key() = %q", k)
		}
		again, err := FromAnnotations(s.Annotations(), namespace, "unrelated")
		if err != nil || !reflect.DeepEqual(again, s) {
			t.Fatalf("re-parsing %v: %+v, %v; want %+v", s.Annotations(), again, err, s)
		}
	})
}

// FuzzParseAgentEnv: ParseAgentEnv never panics; every problem is an
// *EnvError naming a variable, and none shows the database URL; whatever it
// accepts renders, through the pod, back to the same values.
func FuzzParseAgentEnv(f *testing.F) {
	f.Add("schedule,lease", "team-a/report", "2026-12-02T12:00:00Z", "0 * * * *", "Europe/Berlin", "45s", "true", "10m", "1h", "", "dc-a", "report-29936880", "uid-1", "report-29936880-x", "postgres://u:p@h/db", "app", "Never", "http://127.0.0.1:15020/quitquitquit", false)
	f.Add("lease", "team-a/report", "manual", "", "", "", "", "", "", "3", "dc-b", "report-rerun", "uid-2", "pod", "dsn", "", "OnFailure", "", false)
	f.Add("schedule", "team-a/report", "", "", "", "1s", "TRUE", "0s", "1s", "+1", "dc/a", "", "", "a/b", "", "a,b", "Always", "http://[::1]:0/x,https://h:1/", true)
	f.Add(" lease , schedule ", "Team/x", "2026-12-02T13:00:00.5+01:00", "@hourly", "Local", "1h0m0s", "false", "24h", "24h", "007", "dc-a", "j", "u", "p", "d", "x", "", "http://localhost:4191/shutdown", false)
	f.Add("sometimes", "no-namespace", "0001-01-01T00:00:00Z", "* * * * *", "", "30", "yes", "-1s", "soon", "-1", "", "", "", "", "", "", "", "http://u@127.0.0.1:1/#f", false)
	f.Fuzz(func(t *testing.T, mode, key, window, schedule, tz, ttl, standby, catchup, appStart, index, cluster, jobName, jobUID, podName, dsn, apps, restart, quit string, short bool) {
		env := map[string]string{EnvMode: mode, EnvKey: key, EnvWindow: window, EnvSchedule: schedule, EnvTimeZone: tz,
			EnvLeaseTTL: ttl, EnvStandby: standby, EnvCatchup: catchup, EnvAppStartTimeout: appStart, EnvJobIndex: index,
			EnvCluster: cluster, EnvJobName: jobName, EnvJobUID: jobUID, EnvPodName: podName, EnvDatabaseURL: dsn,
			EnvAppContainers: apps, EnvRestartPolicy: restart, EnvProxyQuit: quit}
		opts := ParseOptions{AllowShortTTL: short}
		e, err := ParseAgentEnv(lookup(env), opts)
		if err != nil {
			for _, leaf := range leaves(err) {
				ee, ok := leaf.(*EnvError)
				if !ok || env[ee.Name] != ee.Value && !(ee.Name == EnvDatabaseURL && ee.Value == "") || ee.Problem == "" {
					t.Fatalf("malformed problem %#v", leaf)
				}
				if ee.Name == EnvDatabaseURL && ee.Value != "" {
					t.Fatalf("an error shows the database URL: %v", ee)
				}
			}
			if e.Key != key || e.SharedDir == "" || e.TerminationLog == "" {
				t.Fatalf("on error: %+v", e)
			}
			return
		}
		if e.Manual && !e.Window.IsZero() || !e.Manual && e.Window.IsZero() && e.Schedule == "" {
			t.Fatalf("window %v, manual %v, schedule %q: not one state", e.Window, e.Manual, e.Schedule)
		}
		again, err := ParseAgentEnv(lookup(resolve(t, e.Render(), podOf(e))), opts)
		if err != nil || !sameEnv(again, e) {
			t.Fatalf("round trip of %+v gave %+v, %v", e, again, err)
		}
	})
}

// leaves lists the errors of an errors.Join tree.
func leaves(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leaves(e)...)
		}
		return out
	}
	return []error{err}
}
