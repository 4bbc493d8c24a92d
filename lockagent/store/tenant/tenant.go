// Package tenant owns the tenants' roles: each opted-in namespace's login
// role per cluster, created, rotated and dropped by the owner (the
// webhook), and the connection string a namespace's sidecars get. The
// sidecar never links this package.
package tenant

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/db"
	"github.com/dislock/dislock/lockagent/store/internal/dsn"
)

// Migration 4 creates what the roles rest on. Each opted-in namespace gets, per cluster, a
// login role that may lock only the keys of its namespace: row-level
// security on the key's namespace prefix, tokens only through
// dislock.next_token(), nothing else. The webhook creates them with the
// owner's URL and puts only the namespace's own credential into the
// namespace. A role per cluster, not one shared by every cluster's webhook,
// so that each cluster rotates its credentials on its own schedule without
// coordinating with the others; the namespaces' keys are the same in every
// cluster, so the rows the roles reach are too.

// GroupRole is the NOLOGIN role every tenant login role is a member
// of; the privileges and row-level security policies are granted to it.
const GroupRole = "dislock_tenant"

// RolePrefix starts every tenant login role's name.
const RolePrefix = "dislock_t_"

// SCRAM-SHA-256 verifier parameters. The iteration count makes each guess
// of a leaked verifier cost an attacker as much as a login costs the
// client: it protects passwords a person can guess. A tenant password is
// 256 bits from crypto/rand, beyond any count of guesses, so one iteration
// loses nothing; with PostgreSQL's default, 4 096, a pod's login through
// PgBouncer cost its CPU 1.45-1.65 ms instead of 0.59-0.62
// (BenchmarkTenantLogin), each time the top of the hour starts thousands.
// Clients that insist on RFC 7677's 4 096 (older pgjdbc) cannot use a
// tenant's credential; the agent is not one of them. The salt is
// PostgreSQL's length.
const (
	scramIterations = 1
	scramSaltLen    = 16
)

// ConnectionLimit bounds the PostgreSQL sessions of one tenant role:
// through PgBouncer a role holds at most its pool's server connections, and
// a tenant that reaches PostgreSQL directly must not take every backend.
const ConnectionLimit = 50

// Defaults every tenant role's sessions start with (ALTER ROLE … SET at
// provisioning), so that one namespace's sessions cannot cost the others
// much by accident. The agent's statements are short and it opens no
// transaction, so none of them binds it. A statement_timeout never cuts a
// commit's wait for the synchronous standby short (PostgreSQL stops the
// statement's timer before the commit), so it never makes a claim
// uncertain.
//
// statement_timeout and idle_in_transaction_session_timeout are a tenant's
// own to change: it may SET them in its session, or ALTER ROLE
// CURRENT_USER SET them for its role, as any role may. They bound a
// careless tenant, not a hostile one; for that, PgBouncer's
// idle_transaction_timeout ends an idle transaction whatever the session
// set (docs/install.md, "What one tenant can cost the others").
// temp_file_limit binds every tenant: only a role granted SET on it (a
// superuser's) may change it, and the owner may set it only when a
// superuser granted it that (PostgreSQL 15 and later: GRANT SET ON
// PARAMETER temp_file_limit TO <owner>); without the grant it is left
// unset, and the server-wide temp_file_limit applies.
const (
	// StatementTimeout ends a statement that runs longer: the
	// snapshot of a long statement holds back the cleanup of every
	// namespace's dead rows.
	StatementTimeout = time.Minute
	// IdleInTransactionTimeout ends a session idle inside a
	// transaction longer (the rows it locked are let go).
	IdleInTransactionTimeout = 30 * time.Second
	// TempFileLimit bounds the temporary files of each of the
	// role's sessions (a spilling sort): at most ConnectionLimit
	// times this per role on the disk every namespace shares.
	TempFileLimit = "64MB"
)

