package contract

import "time"

// The user-facing contract: every key dislock reads or writes on a CronJob,
// a Job or a namespace. These names are public API; renaming one breaks
// every CronJob that uses it.
const (
	// Prefix starts every dislock annotation. An unknown key under it is an
	// error, so that a typo never silently turns a lock off.
	Prefix = "dislock.io/"

	// AnnotationMode opts a CronJob in and says which locks to take:
	// "schedule", "lease" or "schedule,lease". Required.
	AnnotationMode = Prefix + "mode"

	// AnnotationKey names the lock; the default is the CronJob name. The
	// effective key is always "<namespace>/<name>", and names cannot hold a
	// '/', so one namespace can never reach another's locks.
	AnnotationKey = Prefix + "key"

	// AnnotationLeaseTTL is the lease and liveness TTL as a Go duration
	// between MinLeaseTTL and MaxLeaseTTL; the heartbeat runs every TTL/3.
	AnnotationLeaseTTL = Prefix + "lease-ttl"

	// AnnotationStandby, "true" or "false" (schedule mode only): a loser
	// waits while the window's owner is alive and takes the window over if
	// the owner fails or dies, instead of skipping at once.
	AnnotationStandby = Prefix + "standby"

	// AnnotationCatchup is a Go duration in (0, MaxCatchup]: a pod that
	// starts when the DB clock is past window start + catchup skips the run
	// as stale. Unset means no limit.
	AnnotationCatchup = Prefix + "catchup"

	// AnnotationPreferCluster names the data centre (a webhook's
	// --cluster-name) that should run the CronJob's windows: its pods claim
	// a window at once, and the other clusters' pods only from the window's
	// start + AnnotationPreferGrace by the database's clock. If the
	// preferred cluster has not claimed by then, another cluster runs the
	// window. Schedule modes only; manual runs have no window and ignore it.
	AnnotationPreferCluster = Prefix + "prefer-cluster"
	// AnnotationPreferGrace is a Go duration between MinPreferGrace and
	// MaxPreferGrace (default DefaultPreferGrace), below dislock.io/catchup
	// and dislock.io/missed-after when they are set: how long the other
	// clusters leave the preferred one to claim. Needs
	// AnnotationPreferCluster.
	AnnotationPreferGrace = Prefix + "prefer-grace"

	// AnnotationMissedAfter is a Go duration between MinMissedAfter and
	// MaxMissedAfter: a window with no successful run this long after its
	// start counts as missed (dislock_missed_windows_total, `dislock
	// missed`). Unset: one period of the schedule, at least a minute and at
	// most an hour (ledger.DefaultMissedGrace). Set it above the time the
	// Job's retries take.
	AnnotationMissedAfter = Prefix + "missed-after"

	// AnnotationAppStartTimeout is a Go duration between MinAppStartTimeout
	// and MaxAppStartTimeout (default DefaultAppStartTimeout): after a pod
	// won a window or a lease, if none of its app containers has started by
	// then (an image that cannot be pulled, a ConfigMap missing in one
	// cluster), the claim is given up as failed, so that a standby or the
	// Job's retry can take it instead of the window being blocked everywhere.
	AnnotationAppStartTimeout = Prefix + "app-start-timeout"

	// AnnotationEntrypoint is a JSON array of strings: the command to wrap for
	// containers without a command when the image's entrypoint cannot be read
	// from the registry.
	AnnotationEntrypoint = Prefix + "entrypoint"

	// AnnotationProxyQuit overrides the webhook's detection of classic
	// (non-native) service-mesh sidecars, which never exit by themselves and
	// so keep a Job's pod from ending: ProxyQuitNone, or up to MaxProxyQuit
	// comma-separated loopback http URLs with a port (see ProxyQuitProblem)
	// that the agent POSTs to once every app container ended, e.g.
	// "http://127.0.0.1:15020/quitquitquit". Unset: the webhook detects
	// Istio and Linkerd sidecars itself.
	AnnotationProxyQuit = Prefix + "proxy-quit"
	// ProxyQuitNone is the AnnotationProxyQuit value that turns the quit
	// off: no sidecar is detected, none is told to quit.
	ProxyQuitNone = "none"

	// AnnotationAgentCPURequest, AnnotationAgentCPULimit,
	// AnnotationAgentMemoryRequest and AnnotationAgentMemoryLimit size the
	// dislock-agent sidecar of the CronJob's pods (Kubernetes quantities,
	// e.g. "50m", "128Mi") when the installation's sizes do not fit the
	// namespace's LimitRange or ResourceQuota; each unset one keeps the
	// installation's, and none may exceed the most the installation allows.
	// The webhook reads them; the agent never does.
	AnnotationAgentCPURequest    = Prefix + "agent-cpu-request"
	AnnotationAgentCPULimit      = Prefix + "agent-cpu-limit"
	AnnotationAgentMemoryRequest = Prefix + "agent-memory-request"
	AnnotationAgentMemoryLimit   = Prefix + "agent-memory-limit"

	// AnnotationStatus is written by the webhook on a Job it mutated (JSON:
	// version, mode, key, window, injected containers). Its presence makes the
	// webhook leave the Job alone. Users never set it.
	AnnotationStatus = Prefix + "status"

	// LabelInjection on a namespace, with value LabelInjectionEnabled, opts
	// the namespace in.
	LabelInjection = Prefix + "injection"
	// LabelInjectionEnabled is the value of LabelInjection that opts in.
	LabelInjectionEnabled = "enabled"
)

