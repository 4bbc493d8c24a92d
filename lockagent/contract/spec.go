// Package contract owns what crosses dislock's process boundaries: the
// dislock.io/ annotations on a CronJob (or its job template), parsed once
// into a validated Spec; the environment the webhook hands the sidecar; and
// the termination record the sidecar leaves for the webhook.
//
// It imports nothing from Kubernetes: the sidecar agent links it, and the
// agent must stay small. The webhook uses the same parser to reject bad
// CronJobs and Jobs, so what is accepted at apply time is exactly what the
// agent can run.
package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Spec is the validated lock request of one CronJob.
type Spec struct {
	Mode      Mode
	Name      string // lock name: dislock.io/key, or the CronJob name
	Namespace string
	LeaseTTL  time.Duration
	Standby   bool
	Catchup   time.Duration // 0 = unset
	// MissedAfter is dislock.io/missed-after; 0 = unset (the default grace).
	MissedAfter time.Duration
	// PreferCluster is dislock.io/prefer-cluster, "" when unset; then
	// PreferGrace is dislock.io/prefer-grace or DefaultPreferGrace, and 0
	// otherwise.
	PreferCluster string
	PreferGrace   time.Duration
	// AppStartTimeout bounds the time from winning a claim to the first app
	// container starting; DefaultAppStartTimeout when unset.
	AppStartTimeout time.Duration
	// Entrypoint is the command to wrap when a container has none; nil = unset.
	Entrypoint []string
	// ProxyQuit is dislock.io/proxy-quit: the zero value (unset) leaves the
	// pod's classic mesh sidecars to the webhook's detection.
	ProxyQuit ProxyQuit
}

// ProxyQuit is what dislock.io/proxy-quit says about the classic
// (non-native) mesh sidecars of a CronJob's pods, which never exit by
// themselves. The zero value is the annotation unset: the webhook detects
// Istio and Linkerd sidecars itself.
type ProxyQuit struct {
	// Set: the annotation is present, and URLs replace the detection. Set
	// with no URLs is ProxyQuitNone: the agent tells no sidecar to quit.
	Set bool
	// URLs are the quit endpoints the agent POSTs to once every app
	// container ended: loopback http URLs with a port, at most
	// MaxProxyQuit, each once.
	URLs []string
}

// String spells p as the annotation's value: "" when unset, ProxyQuitNone,
// or the URLs comma-separated.
func (p ProxyQuit) String() string {
	switch {
	case !p.Set:
		return ""
	case len(p.URLs) == 0:
		return ProxyQuitNone
	}
	return strings.Join(p.URLs, ",")
}

// Key returns the effective lock key, "<namespace>/<name>".
func (s Spec) Key() string { return s.Namespace + "/" + s.Name }

// FieldError is one bad annotation: which, its value, and what is wrong with
// it, phrased to read after the value and to end with the allowed values.
type FieldError struct {
	Annotation string
	Value      string
	Problem    string
}

// maxShownValue bounds how much of a value an error repeats: annotation
// values can be large, and admission messages should stay readable.
const maxShownValue = 120

// Error formats as `annotation dislock.io/lease-ttl: "5" is not a duration
// (want e.g. "30s", between 5s and 1h)`, or, for a missing or empty value,
// `annotation dislock.io/mode is required (...)`.
func (e *FieldError) Error() string {
	if e.Value == "" {
		return "annotation " + e.Annotation + " " + e.Problem
	}
	return "annotation " + e.Annotation + ": " + quote(e.Value) + " " + e.Problem
}

// quote shows a value unambiguously; JSON values are backquoted rather than
// drowned in escapes.
func quote(v string) string {
	if len(v) > maxShownValue {
		cut := maxShownValue
		for cut > 0 && !utf8.RuneStart(v[cut]) {
			cut--
		}
		v = v[:cut] + "..."
	}
	if strings.Contains(v, `"`) && strconv.CanBackquote(v) {
		return "`" + v + "`"
	}
	return strconv.Quote(v)
}

