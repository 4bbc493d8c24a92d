package contract

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/dislock/dislock/lockagent/window"
)

// AgentEnv is the sidecar's environment as values. The webhook fills it from
// a Spec and the Job and renders it with Render; the agent reads it back with
// ParseAgentEnv. Those two are the only places that spell or read a
// variable, so the webhook can never write what the agent refuses, and both
// sides hold values to the same bounds.
type AgentEnv struct {
	Mode Mode
	// Key is the effective lock key, "<namespace>/<name>".
	Key string
	// Window is the window start (UTC) the Job names. It is zero for a
	// manual run, and when the agent computes the window from Schedule and
	// TimeZone at database time (the webhook has no database clock).
	Window time.Time
	// Manual marks a run created by hand from the CronJob: no schedule
	// tick, so no schedule lock; the lease is still honoured.
	Manual   bool
	Schedule string // the CronJob's spec.schedule
	TimeZone string // the CronJob's spec.timeZone, "" when unset
	LeaseTTL time.Duration
	Standby  bool
	Catchup  time.Duration // 0: no limit
	// MissedAfter is the CronJob's dislock.io/missed-after, 0 when unset;
	// the agent records it in its view of the job, which the missed-window
	// detection reads.
	MissedAfter time.Duration
	// PreferCluster is the CronJob's dislock.io/prefer-cluster, "" when
	// unset; PreferGrace its grace (0 when unset). A pod of another
	// cluster claims a window only from its start + PreferGrace, by the
	// database's clock.
	PreferCluster string
	PreferGrace   time.Duration
	// AppStartTimeout bounds the time from a "run" decision to the first
	// wrapper starting its app; after it the claim is given up.
	AppStartTimeout time.Duration
	// Indexed is set for a pod of an Indexed Job, which claims one window
	// per completion index; JobIndex is then its index.
	Indexed  bool
	JobIndex int
	// Completions is an Indexed Job's spec.completions (0: not Indexed,
	// or not known).
	Completions int
	// AppContainers names the pod's app containers (each wrapper's
	// DISLOCK_CONTAINER_NAME). The agent waits for every one of them to
	// start before the app-start timeout, and may record a success as soon
	// as every one of them succeeded. Empty: not known (a pod run by hand);
	// the first wrapper to start counts.
	AppContainers []string
	// RestartPolicy is the pod's restartPolicy: RestartNever or
	// RestartOnFailure, "" when unknown. Under Never a container's exit is
	// final, so the agent may record a failure as soon as every app
	// container ended, instead of when the kubelet stops it.
	RestartPolicy string
	// ProxyQuit are the quit endpoints of the pod's classic (non-native)
	// mesh sidecars, loopback http URLs. Such a sidecar is a regular
	// container that never exits by itself, so the pod would never end:
	// once every app container ended for good (and the outcome is
	// recorded), the agent POSTs to each. Needs AppContainers.
	ProxyQuit []string

	// The parts of the lock owner: the data centre (the webhook's
	// --cluster-name) and the pod's Job, the Job's UID and the pod.
	Cluster string
	JobName string
	JobUID  string
	PodName string

	// DatabaseURL is the PostgreSQL DSN. It never appears in an error.
	DatabaseURL string
	// SharedDir and TerminationLog default to DefaultSharedDir and
	// DefaultTerminationLog.
	SharedDir      string
	TerminationLog string
}

// Namespace is the namespace part of Key: the namespace of the CronJob, and
// the one whose rows the database lets the tenant role touch.
func (e AgentEnv) Namespace() string {
	ns, _, _ := strings.Cut(e.Key, "/")
	return ns
}