// The keys the webhook writes for users and tools to read, never to set:
// on the pods it injected, on finished pods and their Jobs, and on the
// database Secrets it keeps in opted-in namespaces.
const (
	// LabelInjected, valued LabelInjectedValue, is put on every pod
	// template the webhook injected, so that the pods of injected Jobs can be
	// selected (kubectl get pods -l dislock.io/injected) and the outcome
	// controller watches those pods only, not every pod of the cluster.
	LabelInjected      = Prefix + "injected"
	LabelInjectedValue = "true"

	// LabelOutcome is what a finished pod's run came to: the Outcome of its
	// sidecar's Termination (succeeded, failed, skipped or error), on the
	// pod and its Job. On a pod it is also the mark that the pod was
	// handled: its Event is never emitted twice. The termination record
	// spells it and LabelTookOver too.
	LabelOutcome = Prefix + "outcome"
	// LabelTookOver is "true" on a pod (and its Job) whose run took the
	// window over from a failed or lapsed owner; absent otherwise.
	LabelTookOver = Prefix + "took-over"
	// AnnotationJobOutcomes holds, on a Job, the outcome of the newest
	// finished pod of each completion index ("-" for a Job that is not
	// Indexed), as JSON; the Job's labels are computed from it, so that
	// the order in which pods are handled does not matter.
	AnnotationJobOutcomes = Prefix + "outcomes"

	// AnnotationTenantRole names the database role whose credential a
	// namespace's provisioned database Secret holds.
	AnnotationTenantRole = Prefix + "tenant-role"
	// AnnotationTenantRoleCreated is when that role was created (RFC 3339):
	// the rotation counts from it.
	AnnotationTenantRoleCreated = Prefix + "tenant-role-created"
	// AnnotationTenantRoleGeneration is that role's generation.
	AnnotationTenantRoleGeneration = Prefix + "tenant-role-generation"
	// AnnotationCopiedFrom names the source of a copy of the database
	// secret.
	AnnotationCopiedFrom = Prefix + "copied-from"
)

// Defaults and bounds of the annotation values.
const (
	DefaultLeaseTTL = 30 * time.Second
	// MinLeaseTTL keeps the heartbeat (every TTL/3) from hammering the
	// database and leaves room for the safety margin the agent subtracts.
	MinLeaseTTL = 5 * time.Second
	// MaxLeaseTTL bounds how long a dead holder blocks everyone else.
	MaxLeaseTTL = time.Hour
	// DefaultAppStartTimeout is how long a pod that won a window may take to
	// start its app before the claim is given up.
	DefaultAppStartTimeout = 10 * time.Minute
	// MinAppStartTimeout leaves time to pull an image and start a container
	// on a busy node: giving a claim up that a healthy pod was about to use
	// only moves the run elsewhere.
	MinAppStartTimeout = 30 * time.Second
	// MaxAppStartTimeout bounds how long a pod whose app never starts keeps
	// the window from every other cluster (and keeps its Job from ending).
	MaxAppStartTimeout = 24 * time.Hour
	// MaxCatchup keeps a catch-up far inside the retention of old windows
	// (30 days by default): a pod must never start a run so late that the
	// record of that window's earlier run could already have been deleted.
	// A run more than a day late is better left to the next tick.
	MaxCatchup = 24 * time.Hour
	// MinMissedAfter and MaxMissedAfter bound dislock.io/missed-after: the
	// missed-window detection runs every half minute, and judges windows
	// at most a day back.
	MinMissedAfter = time.Minute
	MaxMissedAfter = 24 * time.Hour

	// DefaultPreferGrace, MinPreferGrace and MaxPreferGrace are the default
	// and bounds of dislock.io/prefer-grace. The grace delays every window
	// the preferred cluster does not take by as much, so it is short.
	DefaultPreferGrace = 30 * time.Second
	MinPreferGrace     = time.Second
	MaxPreferGrace     = 10 * time.Minute
)

// userAnnotations are the keys users set, in the order errors list them.
var userAnnotations = []string{
	AnnotationMode, AnnotationKey, AnnotationLeaseTTL,
	AnnotationStandby, AnnotationCatchup, AnnotationMissedAfter, AnnotationPreferCluster, AnnotationPreferGrace,
	AnnotationAppStartTimeout, AnnotationEntrypoint, AnnotationProxyQuit,
	AnnotationAgentCPURequest, AnnotationAgentCPULimit, AnnotationAgentMemoryRequest, AnnotationAgentMemoryLimit,
}
