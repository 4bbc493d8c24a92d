// Package webhook owns dislock's admission side: the mutating webhook that
// puts every Job of an opted-in CronJob under the lock agent, the validating
// webhook that refuses bad CronJobs when they are applied, and the server
// that hosts them. It holds the admission handlers (admission.go), the JSON
// patch they answer with (patch.go) and the wiring of the components below
// (setup.go: [SetupWithManager] gives each its own options, made from the
// flags' [Config]).
//
// Per admission, on every replica:
//
//   - inject: the mutation itself, a pure function of the Job, its CronJob
//     and the options, tested with golden files;
//   - registry: the image entrypoints the mutation wraps, read from the
//     tenants' registries within bounds a tenant cannot lift.
//
// On the elected leader only:
//
//   - controller/outcome: what each finished pod's run came to, as labels on
//     the pod and its Job and an Event on the CronJob;
//   - controller/secretcopy or controller/tenants: the database Secret of
//     every opted-in namespace, a copy of the administrator's or the
//     credential of a database role of the namespace's own;
//   - maintenance, with the owner's database URL: retention, the clusters'
//     comparison, the fencing token record and the ledger's metrics. Its
//     database gate runs on every replica too (none is ready before the
//     schema is usable), and every replica serves the ledger's metrics the
//     leader computed.
package webhook
