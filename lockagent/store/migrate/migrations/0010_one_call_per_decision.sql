-- dislock: compatible-from 7
-- Version 10: a pod decides in one call, and what the tenants' checks run
-- is planned once per server connection.
--
-- At the top of the hour every pod of every cluster asks at once. Until now
-- each asked in three round trips (the database clock, its cluster's view,
-- the claim), each statement planned afresh (PgBouncer's transaction
-- pooling allows no prepared statements), and the functions row-level
-- security calls on every write (tenant_namespace, token_high_water, the
-- triggers' foreign_to_tenant) were SQL functions, planned again on every
-- statement that called them. PL/pgSQL keeps a function's plans for the
-- life of the server connection, which PgBouncer shares between every pod
-- of a namespace's pool.
--
-- claim_window is now the one place the claim of "Ownership and re-entry"
-- is decided; the Store's ClaimWindow and the agent's decision both call
-- it. The ledger's write and the renewals are functions too
-- (record_decision, renew_window, renew_lease), for their plans. Older code keeps working: it claims with its own statement, by the
-- same rule, against the same rows (hence compatible-from 7).

-- The namespace the session's login role serves (see migration 4), now
-- planned once per connection.
CREATE OR REPLACE FUNCTION dislock.tenant_namespace() RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN (SELECT namespace FROM dislock.tenants WHERE role_name = session_user AND retired_at IS NULL);
END
$$;

-- The largest token next_token() can have handed out so far (see
-- migrations 4 and 9), now planned once per connection.
CREATE OR REPLACE FUNCTION dislock.token_high_water() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN (SELECT (dislock.token_epoch_now() << 40) + (dislock.token_counter_drawn() - e.counter_base)
            FROM dislock.token_epoch e);
END
$$;

-- Whether the session is a tenant role writing outside its namespace (see
-- migration 7), now planned once per connection.
CREATE OR REPLACE FUNCTION dislock.foreign_to_tenant(lock_key text) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN (SELECT coalesce(bool_or(t.retired_at IS NOT NULL OR NOT starts_with(foreign_to_tenant.lock_key, t.namespace || '/')), false)
            FROM dislock.tenants t WHERE t.role_name = session_user);
END
$$;

-- The rule of "Ownership and re-entry": whether the claim of claimer (its
-- Job's owner prefix job_prefix, standby) may take the existing window row
-- w at now(). The same pod re-enters its running claim; another pod of the
-- same Job, or any pod when standby, takes a window whose owner failed or
-- whose liveness lapsed. A succeeded or skipped window never changes hands.
-- A plain SQL function, so that the planner inlines it where it is used.
CREATE OR REPLACE FUNCTION dislock.window_takeable(w dislock.windows, claimer text, job_prefix text, standby boolean)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT (w.owner = claimer AND w.state = 'running')
        OR (w.owner <> claimer
            AND (w.state = 'failed' OR (w.state = 'running' AND w.alive_until <= now()))
            AND (starts_with(w.owner, job_prefix) OR standby))
$$;

-- claim_window claims window (key, window_start, job_index) for owner, or
-- says who holds it, in one call; with a view it also records the calling
-- cluster's view of the job and returns the other clusters' recent views
-- that differ from it, and with max_late_us it first refuses a window
-- started longer ago than that by the database's clock. It runs with the
-- caller's rights: a tenant claims only in its namespace, as before.
--
-- outcome is:
--   claimed, reentered, took-over: the row is the caller's claim. A take
--     draws its token only once it holds the row lock, so it is larger than
--     any token handed out for the row before; the same pod keeps its token
--     and claim time.
--   refused: the row is its owner's, which the caller may not take now.
--   stale: the window started more than max_late_us ago and is not the
--     caller's own running claim (which it re-enters, however late): nothing
--     was written; db_now says how late it is, and w holds the request
--     (token 0).
--
-- The row is read first, and the insert is not even tried when the row
-- could not be taken: the common refusal (another cluster's pod at the top
-- of the hour) locks nothing, draws no token and writes nothing, so it
-- waits for no WAL flush. A row not there yet, or that looks takeable, goes
-- through the insert, whose conflict path decides under the row lock; when
-- that path refuses (the row changed meanwhile), the row is read again,
-- each statement of this function seeing what committed before it began.
--
-- The view is written only when it changed or was last written more than
-- view_refresh ago (up to twice that, by the key's hash): otherwise a
-- decision would write a row (and wait for a WAL flush) to say what the row
-- already says. Its seen_at is therefore up to twice view_refresh old;
-- every reader's recency is days. A refusal that wrote the view commits
-- without waiting for the flush, as views always have.
CREATE OR REPLACE FUNCTION dislock.claim_window(
    p_key text, p_window timestamptz, p_index int, p_owner text, p_cluster text, p_pod text,
    p_ttl_us bigint, p_job_prefix text, p_standby boolean,
    p_view jsonb, p_view_recency_us bigint, p_view_refresh_us bigint, p_max_late_us bigint,
    OUT w dislock.windows, OUT outcome text, OUT db_now timestamptz,
    OUT other_clusters text[], OUT other_views text[], OUT other_seen timestamptz[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    inserted   boolean;
    wrote_view boolean := false;
    seen       timestamptz;
    was      jsonb;
BEGIN
    db_now := now();
    IF p_max_late_us IS NOT NULL AND db_now - p_window > p_max_late_us * interval '1 microsecond' THEN
        -- Too late to claim, but not to re-enter: the same pod's retry of
        -- a claim whose reply it lost goes on with it.
        SELECT * INTO w FROM dislock.windows r
        WHERE r.lock_key = p_key AND r.window_start = p_window AND r.job_index = p_index;
        IF FOUND AND w.owner = p_owner AND w.state = 'running' THEN
            p_max_late_us := NULL;
        END IF;
    END IF;
    IF p_max_late_us IS NOT NULL AND db_now - p_window > p_max_late_us * interval '1 microsecond' THEN
        -- w is the request, so that the reply has the shape of every
        -- other.
        w := NULL;
        w.lock_key := p_key; w.window_start := p_window; w.job_index := p_index; w.owner := p_owner;
        w.cluster := p_cluster; w.pod := p_pod; w.token := 0; w.state := 'running';
        w.claimed_at := db_now; w.alive_until := db_now;
        outcome := 'stale';
        RETURN;
    END IF;
    IF p_view IS NOT NULL THEN
        SELECT v.view, v.seen_at INTO was, seen FROM dislock.views v
        WHERE v.lock_key = p_key AND v.cluster = p_cluster;
        -- Each key refreshes after between one and two view_refresh, by
        -- its hash: keys first seen at one instant do not all refresh at
        -- the same later one.
        IF NOT FOUND OR was <> p_view
           OR seen < now() - p_view_refresh_us * interval '1 microsecond' * (1 + (hashtext(p_key) & 1023) / 1024.0) THEN
            INSERT INTO dislock.views AS v (lock_key, cluster, view, seen_at)
            VALUES (p_key, p_cluster, p_view, now())
            ON CONFLICT ON CONSTRAINT views_pkey DO UPDATE SET view = EXCLUDED.view, seen_at = EXCLUDED.seen_at,
                changed_at = CASE WHEN v.view = EXCLUDED.view THEN v.changed_at ELSE now() END;
            wrote_view := true;
        END IF;
        SELECT coalesce(array_agg(o.cluster ORDER BY o.cluster), '{}'), coalesce(array_agg(o.view::text ORDER BY o.cluster), '{}'),
               coalesce(array_agg(o.seen_at ORDER BY o.cluster), '{}')
        INTO other_clusters, other_views, other_seen
        FROM dislock.views o
        WHERE o.lock_key = p_key AND o.cluster <> p_cluster AND o.view <> p_view
          AND isfinite(o.seen_at) AND o.seen_at > now() - p_view_recency_us * interval '1 microsecond';
    END IF;
    FOR attempt IN 1..10 LOOP
        SELECT * INTO w FROM dislock.windows r
        WHERE r.lock_key = p_key AND r.window_start = p_window AND r.job_index = p_index;
        IF FOUND AND NOT dislock.window_takeable(w, p_owner, p_job_prefix, p_standby) THEN
            outcome := 'refused';
            IF wrote_view THEN
                -- The view is the only write: advice, whose commit need
                -- not wait for the WAL flush (a refusal acts on no write
                -- of its own).
                PERFORM set_config('synchronous_commit', 'off', true);
            END IF;
            RETURN;
        END IF;
        INSERT INTO dislock.windows AS r
            (lock_key, window_start, job_index, owner, cluster, pod, token, state, claimed_at, alive_until)
        VALUES (p_key, p_window, p_index, p_owner, p_cluster,
                p_pod, dislock.next_token(), 'running', now(), now() + p_ttl_us * interval '1 microsecond')
        ON CONFLICT ON CONSTRAINT windows_pkey DO UPDATE SET
            token       = CASE WHEN r.owner = EXCLUDED.owner THEN r.token ELSE dislock.next_token() END,
            claimed_at  = CASE WHEN r.owner = EXCLUDED.owner THEN r.claimed_at ELSE EXCLUDED.claimed_at END,
            owner       = EXCLUDED.owner,
            cluster     = EXCLUDED.cluster,
            pod         = EXCLUDED.pod,
            state       = 'running',
            alive_until = EXCLUDED.alive_until,
            finished_at = NULL,
            exit_code   = NULL
        WHERE dislock.window_takeable(r, EXCLUDED.owner, p_job_prefix, p_standby)
        RETURNING (r.xmax = 0) INTO inserted;
        IF FOUND THEN
            -- The row as this transaction left it (a row variable cannot
            -- share an INTO list with xmax's answer).
            SELECT * INTO w FROM dislock.windows r
            WHERE r.lock_key = p_key AND r.window_start = p_window AND r.job_index = p_index;
            outcome := CASE WHEN inserted THEN 'claimed' WHEN (w).claimed_at = now() THEN 'took-over' ELSE 'reentered' END;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'dislock: claiming window % of %: the row kept changing hands or disappearing', p_window, p_key;
END
$$;

REVOKE ALL ON FUNCTION dislock.window_takeable(dislock.windows, text, text, boolean),
    dislock.claim_window(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dislock.window_takeable(dislock.windows, text, text, boolean),
    dislock.claim_window(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) TO dislock_tenant;

-- record_decision adds a pod's decision to the ledger and counts it: the
-- row, its (key, cluster, action) count and the key's statistics (last
-- decision and success, and the run's duration, seconds or NULL, in the
-- cumulative histogram whose upper bounds are buckets). The same statement
-- the agents sent before, now planned once per connection. With the
-- caller's rights: a tenant writes only its namespace's ledger.
CREATE OR REPLACE FUNCTION dislock.record_decision(
    p_key text, p_window timestamptz, p_index int, p_cluster text, p_job text, p_pod text,
    p_action text, p_reason text, p_token bigint, p_seconds float8, p_buckets float8[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    WITH d AS (
        INSERT INTO dislock.decisions (lock_key, window_start, job_index, cluster, job, pod, action, reason, token, decided_at)
        VALUES (p_key, p_window, p_index, p_cluster, p_job, p_pod, p_action, p_reason, p_token, now())),
    c AS (
        INSERT INTO dislock.decision_counts AS c (lock_key, cluster, action, n) VALUES (p_key, p_cluster, p_action, 1)
        ON CONFLICT (lock_key, cluster, action) DO UPDATE SET n = c.n + 1)
    INSERT INTO dislock.key_stats AS k (lock_key, first_seen, last_decided, last_success, duration_count, duration_sum, duration_buckets)
    VALUES (p_key, now(), now(), CASE WHEN p_action = 'succeeded' THEN now() END,
            CASE WHEN p_seconds IS NULL THEN 0 ELSE 1 END, coalesce(p_seconds, 0),
            ARRAY(SELECT CASE WHEN p_seconds <= le THEN 1 ELSE 0 END::bigint FROM unnest(p_buckets) WITH ORDINALITY AS b(le, i) ORDER BY i))
    ON CONFLICT (lock_key) DO UPDATE SET
        last_decided     = EXCLUDED.last_decided,
        last_success     = coalesce(EXCLUDED.last_success, k.last_success),
        duration_count   = k.duration_count + EXCLUDED.duration_count,
        duration_sum     = k.duration_sum + EXCLUDED.duration_sum,
        duration_buckets = ARRAY(SELECT coalesce(o, 0) + coalesce(n, 0)
                                 FROM unnest(k.duration_buckets, EXCLUDED.duration_buckets) WITH ORDINALITY AS b(o, n, i) ORDER BY i);
END
$$;

REVOKE ALL ON FUNCTION dislock.record_decision(text, timestamptz, int, text, text, text, text, text, bigint, float8, float8[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dislock.record_decision(text, timestamptz, int, text, text, text, text, text, bigint, float8, float8[]) TO dislock_tenant;

-- renew_window extends the running claim of (key, window_start, job_index)
-- whose token is p_token by p_ttl_us from now(), and returns the new
-- liveness and now(); no row when the claim is no longer the caller's (a
-- takeover drew a new token, or it finished). The statement the agents
-- sent before, now planned once per connection.
CREATE OR REPLACE FUNCTION dislock.renew_window(p_key text, p_window timestamptz, p_index int, p_token bigint, p_ttl_us bigint)
RETURNS TABLE (renewed_until timestamptz, db_now timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE dislock.windows w SET alive_until = now() + p_ttl_us * interval '1 microsecond'
    WHERE w.lock_key = p_key AND w.window_start = p_window AND w.job_index = p_index
      AND w.token = p_token AND w.state = 'running'
    RETURNING w.alive_until INTO renewed_until;
    IF FOUND THEN
        db_now := now();
        RETURN NEXT;
    END IF;
END
$$;

-- renew_lease extends the live lease of key whose token is p_token by
-- p_ttl_us from now(), and returns the new expiry and now(); no row when
-- the lease is no longer the caller's. Live is judged at clock_timestamp()
-- when the row is read, and the renewal trigger of migration 7 judges a
-- renewal that waited on the row lock again: see the Store's qRenewLease.
CREATE OR REPLACE FUNCTION dislock.renew_lease(p_key text, p_token bigint, p_ttl_us bigint)
RETURNS TABLE (renewed_until timestamptz, db_now timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE dislock.leases l SET expire_at = now() + p_ttl_us * interval '1 microsecond'
    WHERE l.lock_key = p_key AND l.token = p_token AND l.expire_at > clock_timestamp()
    RETURNING l.expire_at INTO renewed_until;
    IF FOUND THEN
        db_now := now();
        RETURN NEXT;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION dislock.renew_window(text, timestamptz, int, bigint, bigint), dislock.renew_lease(text, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dislock.renew_window(text, timestamptz, int, bigint, bigint), dislock.renew_lease(text, bigint, bigint) TO dislock_tenant;
