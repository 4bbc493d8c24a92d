-- Version 3: fencing tokens never go back, even after a failover that lost
-- commits.
--
-- A token is (epoch << 40) + counter, where the epoch follows the WAL
-- timeline the primary writes on. A promoted standby starts a timeline
-- higher than every timeline it knows of, which with synchronous
-- replication (or a WAL archive every node restores from) is every timeline
-- before it. So every token handed out after a failover is larger than
-- every token handed out before it, however many of the old primary's
-- commits (and sequence values) the failover lost.
-- Within one timeline the counter only grows: a sequence is WAL-logged ahead
-- of what it hands out, so a crash and restart never repeats a value.
--
-- The counter is capped below 2^40 so that it can never spill into the
-- epoch bits: at 1000 tokens a second that is 34 years.
--
-- The sequence is renamed: agents of schema version 2 draw from
-- dislock.fencing_token, which then no longer exists, so their claims fail
-- (they fail closed) instead of handing out tokens without the epoch.
ALTER SEQUENCE dislock.fencing_token RENAME TO token_counter;
ALTER SEQUENCE dislock.token_counter MAXVALUE 1099511627775;

-- The epoch follows the timeline: epoch = base_epoch + (timeline -
-- base_timeline), within one PostgreSQL cluster (system_id, the identifier
-- a physical standby shares with its primary). Another cluster starts its
-- timelines again: pg_upgrade creates one, and so does restoring the schema
-- into a new initdb. Then, or whenever the timeline would take the epoch
-- below the highest it ever used (last_epoch), next_token() rebases once:
-- the epoch continues at last_epoch + 1. Each row change here happens once
-- per new timeline or cluster, not per token.
CREATE TABLE IF NOT EXISTS dislock.token_epoch (
    one           boolean PRIMARY KEY DEFAULT true CHECK (one),
    system_id     bigint,
    base_epoch    bigint  NOT NULL DEFAULT 1,
    base_timeline bigint  NOT NULL DEFAULT 1,
    last_epoch    bigint  NOT NULL DEFAULT 0
);
INSERT INTO dislock.token_epoch (system_id) SELECT system_identifier FROM pg_catalog.pg_control_system()
ON CONFLICT DO NOTHING;

-- The timeline is the first 8 hex digits of the current WAL file's name.
-- pg_walfile_name fails on a standby, so a token is never drawn there.
CREATE OR REPLACE FUNCTION dislock.wal_timeline() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
$$;

-- token_epoch_rebase tells whether the epoch must continue above
-- last_epoch instead of following the timeline.
CREATE OR REPLACE FUNCTION dislock.token_epoch_rebase(e dislock.token_epoch, tl bigint, sysid bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT e.system_id IS DISTINCT FROM sysid OR tl < e.base_timeline
        OR e.base_epoch + (tl - e.base_timeline) < e.last_epoch
$$;

-- token_epoch_now is the epoch the next token gets, without writing
-- anything (dislock check uses it).
CREATE OR REPLACE FUNCTION dislock.token_epoch_now() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN dislock.token_epoch_rebase(e, tl.t, c.system_identifier) THEN e.last_epoch + 1
                ELSE e.base_epoch + (tl.t - e.base_timeline) END
    FROM dislock.token_epoch e, (SELECT dislock.wal_timeline() AS t) tl, pg_catalog.pg_control_system() c
$$;

CREATE OR REPLACE FUNCTION dislock.next_token() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    tl    bigint := dislock.wal_timeline();
    sysid bigint := (SELECT system_identifier FROM pg_catalog.pg_control_system());
    e     dislock.token_epoch;
    epoch bigint;
BEGIN
    SELECT * INTO e FROM dislock.token_epoch;
    IF dislock.token_epoch_rebase(e, tl, sysid) THEN
        -- Concurrent callers queue on the row; only the first rebases.
        UPDATE dislock.token_epoch t SET base_epoch = last_epoch + 1, base_timeline = tl, system_id = sysid
        WHERE dislock.token_epoch_rebase(t, tl, sysid);
        SELECT * INTO e FROM dislock.token_epoch;
    END IF;
    epoch := e.base_epoch + (tl - e.base_timeline);
    IF epoch > e.last_epoch THEN
        UPDATE dislock.token_epoch SET last_epoch = epoch WHERE last_epoch < epoch;
    END IF;
    RETURN (epoch << 40) + pg_catalog.nextval('dislock.token_counter');
END
$$;
