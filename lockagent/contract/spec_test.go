package contract

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseMode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    Mode
		wantErr string // substring; "" = valid
	}{
		{in: "schedule", want: Mode{Schedule: true}},
		{in: "lease", want: Mode{Lease: true}},
		{in: "schedule,lease", want: Mode{Schedule: true, Lease: true}},
		{in: "lease,schedule", want: Mode{Schedule: true, Lease: true}},
		{in: " schedule , lease ", want: Mode{Schedule: true, Lease: true}},
		{in: "", wantErr: `mode is empty (want "schedule", "lease" or "schedule,lease")`},
		{in: "  ", wantErr: "mode is empty"},
		{in: "sometimes", wantErr: `mode "sometimes" is not a valid mode (want "schedule", "lease" or "schedule,lease")`},
		{in: "Schedule", wantErr: "is not a valid mode"},
		{in: "schedule,sometimes", wantErr: `unknown item "sometimes"`},
		{in: "schedule,schedule", wantErr: `names "schedule" twice`},
		{in: "schedule,", wantErr: "has an empty item"},
		{in: "schedule;lease", wantErr: "is not a valid mode"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseMode(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseMode(%q) = %v, %v; want error containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseMode(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
			if again, err := ParseMode(got.String()); err != nil || again != got {
				t.Errorf("ParseMode(%q.String()) = %v, %v", got, again, err)
			}
		})
	}
}

func TestModeString(t *testing.T) {
	t.Parallel()
	for m, want := range map[Mode]string{
		{}:                            "",
		{Schedule: true}:              "schedule",
		{Lease: true}:                 "lease",
		{Schedule: true, Lease: true}: "schedule,lease",
	} {
		if got := m.String(); got != want {
			t.Errorf("%#v.String() = %q, want %q", m, got, want)
		}
	}
}

