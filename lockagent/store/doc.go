// Package store owns what the sidecar does with PostgreSQL: dislock's two
// lock primitives, the schedule window (one owner per key and schedule
// tick, across every cluster) and the lease (at most one live holder per
// key, renewed by heartbeats), with their fencing tokens; the job views
// clusters compare; the agent's ledger writes; and the Store, its
// connection and its errors.
//
// Every operation is a single autocommit statement that takes its time from
// now() in SQL, so it is safe behind PgBouncer in transaction pooling mode and
// never depends on the caller's wall clock: cluster nodes disagree about the
// time, the database is the one clock everybody shares. The package imports no
// Kubernetes code because the lock agent, which is copied into every pod,
// links it. What only the owner role runs lives in the subpackages migrate,
// tenant, check and ledger, which the agent never imports.
package store
