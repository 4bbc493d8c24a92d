-- dislock: compatible-from 7
-- Version 12: a decision no longer pays for row-level security.
--
-- A pod's decision is two calls, claim_window and record_decision
-- (migration 10), and both ran with the caller's rights: every statement in
-- them evaluated a policy's tenant_namespace() (the claim's reads of its
-- window and view, its upserts, the ledger's three tables) and every row a
-- claim wrote evaluated token_high_water(). At the top of the hour that was
-- a third of the database's CPU per decision.
--
-- Both now run with their owner's rights behind one check, as renew does
-- (migration 11): the key must be one the caller may write, by
-- session_scope(). What the policies checked besides holds by construction:
-- a claim's token is drawn by next_token() under the row lock or kept from
-- the row, never the caller's, so no row written can exceed the high water;
-- the ledger's policies checked the namespace alone. The rule of
-- "Ownership and re-entry" and the ledger's write stay where migration 10
-- put them, renamed claim_window_unchecked and record_decision_unchecked:
-- only the owner may call those, and they still run with the caller's
-- rights. The triggers of migration 7 fire as before. Agents of schemas 7-9
-- keep their own statements under row-level security; agents of schema 10
-- call the same names with the same arguments (hence compatible-from 7).

-- require_scope raises insufficient_privilege, as row-level security did,
-- unless the session's role may write key (see session_scope); what names
-- the refused action in the message.
CREATE OR REPLACE FUNCTION dislock.require_scope(p_key text, p_what text) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    scope text := dislock.session_scope();
BEGIN
    IF scope IS NULL OR NOT starts_with(p_key, scope) THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('dislock: role %s may not %s %s', session_user, p_what, p_key),
            HINT = CASE WHEN scope IS NULL
                        THEN 'the role serves no live namespace: the webhook provisions one role per namespace (docs/operations.md)'
                        ELSE format('the role writes only keys of %s', scope) END;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION dislock.require_scope(text, text) FROM PUBLIC;

-- Once only: a migration runs again over itself (an older migrator, a
-- schema_migrations row lost), and claim_window is then already the check.
DO $$
BEGIN
    IF to_regprocedure('dislock.claim_window_unchecked(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint)') IS NULL THEN
        ALTER FUNCTION dislock.claim_window(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint)
            RENAME TO claim_window_unchecked;
    END IF;
    IF to_regprocedure('dislock.record_decision_unchecked(text, timestamptz, int, text, text, text, text, text, bigint, float8, float8[])') IS NULL THEN
        ALTER FUNCTION dislock.record_decision(text, timestamptz, int, text, text, text, text, text, bigint, float8, float8[])
            RENAME TO record_decision_unchecked;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION dislock.claim_window_unchecked(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint)
    FROM PUBLIC, dislock_tenant;

-- claim_window: see claim_window_unchecked (migration 10) for the rule and
-- the outcomes.
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
BEGIN
    PERFORM dislock.require_scope(p_key, 'claim');
    SELECT * INTO c FROM dislock.claim_window_unchecked(p_key, p_window, p_index, p_owner, p_cluster, p_pod,
        p_ttl_us, p_job_prefix, p_standby, p_view, p_view_recency_us, p_view_refresh_us, p_max_late_us);
    w := c.w; outcome := c.outcome; db_now := c.db_now;
    other_clusters := c.other_clusters; other_views := c.other_views; other_seen := c.other_seen;
END
$$;

REVOKE ALL ON FUNCTION dislock.claim_window(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dislock.claim_window(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) TO dislock_tenant;

REVOKE ALL ON FUNCTION dislock.record_decision_unchecked(text, timestamptz, int, text, text, text, text, text, bigint, float8, float8[])
    FROM PUBLIC, dislock_tenant;

-- record_decision: see record_decision_unchecked (migration 10).
CREATE OR REPLACE FUNCTION dislock.record_decision(
    p_key text, p_window timestamptz, p_index int, p_cluster text, p_job text, p_pod text,
    p_action text, p_reason text, p_token bigint, p_seconds float8, p_buckets float8[])
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM dislock.require_scope(p_key, 'record a decision of');
    PERFORM dislock.record_decision_unchecked(p_key, p_window, p_index, p_cluster, p_job, p_pod,
        p_action, p_reason, p_token, p_seconds, p_buckets);
END
$$;

REVOKE ALL ON FUNCTION dislock.record_decision(text, timestamptz, int, text, text, text, text, text, bigint, float8, float8[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dislock.record_decision(text, timestamptz, int, text, text, text, text, text, bigint, float8, float8[]) TO dislock_tenant;
