// Package ledger owns what the owner does with the history the agents
// leave in the database: the missed-window detection, the ledger's
// statistics and the metrics snapshot, the owner's listings of decisions
// and missed windows, retention, and keeping the fencing-token epoch the
// claims draw from. The webhook's elected replica and the operator CLI
// run it with the owner's role; the sidecar never links this package.
package ledger
