// Package inject is the mutation itself, a pure function, [Inject]: it reads
// nothing but its arguments (the Job, its CronJob, the [Options] from the
// flags, the image entrypoints the caller resolved for the containers
// [NeedsEntrypoint] lists, and, with [InjectInNamespace], the Job's
// Namespace) and is tested with input/output golden files in testdata/inject
// plus an idempotency re-run of every case. Decoding, owner lookups, registry
// lookups, events and metrics stay in the admission handlers (package
// webhook), which read each Job once ([NewReview]) and inject it from that
// reading.
//
// # What Inject does
//
// The dislock annotations are the CronJob's own, overridden key by key by
// the Job's (which the controller copied from spec.jobTemplate), parsed by
// [contract.FromAnnotations]; any problem denies the Job with every problem
// listed.
//
// A Job that already carries any part of an injection ([StatusAnnotation],
// a container named "dislock-agent", the "dislock" volume, a DISLOCK_
// variable, a command that runs dislock-agent) is checked, never trusted:
// the injection is taken off again (the sidecar, the volume and mounts,
// the wrapper in front of each command) and the Job it came from is
// injected afresh with the webhook's options. The Job passes unchanged only
// if it is exactly that (a reinvocation, or a copy of an injected Job);
// otherwise it is refused with [ErrForgedInjection], naming the first
// field that differs. So nothing passes with another namespace's key,
// another image or an app command outside the wrapper. A Job no CronJob
// controls is never injected, and is refused if it looks injected.
//
// The pod template gets the label dislock.io/injected=true
// ([contract.LabelInjected]), the emptyDir volume "dislock" (mounted at
// /dislock), the native sidecar "dislock-agent" as initContainers[0]
// (existing init containers follow it, unwrapped: they run in every
// cluster, after the decision), and each app container's command becomes
// ["/dislock/bin/dislock-agent", "exec", "--"] followed by its original
// entrypoint: its command, else dislock.io/entrypoint, else the image's
// entrypoint from the registry. Kubernetes drops the image's Cmd once a
// command is set, so dislock.io/entrypoint should include the Cmd too when
// the container has no args. Each app container also gets
// DISLOCK_CONTAINER_NAME; only the sidecar gets the database secret.
//
// The sidecar's environment is a [contract.AgentEnv], planned once per Job
// and rendered by contract, which also parses it in the agent: the two sides
// cannot spell or bound a variable differently. This package only maps
// contract's neutral variables (a value, a downward-API field, the database
// Secret) to corev1.EnvVar.
//
// Job shapes: an Indexed Job's pods each read DISLOCK_JOB_INDEX from their
// completion-index annotation and claim one window per index; parallelism or
// completions above 1 without completionMode Indexed is refused (the pods
// would all claim one window). A Job that leaves podReplacementPolicy unset
// gets Failed, so that a replacement pod is normally created only once the
// old one is gone; the lock is safe without it, but the replacement would
// wait out the old pod's claim.
//
// # Classic mesh sidecars
//
// Istio's istio-proxy and Linkerd's linkerd-proxy, injected as regular
// containers, never exit, so a Job's pod would never complete. The meshes
// inject Pods, after this webhook admitted the Job, so the plan predicts
// them from the pod template's labels and annotations and the Job's
// namespace's ([InjectInNamespace]; the handler reads the namespace from the
// manager's cache when it watches Namespaces), and hands the agent their quit
// URLs in DISLOCK_PROXY_QUIT, with the pod's restartPolicy in
// DISLOCK_RESTART_POLICY. For Linkerd it also sets
// config.linkerd.io/proxy-admin-shutdown=enabled on the pod template, unless
// the template chose otherwise (then it warns). dislock.io/proxy-quit
// replaces the detection ("none", or URLs). Containers named istio-proxy or
// linkerd-proxy are never wrapped, never app containers, and never looked up
// in a registry. What was found is an admission warning, a log line and part
// of the DislockInjected Event. See docs/mesh.md.
//
// # The window without a clock
//
// The webhook has no database clock, and the window must never come from a
// local one. So only the clock-free rules of [window.Resolve] run here: a
// manual run gets DISLOCK_WINDOW=manual; the scheduled-timestamp annotation
// or the <cronjob>-<minutes> Job name give DISLOCK_WINDOW; otherwise
// DISLOCK_WINDOW stays empty and the agent computes the window from
// DISLOCK_SCHEDULE and DISLOCK_TIME_ZONE at database time, after the webhook
// checked that the schedule parses.
//
// # Choices in the sidecar
//
//   - Command ["dislock-agent", "agent"]: the dislock image has the binary at
//     /usr/local/bin/dislock-agent, on its PATH. The agent copies itself into
//     the shared volume before it writes a decision, which is what the app
//     containers' wrapped commands run.
//   - DISLOCK_JOB_UID comes from the pod's batch.kubernetes.io/controller-uid
//     label: an admitted Job has no UID yet, and the downward API cannot read
//     ownerReferences. Jobs with spec.manualSelector do not get that label,
//     so they are refused.
//   - A postStart hook (exec "dislock-agent probe --wait=5m0s") returns once
//     the agent has installed its binary in the shared volume, not once it
//     has decided: the wrapper in each app container waits for the decision
//     itself. A standby may wait for the owner's whole run, hours, and no
//     gate may restart a sidecar that is waiting as it should. The kubelet
//     runs the hook inside the sync that starts the sidecar and starts the
//     app containers at its next look at the pod (its 1-second relist); a
//     startupProbe would add a wait for the probe worker's next 1-second
//     period, since the worker only sees the sidecar running after that
//     relist (about 1.2 s per pod start, measured: docs/benchmarks.md). The
//     kubelet puts no limit on a hook, so the hook fails after 5 minutes
//     (installing takes seconds; the rest is slack for a slow node) and the
//     kubelet restarts the sidecar, whose next hook finds the binary. A
//     kubelet restarted while a hook still waits (an install that takes
//     longer than the kubelet's restart) counts the running sidecar as
//     started, which a startupProbe would not: the app container then fails
//     to start (its wrapped command does not exist yet), nothing runs
//     unlocked, and the Job's retry starts over.
//   - The sidecar runs as uid/gid 65533 (not an app's usual uid), non-root, with a read-only root
//     filesystem, no capabilities, no privilege escalation and the
//     RuntimeDefault seccomp profile, set on the container so that it holds
//     whatever the pod's securityContext says and meets the "restricted" Pod
//     Security Standard.
package inject