// FieldErrors returns the *FieldError values in an error from FromAnnotations,
// in order, e.g. to turn them into an admission response's causes.
func FieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		if fe, ok := err.(*FieldError); ok {
			out = append(out, fe)
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// Enabled reports whether the annotations ask for dislock: dislock.io/mode is
// present (even empty), or any other dislock.io/ annotation except status is.
// The second half is deliberate: a CronJob with dislock.io/key set and the
// mode key misspelt must be rejected with an error, not run unlocked in every
// cluster.
func Enabled(annotations map[string]string) bool {
	for k := range annotations {
		if strings.HasPrefix(k, Prefix) && k != AnnotationStatus {
			return true
		}
	}
	return false
}

// Merge returns the dislock annotations that apply to a CronJob's Jobs: the
// CronJob's own, overridden key by key by its job template's (which the
// controller copies onto every Job). Only keys under Prefix are kept, never
// AnnotationStatus. Either map may be nil.
func Merge(cronJob, jobTemplate map[string]string) map[string]string {
	out := map[string]string{}
	for _, src := range []map[string]string{cronJob, jobTemplate} {
		for k, v := range src {
			if strings.HasPrefix(k, Prefix) && k != AnnotationStatus {
				out[k] = v
			}
		}
	}
	return out
}

// FromAnnotations parses and validates the dislock annotations of a CronJob in
// namespace. cronJobName is the default lock name. Surrounding spaces in
// values are ignored.
//
// It reports every problem at once: the error is an errors.Join of
// *FieldError, one per bad annotation (see FieldErrors), plus a plain error if
// namespace itself is unusable. On error the returned Spec is the zero Spec.
func FromAnnotations(annotations map[string]string, namespace, cronJobName string) (Spec, error) {
	var errs []error
	bad := func(annotation, value, problem string) {
		errs = append(errs, &FieldError{Annotation: annotation, Value: value, Problem: problem})
	}
	s := Spec{Namespace: namespace, LeaseTTL: DefaultLeaseTTL, AppStartTimeout: DefaultAppStartTimeout}

	modeKnown := false
	if v, ok := annotations[AnnotationMode]; !ok {
		bad(AnnotationMode, "", "is required "+wantModes)
	} else if m, problem := parseMode(v); problem != "" {
		bad(AnnotationMode, v, problem)
	} else {
		s.Mode, modeKnown = m, true
	}

	if v, ok := annotations[AnnotationKey]; ok {
		switch name := strings.TrimSpace(v); {
		case name == "":
			bad(AnnotationKey, v, "is empty (want a name such as \"nightly-report\", or remove it to use the CronJob name)")
		case !validName(name):
			bad(AnnotationKey, v, "is not a valid name "+wantName)
		default:
			s.Name = name
		}
	} else if !validName(cronJobName) {
		// Only reachable when the caller has no CronJob name to default to.
		bad(AnnotationKey, "", fmt.Sprintf("is required: the CronJob name %q cannot be the lock name %s", cronJobName, wantName))
	} else {
		s.Name = cronJobName
	}

	if v, ok := annotations[AnnotationLeaseTTL]; ok {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		switch {
		case err != nil:
			bad(AnnotationLeaseTTL, v, "is not a duration "+wantLeaseTTL)
		case d < MinLeaseTTL || d > MaxLeaseTTL:
			bad(AnnotationLeaseTTL, v, "is out of range (want "+between(MinLeaseTTL, MaxLeaseTTL)+")")
		default:
			s.LeaseTTL = d
		}
	}

	if v, ok := annotations[AnnotationStandby]; ok {
		// Exactly true or false: ParseBool's "1", "t" or "F" are not what a
		// reader of the YAML would expect to be a switch.
		switch b := strings.TrimSpace(v); {
		case strings.EqualFold(b, "true"):
			if modeKnown && !s.Mode.Schedule {
				bad(AnnotationStandby, v, `needs schedule mode (set dislock.io/mode to "schedule" or "schedule,lease", or remove dislock.io/standby)`)
			}
			s.Standby = true
		case strings.EqualFold(b, "false"):
		default:
			bad(AnnotationStandby, v, `is not a boolean (want "true" or "false")`)
		}
	}

	if v, ok := annotations[AnnotationCatchup]; ok {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		switch {
		case err != nil:
			bad(AnnotationCatchup, v, "is not a duration "+wantCatchup)
		case d <= 0 || d > MaxCatchup:
			bad(AnnotationCatchup, v, "is out of range (want "+catchupRange+")")
		default:
			s.Catchup = d
		}
	}

	if v, ok := annotations[AnnotationMissedAfter]; ok {
		if d, err := ParseMissedAfter(v); err != nil {
			errs = append(errs, err)
		} else {
			s.MissedAfter = d
		}
	}

	grace, graceSet := annotations[AnnotationPreferGrace]
	graceOK := true
	if graceSet {
		if d, problem := parseDuration(strings.TrimSpace(grace), MinPreferGrace, MaxPreferGrace, "20s"); problem != "" {
			bad(AnnotationPreferGrace, grace, problem)
			graceOK = false
		} else {
			s.PreferGrace = d
		}
	}
	if v, ok := annotations[AnnotationPreferCluster]; ok {
		switch c := strings.TrimSpace(v); {
		case !ValidClusterName(c):
			bad(AnnotationPreferCluster, v, "is not a cluster name "+wantCluster+": one of the webhooks' --cluster-name")
		case modeKnown && !s.Mode.Schedule:
			bad(AnnotationPreferCluster, v, preferNeedsSchedule)
		default:
			s.PreferCluster = c
		}
		if !graceSet {
			s.PreferGrace, grace = DefaultPreferGrace, shortDuration(DefaultPreferGrace)+" (the default)"
		}
		if problem := s.preferGraceProblem(); problem != "" && graceOK {
			bad(AnnotationPreferGrace, grace, problem)
		}
	} else if graceSet {
		bad(AnnotationPreferGrace, grace, "needs "+AnnotationPreferCluster+" (name the cluster to prefer, or remove "+AnnotationPreferGrace+")")
	}

	if v, ok := annotations[AnnotationAppStartTimeout]; ok {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		switch {
		case err != nil:
			bad(AnnotationAppStartTimeout, v, "is not a duration "+wantAppStartTimeout)
		case d < MinAppStartTimeout || d > MaxAppStartTimeout:
			bad(AnnotationAppStartTimeout, v, "is out of range (want "+between(MinAppStartTimeout, MaxAppStartTimeout)+")")
		default:
			s.AppStartTimeout = d
		}
	}

	if v, ok := annotations[AnnotationEntrypoint]; ok {
		cmd, problem := parseEntrypoint(v)
		if problem != "" {
			bad(AnnotationEntrypoint, v, problem)
		}
		s.Entrypoint = cmd
	}

	if v, ok := annotations[AnnotationProxyQuit]; ok {
		pq, problem := parseProxyQuit(v)
		if problem != "" {
			bad(AnnotationProxyQuit, v, problem)
		}
		s.ProxyQuit = pq
	}

	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		if !strings.HasPrefix(k, Prefix) || k == AnnotationStatus || slices.Contains(userAnnotations, k) {
			continue
		}
		hint := "known: " + strings.Join(userAnnotations, ", ")
		if guess := closest(k); guess != "" {
			hint = "did you mean " + guess + "? " + hint
		}
		bad(k, annotations[k], "is not a dislock annotation ("+hint+")")
	}

	if !validName(namespace) {
		errs = append(errs, fmt.Errorf("namespace %q is not a valid namespace name: every lock key is <namespace>/<name>", namespace))
	}
	if len(errs) > 0 {
		return Spec{}, errors.Join(errs...)
	}
	return s, nil
}