// tenantRoleBounds sets the role's defaults the owner may always set; the
// role name is quoted by the caller.
func tenantRoleBounds(role string) string {
	return fmt.Sprintf("ALTER ROLE %s SET statement_timeout = %d; ALTER ROLE %s SET idle_in_transaction_session_timeout = %d",
		role, StatementTimeout.Milliseconds(), role, IdleInTransactionTimeout.Milliseconds())
}

// boundTenantTempFiles sets the role's temp_file_limit if the owner may (see
// TempFileLimit), in a savepoint: a refusal leaves the rest of
// the provisioning's transaction as it was.
func boundTenantTempFiles(ctx context.Context, tx pgx.Tx, role string) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	err = sp.Conn().PgConn().Exec(ctx, "ALTER ROLE "+role+" SET temp_file_limit = "+quoteLiteral(TempFileLimit)).Close()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege: no GRANT SET ON PARAMETER
		return sp.Rollback(ctx)
	}
	if err != nil {
		return fmt.Errorf("bounding the temporary files of role %s: %w", role, err)
	}
	return sp.Commit(ctx)
}

// Credential is one login role of a namespace's tenant.
type Credential struct {
	Role, Password     string
	Namespace, Cluster string
	Generation         int
}

// Role is one live generation of a namespace's login role.
type Role struct {
	Role       string `json:"role"`
	Namespace  string `json:"namespace"`
	Cluster    string `json:"cluster"`
	Generation int    `json:"generation"`
	// CreatedAt and SupersededAt are database times in UTC; SupersededAt
	// is nil for the generation in use.
	CreatedAt    time.Time  `json:"createdAt"`
	SupersededAt *time.Time `json:"supersededAt,omitempty"`
}

const (
	// qTenantLock serialises every change to the tenants' roles, so that
	// concurrent provisioners (webhook replicas, clusters) never pick the
	// same generation. A table lock, not an advisory one: tenants have no
	// right on dislock.tenants, so no tenant can hold it (any role can take
	// any advisory lock, and so stall every provisioner). Changes are rare
	// and short.
	qTenantLock = `LOCK TABLE dislock.tenants IN SHARE ROW EXCLUSIVE MODE`

	// qNextTenantGeneration counts retired generations too: a role name is
	// never used twice.
	qNextTenantGeneration = `SELECT coalesce(max(generation), 0) + 1 FROM dislock.tenants
WHERE cluster = $1::text AND namespace = $2::text`

	qSupersedeTenants = `UPDATE dislock.tenants SET superseded_at = now()
WHERE cluster = $1::text AND namespace = $2::text AND superseded_at IS NULL AND retired_at IS NULL`

	qInsertTenant = `INSERT INTO dislock.tenants (role_name, cluster, namespace, generation, created_at)
VALUES ($1::text, $2::text, $3::text, $4::int, now())`

	qListTenantRoles = `SELECT role_name, namespace, cluster, generation, created_at, superseded_at FROM dislock.tenants
WHERE cluster = $1::text AND namespace = $2::text AND retired_at IS NULL
ORDER BY generation DESC`

	qRetirableTenants = `SELECT role_name FROM dislock.tenants
WHERE cluster = $1::text AND namespace = $2::text AND retired_at IS NULL
  AND superseded_at <= now() - $3::bigint * interval '1 microsecond'
ORDER BY generation`

	// qRetireTenant marks one role retired if it still is due; the role is
	// dropped in the same transaction.
	qRetireTenant = `UPDATE dislock.tenants SET retired_at = now()
WHERE role_name = $1::text AND retired_at IS NULL
  AND superseded_at <= now() - $2::bigint * interval '1 microsecond'`
)

// dnsLabel is an RFC 1123 label, which every Kubernetes namespace name is.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// validateTenant lists every problem with a (cluster, namespace).
func validateTenant(cluster, namespace string) error {
	var errs []error
	switch {
	case cluster == "":
		errs = append(errs, errors.New("cluster is empty (the webhook's --cluster-name)"))
	case strings.ContainsAny(cluster, "/\x00"):
		// As in owner strings, '/' separates a key's parts.
		errs = append(errs, fmt.Errorf("cluster %q contains '/' or NUL", cluster))
	}
	if len(namespace) > 63 || !dnsLabel.MatchString(namespace) {
		errs = append(errs, fmt.Errorf("namespace %q is not a DNS label (lowercase letters, digits and '-', "+
			"starting and ending with a letter or digit, at most 63 characters)", namespace))
	}
	return errors.Join(errs...)
}

