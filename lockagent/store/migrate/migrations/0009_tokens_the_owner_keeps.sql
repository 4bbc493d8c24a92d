-- dislock: compatible-from 7
-- Version 9: fencing tokens are drawn without writing, and only the owner
-- moves their epoch.
--
-- Until now next_token() wrote token_epoch whenever the epoch moved (the
-- first token after a failover, a pg_upgrade or a restore): a caller that
-- drew that token inside a transaction it left open (any tenant can) held
-- the row, and every other namespace's grants waited on it. Now next_token()
-- only reads. Where the epoch no longer follows from the row (another
-- PostgreSQL cluster, a timeline older than the row's, the row's epochs
-- ahead of the timeline, or a token counter that is not the one the row was
-- confirmed with: a logical restore recreates the sequence) it refuses with
-- SQLSTATE DL002 until the owner confirms the epoch with
-- keep_token_epoch(), in its own short transaction. The webhook's elected
-- replica does that at start and every few seconds; `dislock tokens` does
-- it too. A grant never waits on a caller's transaction.
--
-- keep_token_epoch(floor) also moves the epoch past floor, the highest
-- token recorded outside the database (each cluster's webhook keeps one in
-- a Kubernetes object): a database restored from a backup is behind it, and
-- the epoch then moves above every epoch recorded anywhere before the next
-- grant the owner allows.
--
-- A token is epoch << 40 plus the counter's offset in its epoch
-- (token_counter minus counter_base): a new epoch may start the offset
-- again: keep_token_epoch() does so once half of an epoch's offsets are
-- spent, and on demand (`dislock tokens --new-epoch`). With 2^23 epochs of
-- 2^39 tokens, no caller drawing in a loop exhausts them. The epoch is bounded below
-- 2^23 so that a token stays a positive bigint: next_token() refuses with
-- DL003 beyond either bound instead of wrapping.
--
-- Older code keeps working: its claims call next_token() as before, and
-- its check reads the epoch through token_epoch_now() (hence
-- compatible-from 7). Only after `dislock tokens --new-epoch` does its check
-- misjudge the counter's fill.
ALTER TABLE dislock.token_epoch
    ADD COLUMN IF NOT EXISTS counter_oid  oid,
    ADD COLUMN IF NOT EXISTS counter_base bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS confirmed_at timestamptz;
UPDATE dislock.token_epoch SET counter_oid = 'dislock.token_counter'::regclass::oid, confirmed_at = now()
WHERE counter_oid IS NULL;
ALTER SEQUENCE dislock.token_counter NO MAXVALUE;

-- The last value the counter handed out: a sequence restored, or never
-- drawn from, hands out its last_value itself next (is_called is false).
CREATE OR REPLACE FUNCTION dislock.token_counter_drawn() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT last_value - CASE WHEN is_called THEN 0 ELSE 1 END FROM dislock.token_counter
$$;

-- The epoch the timeline gives, from the row alone: within one PostgreSQL
-- cluster it follows the WAL timeline (a promoted standby's timeline is
-- higher than every one before it), without any write.
CREATE OR REPLACE FUNCTION dislock.token_epoch_now() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT e.base_epoch + (dislock.wal_timeline() - e.base_timeline) FROM dislock.token_epoch e
$$;

-- Why tokens cannot be drawn from row e on timeline tl (NULL when they
-- can): the owner must confirm the epoch first. Callers judge the row they
-- computed the epoch from, never a second read of the table (an owner's
-- move committed between two reads would pass a token of the held row).
CREATE OR REPLACE FUNCTION dislock.token_epoch_held_by(e dislock.token_epoch, tl bigint) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN e.system_id IS DISTINCT FROM c.system_identifier THEN
            format('the database is another PostgreSQL cluster (system identifier %s, the epochs were kept in %s): a pg_upgrade, or a restore into a new cluster', c.system_identifier, e.system_id)
        WHEN e.counter_oid IS DISTINCT FROM 'dislock.token_counter'::regclass::oid THEN
            'the token counter is not the one the epochs were kept with: the schema was restored from a dump'
        WHEN tl < e.base_timeline THEN
            format('the WAL timeline %s is older than the one the epochs were kept on (%s)', tl, e.base_timeline)
        WHEN e.base_epoch + (tl - e.base_timeline) < e.last_epoch THEN
            format('the timeline gives epoch %s, below epoch %s already used', e.base_epoch + (tl - e.base_timeline), e.last_epoch)
        END
    FROM pg_catalog.pg_control_system() c
$$;

-- Why tokens cannot be drawn now (NULL when they can).
CREATE OR REPLACE FUNCTION dislock.token_epoch_held() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT dislock.token_epoch_held_by(e, dislock.wal_timeline()) FROM dislock.token_epoch e
$$;

CREATE OR REPLACE FUNCTION dislock.next_token() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    tl     bigint := dislock.wal_timeline();
    e      dislock.token_epoch;
    held   text;
    epoch  bigint;
    offs   bigint;
