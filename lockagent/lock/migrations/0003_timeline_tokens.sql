-- Version 3: fencing tokens never go back, even after a failover that lost
-- commits.
--
-- A token is (epoch << 40) + counter, where epoch is the WAL timeline the
-- primary writes on plus an offset an operator can raise. Every promotion
-- of a standby starts a new, higher timeline, so every token handed out
-- after a failover is larger than every token handed out before it, however
-- many of the old primary's commits (and sequence values) the failover lost.
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

-- The offset lets an operator who restores the schema into another
-- PostgreSQL cluster (whose timelines start again at 1) keep tokens growing:
-- `dislock check` tells when that is needed and by how much.
CREATE TABLE IF NOT EXISTS dislock.token_epoch (
    one             boolean PRIMARY KEY DEFAULT true CHECK (one),
    timeline_offset int     NOT NULL DEFAULT 0 CHECK (timeline_offset >= 0)
);
INSERT INTO dislock.token_epoch DEFAULT VALUES ON CONFLICT DO NOTHING;

-- The timeline is the first 8 hex digits of the current WAL file's name.
-- pg_walfile_name fails on a standby, so a token is never drawn there.
CREATE OR REPLACE FUNCTION dislock.token_epoch_now() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
         + (SELECT timeline_offset FROM dislock.token_epoch)
$$;

CREATE OR REPLACE FUNCTION dislock.next_token() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT (dislock.token_epoch_now() << 40) + pg_catalog.nextval('dislock.token_counter')
$$;