const (
	wantName    = `(want lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters, e.g. "nightly-report")`
	wantCommand = `(want a JSON array of non-empty strings, e.g. ["/app/run","--daily"])`
)

// wantProxyQuit is the fix of every dislock.io/proxy-quit problem that is
// not one URL's own.
var wantProxyQuit = fmt.Sprintf(`(want %q, or at most %d comma-separated loopback http URLs with a port, e.g. "http://127.0.0.1:15020/quitquitquit")`,
	ProxyQuitNone, MaxProxyQuit)

// The allowed ranges, spelt from the same constants that enforce them, so
// that a message can never name other bounds than the check uses.
var (
	catchupRange        = "more than 0s and at most " + shortDuration(MaxCatchup)
	wantLeaseTTL        = `(want e.g. "30s", ` + between(MinLeaseTTL, MaxLeaseTTL) + ")"
	wantCatchup         = `(want e.g. "10m", ` + catchupRange + ")"
	wantAppStartTimeout = `(want e.g. "10m", ` + between(MinAppStartTimeout, MaxAppStartTimeout) + ")"
	wantMissedAfter     = `(want e.g. "2h", ` + between(MinMissedAfter, MaxMissedAfter) + ": longer than the Job's retries take)"
)

// preferNeedsSchedule is the problem of a preferred cluster in lease mode,
// which has no windows: a pod of another cluster that takes the lease once
// the grace is over runs the tick again if the preferred cluster's run has
// ended, where without the preference it would have found the lease held.
const preferNeedsSchedule = `needs schedule mode: without windows, a cluster that waits out the grace runs the tick again once the preferred cluster's run ended (set dislock.io/mode to "schedule" or "schedule,lease", or remove dislock.io/prefer-cluster)`