// tenantRoleName is dislock_t_<hash of cluster and namespace>_g<generation>:
// at most 54 bytes, inside PostgreSQL's 63. The hash keeps names of any
// length inside the limit and distinct.
func tenantRoleName(cluster, namespace string, generation int) string {
	sum := sha256.Sum256([]byte(cluster + "/" + namespace))
	return RolePrefix + hex.EncodeToString(sum[:16]) + "_g" + strconv.Itoa(generation)
}

// Provision creates a new generation of the (cluster, namespace)
// tenant role with a fresh random password and returns it; older
// generations stay valid until retired. The password never reaches the
// server: only its SCRAM-SHA-256 verifier does, so neither the server's
// statement log nor anyone reading pg_authid learns it.
func Provision(ctx context.Context, st *store.Store, cluster, namespace string) (Credential, error) {
	h := st.Handle()
	if err := validateTenant(cluster, namespace); err != nil {
		return Credential{}, fmt.Errorf("provisioning a tenant role: %w", err)
	}
	password, err := newTenantPassword()
	if err != nil {
		return Credential{}, err
	}
	salt := make([]byte, scramSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return Credential{}, fmt.Errorf("provisioning a tenant role: %w", err)
	}
	verifier, err := scramVerifier(password, salt, scramIterations)
	if err != nil {
		return Credential{}, err
	}
	c := Credential{Password: password, Namespace: namespace, Cluster: cluster}
	op := fmt.Sprintf("provisioning a role for namespace %s of cluster %s", namespace, cluster)
	err = tenantTx(ctx, h, op, cluster, namespace, func(tx pgx.Tx) error {
		var err error
		if c.Generation, err = nextGeneration(ctx, tx, cluster, namespace); err != nil {
			return err
		}
		c.Role = tenantRoleName(cluster, namespace, c.Generation)
		// Utility statements take no parameters; both values are built
		// here from a hash and base64 and quoted anyway.
		role := pgx.Identifier{c.Role}.Sanitize()
		create := "CREATE ROLE " + role + " LOGIN PASSWORD " + quoteLiteral(verifier) +
			" CONNECTION LIMIT " + strconv.Itoa(ConnectionLimit) + " IN ROLE " + pgx.Identifier{GroupRole}.Sanitize()
		if err := tx.Conn().PgConn().Exec(ctx, create).Close(); err != nil {
			return fmt.Errorf("creating role %s: %w", c.Role, err)
		}
		// Names resolve in pg_catalog first and never in a schema anyone
		// may create objects in: an operator or function a tenant planted
		// in public cannot stand in for a built-in in this role's
		// statements.
		if err := tx.Conn().PgConn().Exec(ctx, "ALTER ROLE "+role+" SET search_path = pg_catalog, pg_temp").Close(); err != nil {
			return fmt.Errorf("pinning the search_path of role %s: %w", c.Role, err)
		}
		if err := tx.Conn().PgConn().Exec(ctx, tenantRoleBounds(role)).Close(); err != nil {
			return fmt.Errorf("bounding the sessions of role %s: %w", c.Role, err)
		}
		if err := boundTenantTempFiles(ctx, tx, role); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, qInsertTenant, c.Role, cluster, namespace, c.Generation)
		return err
	})
	if err != nil {
		return Credential{}, err
	}
	return c, nil
}

// nextGeneration is the (cluster, namespace) tenant's next generation, a
// role's or a gateway credential's, with every live one superseded by it;
// inside a tenants' transaction.
func nextGeneration(ctx context.Context, tx pgx.Tx, cluster, namespace string) (int, error) {
	var g int
	if err := tx.QueryRow(ctx, qNextTenantGeneration, cluster, namespace).Scan(&g); err != nil {
		return 0, err
	}
	_, err := tx.Exec(ctx, qSupersedeTenants, cluster, namespace)
	return g, err
}