// Where the sidecar's pod finds the facts the webhook cannot know when it
// admits the Job. These are Kubernetes names, not packages: the agent links
// this package and no Kubernetes code.
const (
	// LabelJobUID is put on every pod of a Job by the Job controller, valued
	// with the Job's UID. An admitted Job has no UID yet, and the downward
	// API cannot read a pod's ownerReferences, so the sidecar reads its
	// Job's UID from this label of its own pod.
	LabelJobUID = "batch.kubernetes.io/controller-uid"
	// LabelJobName is set alongside LabelJobUID; it names the Job when the
	// Job itself is admitted without a name (generateName).
	LabelJobName = "batch.kubernetes.io/job-name"
	// AnnotationJobCompletionIndex is put on every pod of an Indexed Job by
	// the Job controller: the pod's completion index.
	AnnotationJobCompletionIndex = "batch.kubernetes.io/job-completion-index"

	// Downward-API field paths of the pod-level variables.
	FieldPodName            = "metadata.name"
	FieldJobUID             = "metadata.labels['" + LabelJobUID + "']"
	FieldJobName            = "metadata.labels['" + LabelJobName + "']"
	FieldJobCompletionIndex = "metadata.annotations['" + AnnotationJobCompletionIndex + "']"
)

// EnvVar is one variable of the sidecar's environment as the webhook sets
// it, in terms that need no Kubernetes types: a literal Value; a field of the
// pod, read through the downward API (FieldPath); or the database URL, from
// the namespace's database Secret (FromDatabaseSecret). At most one of
// FieldPath and FromDatabaseSecret is set; with neither, Value is the value,
// possibly empty.
type EnvVar struct {
	Name               string
	Value              string
	FieldPath          string
	FromDatabaseSecret bool
}

// Render spells e as the variables the webhook sets on the sidecar, always
// in the same order. e must be what ParseAgentEnv accepts, with Window set or
// Manual set or a Schedule to compute the window from; the round trip
// through the pod then gives e back.
//
// The facts only the pod knows are rendered as references the kubelet
// resolves, whatever e holds for them: DISLOCK_POD_NAME from the pod's name;
// DISLOCK_JOB_UID from LabelJobUID; DISLOCK_JOB_NAME is e.JobName, or from
// LabelJobName when e.JobName is empty (a Job admitted with generateName);
// DISLOCK_JOB_INDEX, for an Indexed Job only, from the pod's completion-index
// annotation, since each pod of the Job has its own; and DISLOCK_DATABASE_URL
// from the database Secret, so that no Job spec holds the credentials.
// DISLOCK_SHARED_DIR and DISLOCK_TERMINATION_LOG are rendered only when they
// differ from their defaults.
func (e AgentEnv) Render() []EnvVar {
	catchup := ""
	if e.Catchup != 0 {
		catchup = shortDuration(e.Catchup)
	}
	vars := []EnvVar{
		{Name: EnvMode, Value: e.Mode.String()},
		{Name: EnvKey, Value: e.Key},
		{Name: EnvWindow, Value: e.renderWindow()},
		{Name: EnvSchedule, Value: e.Schedule},
		{Name: EnvTimeZone, Value: e.TimeZone},
		{Name: EnvLeaseTTL, Value: shortDuration(e.LeaseTTL)},
		{Name: EnvStandby, Value: strconv.FormatBool(e.Standby)},
		{Name: EnvCatchup, Value: catchup},
		{Name: EnvAppStartTimeout, Value: shortDuration(e.AppStartTimeout)},
		{Name: EnvCluster, Value: e.Cluster},
	}
	if len(e.AppContainers) > 0 {
		vars = append(vars, EnvVar{Name: EnvAppContainers, Value: strings.Join(e.AppContainers, ",")})
	}
	if e.RestartPolicy != "" {
		vars = append(vars, EnvVar{Name: EnvRestartPolicy, Value: e.RestartPolicy})
	}
	if e.MissedAfter != 0 {
		vars = append(vars, EnvVar{Name: EnvMissedAfter, Value: shortDuration(e.MissedAfter)})
	}
	if e.PreferCluster != "" {
		vars = append(vars, EnvVar{Name: EnvPreferCluster, Value: e.PreferCluster},
			EnvVar{Name: EnvPreferGrace, Value: shortDuration(e.PreferGrace)})
	}
	if len(e.ProxyQuit) > 0 {
		vars = append(vars, EnvVar{Name: EnvProxyQuit, Value: strings.Join(e.ProxyQuit, ",")})
	}
	if e.JobName != "" {
		vars = append(vars, EnvVar{Name: EnvJobName, Value: e.JobName})
	} else {
		vars = append(vars, EnvVar{Name: EnvJobName, FieldPath: FieldJobName})
	}
	vars = append(vars,
		EnvVar{Name: EnvJobUID, FieldPath: FieldJobUID},
		EnvVar{Name: EnvPodName, FieldPath: FieldPodName})
	if e.Indexed {
		vars = append(vars, EnvVar{Name: EnvJobIndex, FieldPath: FieldJobCompletionIndex})
		if e.Completions > 0 {
			vars = append(vars, EnvVar{Name: EnvCompletions, Value: strconv.Itoa(e.Completions)})
		}
	}
	vars = append(vars, EnvVar{Name: EnvDatabaseURL, FromDatabaseSecret: true})
	if e.SharedDir != "" && e.SharedDir != DefaultSharedDir {
		vars = append(vars, EnvVar{Name: EnvSharedDir, Value: e.SharedDir})
	}
	if e.TerminationLog != "" && e.TerminationLog != DefaultTerminationLog {
		vars = append(vars, EnvVar{Name: EnvTerminationLog, Value: e.TerminationLog})
	}
	return vars
}