func TestFromAnnotations(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		annotations map[string]string
		namespace   string
		cronJob     string
		want        Spec
		wantErrs    []string // each must appear in the error; nil = valid
	}{
		{
			name:        "only the mode: everything else defaults",
			annotations: map[string]string{AnnotationMode: "schedule"},
			want:        Spec{Mode: Mode{Schedule: true}, Name: "report", Namespace: "team-a", LeaseTTL: 30 * time.Second, AppStartTimeout: DefaultAppStartTimeout},
		},
		{
			name: "every annotation set",
			annotations: map[string]string{
				AnnotationMode:            "schedule,lease",
				AnnotationKey:             "billing.daily-export",
				AnnotationLeaseTTL:        "2m",
				AnnotationStandby:         "TRUE",
				AnnotationCatchup:         "15m",
				AnnotationAppStartTimeout: "90m",
				AnnotationEntrypoint:      `["/app/run", "--daily"]`,
				AnnotationStatus:          `{"version":1}`,
				"other.io/annotation":     "ignored",
			},
			want: Spec{
				Mode: Mode{Schedule: true, Lease: true}, Name: "billing.daily-export", Namespace: "team-a",
				LeaseTTL: 2 * time.Minute, Standby: true, Catchup: 15 * time.Minute, AppStartTimeout: 90 * time.Minute,
				Entrypoint: []string{"/app/run", "--daily"},
			},
		},
		{
			name:        "surrounding spaces are ignored",
			annotations: map[string]string{AnnotationMode: " lease ", AnnotationKey: " k ", AnnotationLeaseTTL: " 5s ", AnnotationStandby: " false "},
			want:        Spec{Mode: Mode{Lease: true}, Name: "k", Namespace: "team-a", LeaseTTL: 5 * time.Second, AppStartTimeout: DefaultAppStartTimeout},
		},
		{
			name:        "the lease TTL bounds are inclusive",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationLeaseTTL: "1h"},
			want:        Spec{Mode: Mode{Lease: true}, Name: "report", Namespace: "team-a", LeaseTTL: time.Hour, AppStartTimeout: DefaultAppStartTimeout},
		},
		{
			name:        "the issue's example names both problems in one error",
			annotations: map[string]string{AnnotationLeaseTTL: "5", AnnotationMode: "sometimes"},
			wantErrs: []string{
				`annotation dislock.io/mode: "sometimes" is not a valid mode (want "schedule", "lease" or "schedule,lease")`,
				`annotation dislock.io/lease-ttl: "5" is not a duration (want e.g. "30s", between 5s and 1h)`,
			},
		},
		{
			name:        "a missing mode",
			annotations: map[string]string{AnnotationKey: "report"},
			wantErrs:    []string{"annotation dislock.io/mode is required"},
		},
		{
			name:        "an empty mode",
			annotations: map[string]string{AnnotationMode: ""},
			wantErrs:    []string{"annotation dislock.io/mode is empty"},
		},
		{
			name:        "a lease TTL below the minimum",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationLeaseTTL: "4s"},
			wantErrs:    []string{`annotation dislock.io/lease-ttl: "4s" is out of range (want between 5s and 1h)`},
		},
		{
			name:        "a lease TTL above the maximum",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationLeaseTTL: "61m"},
			wantErrs:    []string{`"61m" is out of range`},
		},
		{
			name:        "a key with a slash cannot reach another namespace",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationKey: "other-ns/report"},
			wantErrs:    []string{`annotation dislock.io/key: "other-ns/report" is not a valid name`},
		},
		{
			name:        "a key with capitals",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationKey: "Report"},
			wantErrs:    []string{`"Report" is not a valid name`},
		},
		{
			name:        "a key ending in a dash",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationKey: "report-"},
			wantErrs:    []string{`"report-" is not a valid name`},
		},
		{
			name:        "a key of 254 characters",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationKey: strings.Repeat("a", 254)},
			wantErrs:    []string{"is not a valid name", "..."},
		},
		{
			name:        "an empty key",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationKey: ""},
			wantErrs:    []string{"annotation dislock.io/key is empty"},
		},
		{
			name:        "no key and no CronJob name",
			annotations: map[string]string{AnnotationMode: "lease"},
			cronJob:     "-",
			wantErrs:    []string{"annotation dislock.io/key is required"},
		},
		{
			name:        "standby is exactly true or false",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationStandby: "yes"},
			wantErrs:    []string{`annotation dislock.io/standby: "yes" is not a boolean (want "true" or "false")`},
		},
		{
			name:        "standby is not ParseBool's 1",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationStandby: "1"},
			wantErrs:    []string{`"1" is not a boolean`},
		},
		{
			name:        "standby without schedule mode",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationStandby: "true"},
			wantErrs:    []string{`annotation dislock.io/standby: "true" needs schedule mode`},
		},
		{
			name:        "standby false in lease mode is harmless",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationStandby: "false"},
			want:        Spec{Mode: Mode{Lease: true}, Name: "report", Namespace: "team-a", LeaseTTL: 30 * time.Second, AppStartTimeout: DefaultAppStartTimeout},
		},
		{
			name:        "catchup must be positive",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationCatchup: "0s"},
			wantErrs:    []string{`annotation dislock.io/catchup: "0s" is out of range (want more than 0s and at most 24h)`},
		},
		{
			name:        "catchup of more than a day",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationCatchup: "25h"},
			wantErrs:    []string{`"25h" is out of range`},
		},
		{
			name:        "catchup without a unit",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationCatchup: "10"},
			wantErrs:    []string{`"10" is not a duration (want e.g. "10m"`},
		},
		{
			name:        "missed-after is kept",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationMissedAfter: "2h"},
			want:        Spec{Mode: Mode{Schedule: true}, Name: "report", Namespace: "team-a", LeaseTTL: DefaultLeaseTTL, AppStartTimeout: DefaultAppStartTimeout, MissedAfter: 2 * time.Hour},
		},
		{
			name:        "prefer-cluster alone takes the default grace",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationPreferCluster: " dc-b "},
			want: Spec{Mode: Mode{Schedule: true}, Name: "report", Namespace: "team-a", LeaseTTL: DefaultLeaseTTL, AppStartTimeout: DefaultAppStartTimeout,
				PreferCluster: "dc-b", PreferGrace: DefaultPreferGrace},
		},
		{
			name:        "prefer-cluster with its grace, below catchup and missed-after",
			annotations: map[string]string{AnnotationMode: "schedule,lease", AnnotationPreferCluster: "dc-a", AnnotationPreferGrace: "20s", AnnotationCatchup: "21s", AnnotationMissedAfter: "1m"},
			want: Spec{Mode: Mode{Schedule: true, Lease: true}, Name: "report", Namespace: "team-a", LeaseTTL: DefaultLeaseTTL, AppStartTimeout: DefaultAppStartTimeout,
				Catchup: 21 * time.Second, MissedAfter: time.Minute, PreferCluster: "dc-a", PreferGrace: 20 * time.Second},
		},
		{
			name:        "a prefer-grace without a cluster names the fix",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationPreferGrace: "20s"},
			wantErrs:    []string{`annotation dislock.io/prefer-grace: "20s" needs dislock.io/prefer-cluster (name the cluster to prefer, or remove dislock.io/prefer-grace)`},
		},
		{
			name:        "a prefer-cluster that cannot name a cluster",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationPreferCluster: "dc a"},
			wantErrs:    []string{`annotation dislock.io/prefer-cluster: "dc a" is not a cluster name (want at most 63 printable characters without '/' or spaces, e.g. dc-a): one of the webhooks' --cluster-name`},
		},
		{
			name:        "an empty prefer-cluster",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationPreferCluster: ""},
			wantErrs:    []string{`annotation dislock.io/prefer-cluster is not a cluster name`},
		},
		{
			name:        "a prefer-cluster in lease mode, which has no windows, is refused naming the fix",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationPreferCluster: "dc-a"},
			wantErrs:    []string{`annotation dislock.io/prefer-cluster: "dc-a" needs schedule mode: without windows, a cluster that waits out the grace runs the tick again once the preferred cluster's run ended (set dislock.io/mode to "schedule" or "schedule,lease", or remove dislock.io/prefer-cluster)`},
		},
		{
			name:        "a prefer-grace out of range names the bounds",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationPreferCluster: "dc-a", AnnotationPreferGrace: "11m"},
			wantErrs:    []string{`annotation dislock.io/prefer-grace: "11m" is out of range (want between 1s and 10m)`},
		},
		{
			name:        "a prefer-grace not below catchup",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationPreferCluster: "dc-a", AnnotationPreferGrace: "1m", AnnotationCatchup: "1m"},
			wantErrs:    []string{`annotation dislock.io/prefer-grace: "1m" is not below dislock.io/catchup 1m: every window the preferred cluster leaves would be stale before another cluster may claim it (want a grace below the catchup)`},
		},
		{
			name:        "the default prefer-grace not below catchup says it is the default",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationPreferCluster: "dc-a", AnnotationCatchup: "10s"},
			wantErrs:    []string{`annotation dislock.io/prefer-grace: "30s (the default)" is not below dislock.io/catchup 10s`},
		},
		{
			name:        "a prefer-grace not below missed-after",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationPreferCluster: "dc-a", AnnotationPreferGrace: "2m", AnnotationMissedAfter: "2m"},
			wantErrs:    []string{`annotation dislock.io/prefer-grace: "2m" is not below dislock.io/missed-after 2m: every window the preferred cluster leaves would count as missed`},
		},
		{
			name:        "a missed-after below a minute names the bounds and the fix",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationMissedAfter: "30s"},
			wantErrs:    []string{`annotation dislock.io/missed-after: "30s" is out of range (want e.g. "2h", between 1m and 24h: longer than the Job's retries take)`},
		},
		{
			name:        "a missed-after without a unit",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationMissedAfter: "90"},
			wantErrs:    []string{`annotation dislock.io/missed-after: "90" is not a duration (want e.g. "2h"`},
		},
		{
			name:        "the app-start timeout bounds are inclusive",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationAppStartTimeout: "24h"},
			want:        Spec{Mode: Mode{Schedule: true}, Name: "report", Namespace: "team-a", LeaseTTL: DefaultLeaseTTL, AppStartTimeout: 24 * time.Hour},
		},
		{
			name:        "an app-start timeout below the minimum names the bounds",
			annotations: map[string]string{AnnotationMode: "schedule", AnnotationAppStartTimeout: "10s"},
			wantErrs:    []string{`annotation dislock.io/app-start-timeout: "10s" is out of range (want between 30s and 24h)`},
		},
		{
			name:        "an app-start timeout without a unit",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationAppStartTimeout: "600"},
			wantErrs:    []string{`annotation dislock.io/app-start-timeout: "600" is not a duration (want e.g. "10m", between 30s and 24h)`},
		},
		{
			name:        "an entrypoint that is a string, not an array",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationEntrypoint: "/app/run --daily"},
			wantErrs:    []string{`annotation dislock.io/entrypoint: "/app/run --daily" is not a JSON array of strings`},
		},
		{
			name:        "an entrypoint of null",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationEntrypoint: "null"},
			wantErrs:    []string{"is not a JSON array of strings"},
		},
		{
			name:        "an entrypoint with a number",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationEntrypoint: `["/app/run", 1]`},
			wantErrs:    []string{"annotation dislock.io/entrypoint: `[\"/app/run\", 1]` is not a JSON array of strings"},
		},
		{
			name:        "an empty entrypoint array",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationEntrypoint: "[]"},
			wantErrs:    []string{`"[]" is an empty array`},
		},
		{
			name:        "an entrypoint with an empty string",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationEntrypoint: `["/app/run", ""]`},
			wantErrs:    []string{"has an empty string at index 1"},
		},
		{
			name:        "an entrypoint with trailing garbage",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationEntrypoint: `["/app/run"]x`},
			wantErrs:    []string{"is not a JSON array of strings"},
		},
		{
			name:        "proxy-quit none turns the mesh detection off",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationProxyQuit: " None "},
			want: Spec{Mode: Mode{Lease: true}, Name: "report", Namespace: "team-a", LeaseTTL: DefaultLeaseTTL, AppStartTimeout: DefaultAppStartTimeout,
				ProxyQuit: ProxyQuit{Set: true}},
		},
		{
			name: "proxy-quit lists loopback URLs, spaces around each ignored",
			annotations: map[string]string{AnnotationMode: "lease",
				AnnotationProxyQuit: " http://127.0.0.1:15000/quitquitquit , http://localhost:9901/quit,http://[::1]:4191/shutdown "},
			want: Spec{Mode: Mode{Lease: true}, Name: "report", Namespace: "team-a", LeaseTTL: DefaultLeaseTTL, AppStartTimeout: DefaultAppStartTimeout,
				ProxyQuit: ProxyQuit{Set: true, URLs: []string{"http://127.0.0.1:15000/quitquitquit", "http://localhost:9901/quit", "http://[::1]:4191/shutdown"}}},
		},
		{
			name:        "a proxy-quit URL off the pod's loopback names the value and the fix",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationProxyQuit: "http://10.0.0.7:15020/quitquitquit"},
			wantErrs: []string{`annotation dislock.io/proxy-quit: "http://10.0.0.7:15020/quitquitquit" is not on the pod's loopback ` +
				`(want a loopback http URL with a port, e.g. "http://127.0.0.1:15020/quitquitquit")`},
		},
		{
			name:        "a bad URL in a proxy-quit list is named",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationProxyQuit: "http://127.0.0.1:15020/quitquitquit,https://127.0.0.1:4191/shutdown"},
			wantErrs: []string{`annotation dislock.io/proxy-quit: "http://127.0.0.1:15020/quitquitquit,https://127.0.0.1:4191/shutdown" ` +
				`holds "https://127.0.0.1:4191/shutdown", which is not an http URL (want a loopback http URL with a port`},
		},
		{
			name:        "a proxy-quit URL without a port",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationProxyQuit: "http://localhost/quitquitquit"},
			wantErrs:    []string{`"http://localhost/quitquitquit" has no port`},
		},
		{
			name:        "an empty proxy-quit",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationProxyQuit: " "},
			wantErrs:    []string{`annotation dislock.io/proxy-quit: " " is empty (want "none", or at most 4 comma-separated loopback http URLs with a port`},
		},
		{
			name:        "a proxy-quit with an empty item",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationProxyQuit: "http://127.0.0.1:1/q,"},
			wantErrs:    []string{"has an empty item"},
		},
		{
			name:        "a proxy-quit URL twice",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationProxyQuit: "http://127.0.0.1:1/q, http://127.0.0.1:1/q"},
			wantErrs:    []string{`lists "http://127.0.0.1:1/q" twice`},
		},
		{
			name:        "more proxy-quit URLs than a pod has sidecars",
			annotations: map[string]string{AnnotationMode: "lease", AnnotationProxyQuit: "http://127.0.0.1:1/a,http://127.0.0.1:1/b,http://127.0.0.1:1/c,http://127.0.0.1:1/d,http://127.0.0.1:1/e"},
			wantErrs:    []string{"lists 5 URLs (want"},
		},
		{
			name:        "a misspelt annotation is an error with a suggestion",
			annotations: map[string]string{AnnotationMode: "lease", "dislock.io/leasettl": "30s"},
			wantErrs: []string{
				`annotation dislock.io/leasettl: "30s" is not a dislock annotation (did you mean dislock.io/lease-ttl? known: dislock.io/mode, dislock.io/key, dislock.io/lease-ttl, dislock.io/standby, dislock.io/catchup, dislock.io/missed-after, dislock.io/prefer-cluster, dislock.io/prefer-grace, dislock.io/app-start-timeout, dislock.io/entrypoint, dislock.io/proxy-quit, dislock.io/agent-cpu-request, dislock.io/agent-cpu-limit, dislock.io/agent-memory-request, dislock.io/agent-memory-limit)`,
			},
		},
		{
			name:        "a misspelt mode key is reported next to the missing mode",
			annotations: map[string]string{"dislock.io/mdoe": "schedule"},
			wantErrs:    []string{"annotation dislock.io/mode is required", "dislock.io/mdoe", "did you mean dislock.io/mode?"},
		},
		{
			name:        "an unrelated unknown annotation gets no suggestion",
			annotations: map[string]string{AnnotationMode: "lease", "dislock.io/priority": "high"},
			wantErrs:    []string{`annotation dislock.io/priority: "high" is not a dislock annotation (known: `},
		},
		{
			name:        "an empty namespace",
			annotations: map[string]string{AnnotationMode: "lease"},
			namespace:   "-",
			wantErrs:    []string{`namespace "" is not a valid namespace name`},
		},
		{
			name: "every problem at once",
			annotations: map[string]string{
				AnnotationMode: "lease", AnnotationKey: "A", AnnotationLeaseTTL: "x", AnnotationStandby: "true",
				AnnotationCatchup: "-1m", AnnotationEntrypoint: "[]", "dislock.io/standy": "true",
				AnnotationAppStartTimeout: "forever",
			},
			wantErrs: []string{
				"dislock.io/key:", "dislock.io/lease-ttl:", "dislock.io/standby:", "dislock.io/catchup:",
				"dislock.io/entrypoint:", "dislock.io/standy:", "dislock.io/app-start-timeout:",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ns, cj := "team-a", "report"
			if tt.namespace == "-" {
				ns = ""
			}
			if tt.cronJob == "-" {
				cj = ""
			}
			got, err := FromAnnotations(tt.annotations, ns, cj)
			if tt.wantErrs != nil {
				if err == nil {
					t.Fatalf("FromAnnotations = %+v, want errors %q", got, tt.wantErrs)
				}
				for _, want := range tt.wantErrs {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error does not contain %q:\n%v", want, err)
					}
				}
				if !reflect.DeepEqual(got, Spec{}) {
					t.Errorf("FromAnnotations returned %+v with an error, want the zero Spec", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromAnnotations: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("FromAnnotations =\n%+v\nwant\n%+v", got, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			again, err := FromAnnotations(got.Annotations(), ns, "unrelated")
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Errorf("FromAnnotations(Annotations()) = %+v, %v; want %+v", again, err, got)
			}
		})
	}
}

