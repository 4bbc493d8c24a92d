-- dislock: compatible-from 7
-- Version 16: a key paused everywhere.
--
-- An operator pauses a key (`dislock pause`, `kubectl dislock pause`) in
-- the one place every cluster's pods ask: from then on, until it is resumed
-- or its until passes, no pod of any cluster starts a run of it. A pod
-- asking for a new window, taking over a failed or lapsed one, or acquiring
-- a lease is answered 'paused', and skips; so is, for ever, a pod of a
-- window that started while a pause held (it never runs late). What
-- already runs is not stopped: the same pod re-entering its running claim
-- or its live lease (its agent restarted) still may.
--
-- The pauses are kept as history: one row per pause, closed when resumed or
-- replaced, so that missed-window detection can tell a window that started
-- paused (never missed) from one that was missed.
--
-- This release's agents call claim_unless_paused, which says who paused the
-- key; agents of schemas 10-15 know no 'paused' outcome: against a paused key
-- their pods fail closed (claim_window's answer is unknown to them) or, in
-- lease mode alone, do not see the pause at all; agents of schemas before
-- 10 claim with statements of their own and do not see it either. Without a
-- pause nothing changes for them (hence compatible-from 7;
-- docs/operations.md says to upgrade every cluster's agent before relying
-- on pauses). A pause is the operator's brake on the agents, not a wall
-- against a namespace's own role, which may write its own rows.

CREATE TABLE IF NOT EXISTS dislock.pauses (
    lock_key   text        NOT NULL,
    paused_at  timestamptz NOT NULL,
    paused_by  text        NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    -- NULL: until resumed.
    until      timestamptz,
    -- When it ended early (resumed, or replaced by a new pause); NULL while
    -- it is open. A pause whose until passed stays open until the next
    -- pause or resume of its key closes it at its until.
    resumed_at timestamptz,
    resumed_by text,
    PRIMARY KEY (lock_key, paused_at),
    CONSTRAINT pauses_until_after CHECK (until IS NULL OR until > paused_at),
    CONSTRAINT pauses_resumed_after CHECK (resumed_at IS NULL OR resumed_at >= paused_at),
    -- Every reader's time.Time holds them.
    CONSTRAINT pauses_finite CHECK (isfinite(paused_at) AND (until IS NULL OR isfinite(until))
                                    AND (resumed_at IS NULL OR isfinite(resumed_at)))
);

-- At most one open pause per key, and the index every decision's lookup
-- takes.
CREATE UNIQUE INDEX IF NOT EXISTS pauses_open ON dislock.pauses (lock_key) WHERE resumed_at IS NULL;

-- Only the owner writes pauses (the webhook on a user's authorised request,
-- dislock pause with the owner's URL); tenants read theirs only through
-- pause_of.
REVOKE ALL ON dislock.pauses FROM PUBLIC;

-- pause_of returns key's pause in force at now(), or no row. It runs with
-- the owner's rights, so that a tenant needs no grant on the table, and
-- answers only a role that may write the key (see session_scope): whether
-- another namespace's key is paused is not a tenant's to learn.
CREATE OR REPLACE FUNCTION dislock.pause_of(p_key text,
    OUT paused_by text, OUT reason text, OUT until timestamptz)
RETURNS SETOF record
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM dislock.require_scope(p_key, 'read the pause of');
    RETURN QUERY SELECT p.paused_by, p.reason, p.until FROM dislock.pauses p
        WHERE p.lock_key = p_key AND p.resumed_at IS NULL AND (p.until IS NULL OR p.until > now());
END
$$;

REVOKE ALL ON FUNCTION dislock.pause_of(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dislock.pause_of(text) TO dislock_tenant;

-- pause_holding is the pause that refuses a claim of window p_window of
-- p_key: one in force now, or one that held when the window started. No
-- row: none. Only the claim functions (with the owner's rights) call it;
-- VOLATILE, so that each call sees what committed until it began. A pause
-- in force is judged at now(), the time a claim records as its claim's.
CREATE OR REPLACE FUNCTION dislock.pause_holding(p_key text, p_window timestamptz,
    OUT paused_by text, OUT reason text, OUT until timestamptz)
RETURNS SETOF record
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT p.paused_by, p.reason, p.until FROM dislock.pauses p
    WHERE p.lock_key = p_key
      AND (p.resumed_at IS NULL AND (p.until IS NULL OR p.until > now())
           OR p.paused_at <= p_window AND p_window < coalesce(p.resumed_at, p.until, 'infinity'))
    ORDER BY p.paused_at DESC LIMIT 1
$$;

REVOKE ALL ON FUNCTION dislock.pause_holding(text, timestamptz) FROM PUBLIC, dislock_tenant;

-- claim_window (migration 12) gains the 'paused' outcome. Its result type
-- stays, so that migrations 10 and 12 run again over it (an older
-- migrator, a schema_migrations row lost) as they did; who paused, until
-- when and why this release's agents read from claim_unless_paused.
CREATE OR REPLACE FUNCTION dislock.claim_window(
    p_key text, p_window timestamptz, p_index int, p_owner text, p_cluster text, p_pod text,
    p_ttl_us bigint, p_job_prefix text, p_standby boolean,
    p_view jsonb, p_view_recency_us bigint, p_view_refresh_us bigint, p_max_late_us bigint,
    OUT w dislock.windows, OUT outcome text, OUT db_now timestamptz,
    OUT other_clusters text[], OUT other_views text[], OUT other_seen timestamptz[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
    p record;
BEGIN
    PERFORM dislock.require_scope(p_key, 'claim');
    -- A paused key starts no run, nor does a window that started while a
    -- pause held. A running claim that is the caller's, or whose owner is
    -- alive, is answered as ever (re-entered, or refused: another pod of
    -- its Job, or a standby, waits for the run to end; a pause stops no
    -- run, and a replacement pod that skipped would complete the Job and
    -- have its running pod deleted). What would take a run over is
    -- refused below.
    IF EXISTS (SELECT FROM dislock.pause_holding(p_key, p_window))
       AND NOT EXISTS (SELECT FROM dislock.windows x WHERE x.lock_key = p_key AND x.window_start = p_window
                       AND x.job_index = p_index AND x.state = 'running'
                       AND (x.owner = p_owner OR x.alive_until > now())) THEN
        -- The caller's own fields, as a stale answer carries (migration
        -- 10): nothing was written.
        db_now := now();
        w.lock_key := p_key; w.window_start := p_window; w.job_index := p_index; w.owner := p_owner;
        w.cluster := p_cluster; w.pod := p_pod; w.token := 0; w.state := 'running';
        w.claimed_at := db_now; w.alive_until := db_now;
        outcome := 'paused';
        RETURN;
    END IF;
    SELECT * INTO c FROM dislock.claim_window_unchecked(p_key, p_window, p_index, p_owner, p_cluster, p_pod,
        p_ttl_us, p_job_prefix, p_standby, p_view, p_view_recency_us, p_view_refresh_us, p_max_late_us);
    w := c.w; outcome := c.outcome; db_now := c.db_now;
    other_clusters := c.other_clusters; other_views := c.other_views; other_seen := c.other_seen;
    -- A claim that starts a run while a pause holds (one that committed
    -- while this claim waited for the window's row, after the look above,
    -- or a live owner that lapsed meanwhile) is undone. This statement sees
    -- what committed until it began.
    IF outcome IN ('claimed', 'took-over') THEN
        SELECT h.paused_by, h.reason, h.until INTO p FROM dislock.pause_holding(p_key, p_window) h;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'DL004',
                MESSAGE = format('dislock: %s was paused while this claim of window %s waited', p_key, p_window),
                DETAIL = p.paused_by, HINT = p.reason,
                COLUMN = coalesce(to_char(p.until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), '');
        END IF;
    END IF;
    IF outcome <> 'refused' AND outcome <> 'stale' AND dislock.session_scope() <> '' AND w.token > dislock.token_high_water() THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('dislock: role %s may not hold window %s of %s: its token %s is above the high water %s',
                             session_user, p_window, p_key, w.token, dislock.token_high_water()),
            HINT = 'run dislock check with the owner''s URL and apply its fix for the tokens';
    END IF;
END
$$;

-- claim_unless_paused is claim_window with, on a 'paused' answer, who
-- paused the key, until when and why: what this release's agents call.
CREATE OR REPLACE FUNCTION dislock.claim_unless_paused(
    p_key text, p_window timestamptz, p_index int, p_owner text, p_cluster text, p_pod text,
    p_ttl_us bigint, p_job_prefix text, p_standby boolean,
    p_view jsonb, p_view_recency_us bigint, p_view_refresh_us bigint, p_max_late_us bigint,
    OUT w dislock.windows, OUT outcome text, OUT db_now timestamptz,
    OUT other_clusters text[], OUT other_views text[], OUT other_seen timestamptz[],
    OUT paused_by text, OUT pause_reason text, OUT paused_until timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM dislock.claim_window(p_key, p_window, p_index, p_owner, p_cluster, p_pod,
        p_ttl_us, p_job_prefix, p_standby, p_view, p_view_recency_us, p_view_refresh_us, p_max_late_us);
    w := c.w; outcome := c.outcome; db_now := c.db_now;
    other_clusters := c.other_clusters; other_views := c.other_views; other_seen := c.other_seen;
    IF outcome = 'paused' THEN
        SELECT h.paused_by, h.reason, h.until INTO paused_by, pause_reason, paused_until
            FROM dislock.pause_holding(p_key, p_window) h;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION dislock.claim_unless_paused(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dislock.claim_unless_paused(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) TO dislock_tenant;
