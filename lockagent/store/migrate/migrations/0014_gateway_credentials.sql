-- dislock: compatible-from 7
-- Version 14: a namespace's pods may hold a lock gateway's credential
-- instead of a database role.
--
-- The lock gateway (lockagent/gateway) holds the only database login of
-- its cluster and runs the pods' calls on their behalf; a pod proves its
-- namespace with a credential the webhook mints. Each credential is a
-- generation of the namespace's tenant, like a role: the same row in
-- dislock.tenants, the same generations, superseding, grace and retiring,
-- so that a namespace moves from roles to the gateway (or back) by its
-- next generation, and the roles it leaves behind are dropped after the
-- grace as any superseded role is. The row keeps the credential's SHA-256
-- digest, never the credential: whoever reads the table cannot call as the
-- namespace. The credential is 256 random bits, so one unsalted hash
-- protects it as well as a slow one would.
--
-- Such a row names no role: its role_name is longer than any role name
-- PostgreSQL allows (63 bytes), so no session_user ever matches it and
-- session_scope() and tenant_namespace() never grant its namespace to a
-- login. Retiring it drops no role (DROP ROLE IF EXISTS finds none).
-- Owner only, like the rest of dislock.tenants. Older code never reads the
-- column (hence compatible-from 7).
ALTER TABLE dislock.tenants ADD COLUMN IF NOT EXISTS gateway_digest bytea;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'tenants_gateway_digest_check'
                   AND conrelid = 'dislock.tenants'::regclass) THEN
        ALTER TABLE dislock.tenants ADD CONSTRAINT tenants_gateway_digest_check
            CHECK (gateway_digest IS NULL OR (octet_length(gateway_digest) = 32 AND octet_length(role_name) > 63));
    END IF;
END
$$;
