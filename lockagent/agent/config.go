package agent

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
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
	Mode     contract.Mode
	Key      string
	Window   time.Time // zero: computed from Schedule at database time, or manual
	Manual   bool      // no window: bypasses the schedule lock, honours the lease
	Schedule string
	TimeZone string
	TTL      time.Duration
	Standby  bool
	Catchup  time.Duration
	// MissedAfter is dislock.io/missed-after, recorded in the view; 0: unset.
	MissedAfter time.Duration
	// PreferCluster is dislock.io/prefer-cluster ("" unset): in any other
	// cluster the agent claims a window only from its start + PreferGrace.
	PreferCluster string
	PreferGrace   time.Duration
	Owner         store.Owner
	// JobIndex is the completion index of an Indexed Job's pod, -1 otherwise.
	JobIndex int
	// Completions is an Indexed Job's spec.completions, 0 when unknown.
	Completions int
	// AppStartTimeout: after "run", if no wrapper started the app by then,
	// the claim is given up so that a standby or the Job's retry can take it.
	AppStartTimeout time.Duration
	// AppContainers are the names of the pod's app containers; empty when
	// unknown (then the first wrapper to start counts).
	AppContainers []string
	// RestartPolicy is the pod's restartPolicy ("" unknown): under Never an
	// app container that failed is not restarted, so its result is final.
	RestartPolicy string
	// ProxyQuit are the quit endpoints of the pod's classic mesh sidecars,
	// POSTed once every app container ended for good and the outcome is
	// recorded (see quitProxies).
	ProxyQuit []string

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

// parseConfig reads flags (which override) and the environment, which
// contract.ParseAgentEnv parses: the same code that renders it in the webhook
// holds it to the same bounds. It returns every problem at once, each naming
// the variable, its value and the fix. On error the Config still holds what
// could be read, so that the agent can publish an error decision.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("dislock-agent agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := Config{}
	shared := fs.String("shared-dir", "", "directory shared with the wrappers ($"+contract.EnvSharedDir+", default "+contract.DefaultSharedDir+")")
	termLog := fs.String("termination-log", "", "file for the one-line outcome ($"+contract.EnvTerminationLog+", default "+contract.DefaultTerminationLog+")")
	fs.DurationVar(&c.StartTimeout, "start-timeout", DefaultStartTimeout, "how long to retry an unreachable database before deciding error")
	fs.DurationVar(&c.StopTimeout, "stop-timeout", DefaultStopTimeout, "how long to try recording the outcome after SIGTERM")
	// Test-only flags, left out of the usage text: neither has a use in a
	// pod, and the short TTLs would be unsafe there.
	fs.DurationVar(&c.WallClockOffset, "test-wall-clock-offset", 0, "test only: shift the local wall clock (decisions must not change)")
	var opts contract.ParseOptions
	fs.BoolVar(&opts.AllowShortTTL, "test-allow-short-ttl", false, "test only: allow a lease TTL and an app-start timeout down to 1s")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: dislock-agent agent [flags] (configured by the DISLOCK_* environment)\n")
		fs.VisitAll(func(f *flag.Flag) {
			if !strings.HasPrefix(f.Name, "test-") {
				fmt.Fprintf(fs.Output(), "  -%s\n    \t%s\n", f.Name, f.Usage)
			}
		})
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q (the agent is configured by DISLOCK_* env)", fs.Arg(0))
	}

	// The flags mirror their variables.
	env, err := contract.ParseAgentEnv(func(name string) string {
		switch {
		case name == contract.EnvSharedDir && *shared != "":
			return *shared
		case name == contract.EnvTerminationLog && *termLog != "":
			return *termLog
		}
		return getenv(name)
	}, opts)
	c.Mode, c.Key = env.Mode, env.Key
	c.Window, c.Manual = env.Window, env.Manual
	c.Schedule, c.TimeZone = env.Schedule, env.TimeZone
	c.TTL, c.Standby, c.Catchup, c.MissedAfter = env.LeaseTTL, env.Standby, env.Catchup, env.MissedAfter
	c.PreferCluster, c.PreferGrace = env.PreferCluster, env.PreferGrace
	c.AppStartTimeout, c.AppContainers = env.AppStartTimeout, env.AppContainers
	c.RestartPolicy, c.ProxyQuit = env.RestartPolicy, env.ProxyQuit
	c.JobIndex = -1
	if env.Indexed {
		c.JobIndex, c.Completions = env.JobIndex, env.Completions
	}
	c.Owner = store.Owner{Cluster: env.Cluster, Namespace: env.Namespace(), Job: env.JobName, JobUID: env.JobUID, Pod: env.PodName}
	c.DatabaseURL = env.DatabaseURL
	c.SharedDir, c.TerminationLog = env.SharedDir, env.TerminationLog
	return c, err
}