// Roles lists the live generations (newest first) with when they were
// created / superseded.
func Roles(ctx context.Context, st *store.Store, cluster, namespace string) ([]Role, error) {
	h := st.Handle()
	if err := validateTenant(cluster, namespace); err != nil {
		return nil, fmt.Errorf("listing tenant roles: %w", err)
	}
	op := fmt.Sprintf("listing the roles of namespace %s of cluster %s", namespace, cluster)
	rows, err := h.Pool.Query(ctx, qListTenantRoles, cluster, namespace)
	if err != nil {
		return nil, h.Classify(op, err)
	}
	defer rows.Close()
	var out []Role
	for rows.Next() {
		var r Role
		if err := rows.Scan(&r.Role, &r.Namespace, &r.Cluster, &r.Generation, &r.CreatedAt, &r.SupersededAt); err != nil {
			return nil, h.Classify(op, err)
		}
		r.CreatedAt = r.CreatedAt.UTC()
		if r.SupersededAt != nil {
			t := r.SupersededAt.UTC()
			r.SupersededAt = &t
		}
		out = append(out, r)
	}
	return out, h.Classify(op, rows.Err())
}

// Supersede marks every live generation of the (cluster,
// namespace) tenant superseded now, without creating a new one (the
// namespace opted out): Retire drops them after the grace.
func Supersede(ctx context.Context, st *store.Store, cluster, namespace string) error {
	h := st.Handle()
	if err := validateTenant(cluster, namespace); err != nil {
		return fmt.Errorf("superseding tenant roles: %w", err)
	}
	op := fmt.Sprintf("superseding the roles of namespace %s of cluster %s", namespace, cluster)
	return tenantTx(ctx, h, op, cluster, namespace, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, qSupersedeTenants, cluster, namespace)
		return err
	})
}

// Retire drops the generations superseded more than `grace` ago
// (DB time); returns the dropped role names. Each role is dropped in a
// transaction of its own, so one that cannot be dropped (it owns objects a
// DBA must deal with) does not keep the others alive; the error names it.
// A role whose drop waited LockTimeout for a lock (a session of the
// role holds its role locked) stays live, and the error says so: the
// provisioning of every other namespace waits behind a drop, so it is not
// left waiting longer. A session still open with a dropped role can do
// nothing more: the rights came from dislock_tenant, and the role no
// longer maps to a namespace.
func Retire(ctx context.Context, st *store.Store, cluster, namespace string, grace time.Duration) ([]string, error) {
	h := st.Handle()
	if err := validateTenant(cluster, namespace); err != nil {
		return nil, fmt.Errorf("retiring tenant roles: %w", err)
	}
	if grace < 0 {
		return nil, fmt.Errorf("retiring tenant roles: grace %s is negative", grace)
	}
	op := fmt.Sprintf("retiring the roles of namespace %s of cluster %s", namespace, cluster)
	rows, err := h.Pool.Query(ctx, qRetirableTenants, cluster, namespace, db.Micros(grace))
	if err != nil {
		return nil, h.Classify(op, err)
	}
	due, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, h.Classify(op, err)
	}
	return retireEach(ctx, h, op, cluster, namespace, due, func(role string) string { return role },
		qRetireTenant, db.Micros(grace))
}

// retireEach retires and drops each role of due, each in a transaction of
// its own: retire marks it retired with the statement (its arguments the
// role and arg) and, if that still applies (another provisioner may have
// retired it meanwhile), drops it. It returns the roles it dropped, and an
// error naming each it could not drop and why.
func retireEach[T any](ctx context.Context, h *db.Handle, op, cluster, namespace string, due []T, role func(T) string,
	retire string, arg any) ([]T, error) {
	var dropped []T
	var errs []error
	for _, r := range due {
		var retired bool
		err := tenantTx(ctx, h, op+": dropping "+role(r), cluster, namespace, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, retire, role(r), arg)
			if err != nil || tag.RowsAffected() == 0 {
				return err // retired meanwhile, or no longer due
			}
			retired = true
			if IsGatewayCredential(role(r)) {
				// No role to drop, and DROP ROLE, even IF EXISTS, needs
				// the CREATEROLE an owner serving the gateway may lack.
				return nil
			}
			return dropTenantRole(ctx, tx, role(r))
		})
		switch {
		case err != nil:
			errs = append(errs, err)
		case retired:
			dropped = append(dropped, r)
		}
	}
	return dropped, errors.Join(errs...)
}