func TestFieldErrorsListsEachProblem(t *testing.T) {
	t.Parallel()
	_, err := FromAnnotations(map[string]string{
		AnnotationLeaseTTL: "5", AnnotationMode: "sometimes", "dislock.io/x": "",
	}, "team-a", "report")
	fes := FieldErrors(err)
	var got []string
	for _, fe := range fes {
		got = append(got, fe.Annotation)
	}
	want := []string{AnnotationMode, AnnotationLeaseTTL, "dislock.io/x"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("FieldErrors annotations = %q, want %q (all of: %v)", got, want, err)
	}
	if fes[1].Value != "5" || !strings.HasPrefix(fes[1].Problem, "is not a duration") {
		t.Errorf("lease-ttl FieldError = %+v", fes[1])
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Annotation != AnnotationMode {
		t.Errorf("errors.As finds %+v, want the mode error first", fe)
	}
	if FieldErrors(nil) != nil {
		t.Error("FieldErrors(nil) is not empty")
	}
}

func TestEnabled(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		annotations map[string]string
		want        bool
	}{
		{"no annotations", nil, false},
		{"unrelated annotations", map[string]string{"example.com/mode": "schedule"}, false},
		{"the mode", map[string]string{AnnotationMode: "schedule"}, true},
		{"an empty mode still asks for a lock", map[string]string{AnnotationMode: ""}, true},
		{"another dislock annotation without the mode asks for a lock", map[string]string{AnnotationKey: "report"}, true},
		{"a misspelt mode key asks for a lock", map[string]string{"dislock.io/mdoe": "schedule"}, true},
		{"only the webhook's status does not", map[string]string{AnnotationStatus: "{}"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Enabled(tt.annotations); got != tt.want {
				t.Errorf("Enabled(%v) = %v, want %v", tt.annotations, got, tt.want)
			}
		})
	}
}

