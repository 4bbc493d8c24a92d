// Package failover tests dislock's promises across a database failover, on a
// real HA PostgreSQL (test/hapg): Patroni with synchronous replication, and
// an asynchronous primary/standby pair for the failure it must survive too.
package failover
