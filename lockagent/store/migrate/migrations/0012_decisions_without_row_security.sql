-- dislock: compatible-from 7
-- Version 12: a decision no longer pays for row-level security.
--
-- A pod's decision is two calls, claim_window and record_decision
-- (migration 10), and both ran with the caller's rights: every statement in
-- them evaluated a policy's tenant_namespace() (the claim's reads of its
-- window and view, its upserts, the ledger's three tables) and every row a
-- claim wrote evaluated token_high_water(): a seventh of the database's CPU
-- per decision (BenchmarkDecision).
--
-- Both now run with their owner's rights behind one check, as renew does
-- (migration 11): the key must be one the caller may write, by
-- session_scope(), which no longer gives every key to a BYPASSRLS role.
-- What the policies checked besides: a claim's token is drawn by
-- next_token() under the row lock, never above the high water, or kept
-- from the row, which claim_window checks on every claim a tenant wins;
-- the ledger's policies checked the namespace alone. The rule of
-- "Ownership and re-entry" and the ledger's write stay where migration 10
-- put them, renamed claim_window_unchecked and record_decision_unchecked:
-- only the owner may call those, and they still run with the caller's
-- rights. The triggers of migration 7 fire as before. Agents of schemas 7-9
-- keep their own statements under row-level security; agents of schema 10
-- call the same names with the same arguments (hence compatible-from 7).

-- The key prefix the session's role may write through the functions that
-- run with the owner's rights (claim_window, record_decision, renew): its
-- live namespace and '/' for a tenant role; '' (every key) for a superuser
-- and a member of the tables' owner (with its privileges, or able to SET
-- ROLE to it, as a NOINHERIT login role whose sessions start as the owner),
-- which may write every row anyway; NULL (no key) for any other role.
-- Migration 11 gave every key to a BYPASSRLS role too, but row-level
-- security only ever filtered what a role's grants allowed, and such a role
-- may hold no grant to write (a monitoring role reading every namespace):
-- through these functions it would have written every namespace's rows.
CREATE OR REPLACE FUNCTION dislock.session_scope() RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ns text;
BEGIN
    SELECT t.namespace INTO ns FROM dislock.tenants t WHERE t.role_name = session_user AND t.retired_at IS NULL;
    IF FOUND THEN
        RETURN ns || '/';
    END IF;
    IF (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user)
       OR pg_has_role(session_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = 'dislock.windows'::regclass), 'MEMBER') THEN
        RETURN '';
    END IF;
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION dislock.session_scope() FROM PUBLIC;

-- require_scope raises insufficient_privilege, as row-level security did,
-- unless the session's role may write key (see session_scope); what names
-- the refused action in the message. A NULL key is refused too.
CREATE OR REPLACE FUNCTION dislock.require_scope(p_key text, p_what text) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    scope text := dislock.session_scope();
BEGIN
    IF NOT coalesce(starts_with(p_key, scope), false) THEN
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
-- the outcomes. Row-level security's WITH CHECK also refused a tenant's
-- write of a row whose token is above the high water (migration 9): a new
-- or taken-over claim draws its token from next_token(), never above it,
-- but a re-entry keeps the row's, which two asynchronous failovers in a
-- row can leave above it. Every claim a tenant wins is checked, whatever
-- its outcome says: that running job fails closed, as its renewals do (see
-- renew), until the owner applies dislock check's fix.
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
    IF outcome <> 'refused' AND outcome <> 'stale' AND dislock.session_scope() <> '' AND w.token > dislock.token_high_water() THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('dislock: role %s may not hold window %s of %s: its token %s is above the high water %s',
                             session_user, p_window, p_key, w.token, dislock.token_high_water()),
            HINT = 'run dislock check with the owner''s URL and apply its fix for the tokens';
    END IF;
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
