-- Version 5: the ledger. Every cluster's decision for a window is kept, not
-- only the owner's, so that "why did dc-a skip at 02:00" outlives the pod,
-- and a window that ran nowhere can be found and counted.

-- One row per decision of one pod: run, takeover (run after taking a failed
-- or lapsed owner's window), skip, wait (the pod waits for a live owner or
-- lease), error (the pod could not decide), and the end of a run it owned
-- (succeeded, failed). window_start is NULL where the pod locked no window
-- (lease mode only, a manual run, an error before the window was known).
-- Written by the agents in one statement each (no transaction: pooler-safe),
-- read by the owner's CLI and metrics, deleted by retention.
CREATE TABLE IF NOT EXISTS dislock.decisions (
    lock_key     text        NOT NULL,
    window_start timestamptz,
    job_index    int         NOT NULL DEFAULT -1,
    cluster      text        NOT NULL,
    job          text        NOT NULL,
    pod          text        NOT NULL,
    action       text        NOT NULL,
    reason       text        NOT NULL,
    token        bigint      NOT NULL DEFAULT 0,
    decided_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT decisions_action CHECK (action IN ('run', 'takeover', 'skip', 'wait', 'error', 'succeeded', 'failed')),
    CONSTRAINT decisions_finite_times CHECK (isfinite(decided_at) AND (window_start IS NULL OR isfinite(window_start))),
    CONSTRAINT decisions_text_size CHECK (octet_length(lock_key) <= 512 AND octet_length(cluster) <= 512
        AND octet_length(job) <= 512 AND octet_length(pod) <= 512 AND octet_length(reason) <= 2048)
);
CREATE INDEX IF NOT EXISTS decisions_key_window_idx ON dislock.decisions (lock_key, window_start);
CREATE INDEX IF NOT EXISTS decisions_decided_at_idx ON dislock.decisions (decided_at);

-- Per key, cluster and action, how many decisions there were: monotonic
-- counts for the metrics, which retention of the ledger rows does not take
-- back. A row goes only with its key (see key_stats).
CREATE TABLE IF NOT EXISTS dislock.decision_counts (
    lock_key text   NOT NULL,
    cluster  text   NOT NULL,
    action   text   NOT NULL,
    n        bigint NOT NULL,
    PRIMARY KEY (lock_key, cluster, action),
    -- A key is at most 328 bytes, a cluster name 63 (what agents write):
    -- the metrics carry both in every series.
    CONSTRAINT decision_counts_text_size CHECK (octet_length(lock_key) <= 328 AND octet_length(cluster) <= 63),
    CONSTRAINT decision_counts_action CHECK (action IN ('run', 'takeover', 'skip', 'wait', 'error', 'succeeded', 'failed')),
    CONSTRAINT decision_counts_n CHECK (n >= 0)
);

-- Per key: when it was first and last decided, its last success, the run
-- durations as a cumulative histogram (bounds chosen by the agent's code,
-- one count per bound), and what the owner's missed-window detection found:
-- how many windows were missed, the newest one, and up to which window
-- start every window has been judged. The metrics read this table, one row
-- per key, instead of scanning the windows.
CREATE TABLE IF NOT EXISTS dislock.key_stats (
    lock_key           text             PRIMARY KEY,
    first_seen         timestamptz      NOT NULL,
    last_decided       timestamptz      NOT NULL,
    last_success       timestamptz,
    duration_count     bigint           NOT NULL DEFAULT 0,
    duration_sum       double precision NOT NULL DEFAULT 0,
    duration_buckets   bigint[]         NOT NULL DEFAULT '{}',
    missed_total       bigint           NOT NULL DEFAULT 0,
    last_missed_window timestamptz,
    checked_until      timestamptz,
    CONSTRAINT key_stats_finite_times CHECK (isfinite(first_seen) AND isfinite(last_decided)
        AND (last_success IS NULL OR isfinite(last_success))
        AND (last_missed_window IS NULL OR isfinite(last_missed_window))
        AND (checked_until IS NULL OR isfinite(checked_until))),
    CONSTRAINT key_stats_text_size CHECK (octet_length(lock_key) <= 328),
    -- Every number a tenant can write is one the owner's metrics can
    -- serve: finite, not negative, and the histogram a plain list of at
    -- most 32 counts (one per bound), no NULL among them.
    CONSTRAINT key_stats_numbers CHECK (duration_count >= 0 AND missed_total >= 0
        AND duration_sum >= 0 AND duration_sum < 'Infinity'::float8),
    CONSTRAINT key_stats_buckets CHECK (cardinality(duration_buckets) = 0
        OR (array_ndims(duration_buckets) = 1 AND array_lower(duration_buckets, 1) = 1
            AND cardinality(duration_buckets) <= 32 AND array_position(duration_buckets, NULL) IS NULL
            AND 0 <= ALL (duration_buckets)))
);