BEGIN
    SELECT * INTO e FROM dislock.token_epoch;
    held := dislock.token_epoch_held_by(e, tl);
    IF held IS NOT NULL THEN
        RAISE EXCEPTION 'dislock: fencing tokens are held until the owner confirms their epoch: %', held
            USING ERRCODE = 'DL002',
                  HINT = 'the webhook''s elected replica confirms it within seconds; or run dislock tokens with the owner''s URL';
    END IF;
    epoch := e.base_epoch + (tl - e.base_timeline);
    offs := pg_catalog.nextval('dislock.token_counter') - e.counter_base;
    IF epoch >= 8388608 OR offs >= 1099511627776 OR offs < 1 THEN
        RAISE EXCEPTION 'dislock: fencing tokens are exhausted: epoch % (bound 8388607), counter offset % (bound 1099511627775)', epoch, offs
            USING ERRCODE = 'DL003',
                  HINT = 'move to a new epoch with dislock tokens --new-epoch (docs/operations.md, "Fencing tokens")';
    END IF;
    RETURN (epoch << 40) + offs;
END
$$;

-- The largest token next_token() can have handed out so far (see migration
-- 4): now the offset of the counter in its epoch.
CREATE OR REPLACE FUNCTION dislock.token_high_water() RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT (dislock.token_epoch_now() << 40) + (dislock.token_counter_drawn() - e.counter_base)
    FROM dislock.token_epoch e
$$;

-- keep_token_epoch confirms the epoch for the owner, in the caller's
-- (short) transaction: it records the epoch the timeline gives as used,
-- and moves to a new epoch, above every epoch used, recorded (floor) or
-- present in a row, when tokens are held (token_epoch_held), when the
-- database is behind floor (restored from a backup), or when new_epoch is
-- asked. A new epoch starts the counter's offset again only when asked:
-- otherwise the offset goes on. It returns the epoch and the high water
-- after it, and why it moved (NULL when it did not).
CREATE OR REPLACE FUNCTION dislock.keep_token_epoch(floor bigint, new_epoch boolean,
    OUT epoch bigint, OUT high_water bigint, OUT moved text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    e       dislock.token_epoch;
    tl      bigint := dislock.wal_timeline();
    sysid   bigint := (SELECT system_identifier FROM pg_catalog.pg_control_system());
    follow  bigint;
    water   bigint;
    used    bigint;
    renewal boolean := false;
BEGIN
    SELECT * INTO e FROM dislock.token_epoch FOR UPDATE;
    follow := e.base_epoch + (tl - e.base_timeline);
    water := (follow << 40) + (dislock.token_counter_drawn() - e.counter_base);
    moved := dislock.token_epoch_held_by(e, tl);
    IF moved IS NULL AND water < floor THEN
        moved := format('the database is behind the recorded high water %s (it is at %s): it was restored from a backup, or lost commits', floor, water);
    END IF;
    IF moved IS NULL AND new_epoch THEN
        moved := 'a new epoch was asked for';
    END IF;
    -- Half the counter's offsets spent (a tenant drawing in a loop can do
    -- that in weeks): a new epoch starts them again, long before a claim
    -- could fail.
    IF moved IS NULL AND water - (follow << 40) > 549755813887 THEN
        moved := format('the counter passed half of epoch %s', follow);
        new_epoch := true;
        renewal := true;
    END IF;
    IF moved IS NULL THEN
        UPDATE dislock.token_epoch SET last_epoch = follow, confirmed_at = now() WHERE last_epoch < follow;
        epoch := follow;
        high_water := water;
        RETURN;
    END IF;
    -- Every epoch anyone may have used that is known here: the row's, the
    -- timeline's, the recorded floor's and the rows' own tokens (a dump
    -- carries those). After a restore, promotions since the last record
    -- may have used epochs nothing here knows of (one each): the new
    -- epoch leaves room for 15 of them. A renewal moves by one.
    used := greatest(e.last_epoch, follow, floor >> 40,
        coalesce((SELECT max(token) FROM dislock.windows), 0) >> 40,
        coalesce((SELECT max(token) FROM dislock.leases), 0) >> 40);
    epoch := used + CASE WHEN renewal THEN 1 ELSE 16 END;
    IF epoch >= 8388608 THEN
        RAISE EXCEPTION 'dislock: no fencing token epoch is left above % (bound 8388607)', used USING ERRCODE = 'DL003';
    END IF;
    UPDATE dislock.token_epoch SET system_id = sysid, base_timeline = tl, base_epoch = epoch, last_epoch = epoch,
        counter_oid = 'dislock.token_counter'::regclass::oid, confirmed_at = now(),
        counter_base = CASE WHEN new_epoch THEN dislock.token_counter_drawn() ELSE counter_base END;
    high_water := dislock.token_high_water();
END
$$;

REVOKE ALL ON FUNCTION dislock.token_counter_drawn(), dislock.token_epoch_held_by(dislock.token_epoch, bigint), dislock.token_epoch_held(),
    dislock.keep_token_epoch(bigint, boolean) FROM PUBLIC;
