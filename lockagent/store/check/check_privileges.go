package check

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/db"
	"github.com/dislock/dislock/lockagent/store/tenant"
)

// qOwnerPrivileges reads what the owner role needs: CREATE on the database
// to create schema dislock (or, once it exists, owning it) to migrate;
// the group role dislock_tenant, which migration 4 creates unless it
// exists, and which needs CREATEROLE to create; and CREATEROLE (or
// superuser) to provision the tenants' login roles, which the lock
// gateway's credentials do without.
const qOwnerPrivileges = `
SELECT current_user::text, current_database()::text,
       has_database_privilege(current_database(), 'CREATE'),
       coalesce((SELECT pg_has_role(nspowner, 'USAGE') FROM pg_namespace WHERE nspname = 'dislock'), false),
       coalesce((SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user), false),
       EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '` + tenant.GroupRole + `'),
       -- PostgreSQL 16 and later: a CREATEROLE role grants only roles it
       -- holds WITH ADMIN OPTION (a superuser any).
       current_setting('server_version_num')::int < 160000
         OR coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false)
         OR NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '` + tenant.GroupRole + `')
         OR pg_has_role(current_user, '` + tenant.GroupRole + `', 'MEMBER WITH ADMIN OPTION')`

// ownerPrivileges says whether the owner role can migrate, and which of the
// two ways of giving namespaces their credentials it can serve: database
// roles of their own (CREATEROLE), or the lock gateway's credentials
// (nothing more than migrating).
func ownerPrivileges(ctx context.Context, conn *pgx.Conn) Finding {
	var role, database string
	var create, ownsSchema, createRole, group, grantsGroup bool
	if err := conn.QueryRow(ctx, qOwnerPrivileges).Scan(&role, &database, &create, &ownsSchema, &createRole, &group, &grantsGroup); err != nil {
		return Finding{Check: "privileges", Status: StatusFail, Detail: "cannot read the role's privileges: " + err.Error(),
			Fix: "run dislock check again once the database answers"}
	}
	ident := sqlIdent(role)
	var missing, fixes []string
	if !create && !ownsSchema {
		missing = append(missing, "CREATE on database "+database+" (to create schema dislock and migrate it)")
		fixes = append(fixes, fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s", sqlIdent(database), ident))
	}
	if !group && !createRole {
		missing = append(missing, "the group role "+tenant.GroupRole+", which it may not create (the migrations grant the tenants' rights to it)")
		fixes = append(fixes, "CREATE ROLE "+tenant.GroupRole+" NOLOGIN (as any role that may create roles: a managed database's admin user may)")
	}
	if len(missing) > 0 {
		return Finding{Check: "privileges", Status: StatusFail,
			Detail: fmt.Sprintf("role %s lacks %s", role, strings.Join(missing, " and ")),
			Fix:    "as a superuser (or the database's owner): " + strings.Join(fixes, "; ")}
	}
	how := "may create schema dislock"
	if ownsSchema {
		how = "owns schema dislock"
	}
	if createRole && !grantsGroup {
		return Finding{Check: "privileges", Status: StatusWarn,
			Detail: fmt.Sprintf("role %s %s (migrate) and may create roles, but may not grant %s, which someone else created: namespaces cannot get database roles of their own "+
				"(access paths: lock gateway yes, tenant roles no)", role, how, tenant.GroupRole),
			Fix: "for tenant roles: GRANT " + tenant.GroupRole + " TO " + ident + " WITH ADMIN OPTION (as the role that created it); or install with the lock gateway (the chart's gateway.enabled)"}
	}
	if !createRole {
		return Finding{Check: "privileges", Status: StatusWarn,
			Detail: fmt.Sprintf("role %s %s (migrate) but lacks CREATEROLE: namespaces cannot get database roles of their own; "+
				"the lock gateway's credentials need none (access paths: lock gateway yes, tenant roles no)", role, how),
			Fix: "install with the lock gateway (the chart's gateway.enabled, or dislock webhook --tenant-gateway-url); " +
				"for tenant roles instead: ALTER ROLE " + ident + " CREATEROLE (as a superuser)"}
	}
	return Finding{Check: "privileges", Status: StatusOK,
		Detail: fmt.Sprintf("role %s %s (migrate) and may create roles (access paths: tenant roles yes, lock gateway yes)", role, how)}
}

// sqlIdent quotes an identifier for a statement an operator copies, only
// when it needs quotes.
func sqlIdent(name string) string {
	if plainIdent.MatchString(name) {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}

var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// probeKeyName is the name part of the key a tenant's privilege probe
// claims in its own namespace.
const probeKeyName = "dislock-check-probe"

// tenantPrivileges runs what an agent runs, the claim of a window and the
// grant of a lease, their renewals and a ledger write, with the very
// statements the agent sends, on a probe
// key of the role's namespace, inside a transaction it rolls back: the rows
// are never committed. The statements draw fencing tokens (a sequence is
// not transactional), which only leaves a gap in the counter, as any
// claim that is refused does. BEGIN … ROLLBACK holds one server connection
// through PgBouncer's transaction pooling too.
func (s checker) tenantPrivileges(ctx context.Context, conn *pgx.Conn, namespace string) Finding {
	key := namespace + "/" + probeKeyName
	whose := "namespace " + namespace
	if namespace == "" {
		whose = "its namespace (the role cannot tell which: dislock.tenant_namespace() refused it)"
	}
	o := store.Owner{Cluster: "dislock-check", Namespace: namespace, Job: probeKeyName, JobUID: "probe", Pod: probeKeyName}
	const ttl = time.Minute
	window := time.Now().UTC().Truncate(time.Minute)
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		claim, err := firstRow(ctx, tx, store.ClaimWindowSQL, key, window, store.NotIndexed,
			o.WindowOwner(), o.Cluster, o.Pod, db.Micros(ttl), o.JobPrefix(), false, `{"schedule":"probe"}`,
			db.Micros(store.DefaultViewRecency), db.Micros(store.ViewRefresh), nil)
		if err != nil {
			return fmt.Errorf("claiming a window: %w", err)
		}
		var windowToken any // NULL: the probe renews no window
		if claim != nil && claim[12] != "refused" {
			windowToken = claim[6]
		}
		lease, err := firstRow(ctx, tx, store.AcquireLeaseSQL, key, o.LeaseOwner(), db.Micros(ttl))
		if err != nil {
			return fmt.Errorf("taking a lease: %w", err)
		}
		var leaseKey, leaseToken any
		if lease != nil && (lease[5] == "granted" || lease[5] == "reentered") {
			leaseKey, leaseToken = key, lease[2]
		}
		// A real job of the probe's key may hold the window or the lease:
		// the probe then renews nothing of it (its row stays untouched,
		// not even locked).
		if windowToken != nil || leaseToken != nil {
			renewed, err := firstRow(ctx, tx, store.RenewSQL, key, window, store.NotIndexed, windowToken, leaseKey, leaseToken, db.Micros(ttl))
			switch {
			case err != nil:
				return fmt.Errorf("renewing the window's claim and the lease: %w", err)
			case renewed == nil || (windowToken != nil && renewed[0] == nil) || (leaseToken != nil && renewed[1] == nil):
				return fmt.Errorf("renewing the window's claim and the lease: the role's own fresh claim or lease was not renewed (%v)", renewed)
			}
		}
		if _, err := tx.Exec(ctx, store.RecordDecisionSQL, key, window, store.NotIndexed, o.Cluster, o.Job, o.Pod,
			string(store.ActionRun), "dislock check's probe", int64(0), nil, store.DurationBuckets); err != nil {
			return fmt.Errorf("adding a decision to the ledger: %w", err)
		}
		return errRollBack
	})
	if errors.Is(err, errRollBack) {
		// The probe ran what this release's agents send; agents of earlier
		// releases may still run in a cluster not upgraded yet: schema 10's
		// renew with renew_window and renew_lease, those of schemas 7-9
		// claim and write the ledger with their own statements.
		missing, grants, lerr := tenantGrantsMissing(ctx, conn)
		if lerr == nil && len(missing) > 0 {
			return Finding{Check: "privileges", Status: StatusWarn,
				Detail: fmt.Sprintf("the role does what an agent of this release does on key %s of namespace %s, but lacks grants migration 4 gives, which agents of earlier releases use (in a cluster not upgraded yet: schema 10's renew with dislock.renew_window and renew_lease, those of schemas 7-9 write the tables with their own statements); missing: %s",
					key, namespace, strings.Join(missing, ", ")),
				Fix: "as the owner: " + strings.Join(grants, "; ")}
		}
		return Finding{Check: "privileges", Status: StatusOK,
			Detail: fmt.Sprintf("the role claims windows and takes leases of namespace %s (tried on key %s in a transaction rolled back)", namespace, key)}
	}
	f := Finding{Check: "privileges", Status: StatusFail,
		Detail: fmt.Sprintf("the role cannot do what an agent of %s does (tried on key %s in a transaction rolled back): %v", whose, key, err)}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "25000": // invalid_transaction_state: above read committed
		f.Fix = pgErr.Hint
		return f
	case !errors.As(err, &pgErr) || pgErr.Code != "42501": // insufficient_privilege
		f.Fix = "run `dislock migrate` with the owner's URL, then dislock check again"
		return f
	}
	missing, grants, lerr := tenantGrantsMissing(ctx, conn)
	switch {
	case lerr != nil:
		f.Fix = "restore the grants migration 4 gives role " + tenant.GroupRole + " (lockagent/store/migrate/migrations/0004_tenants.sql); cannot list which are missing: " + lerr.Error()
	case len(missing) == 0:
		f.Fix = "the role holds every grant an agent needs, so the namespace check refused it (dislock.require_scope, or a row-level security policy): check that dislock.tenants names this role, not retired, for namespace " + namespace
	default:
		f.Detail += "; missing: " + strings.Join(missing, ", ")
		f.Fix = "as the owner: " + strings.Join(grants, "; ")
	}
	return f
}

