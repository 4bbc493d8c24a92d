-- dislock: compatible-from 7
-- Version 17: a lease in one call, and a pause looked up with a kept plan.
--
-- A pod took its lease with one statement under row-level security, and a
-- refused pod sent a second to learn who holds the lease or who paused its
-- key: two round trips, each planned afresh (no prepared statements through
-- PgBouncer's transaction pooling), and the namespace and the token's high
-- water checked per row by the policies.
--
-- acquire_lease grants, re-enters or refuses in one call, with its owner's
-- rights behind one namespace check (require_scope, as claim_window and
-- renew do) and the high-water check row-level security made on the rows
-- written, its plans kept per connection. A refusal writes nothing.
--
-- A grant that waited for the lease's row while a pause of its key
-- committed is undone (SQLSTATE DL004), as a claim's is (migration 16):
-- the pause was read before the wait, and no grant starts a run after a
-- pause committed. The key whose pause applies is the lease key up to its
-- first '#' (an Indexed Job's lease "ns/name#i" is paused with "ns/name"),
-- decided here rather than by the caller, so that no caller can ask about
-- another namespace's pause through it.
--
-- pause_holding, which every claim calls, becomes PL/pgSQL, so that its
-- plan is kept per server connection (see below). Both undos need each
-- statement of the call to see what committed before it began:
-- acquire_lease and claim_unless_paused refuse to start a run above read
-- committed.
--
-- Older agents keep their statements, against the same rows, under the
-- same rule (hence compatible-from 7).

-- require_read_committed raises unless the transaction runs at read
-- committed. A claim or grant that starts a run needs each statement of its
-- call to see what committed before it began: the recheck of a pause after
-- it waited for its row. A session defaulting to a stricter isolation
-- (default_transaction_isolation on the agents' role or database) would
-- read one snapshot throughout, and keep a claim or grant a pause should
-- have undone. Raised after the claim or grant, it undoes it; refusals and
-- re-entries (a run going) need no recheck, and are answered at any level.
CREATE OR REPLACE FUNCTION dislock.require_read_committed(p_what text) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- PostgreSQL runs read uncommitted as read committed.
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_transaction_state',
            MESSAGE = format('dislock: %s asked for at isolation level %s: dislock decides at read committed',
                             p_what, current_setting('transaction_isolation')),
            HINT = 'reset default_transaction_isolation for the role or database the agents log in with (ALTER ROLE … RESET default_transaction_isolation)';
    END IF;
END
$$;

REVOKE ALL ON FUNCTION dislock.require_read_committed(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION dislock.acquire_lease(p_key text, p_owner text, p_ttl_us bigint,
    OUT l dislock.leases, OUT outcome text, OUT db_now timestamptz,
    OUT paused_by text, OUT pause_reason text, OUT paused_until timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pause_key text := split_part(p_key, '#', 1);
    paused boolean := false;
    inserted boolean;
    p record;
BEGIN
    PERFORM dislock.require_scope(p_key, 'acquire the lease');
    db_now := now();
    -- The row is read first: another's live lease (the common answer at
    -- the top of the hour, another cluster's pod was first) is refused
    -- without the insert, which would lock the row and draw a token, and
    -- so without a write to wait for.
    SELECT y.* INTO l FROM dislock.leases y WHERE y.lock_key = p_key;
    IF NOT (l.lock_key IS NOT NULL AND l.owner <> p_owner AND l.expire_at > db_now) THEN
        SELECT h.paused_by, h.reason, h.until INTO p FROM dislock.pause_holding(pause_key, NULL) h;
        paused := FOUND;
        -- While paused only the caller's own live lease is re-entered (a
        -- restarted sidecar of a run going: a pause stops no run).
        IF NOT paused OR (l.lock_key IS NOT NULL AND l.owner = p_owner AND l.expire_at > db_now) THEN
            -- The insert decides under the row lock, by the same rule,
            -- what committed since the look included.
            INSERT INTO dislock.leases AS x (lock_key, owner, token, acquired_at, expire_at)
            VALUES (p_key, p_owner, dislock.next_token(), db_now, db_now + p_ttl_us * interval '1 microsecond')
            ON CONFLICT (lock_key) DO UPDATE SET
                -- The same owner's live lease keeps its token and
                -- acquisition; anyone else's grant draws a new token under
                -- the row lock, so that tokens grow in the order leases
                -- are granted.
                token       = CASE WHEN x.owner = EXCLUDED.owner AND x.expire_at > now()
                                   THEN x.token ELSE dislock.next_token() END,
                acquired_at = CASE WHEN x.owner = EXCLUDED.owner AND x.expire_at > now()
                                   THEN x.acquired_at ELSE EXCLUDED.acquired_at END,
                owner       = EXCLUDED.owner,
                expire_at   = EXCLUDED.expire_at
            WHERE (x.expire_at <= now() OR x.owner = EXCLUDED.owner)
              AND (NOT paused OR (x.owner = EXCLUDED.owner AND x.expire_at > now()))
            RETURNING x.lock_key, x.owner, x.token, x.acquired_at, x.expire_at, (x.xmax = 0)
                INTO l.lock_key, l.owner, l.token, l.acquired_at, l.expire_at, inserted;
            IF FOUND THEN
                outcome := CASE WHEN inserted OR l.acquired_at = db_now THEN 'granted' ELSE 'reentered' END;
                -- A grant that waited for the row while a pause committed
                -- is undone. This statement sees what committed until it
                -- began.
                IF outcome = 'granted' THEN
                    PERFORM dislock.require_read_committed(format('lease %s', p_key));
                    SELECT h.paused_by, h.reason, h.until INTO p FROM dislock.pause_holding(pause_key, NULL) h;
                    IF FOUND THEN
                        RAISE EXCEPTION USING ERRCODE = 'DL004',
                            MESSAGE = format('dislock: %s was paused while this grant of lease %s waited', pause_key, p_key),
                            DETAIL = p.paused_by, HINT = p.reason,
                            COLUMN = coalesce(to_char(p.until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), '');
                    END IF;
                END IF;
                IF dislock.session_scope() <> '' AND l.token > dislock.token_high_water() THEN
                    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                        MESSAGE = format('dislock: role %s may not hold lease %s: its token %s is above the high water %s',
                                         session_user, p_key, l.token, dislock.token_high_water()),
                        HINT = 'run dislock check with the owner''s URL and apply its fix for the tokens';
                END IF;
                RETURN;
            END IF;
            -- Refused under the row lock: the holder's row, read afresh.
            SELECT y.* INTO l FROM dislock.leases y WHERE y.lock_key = p_key;
        END IF;
    END IF;
    -- Refused. Another's live lease is answered as held, paused or not:
    -- another pod of its Job waits for the run to end, anyone else skips.
    IF paused AND NOT (l.lock_key IS NOT NULL AND l.owner <> p_owner AND l.expire_at > db_now) THEN
        outcome := 'paused';
        l := NULL;
        paused_by := p.paused_by; pause_reason := p.reason; paused_until := p.until;
        RETURN;
    END IF;
    outcome := 'held';
END
$$;

REVOKE ALL ON FUNCTION dislock.acquire_lease(text, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dislock.acquire_lease(text, text, bigint) TO dislock_tenant;

-- pause_holding (migration 16) in PL/pgSQL, with the same answers: as a
-- SQL function with its own search_path it was never inlined, and was
-- planned again on every call, once for every claim and twice for every
-- winner; PL/pgSQL keeps its plan per server connection.
CREATE OR REPLACE FUNCTION dislock.pause_holding(p_key text, p_window timestamptz,
    OUT paused_by text, OUT reason text, OUT until timestamptz)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT p.paused_by, p.reason, p.until FROM dislock.pauses p
        WHERE p.lock_key = p_key
          AND (p.resumed_at IS NULL AND (p.until IS NULL OR p.until > now())
               OR p.paused_at <= p_window AND p_window < coalesce(p.resumed_at, p.until, 'infinity'))
        ORDER BY p.paused_at DESC LIMIT 1;
END
$$;

REVOKE ALL ON FUNCTION dislock.pause_holding(text, timestamptz) FROM PUBLIC, dislock_tenant;

-- claim_unless_paused (migration 16), what this release's agents claim
-- with, undoes a claim that starts a run above read committed too (see
-- require_read_committed): its undo of a claim that waited while the key
-- was paused needs read committed.
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
    IF outcome IN ('claimed', 'took-over') THEN
        PERFORM dislock.require_read_committed(format('window %s of %s', p_window, p_key));
    ELSIF outcome = 'paused' THEN
        SELECT h.paused_by, h.reason, h.until INTO paused_by, pause_reason, paused_until
            FROM dislock.pause_holding(p_key, p_window) h;
    END IF;
END
$$;