func (e AgentEnv) renderWindow() string {
	switch {
	case e.Manual:
		return WindowManual
	case e.Window.IsZero():
		return ""
	}
	return e.Window.UTC().Format(time.RFC3339Nano)
}

// MaxCompletions is the most completions Kubernetes allows an Indexed Job.
const MaxCompletions = 100000

// ParseOptions adjust ParseAgentEnv.
type ParseOptions struct {
	// AllowShortTTL lowers the floor of DISLOCK_LEASE_TTL, and of
	// DISLOCK_APP_START_TIMEOUT (which bounds a claim the same way), to
	// MinTestDuration, so that tests of expiry and takeover take seconds.
	// Test only: the agent sets it from its hidden --test-allow-short-ttl
	// flag. In production a TTL that short would have the heartbeat hammer
	// the database and leave the safety margin less than a scheduling hiccup.
	AllowShortTTL bool
}

// MinTestDuration is the floor of the lease TTL and the app-start timeout
// under ParseOptions.AllowShortTTL.
const MinTestDuration = time.Second

// EnvError is one bad variable of the sidecar's environment: its name, its
// value, and what is wrong with it, phrased to read after the value and to
// end with the fix.
type EnvError struct {
	Name    string
	Value   string // "" when empty or unset; never the database URL
	Problem string
}

// Error formats as `DISLOCK_LEASE_TTL="2s" is out of range (want between 5s
// and 1h)`, or, for an empty value, `DISLOCK_MODE is empty (...)`.
func (e *EnvError) Error() string {
	if e.Value == "" {
		return e.Name + " " + e.Problem
	}
	return e.Name + "=" + quote(e.Value) + " " + e.Problem
}

// Phrases of the env errors.
const (
	wantKey    = `(want <namespace>/<name>, e.g. "team-a/nightly-report")`
	wantWindow = `(want "` + WindowManual + `", an RFC 3339 time such as "2026-12-02T12:00:00Z", or empty to compute it from ` + EnvSchedule + ")"
	wantIndex  = "(want 0, 1, 2, ...: the pod's " + AnnotationJobCompletionIndex + " annotation)"
	wantBool   = `(want "true" or "false")`
	ownerSep   = "contains '/', which separates the parts of a lock owner (want a Kubernetes name)"
)