// firstRow runs query and returns its first row's values, nil when there
// is none (a grant refused): the probe passes on the token a grant
// returned (the window's is the 7th column of ClaimWindowSQL, its outcome
// the 13th; the lease's token the 3rd of AcquireLeaseSQL, its outcome the
// 6th).
func firstRow(ctx context.Context, tx pgx.Tx, query string, args ...any) ([]any, error) {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if !rows.Next() {
		return nil, rows.Err()
	}
	return rows.Values()
}

// errRollBack ends the probe's transaction with a rollback.
var errRollBack = errors.New("rolled back")

// qTenantGrants lists every privilege an agent's statements need, the
// statement that grants it (as migration 4 does, to the tenants' group
// role), and whether the session's role holds it. Membership in the group
// role comes first: without it every other grant is missing at once.
// Objects are found by OID in the catalogs: a name such as
// 'dislock.windows' would need USAGE on the schema just to be looked up.
var qTenantGrants = `
SELECT what, fix, coalesce(held, false) FROM (VALUES
  (0, 'membership in role ` + tenant.GroupRole + `', 'GRANT ` + tenant.GroupRole + ` TO ' || quote_ident(session_user),
      pg_has_role(session_user, '` + tenant.GroupRole + `', 'USAGE')),
  (1, 'USAGE on schema dislock', 'GRANT USAGE ON SCHEMA dislock TO ` + tenant.GroupRole + `',
      has_schema_privilege(session_user, 'dislock', 'USAGE')),
  (2, 'SELECT on dislock.windows', 'GRANT SELECT ON dislock.windows TO ` + tenant.GroupRole + `',
      has_table_privilege(session_user, ` + catalogRel("windows") + `, 'SELECT')),
  (3, 'INSERT on dislock.windows', 'GRANT INSERT ON dislock.windows TO ` + tenant.GroupRole + `',
      has_table_privilege(session_user, ` + catalogRel("windows") + `, 'INSERT')),
  (4, 'UPDATE on dislock.windows'' claim columns',
      'GRANT UPDATE (owner, cluster, pod, token, state, claimed_at, alive_until, finished_at, exit_code) ON dislock.windows TO ` + tenant.GroupRole + `',
      (SELECT bool_and(has_column_privilege(session_user, ` + catalogRel("windows") + `, c, 'UPDATE'))
       FROM unnest(ARRAY['owner', 'cluster', 'pod', 'token', 'state', 'claimed_at', 'alive_until', 'finished_at', 'exit_code']) c)),
  (5, 'SELECT on dislock.leases', 'GRANT SELECT ON dislock.leases TO ` + tenant.GroupRole + `',
      has_table_privilege(session_user, ` + catalogRel("leases") + `, 'SELECT')),
  (6, 'INSERT on dislock.leases', 'GRANT INSERT ON dislock.leases TO ` + tenant.GroupRole + `',
      has_table_privilege(session_user, ` + catalogRel("leases") + `, 'INSERT')),
  (7, 'UPDATE on dislock.leases'' lease columns', 'GRANT UPDATE (owner, token, acquired_at, expire_at) ON dislock.leases TO ` + tenant.GroupRole + `',
      (SELECT bool_and(has_column_privilege(session_user, ` + catalogRel("leases") + `, c, 'UPDATE'))
       FROM unnest(ARRAY['owner', 'token', 'acquired_at', 'expire_at']) c)),
  (8, 'EXECUTE on dislock.next_token(), dislock.tenant_namespace() and dislock.token_high_water()',
      'GRANT EXECUTE ON FUNCTION dislock.next_token(), dislock.tenant_namespace(), dislock.token_high_water() TO ` + tenant.GroupRole + `',
      (SELECT bool_and(has_function_privilege(session_user, p.oid, 'EXECUTE')) FROM pg_proc p
       WHERE p.pronamespace = 'dislock'::regnamespace AND p.proname IN ('next_token', 'tenant_namespace', 'token_high_water'))),
  (9, 'EXECUTE on the agent''s functions: dislock.claim_guarded(), claim_window(), claim_unless_paused(), window_takeable(), acquire_lease(), renew_guarded(), renew(), renew_window(), renew_lease(), commit_guard(), record_decision() and pause_of()',
      'GRANT EXECUTE ON FUNCTION ` + strings.Join(agentFunctions, ", ") + ` TO ` + tenant.GroupRole + `',
      (SELECT count(DISTINCT p.proname) = ` + strconv.Itoa(len(agentFunctions)) + ` AND bool_and(has_function_privilege(session_user, p.oid, 'EXECUTE')) FROM pg_proc p
       WHERE p.pronamespace = 'dislock'::regnamespace AND 'dislock.' || p.proname = ANY(ARRAY['` + strings.Join(agentFunctions, "', '") + `']))),
  (10, 'INSERT on the ledger (dislock.decisions, decision_counts, key_stats) and UPDATE of its counts and statistics',
      'GRANT SELECT, INSERT ON dislock.decisions, dislock.decision_counts, dislock.key_stats TO ` + tenant.GroupRole + `; ' ||
      'GRANT UPDATE (n) ON dislock.decision_counts TO ` + tenant.GroupRole + `; ' ||
      'GRANT UPDATE (last_decided, last_success, duration_count, duration_sum, duration_buckets) ON dislock.key_stats TO ` + tenant.GroupRole + `',
      (SELECT bool_and(has_table_privilege(session_user, t, 'INSERT')) FROM unnest(ARRAY[` + catalogRel("decisions") + `, ` + catalogRel("decision_counts") + `, ` + catalogRel("key_stats") + `]) t)
      AND has_column_privilege(session_user, ` + catalogRel("decision_counts") + `, 'n', 'UPDATE')
      AND (SELECT bool_and(has_column_privilege(session_user, ` + catalogRel("key_stats") + `, c, 'UPDATE'))
           FROM unnest(ARRAY['last_decided', 'last_success', 'duration_count', 'duration_sum', 'duration_buckets']) c))
) AS p(n, what, fix, held)
ORDER BY n`

