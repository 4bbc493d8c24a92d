// Package check is `dislock check`: the preflight of a database URL (can
// it connect, how it reaches PostgreSQL, what its role may do) and the
// checks of what dislock's promises rest on (a writable primary,
// synchronous replication, the schema, fencing tokens that cannot go
// back). The sidecar never links this package.
package check

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/db"
	"github.com/dislock/dislock/lockagent/store/migrate"
)

// Status grades one Finding.
type Status string

const (
	StatusOK Status = "ok"
	// StatusWarn: works, with a weakness the operator should know.
	StatusWarn Status = "warn"
	// StatusFail: claims can be lost or not written at all.
	StatusFail Status = "fail"
	// StatusAccepted: a failing replication setup the operator acknowledged
	// (Options.AllowAsync).
	StatusAccepted Status = "accepted"
)

// Finding is one thing Database verified, with the fix when it is not ok.
type Finding struct {
	Check  string `json:"check"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
	// Role names the role the finding is about (RoleReport.Heading) when
	// dislock check checked several.
	Role string `json:"role,omitempty"`
}

// Options tune Database and URL.
type Options struct {
	// AllowAsync acknowledges a database whose failover may lose commits
	// (asynchronous replication, or a managed service whose replication
	// dislock cannot see): its replication findings (not synchronous_commit
	// = off, which loses commits without any failover) become
	// StatusAccepted.
	AllowAsync bool
	// TokenFloor is the highest fencing token recorded outside the
	// database (0: none), and TokenRecord where: a database below it was
	// restored from a backup, or lost commits, and check fails.
	TokenFloor  int64
	TokenRecord string
}

// Failed reports whether any finding is StatusFail.
func Failed(fs []Finding) bool {
	for _, f := range fs {
		if f.Status == StatusFail {
			return true
		}
	}
	return false
}

// AllowAsyncFlag is the command-line flag that sets Options.AllowAsync;
// fixes name it.
const AllowAsyncFlag = "--allow-async-replication"

const fixSync = "make replication synchronous to a standby in another data centre: with Patroni, " +
	"`patronictl edit-config` and set `synchronous_mode: true`; without it, " +
	"synchronous_standby_names = 'FIRST 1 (<standby>)' and synchronous_commit = on. " +
	"A managed service whose failover loses no commit (its replication is invisible here): pass " + AllowAsyncFlag

// qTopology reads, in one round trip, what the replication checks need.
// pg_stat_replication shows a role without pg_read_all_stats (pg_monitor)
// only pids: sync_state is NULL then.
const qTopology = `
SELECT pg_is_in_recovery(),
       current_setting('transaction_read_only') = 'on',
       current_setting('synchronous_commit'),
       current_setting('synchronous_standby_names'),
       current_setting('server_version'),
       (SELECT count(*) FROM pg_stat_replication),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL),
       coalesce((SELECT string_agg(application_name, ',' ORDER BY application_name) FROM pg_stat_replication
                 WHERE sync_state IN ('sync', 'quorum') AND state = 'streaming'), ''),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum') AND state = 'streaming'),
       current_setting('lc_messages'),
       current_setting('client_connection_check_interval'),
       current_setting('default_transaction_isolation')`

// qRoleSettings lists the defaults, for this role or every role, in this
// database or every database, that weaken a commit: the checking session's
// own settings may look fine (a default for the role in this database wins
// over it). Values are stored as typed ("false", "'off'").
const qRoleSettings = `
SELECT coalesce(r.rolname, 'every role'), coalesce(d.datname, 'every database'), c
FROM pg_db_role_setting s
LEFT JOIN pg_roles r ON r.oid = s.setrole
LEFT JOIN pg_database d ON d.oid = s.setdatabase,
     unnest(s.setconfig) AS c
WHERE (s.setdatabase = 0 OR d.datname = current_database())
  AND (s.setrole = 0 OR r.rolname = current_user)
  AND (c ~* '^synchronous_commit=''?(off|false|no|0|local)''?$'
       OR c ~* '^client_min_messages=''?(error|fatal|panic)''?$')
