package store

// The statements of the Store's lock operations, for those who must run
// the very statement the agent sends: dislock check's tenant probe runs
// them in a transaction it rolls back, and
// the benchmarks hand them to pgbench, so that what they measure is what
// the agents cost the database.

// ClaimWindowSQL is the statement ClaimWindow runs, with its parameters
// $1..$13 (key, window start, job index, owner, cluster, pod, TTL in µs,
// the owner's Job prefix, standby, the cluster's view as JSON or NULL, the
// others' views' recency and the view's refresh in µs, the window's
// largest lateness in µs or NULL). It must run alone in autocommit, as the
// Store runs it: a refusal that wrote the cluster's view relaxes
// synchronous_commit for the rest of its transaction.
var ClaimWindowSQL = qClaimGuarded

// AcquireLeaseSQL is the statement AcquireLease runs, with its parameters
// $1..$3 (key, owner, TTL in µs); it answers a row whatever the outcome
// (see qAcquireLease).
var AcquireLeaseSQL = qAcquireLease

const (
	// RenewSQL is the statement Renew runs, with its parameters $1..$7
	// (key, window, job index, the window's token or NULL, the lease's key
	// or NULL, the lease's token or NULL, TTL in µs). The herd benchmark
	// hands it to pgbench, so that the heartbeats' share of what the
	// database can do is measured against this very statement.
	RenewSQL = qRenewGuarded
	// LedgerBoundsSQL and RecordDecisionSQL are what RecordDecision sends,
	// as one pipeline: the bounds ($1 lock wait and $2 run, in ms), then
	// the ledger row with its parameters $1..$11 (key, window or NULL,
	// index, cluster, job, pod, action, reason, token, the run's seconds
	// or NULL, DurationBuckets).
	LedgerBoundsSQL   = qLedgerBounds
	RecordDecisionSQL = qRecordDecision
)