// agentFunctions are the functions of migrations 10, 11, 16, 17 and 20
// agents call (each name is one function): renew_window and renew_lease
// are the renewals of agents of schema 10, and claim_unless_paused and
// renew the calls of agents of schemas 16-19, still running in clusters
// not upgraded yet.
var agentFunctions = []string{"dislock.claim_guarded", "dislock.claim_unless_paused", "dislock.claim_window", "dislock.pause_of",
	"dislock.window_takeable", "dislock.acquire_lease", "dislock.renew_guarded", "dislock.renew", "dislock.renew_window",
	"dislock.renew_lease", "dislock.commit_guard", "dislock.record_decision"}

// catalogRel is the OID of table dislock.<name>, looked up without a
// privilege on the schema.
func catalogRel(name string) string {
	return `(SELECT c.oid FROM pg_class c WHERE c.relnamespace = 'dislock'::regnamespace AND c.relname = '` + name + `')`
}

// tenantGrantsMissing names the privileges the session's role lacks and the
// grants that restore them.
func tenantGrantsMissing(ctx context.Context, conn *pgx.Conn) (missing, grants []string, err error) {
	rows, err := conn.Query(ctx, qTenantGrants)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var what, fix string
		var held bool
		if err := rows.Scan(&what, &fix, &held); err != nil {
			return nil, nil, err
		}
		if !held {
			missing, grants = append(missing, what), append(grants, fix)
		}
	}
	return missing, grants, rows.Err()
}
