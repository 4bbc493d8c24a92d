-- dislock: compatible-from 5
-- Version 7: a window is one unit whatever the completion mode. A plain Job
-- claims (key, window, -1) and the lease "key"; an Indexed Job claims
-- (key, window, i) and the lease "key#i". Where clusters disagree on
-- completionMode (a CronJob rolled out to Indexed in one data centre first,
-- or edited in one cluster while a run goes on), both shapes would be
-- different rows and leases, and both would run. These triggers refuse the
-- second shape with SQLSTATE DL001, naming who holds the first, so that the
-- refused pod skips and reports the disagreement. They run for every role
-- that writes, so an older agent that does not know the rule fails closed
-- (its claim errs) rather than running twice. Older code keeps working
-- against this schema, hence compatible-from 5.

-- The shape of each window, fixed by its first claim. A row per window
-- claimed since this migration; rows of windows claimed before it are
-- found in dislock.windows instead (see window_unit_check). Written only by
-- the trigger, which runs as the owner: tenants have no right on it.
CREATE TABLE IF NOT EXISTS dislock.window_units (
    lock_key     text        NOT NULL,
    window_start timestamptz NOT NULL,
    indexed      boolean     NOT NULL,
    cluster      text        NOT NULL,
    owner        text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (lock_key, window_start)
);