const (
	// qTenantsBeyond lists, oldest first, the superseded live generations
	// that are not among the namespace's $3 newest live ones.
	qTenantsBeyond = `SELECT role_name, namespace, cluster, generation, created_at, superseded_at FROM (
  SELECT role_name, namespace, cluster, generation, created_at, superseded_at,
         row_number() OVER (ORDER BY generation DESC) AS newest
  FROM dislock.tenants WHERE cluster = $1::text AND namespace = $2::text AND retired_at IS NULL) live
WHERE newest > $3::int AND superseded_at IS NOT NULL
ORDER BY generation`

	// qRetireTenantBeyond marks one role retired if it is still superseded
	// and still has at least $2 newer live generations (checked again under
	// the tenants' lock: another provisioner may have retired some
	// meanwhile); the role is dropped in the same transaction.
	qRetireTenantBeyond = `UPDATE dislock.tenants t SET retired_at = now()
WHERE t.role_name = $1::text AND t.retired_at IS NULL AND t.superseded_at IS NOT NULL
  AND (SELECT count(*) FROM dislock.tenants n
       WHERE n.cluster = t.cluster AND n.namespace = t.namespace
         AND n.retired_at IS NULL AND n.generation > t.generation) >= $2::int`
)

// RetireBeyond drops the superseded generations of the (cluster,
// namespace) tenant that are not among its `keep` newest live generations,
// however recently they were superseded, and returns them oldest first. It
// bounds how many roles one namespace can hold: a tenant that has its
// Secret replaced again and again would otherwise keep every generation
// alive for the whole grace. The generation in use (not superseded) is never
// dropped here, whatever `keep` is. As in Retire, each role is
// dropped in a transaction of its own, a drop waits at most
// LockTimeout for a lock, and the error names any role that could
// not be dropped and why.
func RetireBeyond(ctx context.Context, st *store.Store, cluster, namespace string, keep int) ([]Role, error) {
	h := st.Handle()
	if err := validateTenant(cluster, namespace); err != nil {
		return nil, fmt.Errorf("retiring tenant roles beyond a count: %w", err)
	}
	if keep < 0 {
		return nil, fmt.Errorf("retiring tenant roles beyond a count: keep %d is negative", keep)
	}
	op := fmt.Sprintf("retiring the roles of namespace %s of cluster %s beyond the newest %d", namespace, cluster, keep)
	rows, err := h.Pool.Query(ctx, qTenantsBeyond, cluster, namespace, keep)
	if err != nil {
		return nil, h.Classify(op, err)
	}
	due, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Role, error) {
		var r Role
		err := row.Scan(&r.Role, &r.Namespace, &r.Cluster, &r.Generation, &r.CreatedAt, &r.SupersededAt)
		r.CreatedAt = r.CreatedAt.UTC()
		if r.SupersededAt != nil {
			t := r.SupersededAt.UTC()
			r.SupersededAt = &t
		}
		return r, err
	})
	if err != nil {
		return nil, h.Classify(op, err)
	}
	return retireEach(ctx, h, op, cluster, namespace, due, func(r Role) string { return r.Role },
		qRetireTenantBeyond, keep)
}