-- The windows the owner's detection found missed: nobody ran them, every
-- cluster skipped or died, or the run failed or went silent and nobody took
-- over before the grace ended. The primary key makes detection by several
-- clusters' webhooks at once count each window once.
CREATE TABLE IF NOT EXISTS dislock.missed (
    lock_key     text        NOT NULL,
    window_start timestamptz NOT NULL,
    kind         text        NOT NULL,
    reason       text        NOT NULL,
    detected_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (lock_key, window_start)
);
CREATE INDEX IF NOT EXISTS missed_window_start_idx ON dislock.missed (window_start);
CREATE INDEX IF NOT EXISTS missed_detected_at_idx ON dislock.missed (detected_at);

-- The metrics one webhook replica of each cluster (the elected leader)
-- computed last, served by every replica of that cluster.
CREATE TABLE IF NOT EXISTS dislock.metrics_snapshot (
    cluster     text        PRIMARY KEY,
    computed_at timestamptz NOT NULL,
    body        bytea       NOT NULL
);

-- Tenants write their own namespace's decisions, counts and statistics,
-- with the same policy as the other tables; they cannot change what the
-- owner's detection recorded (missed_total, last_missed_window,
-- checked_until: no column right), and see neither the missed windows nor
-- the snapshots.
ALTER TABLE dislock.decisions ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_namespace ON dislock.decisions;
CREATE POLICY tenant_namespace ON dislock.decisions TO dislock_tenant
    USING (starts_with(lock_key, (SELECT dislock.tenant_namespace()) || '/'))
    WITH CHECK (starts_with(lock_key, (SELECT dislock.tenant_namespace()) || '/'));

ALTER TABLE dislock.decision_counts ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_namespace ON dislock.decision_counts;
CREATE POLICY tenant_namespace ON dislock.decision_counts TO dislock_tenant
    USING (starts_with(lock_key, (SELECT dislock.tenant_namespace()) || '/'))
    WITH CHECK (starts_with(lock_key, (SELECT dislock.tenant_namespace()) || '/'));

ALTER TABLE dislock.key_stats ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_namespace ON dislock.key_stats;
CREATE POLICY tenant_namespace ON dislock.key_stats TO dislock_tenant
    USING (starts_with(lock_key, (SELECT dislock.tenant_namespace()) || '/'))
    WITH CHECK (starts_with(lock_key, (SELECT dislock.tenant_namespace()) || '/'));

ALTER TABLE dislock.missed ENABLE ROW LEVEL SECURITY;
ALTER TABLE dislock.metrics_snapshot ENABLE ROW LEVEL SECURITY;

-- When a cluster's view of a job last changed (its schedule, time zone,
-- ...): the detection judges no window from before it by the new schedule,
-- whose past ticks were never windows. Rows from before this version take
-- the migration's time.
ALTER TABLE dislock.views ADD COLUMN IF NOT EXISTS changed_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE dislock.views DROP CONSTRAINT IF EXISTS views_changed_at_finite,
    ADD CONSTRAINT views_changed_at_finite CHECK (isfinite(changed_at));
GRANT UPDATE (changed_at) ON dislock.views TO dislock_tenant;

GRANT SELECT, INSERT ON dislock.decisions, dislock.decision_counts, dislock.key_stats TO dislock_tenant;
GRANT UPDATE (n) ON dislock.decision_counts TO dislock_tenant;
GRANT UPDATE (last_decided, last_success, duration_count, duration_sum, duration_buckets)
    ON dislock.key_stats TO dislock_tenant;