// preferGraceProblem says why PreferGrace does not fit the other
// settings, or "". The other clusters claim a window the preferred one
// left only once the grace has passed: by then the window must be neither
// stale nor counted missed.
func (s Spec) preferGraceProblem() string {
	switch {
	case s.Catchup > 0 && s.PreferGrace >= s.Catchup:
		return fmt.Sprintf("is not below %s %s: every window the preferred cluster leaves would be stale before another cluster may claim it (want a grace below the catchup)",
			AnnotationCatchup, shortDuration(s.Catchup))
	case s.MissedAfter > 0 && s.PreferGrace >= s.MissedAfter:
		return fmt.Sprintf("is not below %s %s: every window the preferred cluster leaves would count as missed before another cluster may claim it (want a grace below it)",
			AnnotationMissedAfter, shortDuration(s.MissedAfter))
	}
	return ""
}

// ParseMissedAfter reads a dislock.io/missed-after value: a Go duration
// between MinMissedAfter and MaxMissedAfter. The error is a *FieldError
// naming the annotation, the value and the allowed values. The webhook
// holds the annotation to it, and the missed-window detection the value
// the clusters' views carry.
func ParseMissedAfter(v string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	switch {
	case err != nil:
		return 0, &FieldError{Annotation: AnnotationMissedAfter, Value: v, Problem: "is not a duration " + wantMissedAfter}
	case d < MinMissedAfter || d > MaxMissedAfter:
		return 0, &FieldError{Annotation: AnnotationMissedAfter, Value: v, Problem: "is out of range " + wantMissedAfter}
	}
	return d, nil
}

func between(lo, hi time.Duration) string {
	return "between " + shortDuration(lo) + " and " + shortDuration(hi)
}

// shortDuration spells d as a Go duration without trailing zero units:
// "1h" and "10m" rather than "1h0m0s" and "10m0s". time.ParseDuration reads
// it back to d.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// parseEntrypoint decodes a JSON array of at least one non-empty string.
func parseEntrypoint(v string) ([]string, string) {
	t := strings.TrimSpace(v)
	if t == "" {
		return nil, "is empty " + wantCommand
	}
	var cmd []string
	// The '[' check rejects "null", which would decode to a nil slice.
	if !strings.HasPrefix(t, "[") || json.Unmarshal([]byte(t), &cmd) != nil {
		return nil, "is not a JSON array of strings " + wantCommand
	}
	if len(cmd) == 0 {
		return nil, "is an empty array " + wantCommand
	}
	for i, arg := range cmd {
		if arg == "" {
			return nil, fmt.Sprintf("has an empty string at index %d %s", i, wantCommand)
		}
		if strings.ContainsRune(arg, 0) {
			// exec cannot pass a NUL byte; fail here, not in every pod.
			return nil, fmt.Sprintf("has a NUL character at index %d %s", i, wantCommand)
		}
	}
	return cmd, ""
}

