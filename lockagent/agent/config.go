package agent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/lockagent/spec"
)

// Defaults for the agent-only settings.
const (
	// DefaultStartTimeout bounds the retries against an unreachable database
	// before the agent decides "error" (the Job fails and retries by its
	// backoffLimit: fail closed).
	DefaultStartTimeout = 2 * time.Minute
	// DefaultStopTimeout bounds recording the outcome after SIGTERM; it must
	// fit in the pod's terminationGracePeriodSeconds (30 s by default).
	DefaultStopTimeout = 20 * time.Second
)

// Config is everything the agent acts on, parsed once from the environment
// (the webhook's contract) and flags.
type Config struct {
	Mode     spec.Mode
	Key      string
	Window   time.Time // zero: computed from Schedule at database time, or manual
	Manual   bool      // no window: bypasses the schedule lock, honours the lease
	Schedule string
	TimeZone string
	TTL      time.Duration
	Standby  bool
	Catchup  time.Duration
	Owner    lock.Owner
	// JobIndex is the completion index of an Indexed Job's pod, -1 otherwise.
	JobIndex int
	// AppStartTimeout: after "run", if no wrapper started the app by then,
	// the claim is given up so that a standby or the Job's retry can take it.
	AppStartTimeout time.Duration

	DatabaseURL    string
	SharedDir      string
	TerminationLog string
	StartTimeout   time.Duration
	StopTimeout    time.Duration
	// WallClockOffset shifts the agent's local wall clock (test-only): the
	// agent's decisions must not change, because none of them reads it.
	WallClockOffset time.Duration
}

// Margin is how long before the lease can expire at database time the
// holder stops trusting it: it covers the wrapper's SIGTERM→SIGKILL grace,
// polling, and a renewal in flight.
func (c Config) Margin() time.Duration { return c.TTL / 3 }

// KillGrace is the wrapper's SIGTERM→SIGKILL grace: half the margin, so the
// app is dead before the database could hand the lease to someone else.
func (c Config) KillGrace() time.Duration { return c.Margin() / 2 }

// HeartbeatInterval is ttl/3: two renewals can fail before the margin starts.
func (c Config) HeartbeatInterval() time.Duration { return c.TTL / 3 }

// parseConfig reads flags (which override) and the environment. It returns
// every problem at once, each naming the variable and the fix.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("dislock-agent agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := Config{}
	shared := fs.String("shared-dir", or(getenv(spec.EnvSharedDir), spec.DefaultSharedDir), "directory shared with the wrappers ($"+spec.EnvSharedDir+")")
	termLog := fs.String("termination-log", or(getenv(spec.EnvTerminationLog), spec.DefaultTerminationLog), "file for the one-line outcome ($"+spec.EnvTerminationLog+")")
	fs.DurationVar(&c.StartTimeout, "start-timeout", DefaultStartTimeout, "how long to retry an unreachable database before deciding error")
	fs.DurationVar(&c.StopTimeout, "stop-timeout", DefaultStopTimeout, "how long to try recording the outcome after SIGTERM")
	fs.DurationVar(&c.WallClockOffset, "test-wall-clock-offset", 0, "test only: shift the local wall clock (decisions must not change)")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q (the agent is configured by DISLOCK_* env)", fs.Arg(0))
	}
	c.SharedDir, c.TerminationLog = *shared, *termLog

	var errs []error
	bad := func(env, value, want string) {
		errs = append(errs, fmt.Errorf("%s=%q %s", env, value, want))
	}
	var err error
	if c.Mode, err = spec.ParseMode(getenv(spec.EnvMode)); err != nil {
		bad(spec.EnvMode, getenv(spec.EnvMode), `is not a mode (want "schedule", "lease" or "schedule,lease")`)
	}
	c.Key = getenv(spec.EnvKey)
	ns, name, ok := strings.Cut(c.Key, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		bad(spec.EnvKey, c.Key, "is not <namespace>/<name>")
	}
	c.Schedule, c.TimeZone = getenv(spec.EnvSchedule), getenv(spec.EnvTimeZone)
	switch w := getenv(spec.EnvWindow); {
	case w != "":
		if c.Window, err = time.Parse(time.RFC3339, w); err != nil {
			bad(spec.EnvWindow, w, "is not an RFC 3339 time (want e.g. 2026-12-02T12:00:00Z)")
		}
		c.Window = c.Window.UTC()
	case c.Schedule == "":
		// Neither a window nor a schedule to compute one: a manual run.
		c.Manual = true
	}
	c.TTL = spec.DefaultLeaseTTL
	if v := getenv(spec.EnvLeaseTTL); v != "" {
		if c.TTL, err = time.ParseDuration(v); err != nil || c.TTL < time.Second {
			bad(spec.EnvLeaseTTL, v, "is not a duration of at least 1s (want e.g. 30s)")
		}
	}
	switch v := strings.ToLower(getenv(spec.EnvStandby)); v {
	case "", "false":
	case "true":
		c.Standby = true
	default:
		bad(spec.EnvStandby, v, `is not "true" or "false"`)
	}
	if v := getenv(spec.EnvCatchup); v != "" {
		if c.Catchup, err = time.ParseDuration(v); err != nil || c.Catchup <= 0 {
			bad(spec.EnvCatchup, v, "is not a positive duration (want e.g. 10m)")
		}
	}
	c.AppStartTimeout = spec.DefaultAppStartTimeout
	if v := getenv(spec.EnvAppStartTimeout); v != "" {
		if c.AppStartTimeout, err = time.ParseDuration(v); err != nil || c.AppStartTimeout <= 0 {
			bad(spec.EnvAppStartTimeout, v, "is not a positive duration (want e.g. 10m)")
		}
	}
	c.JobIndex = -1
	if v := getenv(spec.EnvJobIndex); v != "" {
		if c.JobIndex, err = strconv.Atoi(v); err != nil || c.JobIndex < 0 {
			bad(spec.EnvJobIndex, v, "is not a completion index (want 0, 1, ...)")
		}
	}
	c.Owner = lock.Owner{Cluster: getenv(spec.EnvCluster), Namespace: ns, Job: getenv(spec.EnvJobName),
		JobUID: getenv(spec.EnvJobUID), Pod: getenv(spec.EnvPodName)}
	for _, f := range [][2]string{{spec.EnvCluster, c.Owner.Cluster}, {spec.EnvJobName, c.Owner.Job},
		{spec.EnvJobUID, c.Owner.JobUID}, {spec.EnvPodName, c.Owner.Pod}} {
		if f[1] == "" || strings.Contains(f[1], "/") {
			bad(f[0], f[1], "must be set and contain no '/'")
		}
	}
	c.DatabaseURL = getenv(spec.EnvDatabaseURL)
	if c.DatabaseURL == "" {
		errs = append(errs, fmt.Errorf("%s is not set (the webhook injects it from the DB secret)", spec.EnvDatabaseURL))
	}
	return c, errors.Join(errs...)
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