// ParseAgentEnv reads the sidecar's environment through getenv. It lists
// every problem at once (an errors.Join of *EnvError), each naming the
// variable, its value and the fix. On error the result still holds every
// value that could be read, defaults for the others, and Key, SharedDir and
// TerminationLog as given: the agent still publishes its error decision.
//
// DISLOCK_WINDOW is WindowManual, an RFC 3339 time, or empty; empty with a
// DISLOCK_SCHEDULE means the agent computes the window at database time,
// empty without one is a manual run (what older webhooks wrote for it).
func ParseAgentEnv(getenv func(string) string, opts ParseOptions) (AgentEnv, error) {
	var errs []error
	bad := func(name, value, problem string) {
		errs = append(errs, &EnvError{Name: name, Value: value, Problem: problem})
	}
	e := AgentEnv{
		LeaseTTL:        DefaultLeaseTTL,
		AppStartTimeout: DefaultAppStartTimeout,
		SharedDir:       or(getenv(EnvSharedDir), DefaultSharedDir),
		TerminationLog:  or(getenv(EnvTerminationLog), DefaultTerminationLog),
	}

	v := getenv(EnvMode)
	m, problem := parseMode(v)
	modeKnown := problem == ""
	if modeKnown {
		e.Mode = m
	} else {
		bad(EnvMode, v, problem)
	}

	e.Key = getenv(EnvKey)
	if problem = keyProblem(e.Key); problem != "" {
		bad(EnvKey, e.Key, problem)
	}

	e.Schedule, e.TimeZone = getenv(EnvSchedule), getenv(EnvTimeZone)
	switch w := getenv(EnvWindow); {
	case w == WindowManual:
		e.Manual = true
	case w != "":
		t, err := time.Parse(time.RFC3339, w)
		if err != nil {
			bad(EnvWindow, w, "is not a window "+wantWindow)
			break
		}
		// The range the webhook's window rules accept.
		if err := window.CheckRange(t.UTC()); err != nil {
			bad(EnvWindow, w, err.Error())
			break
		}
		e.Window = t.UTC()
	case e.Schedule == "":
		e.Manual = true
	}

	minTTL, minAppStart := MinLeaseTTL, MinAppStartTimeout
	if opts.AllowShortTTL {
		minTTL, minAppStart = MinTestDuration, MinTestDuration
	}
	if v := getenv(EnvLeaseTTL); v != "" {
		if d, problem := parseDuration(v, minTTL, MaxLeaseTTL, "30s"); problem != "" {
			bad(EnvLeaseTTL, v, problem)
		} else {
			e.LeaseTTL = d
		}
	}

	switch v := getenv(EnvStandby); strings.ToLower(v) {
	case "", "false":
	case "true":
		if modeKnown && !e.Mode.Schedule {
			bad(EnvStandby, v, `needs schedule mode (set `+EnvMode+` to "schedule" or "schedule,lease", or `+EnvStandby+` to "false")`)
		} else {
			e.Standby = true
		}
	default:
		bad(EnvStandby, v, "is not a boolean "+wantBool)
	}

	if v := getenv(EnvCatchup); v != "" {
		d, err := time.ParseDuration(v)
		switch {
		case err != nil:
			bad(EnvCatchup, v, `is not a duration (want e.g. "10m", `+catchupRange+", or empty for no limit)")
		case d <= 0 || d > MaxCatchup:
			bad(EnvCatchup, v, "is out of range (want "+catchupRange+", or empty for no limit)")
		default:
			e.Catchup = d
		}
	}

	if v := getenv(EnvMissedAfter); v != "" {
		if d, problem := parseDuration(v, MinMissedAfter, MaxMissedAfter, "2h"); problem != "" {
			bad(EnvMissedAfter, v, problem)
		} else {
			e.MissedAfter = d
		}
	}

	switch c, g := getenv(EnvPreferCluster), getenv(EnvPreferGrace); {
	case c == "" && g != "":
		bad(EnvPreferGrace, g, "needs "+EnvPreferCluster+" (the cluster to prefer)")
	case c == "":
	case !ValidClusterName(c):
		bad(EnvPreferCluster, c, "is not a cluster name "+wantCluster)
	case modeKnown && !e.Mode.Schedule:
		bad(EnvPreferCluster, c, "needs schedule mode (set "+EnvMode+` to "schedule" or "schedule,lease", or unset `+EnvPreferCluster+")")
	default:
		if d, problem := parseDuration(g, MinPreferGrace, MaxPreferGrace, "20s"); problem != "" {
			bad(EnvPreferGrace, g, problem)
		} else {
			e.PreferCluster, e.PreferGrace = c, d
		}
	}

	if v := getenv(EnvAppStartTimeout); v != "" {
		if d, problem := parseDuration(v, minAppStart, MaxAppStartTimeout, "10m"); problem != "" {
			bad(EnvAppStartTimeout, v, problem)
		} else {
			e.AppStartTimeout = d
		}
	}

	if v := getenv(EnvJobIndex); v != "" {
		// Digits only: Atoi's sign would let "+1" and "1" name one index.
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || strings.TrimLeft(v, "0123456789") != "" {
			bad(EnvJobIndex, v, "is not a completion index "+wantIndex)
		} else {
			e.Indexed, e.JobIndex = true, n
		}
	}

	if v := getenv(EnvCompletions); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxCompletions || strings.TrimLeft(v, "0123456789") != "" {
			bad(EnvCompletions, v, fmt.Sprintf("is not an Indexed Job's completions (want 1 to %d)", MaxCompletions))
		} else {
			e.Completions = n
		}
	}

	if v := getenv(EnvAppContainers); v != "" {
		for _, name := range strings.Split(v, ",") {
			if !containerName(name) {
				bad(EnvAppContainers, v, `is not a comma-separated list of container names (want e.g. "app,report")`)
				e.AppContainers = nil
				break
			}
			e.AppContainers = append(e.AppContainers, name)
		}
	}

	switch v := getenv(EnvRestartPolicy); v {
	case "", RestartNever, RestartOnFailure:
		e.RestartPolicy = v
	default:
		bad(EnvRestartPolicy, v, `is not a Job pod's restartPolicy (want "`+RestartNever+`" or "`+RestartOnFailure+`")`)
	}

	if v := getenv(EnvProxyQuit); v != "" {
		urls := strings.Split(v, ",")
		if len(urls) > MaxProxyQuit {
			bad(EnvProxyQuit, v, fmt.Sprintf("lists %d URLs (want at most %d)", len(urls), MaxProxyQuit))
		} else {
			for _, u := range urls {
				if problem := ProxyQuitProblem(u); problem != "" {
					bad(EnvProxyQuit, v, "holds "+quote(u)+", which "+problem)
					e.ProxyQuit = nil
					break
				}
				e.ProxyQuit = append(e.ProxyQuit, u)
			}
		}
		if len(e.ProxyQuit) > 0 && len(e.AppContainers) == 0 {
			bad(EnvProxyQuit, v, "needs "+EnvAppContainers+" (the agent quits the proxies once every app container ended)")
			e.ProxyQuit = nil
		}
	}

	e.Cluster = getenv(EnvCluster)
	switch {
	case e.Cluster == "":
		bad(EnvCluster, "", "is empty (want this data centre's name, the webhook's --cluster-name, e.g. dc-a)")
	case !ValidClusterName(e.Cluster):
		bad(EnvCluster, e.Cluster, "is not usable in a lock owner "+wantCluster)
	}
	for _, f := range []struct {
		name, source string
		into         *string
	}{
		{EnvJobName, "label " + LabelJobName, &e.JobName},
		{EnvJobUID, "label " + LabelJobUID, &e.JobUID},
		{EnvPodName, "name", &e.PodName},
	} {
		*f.into = getenv(f.name)
		switch {
		case *f.into == "":
			bad(f.name, "", "is empty (the webhook sets it from the pod's "+f.source+"; set it when running the agent by hand)")
		case strings.Contains(*f.into, "/"):
			bad(f.name, *f.into, ownerSep)
		}
	}

	e.DatabaseURL = getenv(EnvDatabaseURL)
	if e.DatabaseURL == "" {
		bad(EnvDatabaseURL, "", "is empty (want a PostgreSQL URL; the webhook sets it from the namespace's database Secret, whose key must hold one)")
	}
	return e, errors.Join(errs...)
}

