-- dislock: compatible-from 7
-- Version 13: the clusters elect one of them to raise the alerts on what
-- they all read from this database.
--
-- Every cluster's webhook serves the metrics its leader computes from the
-- shared tables (missed windows, failing runs, held leases, disagreeing
-- views, silent keys), so every cluster's Prometheus would raise the same
-- alert and one missed window would page once per cluster. The webhook
-- leaders of all clusters take turns on this one row, a claim by the
-- database clock like a lease: its holder renews it, and once it stops (its
-- cluster down or cut off from the database, or its webhook no longer
-- scraped) another cluster takes it when it lapsed. Each webhook says
-- whether its cluster holds it (dislock_alerting_cluster), and the shipped
-- rules raise those alerts only where it does. alerting_from is when the
-- holder may start to say so: a cluster taking over waits until the one
-- before it can no longer be raising them (its lapse plus a settle time),
-- so that two clusters never page for the same window at once.
--
-- A row, not an advisory lock: a session's advisory lock needs a session,
-- which PgBouncer's transaction pooling does not keep, and any role may take
-- any advisory lock. Owner only: tenants get no right on it, and row-level
-- security without a policy for them, like dislock.metrics_snapshot.
-- Older code never reads it (hence compatible-from 7, what migration 12
-- left: every dislock that worked against 12 works against this).
CREATE TABLE IF NOT EXISTS dislock.alerting_cluster (
    one           boolean     PRIMARY KEY DEFAULT true CHECK (one),
    cluster       text        NOT NULL,
    alerting_from timestamptz NOT NULL,
    expire_at     timestamptz NOT NULL
);

ALTER TABLE dislock.alerting_cluster ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON dislock.alerting_cluster FROM PUBLIC;
