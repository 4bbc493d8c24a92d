-- Version 4: tenant roles. Every opted-in namespace gets login roles of its
-- own (one per cluster, rotated by the webhook), members of the group role
-- dislock_tenant. A tenant role reads and writes only the rows whose key
-- starts with its namespace, draws fencing tokens only through
-- dislock.next_token(), and has no other right in the schema. The owner
-- (the role that runs the migrations, the webhook and the operator CLI) owns
-- every table and so is not subject to row-level security: agents and
-- webhooks of schema version 3 that use the owner's URL keep working.
--
-- Creating dislock_tenant needs CREATEROLE. Creating and dropping the
-- namespaces' login roles (ProvisionTenant, RetireTenantRoles) needs
-- CREATEROLE and the right to grant dislock_tenant: on PostgreSQL 15 and
-- older CREATEROLE alone gives that. On PostgreSQL 16 and newer a
-- CREATEROLE role may grant only roles it holds with ADMIN OPTION; it
-- receives that for the roles it creates, so this migration creating
-- dislock_tenant suffices. Where a DBA created dislock_tenant instead, the
-- owner needs `GRANT dislock_tenant TO <owner> WITH ADMIN OPTION`.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'dislock_tenant') THEN
        IF NOT (SELECT rolcreaterole OR rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
            -- The fix goes into the message itself: clients print the
            -- message, not always the hint.
            RAISE EXCEPTION '%', format('schema dislock version 4 needs the group role dislock_tenant, and role %I may not '
                'create roles: as a superuser, ALTER ROLE %I CREATEROLE (the webhook creates the namespaces'' roles with it too)',
                current_user, current_user)
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        CREATE ROLE dislock_tenant NOLOGIN;
    END IF;
END
$$;

-- One row per login role the webhook of a cluster created for a namespace.
-- A generation is superseded when a newer one replaces it (rotation) or the
-- namespace opts out, and retired (the role dropped) after a grace, so that
-- pods still running with it finish. Retired rows stay, so that a
-- generation number, and with it a role name, is never used twice.
CREATE TABLE IF NOT EXISTS dislock.tenants (
    role_name     text        PRIMARY KEY,
    cluster       text        NOT NULL,
    namespace     text        NOT NULL,
    generation    int         NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    superseded_at timestamptz,
    retired_at    timestamptz,
    UNIQUE (cluster, namespace, generation)
);

-- The namespace the session's login role serves, or NULL for any other
-- role. session_user, not current_user: inside a SECURITY DEFINER function
-- current_user is the owner, and SET ROLE (to dislock_tenant, the only role
-- a tenant may become) does not change session_user. It runs as the owner
-- because tenants may not read dislock.tenants; the search path is pinned
-- so that nothing a caller defines can stand in for what it calls.
CREATE OR REPLACE FUNCTION dislock.tenant_namespace() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT namespace FROM dislock.tenants WHERE role_name = session_user AND retired_at IS NULL
$$;

-- Tenants draw tokens only through next_token(), which runs as the owner:
-- they have no right on the counter (setval would send every namespace's
-- tokens back) nor on the epoch.
ALTER FUNCTION dislock.next_token() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- The largest token next_token() can have handed out so far: the current
-- epoch over the counter's last value. Every token it hands out later is
-- above it. The policies below hold every token a tenant writes to it: the
-- UPDATE column right on token (the claim's takeover draws a new one) would
-- otherwise let a tenant write any value into its own rows, and one far
-- above the epoch makes `dislock check` report lost epochs. A token drawn
-- earlier in the same statement or transaction passes: the counter is read
-- as it is now, not as the statement's snapshot saw it. VOLATILE, not
-- STABLE, for the same reason with the epoch: a STABLE function reads
-- token_epoch in the calling statement's snapshot, and an epoch raised by a
-- concurrent transaction (an operator's UPDATE of token_epoch) after the
-- statement began, which next_token() sees, would refuse the statement's own
-- token. It runs as the owner because tenants may read neither the counter
-- nor the epoch. A row that already holds a token above it (an asynchronous
-- failover lost the epoch; `dislock check` fails then) can no longer be
-- written by its tenant until the operator applies check's fix: fail closed.
CREATE OR REPLACE FUNCTION dislock.token_high_water() RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT (dislock.token_epoch_now() << 40) + last_value FROM dislock.token_counter
$$;

-- A function is executable by PUBLIC unless revoked: the owner keeps what it
-- owns, tenants get exactly the three they need (a row-level security
-- policy runs with the querying role's rights, so it needs tenant_namespace
-- and token_high_water too).
-- A later migration that adds a function must revoke it from PUBLIC too (a
-- test holds every function of the schema to that).
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA dislock FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dislock.next_token(), dislock.tenant_namespace(), dislock.token_high_water() TO dislock_tenant;

-- A key is <namespace>/<name>, or <namespace>/<name>#<index> for a lease of
-- an Indexed Job; a namespace is a DNS label, so it never contains '/', and
-- "team" never matches "team-a/...". One policy per table for every
-- command: USING filters the rows a tenant sees, updates and (would)
-- delete, WITH CHECK refuses a row it writes for another namespace. On
-- INSERT ... ON CONFLICT DO UPDATE, PostgreSQL checks the proposed row with
-- WITH CHECK and raises an error when the existing row fails USING, so a
-- claim on another namespace's key is an error, never a silent no-op. The
-- namespace function sits in a sub-select: it runs once per statement, not
-- per row. token_high_water() does not: it must run after the row's own
-- next_token() (a multi-row INSERT draws one per row), and it runs only on
-- rows written, not on rows scanned.
ALTER TABLE dislock.windows ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_namespace ON dislock.windows;
CREATE POLICY tenant_namespace ON dislock.windows TO dislock_tenant
    USING (starts_with(lock_key, (SELECT dislock.tenant_namespace()) || '/'))
    WITH CHECK (starts_with(lock_key, (SELECT dislock.tenant_namespace()) || '/')
                AND token <= dislock.token_high_water());

ALTER TABLE dislock.leases ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_namespace ON dislock.leases;
CREATE POLICY tenant_namespace ON dislock.leases TO dislock_tenant
    USING (starts_with(lock_key, (SELECT dislock.tenant_namespace()) || '/'))
    WITH CHECK (starts_with(lock_key, (SELECT dislock.tenant_namespace()) || '/')
                AND token <= dislock.token_high_water());

ALTER TABLE dislock.views ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_namespace ON dislock.views;
CREATE POLICY tenant_namespace ON dislock.views TO dislock_tenant
    USING (starts_with(lock_key, (SELECT dislock.tenant_namespace()) || '/'))
    WITH CHECK (starts_with(lock_key, (SELECT dislock.tenant_namespace()) || '/'));

-- Exactly what the agent's statements use. UPDATE is granted per column,
-- never on a key column, and not on the table: with table-wide UPDATE a
-- tenant could LOCK TABLE ... IN ACCESS EXCLUSIVE MODE and stall every
-- namespace's claims. No DELETE (a release only expires a lease), no
-- TRUNCATE, REFERENCES or TRIGGER. schema_migrations is readable so that
-- `dislock check` with a tenant's URL can tell the schema version.
GRANT USAGE ON SCHEMA dislock TO dislock_tenant;
GRANT SELECT, INSERT ON dislock.windows, dislock.leases, dislock.views TO dislock_tenant;
GRANT UPDATE (owner, cluster, pod, token, state, claimed_at, alive_until, finished_at, exit_code)
    ON dislock.windows TO dislock_tenant;
GRANT UPDATE (owner, token, acquired_at, expire_at) ON dislock.leases TO dislock_tenant;
GRANT UPDATE (view, seen_at) ON dislock.views TO dislock_tenant;
GRANT SELECT ON dislock.schema_migrations TO dislock_tenant;

-- A view is a handful of settings. Bounded, no tenant's row can make the
-- owner's reads of every view (the disagreement report) allocate without
-- limit. NOT VALID: rows written before are small, and need no scan.
ALTER TABLE dislock.views DROP CONSTRAINT IF EXISTS views_size,
    ADD CONSTRAINT views_size CHECK (octet_length(view::text) <= 4096) NOT VALID;

-- Every row a tenant can write is one the owner can read back. Time:
-- timestamptz takes 'infinity' and '-infinity', which no Go time.Time (nor
-- any agent's statement, whose times all come from now()) holds; one such
-- row made the owner's listings of every namespace fail (the webhook's
-- disagreement report, `dislock windows`, `dislock leases`). Text: bounded
-- far above what an agent writes (a key is at most 328 bytes, a cluster 63,
-- a pod 253, an owner string the five parts joined by '/'), so that no row
-- makes the owner's reads allocate without limit. Characters are not
-- restricted here: the CLI escapes what it prints. CHECK constraints, not
-- the policies' WITH CHECK: they hold for every role that writes, the
-- owner and schema version 3 agents included, and they also hold on an
-- UPDATE of one column (the tenants' column rights). NOT VALID: only
-- tenants could have written such values, and tenants arrive with this
-- migration, so no existing row needs a scan (nor the long lock one takes).
ALTER TABLE dislock.windows DROP CONSTRAINT IF EXISTS windows_finite_times,
    ADD CONSTRAINT windows_finite_times CHECK (isfinite(window_start) AND isfinite(claimed_at)
        AND isfinite(alive_until) AND (finished_at IS NULL OR isfinite(finished_at))) NOT VALID,
    DROP CONSTRAINT IF EXISTS windows_text_size,
    ADD CONSTRAINT windows_text_size CHECK (octet_length(lock_key) <= 512 AND octet_length(cluster) <= 512
        AND octet_length(pod) <= 512 AND octet_length(owner) <= 1024) NOT VALID;
ALTER TABLE dislock.leases DROP CONSTRAINT IF EXISTS leases_finite_times,
    ADD CONSTRAINT leases_finite_times CHECK (isfinite(acquired_at) AND isfinite(expire_at)) NOT VALID,
    DROP CONSTRAINT IF EXISTS leases_text_size,
    ADD CONSTRAINT leases_text_size CHECK (octet_length(lock_key) <= 512 AND octet_length(owner) <= 1024) NOT VALID;
ALTER TABLE dislock.views DROP CONSTRAINT IF EXISTS views_finite_times,
    ADD CONSTRAINT views_finite_times CHECK (isfinite(seen_at)) NOT VALID,
    DROP CONSTRAINT IF EXISTS views_text_size,
    ADD CONSTRAINT views_text_size CHECK (octet_length(lock_key) <= 512 AND octet_length(cluster) <= 512) NOT VALID;

-- Where the owner owns schema public (it owns the database), nobody else
-- may create there: on PostgreSQL 14 and older, and databases upgraded from
-- them, PUBLIC may, and an operator or function planted in public could
-- stand in for a built-in in another role's statements. Tenant roles also
-- resolve names in pg_catalog first (ProvisionTenant pins their
-- search_path); `dislock check` reports a public schema others may write.
DO $$
BEGIN
    IF pg_catalog.pg_has_role(current_user,
            (SELECT nspowner FROM pg_catalog.pg_namespace WHERE nspname = 'public'), 'USAGE') THEN
        REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    END IF;
END
$$;