// The restartPolicy values of a Job's pod.
const (
	RestartNever     = "Never"
	RestartOnFailure = "OnFailure"
)

// MaxProxyQuit bounds EnvProxyQuit: a pod has a mesh sidecar or two.
const MaxProxyQuit = 4

// ProxyQuitProblem says what keeps u from being a mesh sidecar's quit
// endpoint, or "": it must be a plain http URL on the pod's loopback
// (127.0.0.1, [::1] or localhost) with a port, e.g.
// http://127.0.0.1:15020/quitquitquit, at most 256 bytes, without user
// info, query or fragment. The proxies share the pod's network namespace;
// the agent connects only to loopback addresses, whatever "localhost"
// resolves to.
func ProxyQuitProblem(u string) string {
	const want = ` (want a loopback http URL with a port, e.g. "http://127.0.0.1:15020/quitquitquit")`
	if len(u) > 256 {
		return "is longer than 256 bytes" + want
	}
	p, err := url.Parse(u)
	switch {
	case err != nil:
		return "is not a URL" + want
	case p.Scheme != "http":
		return "is not an http URL" + want
	case p.User != nil || p.RawQuery != "" || p.Fragment != "" || p.Opaque != "" || p.ForceQuery:
		return "has user info, a query or a fragment" + want
	case p.Port() == "":
		return "has no port" + want
	}
	switch p.Hostname() {
	case "127.0.0.1", "::1", "localhost":
	default:
		return "is not on the pod's loopback" + want
	}
	if n, err := strconv.Atoi(p.Port()); err != nil || n < 1 || n > 65535 || strings.TrimLeft(p.Port(), "0123456789") != "" {
		return "has no valid port" + want
	}
	return ""
}