// Server-side bounds of every transaction that changes the tenants' roles.
// They hold the table lock that serialises every namespace's provisioning in
// every cluster, so no wait inside one may be left to the client: a client
// whose context ends closes its connection, and a backend waiting for a
// lock does not notice that until the lock is granted. A tenant can hold a
// lock on its own role (ALTER ROLE CURRENT_USER SET ... in an open
// transaction, which any role may do for itself), and DROP ROLE waits for
// it: unbounded, every other namespace's provisioning waited behind it.
const (
	// LockTimeout bounds each wait for a lock while the tenants'
	// table lock is held (lock_timeout, SQLSTATE 55P03 when it passes): a
	// role a tenant's session holds locked is not dropped this time, and
	// the provisioners queued behind wait this long at most.
	LockTimeout = 3 * time.Second
	// tenantQueueTimeout bounds the wait for the tenants' table lock
	// itself. Longer than LockTimeout: the transaction ahead may be
	// waiting out its own lock timeout, and the queue must not give up
	// just before it lets go.
	tenantQueueTimeout = 20 * time.Second
	// tenantStatementTimeout bounds every statement (statement_timeout)
	// and every pause between statements (idle_in_transaction_session_timeout:
	// a client gone without closing its connection, behind a partition)
	// of such a transaction, above both lock waits.
	tenantStatementTimeout = 30 * time.Second
)

// qTenantTxBegin opens a tenants' transaction: the bounds, then the table
// lock, then the shorter wait for every lock after it. SET LOCAL ends with
// the transaction, also behind PgBouncer's transaction pooling. Sent in
// one round trip with the simple protocol.
var qTenantTxBegin = fmt.Sprintf(`SET LOCAL statement_timeout = %d;
SET LOCAL idle_in_transaction_session_timeout = %d;
SET LOCAL lock_timeout = %d;
%s;
SET LOCAL lock_timeout = %d`, tenantStatementTimeout.Milliseconds(), tenantStatementTimeout.Milliseconds(),
	tenantQueueTimeout.Milliseconds(), qTenantLock, LockTimeout.Milliseconds())

// dropTenantRole drops a role inside a tenants' transaction (the caller's
// op names the role). A lock timeout says whose lock it was most likely and what happens next: the
// transaction rolls back, so the role stays live (neither retired nor
// dropped) and is tried again at the next reconcile.
func dropTenantRole(ctx context.Context, tx pgx.Tx, role string) error {
	err := tx.Conn().PgConn().Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize()).Close()
	if db.LockTimedOut(err) {
		return fmt.Errorf("gave up after %s (lock_timeout) waiting for a lock on role %s, "+
			"most likely held by a session of the role itself (e.g. an open transaction that ran ALTER ROLE CURRENT_USER); "+
			"the role stays live and is dropped at a later reconcile: %w", LockTimeout, role, err)
	}
	return err
}

