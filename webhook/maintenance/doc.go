// Package maintenance holds the webhook's database loops, which run only
// with the owner's database URL (--database-url; [SetupWithManager]). Every
// replica first passes a gate: it migrates schema dislock (or finds it
// migrated) and finds it usable by this build, and is not ready until then.
// The elected leader alone then deletes windows older than --retention,
// compares the clusters' views of each job (a DislockClustersDisagree Event
// on a CronJob whose clusters disagree) and confirms the fencing token epoch
// against the record it keeps in a ConfigMap.
//
// The elected leader also computes the ledger's metrics (decisions, missed
// windows, silent keys, leases, run durations) every --ledger-interval and
// stores them in the database, and every replica serves the newest
// ([LedgerMetrics]); a newly missed window is a DislockMissedWindow Event
// on its CronJob. Those metrics are the same in every cluster, so the
// leaders of all clusters elect, through the database, the one alerting
// cluster whose Prometheus raises the alerts on them
// ([LedgerMetrics.ClaimAlerting]); every replica says whether its cluster is
// it (dislock_alerting_cluster).
package maintenance