// containerName accepts a Kubernetes container name (a DNS-1123 label), which
// is also a plain file name for the started/ and results/ files.
func containerName(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return false
		}
	}
	return true
}

// parseDuration reads a Go duration in [lo, hi], or returns the problem.
func parseDuration(v string, lo, hi time.Duration, example string) (time.Duration, string) {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return 0, `is not a duration (want e.g. "` + example + `", ` + between(lo, hi) + ")"
	case d < lo || d > hi:
		return 0, "is out of range (want " + between(lo, hi) + ")"
	}
	return d, ""
}

// keyProblem checks an effective key. The namespace part is what the
// database's row-level security holds the tenant role to, so it must be a
// namespace name; the name part must only split back the same way. The
// webhook renders only keys FromAnnotations accepted, which are stricter.
func keyProblem(key string) string {
	if key == "" {
		return "is empty " + wantKey
	}
	ns, name, ok := strings.Cut(key, "/")
	switch {
	case !ok || name == "" || strings.Contains(name, "/") || len(name) > 253:
		return "is not <namespace>/<name> " + wantKey
	case !validName(ns):
		return "does not start with a namespace name " + wantKey
	}
	return ""
}

// wantCluster describes a usable cluster name.
const wantCluster = "(want at most 63 printable characters without '/' or spaces, e.g. dc-a)"

// ValidClusterName reports whether name can name a data centre in a lock
// owner "<cluster>/<namespace>/<job>/<job-uid>/<pod>": 1 to 63 printable
// characters, no '/' and no spaces.
func ValidClusterName(name string) bool {
	if name == "" || len(name) > 63 || strings.Contains(name, "/") {
		return false
	}
	for _, r := range name {
		if r < 0x21 || r == 0x7f || r == 0xfffd {
			return false
		}
	}
	return true
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
