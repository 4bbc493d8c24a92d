-- dislock: compatible-from 7
-- Version 11: a pod renews what it holds, its window's liveness and its
-- lease, in one call, and a renewal no longer pays for row-level security.
--
-- A running job renews every TTL/3; ten thousand of them renew a thousand
-- times a second. Through row-level security each renewal evaluated the
-- tenant's namespace twice (USING and WITH CHECK) and the token's high
-- water (WITH CHECK: its timeline from the WAL file name, the counter from
-- the sequence), and a pod holding both a window and a lease sent two
-- statements, each a durable commit of its own.
--
-- renew runs with its owner's rights and checks what row-level security
-- checked: that the key is one the caller may write (session_scope) and the
-- token not above the high water, once per call instead of once per row
-- written. Everything else the row must match (the token, the state, the
-- lease still live at clock_timestamp()) is the renewal's own WHERE clause,
-- as before; the lease's renewal trigger of migration 7 fires as before.
-- renew_window and renew_lease, which agents of schema 10 call, now call
-- renew. Older agents keep sending their own statements under row-level
-- security (hence compatible-from 7).

-- The key prefix the session's role may renew, as row-level security
-- would let it update: its live namespace and '/' for a tenant role; ''
-- (every key) for a role the policies do not restrict (a superuser, a
-- BYPASSRLS role, the tables' owner and whoever has its privileges); NULL
-- (no key) for any other role, to which no policy grants a row (a member
-- of dislock_tenant with no live namespace, retired or made by hand, or
-- one acting as the group through SET ROLE; a role granted EXECUTE on
-- the schema's functions wholesale).
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
    IF (SELECT r.rolsuper OR r.rolbypassrls FROM pg_roles r WHERE r.rolname = session_user)
       OR pg_has_role(session_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = 'dislock.windows'::regclass), 'USAGE') THEN
        RETURN '';
    END IF;
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION dislock.session_scope() FROM PUBLIC;

-- renew extends, by p_ttl_us from now(), the running claim of (p_key,
-- p_window, p_index) whose token is p_window_token, and the live lease
-- p_lease_key whose token is p_lease_token; a NULL or 0 token renews
-- nothing of that kind, and once the window is lost nothing is renewed (the
-- pod stops, and a lease it kept alive would only hold the key longer). One
-- row: each new expiry, NULL where there was nothing to renew or it is no
-- longer the caller's (a takeover drew a new token, the claim finished, the
-- lease lapsed), and now().
--
-- Each pod renews its own claim by its own token: nothing here renews a
-- claim no pod asked for, so a dead pod's claim lapses. A token above the
-- high water (see migration 9) is not renewed, as row-level security's
-- WITH CHECK refused before: that running job fails closed.
CREATE OR REPLACE FUNCTION dislock.renew(p_key text, p_window timestamptz, p_index int, p_window_token bigint,
                                         p_lease_key text, p_lease_token bigint, p_ttl_us bigint)
RETURNS TABLE (window_until timestamptz, lease_until timestamptz, db_now timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    scope text := dislock.session_scope();
    high bigint := dislock.token_high_water();
BEGIN
    IF coalesce(p_window_token, 0) <> 0 THEN
        IF starts_with(p_key, scope) AND p_window_token <= high THEN
            UPDATE dislock.windows w SET alive_until = now() + p_ttl_us * interval '1 microsecond'
            WHERE w.lock_key = p_key AND w.window_start = p_window AND w.job_index = p_index
              AND w.token = p_window_token AND w.state = 'running'
            RETURNING w.alive_until INTO window_until;
        END IF;
        IF window_until IS NULL THEN
            db_now := now();
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    -- Live is judged when the row is read (see the Store's qRenew).
    IF coalesce(p_lease_token, 0) <> 0 AND starts_with(p_lease_key, scope) AND p_lease_token <= high THEN
        UPDATE dislock.leases l SET expire_at = now() + p_ttl_us * interval '1 microsecond'
        WHERE l.lock_key = p_lease_key AND l.token = p_lease_token AND l.expire_at > clock_timestamp()
        RETURNING l.expire_at INTO lease_until;
    END IF;
    db_now := now();
    RETURN NEXT;
END
$$;

-- The two parts of the high water (migration 9), as they were, now planned
-- once per connection: as SQL functions reading a table they are never
-- inlined and were planned again on every call, twice per renewal and
-- claim.
CREATE OR REPLACE FUNCTION dislock.token_counter_drawn() RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT last_value - CASE WHEN is_called THEN 0 ELSE 1 END FROM dislock.token_counter);
END
$$;

CREATE OR REPLACE FUNCTION dislock.token_epoch_now() RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT e.base_epoch + (dislock.wal_timeline() - e.base_timeline) FROM dislock.token_epoch e);
END
$$;

CREATE OR REPLACE FUNCTION dislock.renew_window(p_key text, p_window timestamptz, p_index int, p_token bigint, p_ttl_us bigint)
RETURNS TABLE (renewed_until timestamptz, db_now timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT r.window_until, r.db_now FROM dislock.renew(p_key, p_window, p_index, p_token, NULL, NULL, p_ttl_us) r
                 WHERE r.window_until IS NOT NULL;
END
$$;

CREATE OR REPLACE FUNCTION dislock.renew_lease(p_key text, p_token bigint, p_ttl_us bigint)
RETURNS TABLE (renewed_until timestamptz, db_now timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT r.lease_until, r.db_now FROM dislock.renew(p_key, NULL, NULL, NULL, p_key, p_token, p_ttl_us) r
                 WHERE r.lease_until IS NOT NULL;
END
$$;

REVOKE ALL ON FUNCTION dislock.renew(text, timestamptz, int, bigint, text, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dislock.renew(text, timestamptz, int, bigint, text, bigint, bigint) TO dislock_tenant;