// parseProxyQuit reads dislock.io/proxy-quit: ProxyQuitNone, or at most
// MaxProxyQuit comma-separated quit URLs, each what ProxyQuitProblem accepts
// (surrounding spaces ignored) and each once.
func parseProxyQuit(v string) (ProxyQuit, string) {
	t := strings.TrimSpace(v)
	switch {
	case t == "":
		return ProxyQuit{}, "is empty " + wantProxyQuit
	case strings.EqualFold(t, ProxyQuitNone):
		return ProxyQuit{Set: true}, ""
	}
	items := strings.Split(t, ",")
	if len(items) > MaxProxyQuit {
		return ProxyQuit{}, fmt.Sprintf("lists %d URLs %s", len(items), wantProxyQuit)
	}
	urls := make([]string, 0, len(items))
	for _, item := range items {
		u := strings.TrimSpace(item)
		if u == "" {
			return ProxyQuit{}, "has an empty item " + wantProxyQuit
		}
		if problem := ProxyQuitProblem(u); problem != "" {
			if len(items) == 1 {
				return ProxyQuit{}, problem
			}
			return ProxyQuit{}, "holds " + quote(u) + ", which " + problem
		}
		if slices.Contains(urls, u) {
			return ProxyQuit{}, "lists " + quote(u) + " twice (want each URL once)"
		}
		urls = append(urls, u)
	}
	return ProxyQuit{Set: true, URLs: urls}, ""
}