ORDER BY 1, 2, 3`

// syncQuorum is how many standbys synchronous_standby_names waits for:
// "FIRST n (...)", "ANY n (...)" or "n (...)", else (a plain list, "*") one.
var syncQuorum = regexp.MustCompile(`(?i)^\s*(?:(?:first|any)\s+)?(\d+)\s*\(`)

// Database verifies what dislock's promises rest on and can be seen
// from a connection: that it reaches a writable primary; that a commit is
// replicated synchronously before it is acknowledged, for every role (else
// a failover can lose a claim and the window runs twice); that the server
// would tell a commit whose wait was cut short; the schema version; and
// that fencing tokens cannot go back, and how much of the token counter
// every namespace shares is spent. It returns an error only when the
// database cannot be asked at all.
func Database(ctx context.Context, st *store.Store, opts Options) ([]Finding, error) {
	return checker{st: st, h: st.Handle()}.database(ctx, opts)
}

// checker runs the checks against one Store.
type checker struct {
	st *store.Store
	h  *db.Handle
}

func (s checker) database(ctx context.Context, opts Options) ([]Finding, error) {
	var (
		inRecovery, readOnly                         bool
		syncCommit, syncNames, version, syncStandbys string
		lcMessages, checkInterval, isolation         string
		senders, hidden, streaming                   int64
	)
	err := s.h.Pool.QueryRow(ctx, qTopology).Scan(&inRecovery, &readOnly, &syncCommit, &syncNames, &version,
		&senders, &hidden, &syncStandbys, &streaming, &lcMessages, &checkInterval, &isolation)
	if err != nil {
		return nil, s.h.Classify("checking the database", err)
	}
	var out []Finding
	add := func(name string, st Status, fix, format string, args ...any) {
		out = append(out, Finding{Check: name, Status: st, Detail: fmt.Sprintf(format, args...), Fix: fix})
	}
	// replication findings a database whose failover may lose commits gets
	// anyway: the operator can accept those, and only those.
	replication := func(name, fix, format string, args ...any) {
		if opts.AllowAsync {
			add(name, StatusAccepted, "", format, args...)
			return
		}
		add(name, StatusFail, fix, format, args...)
	}
	switch {
	case inRecovery:
		add("primary", StatusFail, "point the URL at the primary: HAProxy checking Patroni's /primary, or a multi-host URL "+
			"(host=a,b,c target_session_attrs=read-write)", "connected to a standby (PostgreSQL %s in recovery): claims cannot be written", version)
		return out, nil
	case readOnly:
		add("primary", StatusFail, "ALTER DATABASE … RESET default_transaction_read_only (or ALTER ROLE …)",
			"connected to a primary (PostgreSQL %s), but transactions are read-only (default_transaction_read_only): claims cannot be written", version)
		return out, nil
	}
	add("primary", StatusOK, "", "connected to a primary (PostgreSQL %s) at %s", version, s.h.Addr)

	names := strings.TrimSpace(syncNames)
	need := int64(1)
	if m := syncQuorum.FindStringSubmatch(names); m != nil {
		need, _ = strconv.ParseInt(m[1], 10, 64)
	}
	switch {
	case names == "" && senders > 0:
		replication("replication", fixSync, "synchronous_standby_names is empty but %d standby(s) stream asynchronously: a failover to one of them can lose acknowledged claims and a window then runs twice", senders)
	case names == "":
		replication("replication", fixSync, "synchronous_standby_names is empty: replication is asynchronous or there is no standby, so a failover can lose acknowledged claims and a window then runs twice")
	case streaming >= need:
		add("replication", StatusOK, "", "synchronous_standby_names = %q; synchronous standby streaming: %s", syncNames, syncStandbys)
	case hidden > 0:
		add("replication", StatusWarn, "grant the checking role pg_monitor to let dislock check see pg_stat_replication",
			"synchronous_standby_names = %q, but this role cannot see which of the %d standby(s) are synchronous", syncNames, hidden)
	default:
		add("replication", StatusFail, "start the synchronous standbys, or let Patroni's synchronous_mode choose others",
			"synchronous_standby_names = %q waits for %d standby(s) but %d stream as synchronous: every commit waits, and agents fail closed", syncNames, need, streaming)
	}

	const fixCommit = "set synchronous_commit = on (ALTER ROLE … RESET synchronous_commit, or SET … = on)"
	switch syncCommit {
	case "on", "remote_apply":
		add("synchronous_commit", StatusOK, "", "synchronous_commit = %s", syncCommit)
	case "remote_write":
		add("synchronous_commit", StatusWarn, fixCommit,
			"synchronous_commit = remote_write: a claim is lost if the primary is lost together with the standby's operating system")
	case "local":
		replication("synchronous_commit", fixCommit, "synchronous_commit = local: a commit is acknowledged before any standby has it")
	default:
		// Not even on the primary's disk: a crash alone loses claims and
		// hands tokens out again. Nobody can accept that.
		add("synchronous_commit", StatusFail, fixCommit, "synchronous_commit = %s: a commit is acknowledged before it is on disk; a crash loses claims and tokens go back", syncCommit)
	}
	rows, err := s.h.Pool.Query(ctx, qRoleSettings)
	if err != nil {
		return nil, s.h.Classify("checking role and database settings", err)
	}
	for rows.Next() {
		var role, database, setting string
		if err := rows.Scan(&role, &database, &setting); err != nil {
			rows.Close()
			return nil, s.h.Classify("checking role and database settings", err)
		}
		name, _, _ := strings.Cut(setting, "=")
		add("role settings", StatusFail, fmt.Sprintf("ALTER ROLE … IN DATABASE … RESET %s for %s in %s", name, role, database),
			"%s for %s in %s: the agents' claims under it are not durable as acknowledged (or a cut-short wait goes unreported); they retry and fail closed", setting, role, database)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, s.h.Classify("checking role and database settings", err)
	}

	if !englishMessages.MatchString(lcMessages) {
		add("lc_messages", StatusWarn, "ALTER ROLE <dislock's role> SET lc_messages = 'C' (as a superuser)",
			"lc_messages = %q: only under C or POSIX are PostgreSQL's messages surely English, and dislock tells the warning that a commit's wait for the standby was cut short from harmless ones only in English; any warning during a lock write makes it retry", lcMessages)
	}
	if isolation != "read committed" && isolation != "read uncommitted" { // PostgreSQL runs the latter as read committed
		add("isolation", StatusFail, "ALTER ROLE <dislock's role> RESET default_transaction_isolation (or ALTER DATABASE …, or postgresql.conf)",
			"default_transaction_isolation = %s: a claim or lease grant that starts a run is made at read committed only, where a pause can undo one that waited for its row; at this level it is refused and the pod decides error (through a lock gateway with this role, every pod)", isolation)
	}
	if checkInterval == "0" {
		add("client_connection_check_interval", StatusWarn, "ALTER ROLE <dislock's role> SET client_connection_check_interval = '2s'",
			"client_connection_check_interval = 0: a statement an agent gave up on (its commit waiting for a standby, a row lock held by someone) keeps its backend until it ends; many agents can exhaust max_connections")
	}
	return s.checkSchema(ctx, opts, out), nil
}

// englishMessages matches the lc_messages values whose server messages are
// surely English (commitGuard asks the server the same).
var englishMessages = regexp.MustCompile(`^(C|POSIX)$`)

// checkSchema appends the schema and token findings. What it cannot read
// becomes a failing finding, so the findings before it still print.
func (s checker) checkSchema(ctx context.Context, opts Options, out []Finding) []Finding {
	st, err := migrate.Schema(ctx, s.st)
	if err != nil {
		// Only a refused privilege is mended by a grant; anything else (the
		// database gone meanwhile) the error itself explains.
		fix := "see the error; run dislock check again once the database answers"
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
			fix = "grant the checking role USAGE on schema dislock and SELECT on its tables"
		}
		return append(out, Finding{Check: "schema", Status: StatusFail, Detail: "cannot read the schema version: " + err.Error(), Fix: fix})
	}
	switch {
	case st.Current == st.Known:
		out = append(out, Finding{Check: "schema", Status: StatusOK, Detail: fmt.Sprintf("schema dislock is at version %d", st.Current)})
	case st.Current < st.Known:
		return append(out, Finding{Check: "schema", Status: StatusFail, Fix: "run `dislock migrate` (the webhook also migrates at start)",
			Detail: fmt.Sprintf("schema dislock is at version %d; this dislock needs %d", st.Current, st.Known)})
	case st.Incompatible != nil:
		return append(out, Finding{Check: "schema", Status: StatusFail, Detail: st.Incompatible.Error(),
			Fix: fmt.Sprintf("upgrade this cluster's dislock to a release that knows schema version %d", st.Current)})
	default:
		// Another cluster upgraded first: this one keeps working, and the
		// token checks below still apply.
		out = append(out, Finding{Check: "schema", Status: StatusWarn,
			Fix:    fmt.Sprintf("upgrade this cluster's dislock to a release that knows schema version %d (one cluster at a time; docs/install.md, \"Upgrading\")", st.Current),
			Detail: fmt.Sprintf("schema dislock is at version %d, newer than this dislock knows (%d), and every migration since is compatible with it", st.Current, st.Known)})
	}
	// A tenant role may not read the token counter or the epochs (nor
	// every namespace's tokens): it cannot tell, and says so instead of
	// failing.
	var readable bool
	var role, namespace string
	if err := s.h.Pool.QueryRow(ctx, qTokenReadable).Scan(&readable, &role); err != nil {
		return append(out, Finding{Check: "tokens", Status: StatusFail, Detail: "cannot tell whether this role may read the fencing tokens: " + err.Error()})
	}
	if !readable {
		who := "role " + role
		// Only a tenant role may ask; for any other the answer is an error.
		if s.h.Pool.QueryRow(ctx, qTenantNamespace).Scan(&namespace) == nil && namespace != "" {
			who += " (the tenant role of namespace " + namespace + ")"
		}
		return append(out, Finding{Check: "tokens", Status: StatusWarn,
			Detail: who + " may not read the token counter and epochs, so whether fencing tokens can go back was not checked",
			Fix:    "run dislock check with the owner's URL (the webhook's --database-url) to check the tokens"})
	}
	return append(out, s.tokenFindings(ctx, opts)...)
}

// qTokenReadable tells whether this role may run qTokenEpoch and see every
// row's token (row-level security hides other namespaces' rows from a
// tenant), and which role it is.
const qTokenReadable = `
SELECT has_function_privilege('dislock.token_epoch_now()', 'EXECUTE')
       AND has_table_privilege('dislock.token_epoch', 'SELECT')
       AND has_sequence_privilege('dislock.token_counter', 'SELECT')
       AND has_table_privilege('dislock.windows', 'SELECT') AND has_table_privilege('dislock.leases', 'SELECT')
       AND NOT row_security_active('dislock.windows') AND NOT row_security_active('dislock.leases'),
       session_user::text`

// qTenantNamespace names the namespace of a tenant role (empty for another).
const qTenantNamespace = `SELECT coalesce(dislock.tenant_namespace(), '')`

// qTokensAbove lists the rows whose token is at or above $1, highest first.
const qTokensAbove = `
SELECT kind, lock_key, at, token FROM (
    (SELECT 'window' AS kind, lock_key, window_start::text || CASE WHEN job_index >= 0 THEN ' index ' || job_index ELSE '' END AS at, token
     FROM dislock.windows WHERE token >= $1::bigint ORDER BY token DESC LIMIT $2::int)
    UNION ALL
    (SELECT 'lease', lock_key, '', token FROM dislock.leases WHERE token >= $1::bigint ORDER BY token DESC LIMIT $2::int)) r
ORDER BY token DESC LIMIT $2::int`

// maxTokenRowsNamed bounds how many rows a tokens finding names.
const maxTokenRowsNamed = 5

// tokensAbove names the rows holding a token at or above next, e.g.
// `window ns/report at 2026-12-02 12:00:00+00 (token 5497558138957)`, or
// says why it cannot.
func (s checker) tokensAbove(ctx context.Context, next int64) string {
	rows, err := s.h.Pool.Query(ctx, qTokensAbove, next, maxTokenRowsNamed+1)
	if err != nil {
		return "(cannot list them: " + err.Error() + ")"
	}
	defer rows.Close()
	var named []string
	for rows.Next() {
		var kind, key, at string
		var token int64
		if err := rows.Scan(&kind, &key, &at, &token); err != nil {
			return "(cannot list them: " + err.Error() + ")"
		}
		if len(named) == maxTokenRowsNamed {
			named = append(named, "and more (SELECT lock_key, token FROM dislock.windows / dislock.leases WHERE token >= "+strconv.FormatInt(next, 10)+")")
			break
		}
		if at != "" {
			at = " at " + at
		}
		named = append(named, fmt.Sprintf("%s %s%s (token %d)", kind, key, at, token))
	}
	if err := rows.Err(); err != nil {
		return "(cannot list them: " + err.Error() + ")"
	}
	return strings.Join(named, "; ")
}
