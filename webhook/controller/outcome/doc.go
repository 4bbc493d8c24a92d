// Package outcome tells what each injected pod's run came to, answered by
// kubectl without the database:
//
//	kubectl get jobs -l dislock.io/outcome=failed
//	kubectl get pods -l dislock.io/took-over=true
//	kubectl describe cronjob report   # DislockRan, DislockRunFailed, ... Events
//
// Once an injected pod has finished, the outcome controller (elected leader
// only) reads its sidecar's termination message, labels the pod and its Job
// with [contract.LabelOutcome] (and [contract.LabelTookOver]) and puts one
// Event on the CronJob (DislockRan, DislockTookOver, DislockSkipped,
// DislockRunFailed, DislockError). The manager caches only the injected pods
// without an outcome yet, trimmed to their status ([PodCache]).
package outcome
