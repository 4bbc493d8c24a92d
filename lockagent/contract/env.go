package contract

// The sidecar's environment contract. The webhook sets these on the injected
// dislock-agent container; the agent and the exec wrapper read exactly these
// (flags may mirror them), so a test or a plain host cron can run one "pod" as
// two processes.
const (
	// EnvMode is Mode.String(): "schedule", "lease" or "schedule,lease".
	EnvMode = "DISLOCK_MODE"
	// EnvKey is the effective lock key, Spec.Key(): "<namespace>/<name>".
	EnvKey = "DISLOCK_KEY"
	// EnvWindow is the window start in RFC 3339 UTC; WindowManual for a
	// manual run; empty when the agent computes the window from EnvSchedule
	// at database time. Empty with no schedule is read as a manual run too:
	// that is how Jobs injected by older webhooks say it.
	EnvWindow = "DISLOCK_WINDOW"
	// EnvSchedule is the CronJob's spec.schedule.
	EnvSchedule = "DISLOCK_SCHEDULE"
	// EnvTimeZone is the CronJob's spec.timeZone, empty when unset.
	EnvTimeZone = "DISLOCK_TIME_ZONE"
	// EnvLeaseTTL is Spec.LeaseTTL as a Go duration, e.g. "30s".
	EnvLeaseTTL = "DISLOCK_LEASE_TTL"
	// EnvStandby is "true" or "false".
	EnvStandby = "DISLOCK_STANDBY"
	// EnvCatchup is Spec.Catchup as a Go duration, empty when unset.
	EnvCatchup = "DISLOCK_CATCHUP"
	// EnvMissedAfter is Spec.MissedAfter as a Go duration; set only when the
	// CronJob sets dislock.io/missed-after.
	EnvMissedAfter = "DISLOCK_MISSED_AFTER"
	// EnvPreferCluster and EnvPreferGrace are Spec.PreferCluster and
	// Spec.PreferGrace (a Go duration); set only when the CronJob prefers
	// a cluster.
	EnvPreferCluster = "DISLOCK_PREFER_CLUSTER"
	EnvPreferGrace   = "DISLOCK_PREFER_GRACE"
	// EnvAppStartTimeout is Spec.AppStartTimeout as a Go duration: after a
	// "run" decision, how long the agent waits for a wrapper to start the app
	// before it gives the claim up.
	EnvAppStartTimeout = "DISLOCK_APP_START_TIMEOUT"
	// EnvAppContainers is AgentEnv.AppContainers, comma-separated: the names
	// of the pod's app containers, as each wrapper's EnvContainerName.
	EnvAppContainers = "DISLOCK_APP_CONTAINERS"
	// EnvRestartPolicy is AgentEnv.RestartPolicy: the pod's restartPolicy,
	// "Never" or "OnFailure".
	EnvRestartPolicy = "DISLOCK_RESTART_POLICY"
	// EnvProxyQuit is AgentEnv.ProxyQuit, comma-separated: the loopback
	// URLs the agent POSTs to once the pod's app containers are done, so
	// that a classic (non-native) mesh sidecar such as istio-proxy exits
	// and the pod can end.
	EnvProxyQuit = "DISLOCK_PROXY_QUIT"
	// EnvJobIndex is the completion index of an Indexed Job's pod (from the
	// batch.kubernetes.io/job-completion-index annotation), empty otherwise.
	// Each index claims its own window.
	EnvJobIndex = "DISLOCK_JOB_INDEX"
	// EnvCompletions is an Indexed Job's spec.completions, empty otherwise
	// (and from webhooks older than it). The agent puts it in its view of
	// the job, so that clusters whose Jobs have different indexes are
	// reported.
	EnvCompletions = "DISLOCK_COMPLETIONS"
	// EnvCluster names the data centre (the webhook's --cluster-name).
	EnvCluster = "DISLOCK_CLUSTER"
	// EnvJobName, EnvJobUID and EnvPodName come from the downward API.
	EnvJobName = "DISLOCK_JOB_NAME"
	EnvJobUID  = "DISLOCK_JOB_UID"
	EnvPodName = "DISLOCK_POD_NAME"
	// EnvDatabaseURL is the PostgreSQL DSN, from a secretKeyRef. Only the
	// sidecar gets it; app containers never see the credentials.
	EnvDatabaseURL = "DISLOCK_DATABASE_URL"
	// EnvSharedDir is the emptyDir shared by the agent and the wrapper;
	// default DefaultSharedDir.
	EnvSharedDir = "DISLOCK_SHARED_DIR"
	// EnvTerminationLog is where the agent writes its decision for
	// `kubectl get pod -o yaml`; default DefaultTerminationLog.
	EnvTerminationLog = "DISLOCK_TERMINATION_LOG"
	// EnvFencingToken is set by the wrapper in the child's environment: the
	// strictly increasing token of this acquisition, for downstream systems
	// to reject a stale holder.
	EnvFencingToken = "DISLOCK_FENCING_TOKEN"
	// EnvContainerName is set by the webhook on each app container: the
	// wrapper names its result file results/<container> after it, so the
	// agent's outcome can say which container failed.
	EnvContainerName = "DISLOCK_CONTAINER_NAME"
)

// Defaults of the env variables that have one.
const (
	DefaultSharedDir      = "/dislock"
	DefaultTerminationLog = "/dev/termination-log"
)

// WindowManual is EnvWindow's value for a manual run (kubectl create job
// --from=cronjob/...): it is no schedule tick, so it takes no schedule lock
// and still honours the lease.
const WindowManual = "manual"