-- Is the session a tenant role writing outside its namespace (or a retired
-- one)? Row-level security refuses that row after the triggers ran; the
-- triggers then check nothing, so that their refusal tells a tenant nothing
-- about another namespace's windows or leases. The owner, and any role that
-- is not a tenant's, gets false.
CREATE OR REPLACE FUNCTION dislock.foreign_to_tenant(lock_key text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(bool_or(retired_at IS NOT NULL OR NOT starts_with(lock_key, namespace || '/')), false)
    FROM dislock.tenants WHERE role_name = session_user
$$;

-- Runs before every insert attempt into dislock.windows (every claim is an
-- INSERT ... ON CONFLICT; a refusal of the claim's read path inserts
-- nothing and costs nothing here). Two first claims of one window in two
-- shapes serialise on the unit's primary key: the second waits for the
-- first to commit, then reads its unit (each statement of a function sees
-- what committed before it began).
CREATE OR REPLACE FUNCTION dislock.window_unit_check() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    mine boolean := NEW.job_index >= 0;
    u dislock.window_units;
BEGIN
    IF dislock.foreign_to_tenant(NEW.lock_key) THEN
        RETURN NEW;
    END IF;
    SELECT * INTO u FROM dislock.window_units WHERE lock_key = NEW.lock_key AND window_start = NEW.window_start;
    IF NOT FOUND THEN
        INSERT INTO dislock.window_units (lock_key, window_start, indexed, cluster, owner)
        VALUES (NEW.lock_key, NEW.window_start, mine, NEW.cluster, NEW.owner)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            -- The first unit of this window: a row claimed before this
            -- migration may still have the other shape.
            SELECT w.lock_key, w.window_start, w.job_index >= 0, w.cluster, w.owner, w.claimed_at INTO u
            FROM dislock.windows w
            WHERE w.lock_key = NEW.lock_key AND w.window_start = NEW.window_start AND (w.job_index >= 0) <> mine
            LIMIT 1;
            IF NOT FOUND THEN
                RETURN NEW;
            END IF;
        ELSE
            SELECT * INTO u FROM dislock.window_units WHERE lock_key = NEW.lock_key AND window_start = NEW.window_start;
        END IF;
    END IF;
    IF u.indexed = mine THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'DL001',
        MESSAGE = format('window %s of %s is claimed as %s by cluster %s (%s); this pod''s Job is %s: the clusters disagree on completionMode',
            to_char(NEW.window_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), NEW.lock_key,
            CASE WHEN u.indexed THEN 'an Indexed Job''s (one claim per completion index)' ELSE 'a plain Job''s (not Indexed)' END,
            u.cluster, u.owner, CASE WHEN mine THEN 'Indexed' ELSE 'not Indexed' END);
END
$$;

DROP TRIGGER IF EXISTS window_unit_check ON dislock.windows;
CREATE TRIGGER window_unit_check BEFORE INSERT ON dislock.windows
    FOR EACH ROW EXECUTE FUNCTION dislock.window_unit_check();

-- Leases: a plain Job's "key" and an Indexed Job's "key#i" must not be live
-- at once. Acquirers of one key's two shapes serialise on a row of
-- lease_units: a plain acquirer locks it FOR UPDATE, an Indexed one FOR
-- SHARE, so plain holders of one key (one live at a time anyway) and the
-- indexes of one Indexed Job among themselves wait on nothing new, and
-- each shape sees the other's committed grant. The row is never deleted;
-- a key has one, whatever its age.
CREATE TABLE IF NOT EXISTS dislock.lease_units (
    base_key text PRIMARY KEY
);
CREATE INDEX IF NOT EXISTS leases_indexed_base_idx ON dislock.leases (split_part(lock_key, '#', 1))
    WHERE strpos(lock_key, '#') > 0;

CREATE OR REPLACE FUNCTION dislock.lease_unit_check() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    base text := split_part(NEW.lock_key, '#', 1);
    mine boolean := strpos(NEW.lock_key, '#') > 0;
    l dislock.leases;
BEGIN
    IF dislock.foreign_to_tenant(NEW.lock_key) THEN
        RETURN NEW;
    END IF;
    INSERT INTO dislock.lease_units (base_key) VALUES (base) ON CONFLICT DO NOTHING;
    IF mine THEN
        PERFORM 1 FROM dislock.lease_units WHERE base_key = base FOR SHARE;
        SELECT * INTO l FROM dislock.leases WHERE lock_key = base AND expire_at > now();
    ELSE
        PERFORM 1 FROM dislock.lease_units WHERE base_key = base FOR UPDATE;
        SELECT * INTO l FROM dislock.leases
        WHERE split_part(lock_key, '#', 1) = base AND strpos(lock_key, '#') > 0 AND expire_at > now()
        LIMIT 1;
    END IF;
    IF NOT FOUND THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'DL001',
        MESSAGE = format('lease %s is held by %s until %s, the lease of %s; this pod''s Job is %s: the clusters disagree on completionMode',
            l.lock_key, l.owner, to_char(l.expire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            CASE WHEN mine THEN 'a plain Job (not Indexed)' ELSE 'an Indexed Job''s completion index' END,
            CASE WHEN mine THEN 'Indexed' ELSE 'not Indexed' END);
END
$$;

DROP TRIGGER IF EXISTS lease_unit_check ON dislock.leases;
CREATE TRIGGER lease_unit_check BEFORE INSERT ON dislock.leases
    FOR EACH ROW EXECUTE FUNCTION dislock.lease_unit_check();

-- A renewal (same token, a later expiry) of a lease that expired while
-- the renewal waited for the row's lock is no renewal: the other shape's
-- lease may have been granted meanwhile, having read this one as expired.
-- The renewal's WHERE was judged before the wait (at the statement's
-- start); a BEFORE trigger runs once the row is locked, so it judges at
-- the database's clock then, and skips the update (the renewal reports the
-- lease lost).
CREATE OR REPLACE FUNCTION dislock.lease_renewal_check() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.token = OLD.token AND NEW.expire_at > OLD.expire_at THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS lease_renewal_check ON dislock.leases;
CREATE TRIGGER lease_renewal_check BEFORE UPDATE OF expire_at ON dislock.leases
    FOR EACH ROW WHEN (OLD.expire_at <= clock_timestamp()) EXECUTE FUNCTION dislock.lease_renewal_check();

REVOKE ALL ON FUNCTION dislock.foreign_to_tenant(text), dislock.window_unit_check(), dislock.lease_unit_check(),
    dislock.lease_renewal_check() FROM PUBLIC;
