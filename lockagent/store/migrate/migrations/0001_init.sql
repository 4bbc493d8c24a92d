-- Version 1: the schedule-window and lease tables.
-- Ordinary logged tables on purpose: an UNLOGGED table is truncated after a
-- crash and never reaches a replica, so a crash or failover would forget every
-- claimed window and run it again.
CREATE SEQUENCE IF NOT EXISTS dislock.fencing_token;

CREATE TABLE IF NOT EXISTS dislock.windows (
    lock_key     text        NOT NULL,
    window_start timestamptz NOT NULL,
    owner        text        NOT NULL,
    cluster      text        NOT NULL,
    pod          text        NOT NULL,
    token        bigint      NOT NULL,
    state        text        NOT NULL CHECK (state IN ('running', 'succeeded', 'failed', 'skipped')),
    claimed_at   timestamptz NOT NULL,
    alive_until  timestamptz NOT NULL,
    finished_at  timestamptz,
    exit_code    int,
    PRIMARY KEY (lock_key, window_start)
);

-- Retention deletes by age across all keys.
CREATE INDEX IF NOT EXISTS windows_window_start_idx ON dislock.windows (window_start);

CREATE TABLE IF NOT EXISTS dislock.leases (
    lock_key    text        PRIMARY KEY,
    owner       text        NOT NULL,
    token       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL,
    expire_at   timestamptz NOT NULL
);