// validName reports whether s is a DNS-1123 subdomain: 1..253 characters of
// [a-z0-9.-], starting and ending with a letter or digit. Such a name has no
// '/', so "<namespace>/<name>" always splits back the same way.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
	if !alnum(s[0]) || !alnum(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !alnum(c) && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

// closest suggests the known annotation an unknown dislock.io/ key was
// probably meant to be, or "".
func closest(key string) string {
	norm := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				return r
			}
			if r >= 'A' && r <= 'Z' {
				return r + 'a' - 'A'
			}
			return -1
		}, strings.TrimPrefix(s, Prefix))
	}
	k := norm(key)
	best, bestDist := "", 3 // suggest only within two edits
	for _, known := range userAnnotations {
		if d := editDistance(k, norm(known)); d < bestDist {
			best, bestDist = known, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance, with a bail-out for long inputs
// (a key is at most 63 characters after the prefix; anything longer is not a typo).
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return len(a) + len(b)
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Validate checks a Spec built or changed in code against the same rules
// FromAnnotations enforces, and lists every problem.
func (s Spec) Validate() error {
	var errs []error
	if s.Mode.IsZero() {
		errs = append(errs, errors.New("mode is empty "+wantModes))
	}
	if !validName(s.Name) {
		errs = append(errs, fmt.Errorf("name %q is not a valid lock name %s", s.Name, wantName))
	}
	if !validName(s.Namespace) {
		errs = append(errs, fmt.Errorf("namespace %q is not a valid namespace name", s.Namespace))
	}
	if s.LeaseTTL < MinLeaseTTL || s.LeaseTTL > MaxLeaseTTL {
		errs = append(errs, fmt.Errorf("lease TTL %s is out of range (want %s)", s.LeaseTTL, between(MinLeaseTTL, MaxLeaseTTL)))
	}
	if s.Standby && !s.Mode.Schedule {
		errs = append(errs, fmt.Errorf("standby needs schedule mode, not %q", s.Mode))
	}
	if s.Catchup < 0 || s.Catchup > MaxCatchup {
		errs = append(errs, fmt.Errorf("catchup %s is out of range (want 0 for unset, or %s)", s.Catchup, catchupRange))
	}
	if s.MissedAfter != 0 && (s.MissedAfter < MinMissedAfter || s.MissedAfter > MaxMissedAfter) {
		errs = append(errs, fmt.Errorf("missed-after %s is out of range (want 0 for unset, or %s)", s.MissedAfter, between(MinMissedAfter, MaxMissedAfter)))
	}
	switch {
	case s.PreferCluster == "" && s.PreferGrace != 0:
		errs = append(errs, fmt.Errorf("prefer grace %s is set without a preferred cluster", s.PreferGrace))
	case s.PreferCluster == "":
	case !ValidClusterName(s.PreferCluster):
		errs = append(errs, fmt.Errorf("preferred cluster %q is not a cluster name %s", s.PreferCluster, wantCluster))
	case !s.Mode.Schedule:
		errs = append(errs, fmt.Errorf("preferred cluster %q in mode %q %s", s.PreferCluster, s.Mode, preferNeedsSchedule))
	case s.PreferGrace < MinPreferGrace || s.PreferGrace > MaxPreferGrace:
		errs = append(errs, fmt.Errorf("prefer grace %s is out of range (want %s)", s.PreferGrace, between(MinPreferGrace, MaxPreferGrace)))
	case s.preferGraceProblem() != "":
		errs = append(errs, fmt.Errorf("prefer grace %s %s", s.PreferGrace, s.preferGraceProblem()))
	}
	if s.AppStartTimeout < MinAppStartTimeout || s.AppStartTimeout > MaxAppStartTimeout {
		errs = append(errs, fmt.Errorf("app start timeout %s is out of range (want %s)", s.AppStartTimeout, between(MinAppStartTimeout, MaxAppStartTimeout)))
	}
	if s.Entrypoint != nil {
		b, _ := json.Marshal(s.Entrypoint)
		if _, problem := parseEntrypoint(string(b)); problem != "" {
			errs = append(errs, fmt.Errorf("entrypoint %s %s", b, problem))
		}
	}
	switch pq := s.ProxyQuit; {
	case !pq.Set && pq.URLs != nil:
		errs = append(errs, fmt.Errorf("proxy quit URLs %q are given but not set (set ProxyQuit.Set)", pq.URLs))
	case pq.Set && len(pq.URLs) > 0:
		// The annotation's spelling of the URLs reads back to them exactly
		// when they are valid.
		if again, problem := parseProxyQuit(pq.String()); problem != "" {
			errs = append(errs, fmt.Errorf("proxy quit URLs %q: %s", pq.URLs, problem))
		} else if !slices.Equal(again.URLs, pq.URLs) {
			errs = append(errs, fmt.Errorf("proxy quit URLs %q read back from the annotation as %q (want plain URLs: no spaces, no commas, not %q)",
				pq.URLs, again.URLs, ProxyQuitNone))
		}
	}
	return errors.Join(errs...)
}

// Annotations renders the Spec back as annotations that FromAnnotations
// parses to the same Spec, defaults included explicitly.
func (s Spec) Annotations() map[string]string {
	a := map[string]string{
		AnnotationMode:            s.Mode.String(),
		AnnotationKey:             s.Name,
		AnnotationLeaseTTL:        s.LeaseTTL.String(),
		AnnotationAppStartTimeout: s.AppStartTimeout.String(),
	}
	if s.Standby {
		a[AnnotationStandby] = "true"
	}
	if s.Catchup != 0 {
		a[AnnotationCatchup] = s.Catchup.String()
	}
	if s.MissedAfter != 0 {
		a[AnnotationMissedAfter] = s.MissedAfter.String()
	}
	if s.PreferCluster != "" {
		a[AnnotationPreferCluster] = s.PreferCluster
		a[AnnotationPreferGrace] = s.PreferGrace.String()
	}
	if s.Entrypoint != nil {
		b, _ := json.Marshal(s.Entrypoint)
		a[AnnotationEntrypoint] = string(b)
	}
	if s.ProxyQuit.Set {
		a[AnnotationProxyQuit] = s.ProxyQuit.String()
	}
	return a
}
