// Package webhook owns dislock's admission side: the mutating webhook that
// puts every Job of an opted-in CronJob under the lock agent, the validating
// webhook that refuses bad CronJobs when they are applied, and the server
// that hosts them.
//
// # After the run
//
// Once an injected pod has finished, the outcome controller (elected leader
// only) reads its sidecar's termination message, labels the pod and its Job
// with [contract.LabelOutcome] (and [contract.LabelTookOver]) and puts one Event on the
// CronJob (DislockRan, DislockTookOver, DislockSkipped, DislockRunFailed,
// DislockError). The manager caches only the injected pods without an
// outcome yet, trimmed to their status.
package webhook
