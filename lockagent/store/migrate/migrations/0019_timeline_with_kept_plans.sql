-- dislock: compatible-from 7
-- Version 19: the WAL timeline and the epoch's check with kept plans.
--
-- wal_timeline (migration 3) and token_epoch_held_by (migration 9) are SQL
-- functions the planner cannot inline: the first calls a volatile function
-- (pg_current_wal_lsn) though it is declared stable, the second reads a
-- function in its FROM. So every call planned its body again: each
-- renewal and each tenant's claim through the token's high water
-- (token_epoch_now), and each claim that draws a token (next_token) once
-- more. As PL/pgSQL, like the other parts of the tokens (migrations 10 and
-- 11), their plans are kept per server connection. Same names, arguments
-- and answers; older agents call them through the same functions (hence
-- compatible-from 7).
CREATE OR REPLACE FUNCTION dislock.wal_timeline() RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN ('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
END
$$;

CREATE OR REPLACE FUNCTION dislock.token_epoch_held_by(e dislock.token_epoch, tl bigint) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    sysid bigint := (SELECT c.system_identifier FROM pg_catalog.pg_control_system() c);
BEGIN
    RETURN CASE
        WHEN e.system_id IS DISTINCT FROM sysid THEN
            format('the database is another PostgreSQL cluster (system identifier %s, the epochs were kept in %s): a pg_upgrade, or a restore into a new cluster', sysid, e.system_id)
        WHEN e.counter_oid IS DISTINCT FROM 'dislock.token_counter'::regclass::oid THEN
            'the token counter is not the one the epochs were kept with: the schema was restored from a dump'
        WHEN tl < e.base_timeline THEN
            format('the WAL timeline %s is older than the one the epochs were kept on (%s)', tl, e.base_timeline)
        WHEN e.base_epoch + (tl - e.base_timeline) < e.last_epoch THEN
            format('the timeline gives epoch %s, below epoch %s already used', e.base_epoch + (tl - e.base_timeline), e.last_epoch)
        END;
END
$$;