// tenantTx runs fn in one transaction holding the (cluster, namespace)
// lock. A transaction keeps one server connection in PgBouncer's
// transaction pooling too, and nothing in it outlives the commit. Every
// wait in it is bounded on the server (see LockTimeout).
func tenantTx(ctx context.Context, h *db.Handle, op, cluster, namespace string, fn func(pgx.Tx) error) error {
	tx, err := h.Pool.Begin(ctx)
	if err != nil {
		return h.Classify(op, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	if err := tx.Conn().PgConn().Exec(ctx, qTenantTxBegin).Close(); err != nil {
		return h.Classify(op, err)
	}
	if err := fn(tx); err != nil {
		return h.Classify(op, err)
	}
	return h.Classify(op, tx.Commit(ctx))
}

// newTenantPassword is 256 random bits in URL-safe base64: nothing in it
// needs escaping in a URL or a key=value connection string.
func newTenantPassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating a tenant password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// scramVerifier is the SCRAM-SHA-256 secret PostgreSQL stores for password
// (RFC 5802, RFC 7677), in pg_authid's format:
// SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>. The password
// is ASCII, on which SASLprep changes nothing.
func scramVerifier(password string, salt []byte, iterations int) (string, error) {
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", fmt.Errorf("computing the SCRAM verifier: %w", err)
	}
	mac := func(key []byte, msg string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	storedKey := sha256.Sum256(mac(salted, "Client Key"))
	serverKey := mac(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(storedKey[:]), b64(serverKey)), nil
}

// quoteLiteral renders s as an SQL string literal, as read with
// standard_conforming_strings on (PostgreSQL's default). s is a SCRAM
// verifier, which never holds a backslash, so the setting cannot matter.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// ownerOnlyParams are connection parameters that carry the owner's own
// credentials (its password, its client certificate and the key's
// passphrase, its password file): DSN leaves them out.
var ownerOnlyParams = map[string]bool{
	"user": true, "password": true, "sslpassword": true, "sslcert": true, "sslkey": true, "passfile": true,
}

// DSN is the owner DSN with user and password replaced by the
// credential's (same hosts, ports, options). Parameters that hold the
// owner's other credentials (sslcert, sslkey, sslpassword, passfile) are
// dropped: they are the owner's, and the tenant's pods do not have the files.
// A URL stays a URL with everything else as written; a key=value string
// keeps every other pair in order (quoted only where needed).
func DSN(ownerDSN string, c Credential) (string, error) {
	if c.Role == "" || c.Password == "" {
		return "", errors.New("tenant URL: the credential has no role or no password")
	}
	if _, err := store.ParseDatabaseURL(ownerDSN); err != nil {
		return "", fmt.Errorf("tenant URL: owner URL: %w", err)
	}
	var out string
	var err error
	if scheme, rest, ok := dsn.CutURLScheme(ownerDSN); ok {
		out, err = tenantURL(scheme, rest, c)
	} else {
		out, err = tenantKeywordValue(ownerDSN, c)
	}
	if err != nil {
		return "", fmt.Errorf("tenant URL: %s", dsn.Scrub(ownerDSN, err.Error()))
	}
	cfg, err := store.ParseDatabaseURL(out)
	if err != nil {
		// Never expected: both pieces were parsed above. Neither
		// password may appear in the message.
		return "", fmt.Errorf("tenant URL: the result does not parse: %s",
			strings.ReplaceAll(dsn.Scrub(ownerDSN, err.Error()), c.Password, "xxxxx"))
	}
	if cfg.ConnConfig.User != c.Role || cfg.ConnConfig.Password != c.Password {
		return "", errors.New("tenant URL: the result does not name the tenant's role and password")
	}
	return out, nil
}

// tenantURL rewrites a postgres:// URL. As libpq (and pgx) read it, the
// user information is everything before the first '@' that comes before the
// first '/'; hosts, path and query follow, and the query may name the
// user or password again (a later value wins), so those are dropped there.
func tenantURL(scheme, rest string, c Credential) (string, error) {
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		rest = rest[i+1:]
	}
	userinfo := url.UserPassword(c.Role, c.Password).String() + "@"
	q := strings.IndexByte(rest, '?')
	if q < 0 {
		return scheme + userinfo + rest, nil
	}
	var kept []string
	for _, pair := range strings.Split(rest[q+1:], "&") {
		rawKey, _, _ := strings.Cut(pair, "=")
		key, err := url.PathUnescape(rawKey)
		if err != nil {
			return "", fmt.Errorf("query parameter %q: %w", rawKey, err)
		}
		if !ownerOnlyParams[key] {
			kept = append(kept, pair)
		}
	}
	query := ""
	if len(kept) > 0 {
		query = "?" + strings.Join(kept, "&")
	}
	return scheme + userinfo + rest[:q] + query, nil
}

// tenantKeywordValue rewrites a key=value connection string, keeping every
// other pair in order and appending the tenant's user and password.
func tenantKeywordValue(conn string, c Credential) (string, error) {
	pairs, err := dsn.Parse(conn)
	if err != nil {
		return "", err
	}
	var kept []string
	for _, p := range pairs {
		if !ownerOnlyParams[p.Key] {
			kept = append(kept, p.Key+"="+dsn.Quote(p.Value))
		}
	}
	kept = append(kept, "user="+dsn.Quote(c.Role), "password="+dsn.Quote(c.Password))
	return strings.Join(kept, " "), nil
}
