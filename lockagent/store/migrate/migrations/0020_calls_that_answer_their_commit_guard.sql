-- dislock: compatible-from 7
-- Version 20: the claim and the renewal answer their commit guard
-- themselves.
--
-- Every lock write ends its answer with the commit guard: why the
-- session's settings may let its commit be acknowledged before it is as
-- durable as an acknowledgement must mean (empty when they do not), and
-- whether the server's messages are surely in English (see the Store's
-- commitGuard). Agents sent it as expressions of their statement, which
-- PostgreSQL parsed and planned again on every call (PgBouncer's
-- transaction pooling allows no prepared statements): measured with
-- pgbench, a renewal cost 0.38-0.40 ms of PostgreSQL's CPU with them and
-- 0.32-0.34 ms as one call answering them itself.
--
-- commit_guard answers the same from a plan kept per server connection,
-- and claim_guarded and renew_guarded are the calls of the top of the hour
-- (claim_unless_paused, migration 16) and of every heartbeat (renew,
-- migration 11) with it: one function call, its answer's columns flat,
-- nothing else in the statement to parse and plan. Each reads the settings
-- after its call ran, as the statements' expressions did, so that the
-- answer holds for the commit that follows. Older agents keep their
-- statements (hence compatible-from 7).
CREATE OR REPLACE FUNCTION dislock.commit_guard(OUT durability text, OUT english boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    durability := CASE
        WHEN current_setting('synchronous_commit') = 'off'
            THEN 'synchronous_commit = off: a commit is acknowledged before it is on disk'
        WHEN current_setting('synchronous_commit') = 'local' AND current_setting('synchronous_standby_names') <> ''
            THEN 'synchronous_commit = local: a commit is acknowledged before the synchronous standby has it'
        WHEN current_setting('client_min_messages') NOT IN ('debug5', 'debug4', 'debug3', 'debug2', 'debug1', 'log', 'notice', 'info', 'warning')
            THEN 'client_min_messages = ' || current_setting('client_min_messages') ||
                 ': the server would not say that a commit''s wait for the synchronous standby was cut short'
        ELSE '' END;
    english := current_setting('lc_messages') IN ('C', 'POSIX');
END
$$;

CREATE OR REPLACE FUNCTION dislock.claim_guarded(
    p_key text, p_window timestamptz, p_index int, p_owner text, p_cluster text, p_pod text,
    p_ttl_us bigint, p_job_prefix text, p_standby boolean,
    p_view jsonb, p_view_recency_us bigint, p_view_refresh_us bigint, p_max_late_us bigint,
    OUT lock_key text, OUT window_start timestamptz, OUT job_index int, OUT owner text, OUT cluster text, OUT pod text,
    OUT token bigint, OUT state text, OUT claimed_at timestamptz, OUT alive_until timestamptz,
    OUT finished_at timestamptz, OUT exit_code int,
    OUT outcome text, OUT db_now timestamptz,
    OUT other_clusters text[], OUT other_views text[], OUT other_seen timestamptz[],
    OUT paused_by text, OUT pause_reason text, OUT paused_until timestamptz,
    OUT durability text, OUT english boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM dislock.claim_unless_paused(p_key, p_window, p_index, p_owner, p_cluster, p_pod,
        p_ttl_us, p_job_prefix, p_standby, p_view, p_view_recency_us, p_view_refresh_us, p_max_late_us);
    lock_key := (c.w).lock_key; window_start := (c.w).window_start; job_index := (c.w).job_index;
    owner := (c.w).owner; cluster := (c.w).cluster; pod := (c.w).pod; token := (c.w).token;
    state := (c.w).state; claimed_at := (c.w).claimed_at; alive_until := (c.w).alive_until;
    finished_at := (c.w).finished_at; exit_code := (c.w).exit_code;
    outcome := c.outcome; db_now := c.db_now;
    other_clusters := c.other_clusters; other_views := c.other_views; other_seen := c.other_seen;
    paused_by := c.paused_by; pause_reason := c.pause_reason; paused_until := c.paused_until;
    SELECT g.durability, g.english INTO durability, english FROM dislock.commit_guard() g;
END
$$;

CREATE OR REPLACE FUNCTION dislock.renew_guarded(p_key text, p_window timestamptz, p_index int, p_window_token bigint,
    p_lease_key text, p_lease_token bigint, p_ttl_us bigint,
    OUT window_until timestamptz, OUT lease_until timestamptz, OUT db_now timestamptz,
    OUT durability text, OUT english boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    SELECT r.window_until, r.lease_until, r.db_now INTO window_until, lease_until, db_now
    FROM dislock.renew(p_key, p_window, p_index, p_window_token, p_lease_key, p_lease_token, p_ttl_us) r;
    SELECT g.durability, g.english INTO durability, english FROM dislock.commit_guard() g;
END
$$;

REVOKE ALL ON FUNCTION dislock.commit_guard(),
    dislock.claim_guarded(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint),
    dislock.renew_guarded(text, timestamptz, int, bigint, text, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dislock.commit_guard(),
    dislock.claim_guarded(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint),
    dislock.renew_guarded(text, timestamptz, int, bigint, text, bigint, bigint) TO dislock_tenant;
