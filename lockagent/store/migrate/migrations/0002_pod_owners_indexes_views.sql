-- Version 2: windows are owned by a pod and keyed by completion index; each
-- cluster's view of a job is kept so that disagreeing clusters are noticed.

-- An Indexed Job claims one window per completion index; -1 is a Job that is
-- not Indexed. The primary key grows by the index.
ALTER TABLE dislock.windows ADD COLUMN IF NOT EXISTS job_index int NOT NULL DEFAULT -1;
ALTER TABLE dislock.windows DROP CONSTRAINT IF EXISTS windows_pkey;
ALTER TABLE dislock.windows ADD CONSTRAINT windows_pkey PRIMARY KEY (lock_key, window_start, job_index);

-- What each cluster's CronJob looked like when it last claimed: schedule,
-- time zone, mode, standby, lease TTL, catchup. Two clusters with different
-- views of one key can turn one tick into two windows (a time zone) or break
-- a promise (standby set in one cluster only).
CREATE TABLE IF NOT EXISTS dislock.views (
    lock_key text        NOT NULL,
    cluster  text        NOT NULL,
    view     jsonb       NOT NULL,
    seen_at  timestamptz NOT NULL,
    PRIMARY KEY (lock_key, cluster)
);