func TestMergeLetsTheJobTemplateWinKeyByKey(t *testing.T) {
	t.Parallel()
	got := Merge(
		map[string]string{AnnotationMode: "lease", AnnotationKey: "from-cronjob", "example.com/x": "y"},
		map[string]string{AnnotationMode: "schedule", AnnotationStatus: "{}"},
	)
	want := map[string]string{AnnotationMode: "schedule", AnnotationKey: "from-cronjob"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Merge = %v, want %v", got, want)
	}
	if got := Merge(nil, nil); len(got) != 0 {
		t.Errorf("Merge(nil, nil) = %v", got)
	}
}

func TestSpecKey(t *testing.T) {
	t.Parallel()
	s := Spec{Namespace: "team-a", Name: "report"}
	if got := s.Key(); got != "team-a/report" {
		t.Errorf("Key = %q", got)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	good := Spec{Mode: Mode{Schedule: true}, Name: "report", Namespace: "team-a", LeaseTTL: DefaultLeaseTTL, AppStartTimeout: DefaultAppStartTimeout}
	tests := []struct {
		name    string
		change  func(*Spec)
		wantErr string
	}{
		{"a valid spec", func(*Spec) {}, ""},
		{"no mode", func(s *Spec) { s.Mode = Mode{} }, "mode is empty"},
		{"a bad name", func(s *Spec) { s.Name = "a/b" }, `name "a/b"`},
		{"no namespace", func(s *Spec) { s.Namespace = "" }, `namespace ""`},
		{"a zero lease TTL", func(s *Spec) { s.LeaseTTL = 0 }, "lease TTL 0s"},
		{"standby in lease mode", func(s *Spec) { s.Mode, s.Standby = Mode{Lease: true}, true }, "standby needs schedule mode"},
		{"a negative catchup", func(s *Spec) { s.Catchup = -time.Second }, "catchup -1s"},
		{"no app-start timeout", func(s *Spec) { s.AppStartTimeout = 0 }, "app start timeout 0s is out of range (want between 30s and 24h)"},
		{"a preferred cluster", func(s *Spec) { s.PreferCluster, s.PreferGrace = "dc-a", time.Second }, ""},
		{"a prefer grace alone", func(s *Spec) { s.PreferGrace = time.Second }, "prefer grace 1s is set without a preferred cluster"},
		{"a preferred cluster in lease mode", func(s *Spec) { s.Mode, s.PreferCluster, s.PreferGrace = Mode{Lease: true}, "dc-a", time.Second }, `preferred cluster "dc-a" in mode "lease" needs schedule mode`},
		{"a preferred cluster without a grace", func(s *Spec) { s.PreferCluster = "dc-a" }, "prefer grace 0s is out of range (want between 1s and 10m)"},
		{"a preferred cluster with a slash", func(s *Spec) { s.PreferCluster, s.PreferGrace = "dc/a", time.Second }, `preferred cluster "dc/a" is not a cluster name`},
		{"a prefer grace not below catchup", func(s *Spec) { s.PreferCluster, s.PreferGrace, s.Catchup = "dc-a", time.Minute, time.Minute }, "prefer grace 1m0s is not below dislock.io/catchup 1m"},
		{"an empty entrypoint", func(s *Spec) { s.Entrypoint = []string{} }, "empty array"},
		{"an entrypoint with an empty argument", func(s *Spec) { s.Entrypoint = []string{"run", ""} }, "index 1"},
		{"proxy-quit none", func(s *Spec) { s.ProxyQuit = ProxyQuit{Set: true} }, ""},
		{"proxy-quit URLs", func(s *Spec) {
			s.ProxyQuit = ProxyQuit{Set: true, URLs: []string{"http://127.0.0.1:15020/quitquitquit"}}
		}, ""},
		{"proxy-quit URLs not set", func(s *Spec) { s.ProxyQuit = ProxyQuit{URLs: []string{"http://127.0.0.1:15020/quitquitquit"}} }, "given but not set"},
		{"a proxy-quit URL off the loopback", func(s *Spec) { s.ProxyQuit = ProxyQuit{Set: true, URLs: []string{"http://example.com:80/q"}} }, "is not on the pod's loopback"},
		{"a proxy-quit URL that is the word none", func(s *Spec) { s.ProxyQuit = ProxyQuit{Set: true, URLs: []string{"none"}} }, "want plain URLs"},
		{"a proxy-quit URL with a comma", func(s *Spec) {
			s.ProxyQuit = ProxyQuit{Set: true, URLs: []string{"http://127.0.0.1:1/a,http://127.0.0.1:1/b"}}
		}, "want plain URLs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := good
			tt.change(&s)
			err := s.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
