-- dislock: compatible-from 7
-- Version 15: a holder's expiry never moves back while it holds.
--
-- A pod's renewals, and its claim's or lease's re-entries, each set the
-- expiry to their own now() + ttl. Two of them can land out of order: a
-- call the pod gave up on (its try timed out; a lock gateway runs a started
-- call to its end whatever the pod does) may still be waiting on a lock
-- while the pod's next call succeeds, and then land, setting an expiry
-- earlier than the one the pod was answered. The pod's safety deadline
-- counts from the call it was answered for, so an expiry moved back could
-- fall before the deadline, and another pod could take the window or the
-- lease while the app still runs.
--
-- So an update that keeps the holder (the same token: a takeover or a new
-- grant draws a new one) and sets a future expiry earlier than the row's
-- keeps the row's. What ends a hold still ends it: finishing a window
-- leaves 'running', and releasing a lease sets its expiry to now(), which
-- is not in the future. Nothing extends an expiry past what a call of the
-- holder set, so a dead pod's claim still lapses.
--
-- The WHEN clauses are evaluated without calling the functions: a renewal
-- in order pays no trigger. Older agents' statements are kept in order the
-- same way (hence compatible-from 7).

-- Both tables at once, each wait cut short: the triggers' DDL takes ACCESS
-- EXCLUSIVE on each table, and holding dislock.windows while waiting for
-- dislock.leases (behind a tenant's open transaction on its own lease row)
-- would stall every namespace's window calls for the whole wait. Past
-- 200 ms per table this attempt gives up and the migrator tries again.
SET LOCAL lock_timeout = '200ms';
LOCK TABLE dislock.windows, dislock.leases IN ACCESS EXCLUSIVE MODE;
CREATE OR REPLACE FUNCTION dislock.keep_window_expiry() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.alive_until := OLD.alive_until;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS window_expiry_kept ON dislock.windows;
CREATE TRIGGER window_expiry_kept BEFORE UPDATE OF alive_until ON dislock.windows
    FOR EACH ROW WHEN (NEW.token = OLD.token AND OLD.state = 'running' AND NEW.state = 'running'
                       AND NEW.alive_until > now() AND NEW.alive_until < OLD.alive_until)
    EXECUTE FUNCTION dislock.keep_window_expiry();

CREATE OR REPLACE FUNCTION dislock.keep_lease_expiry() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.expire_at := OLD.expire_at;
    RETURN NEW;
END
$$;

-- Named to fire after lease_renewal_check (migration 7; BEFORE triggers
-- fire in name order), which skips a renewal of a lease that expired while
-- it waited for the row.
DROP TRIGGER IF EXISTS lease_renewed_expiry_kept ON dislock.leases;
CREATE TRIGGER lease_renewed_expiry_kept BEFORE UPDATE OF expire_at ON dislock.leases
    FOR EACH ROW WHEN (NEW.token = OLD.token AND NEW.expire_at > now() AND NEW.expire_at < OLD.expire_at)
    EXECUTE FUNCTION dislock.keep_lease_expiry();

REVOKE ALL ON FUNCTION dislock.keep_window_expiry(), dislock.keep_lease_expiry() FROM PUBLIC;
