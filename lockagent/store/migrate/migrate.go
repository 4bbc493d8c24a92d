// Package migrate owns schema dislock: the embedded, numbered migrations,
// the version this build knows, and how a database's schema relates to
// it. Only the owner role migrates (the webhook at start, `dislock
// migrate`); the sidecar never links this package.
package migrate

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/db"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrators serialise on qMigrationLock: a table lock, taken within
// lock_timeout, on a table tenants may only read (SHARE ROW EXCLUSIVE
// conflicts with itself and with the ROW EXCLUSIVE every INSERT takes, not
// with the ACCESS SHARE of a read). No tenant can hold it, so no tenant can
// keep a migrator waiting; another migrator holds it for as long as its
// migration takes, and one waiting for it gives up at lock_timeout and
// tries again.
const qMigrationLock = `LOCK TABLE dislock.schema_migrations IN SHARE ROW EXCLUSIVE MODE`

// migrationLockID is the advisory lock every release before qMigrationLock
// took, without bound, to serialise its migrations ("dislock" in ASCII). It
// is public, and any role may take any advisory lock for as long as its
// session lives: a tenant holding it stalled every replica that started, in
// every cluster. This release still takes it, but only when it has a
// migration to apply and only if it is free at once
// (pg_try_advisory_xact_lock), so that an older release's migrator and this
// one never apply the same migration; see tryOldMigrationLock.
const migrationLockID int64 = 0x646973_6c6f636b

type migration struct {
	version int
	name    string
	sql     string
	// compatibleFrom is the oldest schema version whose code keeps working
	// against the schema this migration leaves (its header line).
	compatibleFrom int
}

// firstDeclaredVersion is the first migration that carries the
// compatibility header, and the one that adds the column recording it.
// Earlier migrations predate the rule and count as compatible only from
// their own version, like their NULL rows in the database.
const firstDeclaredVersion = 6

// compatHeader is the first line every migration from firstDeclaredVersion
// on starts with. Additive migrations (tables, columns, indexes older code
// ignores) name the version before them; a migration that changes a
// statement older code runs names its own version.
var compatHeader = regexp.MustCompile(`^-- dislock: compatible-from ([1-9][0-9]*)$`)

// parseCompatibleFrom reads a migration's compatibility header. It is
// strict: a file that should carry it and does not, or carries it in any
// other spelling or with a version outside 1..version, is refused, so that
// a new migration cannot ship without saying what older code it breaks.
func parseCompatibleFrom(name string, version int, body string) (int, error) {
	first, _, _ := strings.Cut(body, "\n")
	first = strings.TrimSuffix(first, "\r")
	if !strings.HasPrefix(first, "-- dislock:") {
		if version < firstDeclaredVersion {
			return version, nil
		}
		return 0, fmt.Errorf("migration file %s: the first line must be %q, where N is the oldest schema version whose dislock keeps working against this migration "+
			"(the previous version, %d, if it only adds what older code ignores; %d if it changes a statement older code runs)",
			name, "-- dislock: compatible-from N", version-1, version)
	}
	m := compatHeader.FindStringSubmatch(first)
	if m == nil {
		return 0, fmt.Errorf("migration file %s: header %q: want exactly %q with N a schema version", name, first, "-- dislock: compatible-from N")
	}
	from, err := strconv.Atoi(m[1])
	if err != nil || from > version {
		return 0, fmt.Errorf("migration file %s: header %q: compatible-from must be between 1 and the migration's own version %d", name, first, version)
	}
	return from, nil
}

// migrations returns the embedded migrations in version order. Files are
// named NNNN_description.sql and numbered from 1 without gaps.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration file %s: want NNNN_description.sql", e.Name())
		}
		body, err := fs.ReadFile(migrationFiles, path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		from, err := parseCompatibleFrom(e.Name(), v, string(body))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: e.Name(), sql: string(body), compatibleFrom: from})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration %s: want version %d (no gaps or duplicates)", m.name, i+1)
		}
	}
	return out, nil
}

// ExpiriesNeverMoveBack is the schema version from which a holder's expiry
// never moves back (0015_expiries_never_move_back.sql): what lets a pod
// count its safety deadline from when its call started on the database
// rather than from when it sent it (a lock gateway's queue time).
const ExpiriesNeverMoveBack = 15

// SchemaVersion is the newest schema version this build knows.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil {
		panic(err) // the embedded files are fixed at build time and tested
	}
	return len(ms)
}

// DefaultLockTimeout bounds each wait of a migration's DDL for a
// table lock. PostgreSQL queues every later lock request behind a waiting
// ACCESS EXCLUSIVE one, so while an ALTER TABLE waits for a session that
// holds dislock.windows open (any role can: a tenant's open transaction
// that read its own rows), every claim of every namespace waits behind it.
// Cut at this, the claims pass, and Up tries again.
const DefaultLockTimeout = 2 * time.Second

// DefaultRetryFor bounds how long Up retries lock waits that
// timed out before it gives up and names the sessions in the way. The
// webhook retries Up itself; an operator running `dislock migrate`
// gets an answer within about this long.
const DefaultRetryFor = time.Minute

// The pause between two attempts grows from the first to the second: the
// claims that queued behind the attempt pass meanwhile.
const (
	migrationBackoffFirst = 500 * time.Millisecond
	migrationBackoffMax   = 8 * time.Second
)

// Migrator migrates with bounds of its own; the zero Migrator uses the
// defaults (Up).
type Migrator struct {
	// LockTimeout bounds each wait of a migration for a table lock
	// (DefaultLockTimeout when 0): every claim of every namespace queues
	// behind a waiting DDL statement.
	LockTimeout time.Duration
	// RetryFor bounds how long Up retries a migration whose lock wait
	// timed out (DefaultRetryFor when 0).
	RetryFor time.Duration
}

// Up brings schema dislock up to this build's version with the default
// bounds: see Migrator.Up.
func Up(ctx context.Context, st *store.Store) ([]int, error) { return Migrator{}.Up(ctx, st) }

// Up brings schema dislock up to this build's version in one transaction
// and returns the versions it applied. A schema already at (or,
// compatibly, past) this build's version is read and left: no lock is
// taken, so every replica that starts, in every cluster, is done at once
// whoever holds what. Otherwise concurrent callers (webhook replicas in
// several clusters, `dislock migrate`, older releases) apply each migration
// once: they serialise on qMigrationLock, and on the advisory lock of older
// releases while that is free (see migrationLockID). Both are
// transaction-level, which is safe behind PgBouncer's transaction pooling.
//
// Every wait for a lock is cut at LockTimeout (lock_timeout, SQLSTATE
// 55P03), and a migrator of an older release holding the advisory lock is
// not waited for at all; the whole transaction then rolls back and is
// tried again, with backoff, for up to RetryFor. Giving up, the error
// names the sessions in the way.
func (m Migrator) Up(ctx context.Context, st *store.Store) ([]int, error) {
	ms, err := migrations()
	if err != nil {
		return nil, err
	}
	r := run{h: st.Handle(), lockTimeout: m.LockTimeout, retryFor: m.RetryFor}
	if r.lockTimeout <= 0 {
		r.lockTimeout = DefaultLockTimeout
	}
	if r.retryFor <= 0 {
		r.retryFor = DefaultRetryFor
	}
	start := time.Now()
	backoff := migrationBackoffFirst
	for attempt := 1; ; attempt++ {
		applied, err := r.migrateOnce(ctx, ms)
		if !migrationBusy(err) {
			return applied, err
		}
		if waited := time.Since(start); waited+backoff > r.retryFor {
			return nil, fmt.Errorf("%w; gave up after %d attempts in %s, each waiting at most %s (lock_timeout) for a lock so that the claims queued behind it could pass: %s",
				err, attempt, waited.Round(time.Millisecond), r.lockTimeout, r.lockHolders(ctx))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("migrating: %w (while retrying after: %w)", ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, migrationBackoffMax)
	}
}

// run is one Up: the Store's handle and the bounds.
type run struct {
	h                     *db.Handle
	lockTimeout, retryFor time.Duration
}

// ErrSchemaIncompatible matches an *IncompatibleSchemaError.
var ErrSchemaIncompatible = errors.New("schema dislock is newer than this dislock knows and not compatible with it")

// IncompatibleSchemaError: the database's schema is newer than this build
// knows, and a migration since then changed something this build relies on.
type IncompatibleSchemaError struct {
	// Current is the database's version, Known this build's.
	Current, Known int
	// Version and Name are the first migration after Known that this build
	// cannot work against; CompatibleFrom is what it recorded (0: nothing,
	// a row from before compatibility was recorded).
	Version        int
	Name           string
	CompatibleFrom int
}

func (e *IncompatibleSchemaError) Error() string {
	why := fmt.Sprintf("works only with dislock that knows schema version %d or newer (compatible-from %d)", e.CompatibleFrom, e.CompatibleFrom)
	if e.CompatibleFrom == 0 {
		why = fmt.Sprintf("recorded no compatibility, so it works only with dislock that knows schema version %d or newer", e.Version)
	}
	return fmt.Sprintf("schema dislock is at version %d, newer than this dislock knows (%d), and migration %d (%s) %s: "+
		"upgrade this cluster's dislock to a release that knows schema version %d, or restore the database from before that migration (docs/install.md, \"Upgrading\")",
		e.Current, e.Known, e.Version, e.Name, why, e.Current)
}

func (e *IncompatibleSchemaError) Is(target error) bool { return target == ErrSchemaIncompatible }

// SchemaState is how the database's schema relates to this build.
type SchemaState struct {
	// Current is the version the database is at (0: no schema yet); Known
	// is SchemaVersion().
	Current, Known int
	// Incompatible is set when Current > Known and a migration after Known
	// is not compatible with this build.
	Incompatible *IncompatibleSchemaError
}

// Newer reports a schema newer than this build knows.
func (st SchemaState) Newer() bool { return st.Current > st.Known }

// Usable reports whether this build works against the schema as it is: at
// its own version, or newer with every migration since compatible with it.
func (st SchemaState) Usable() bool {
	return st.Current == st.Known || st.Newer() && st.Incompatible == nil
}

const (
	qSchemaVersion = `SELECT coalesce(max(version), 0) FROM dislock.schema_migrations`
	// qNewerMigrations: compatible_from exists in every schema newer than
	// a build that asks (it came with firstDeclaredVersion).
	qNewerMigrations = `SELECT version, name, compatible_from FROM dislock.schema_migrations WHERE version > $1::int ORDER BY version`
)

// schemaState reads the database's version and, when it is newer than
// known, whether code knowing known may run against it: only if every
// migration after known is compatible from known or earlier.
func schemaState(ctx context.Context, q db.Querier, known int) (SchemaState, error) {
	st := SchemaState{Known: known}
	if err := q.QueryRow(ctx, qSchemaVersion).Scan(&st.Current); err != nil {
		return st, err
	}
	if !st.Newer() {
		return st, nil
	}
	rows, err := q.Query(ctx, qNewerMigrations, known)
	if err != nil {
		return st, err
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		var name string
		var from *int
		if err := rows.Scan(&v, &name, &from); err != nil {
			return st, err
		}
		if from == nil || *from > known {
			st.Incompatible = &IncompatibleSchemaError{Current: st.Current, Known: known, Version: v, Name: name}
			if from != nil {
				st.Incompatible.CompatibleFrom = *from
			}
			break
		}
	}
	return st, rows.Err()
}

// Schema reads how the database's schema relates to this build, without
// changing it. A database without schema dislock is at version 0.
func Schema(ctx context.Context, s *store.Store) (SchemaState, error) {
	h := s.Handle()
	st, err := schemaState(ctx, h.Pool, SchemaVersion())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") { // undefined table or schema
		return SchemaState{Known: SchemaVersion()}, nil
	}
	if err != nil {
		return st, h.Classify("reading the schema version", err)
	}
	return st, nil
}

// errOldMigrationLockHeld: a session that may be an older release's
// migrator holds migrationLockID.
var errOldMigrationLockHeld = errors.New("another session that may be migrating (an older dislock's migrator, or a session of the owner's role) holds the advisory lock older releases migrate under")

// errCreatedMeanwhile: another migrator created schema dislock or its
// schema_migrations table at the same moment (a fresh database).
var errCreatedMeanwhile = errors.New("another migrator created schema dislock at the same moment")

// migrationBusy tells an attempt that found another session in its way:
// Up rolls it back and tries again. A deadlock (40P01) is one too: an
// older release's migrator, which takes the table locks in its own order,
// may wait for qMigrationLock while this one waits for a table it holds.
func migrationBusy(err error) bool {
	var pgErr *pgconn.PgError
	return db.LockTimedOut(err) || errors.Is(err, errOldMigrationLockHeld) || errors.Is(err, errCreatedMeanwhile) ||
		errors.As(err, &pgErr) && pgErr.Code == "40P01" // deadlock_detected
}

// Sent in one round trip with the simple protocol: the schema and the table
// qMigrationLock locks, where a migration has never run.
const qCreateSchemaMigrations = `
CREATE SCHEMA IF NOT EXISTS dislock;
CREATE TABLE IF NOT EXISTS dislock.schema_migrations (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now())`

func (r run) migrateOnce(ctx context.Context, ms []migration) ([]int, error) {
	tx, err := r.h.Pool.Begin(ctx)
	if err != nil {
		return nil, r.h.Classify("migrating", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	// Before anything else: every wait below is for a lock. SET LOCAL: it
	// ends with the transaction, also behind PgBouncer.
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, r.lockTimeout.Milliseconds())); err != nil {
		return nil, r.h.Classify("migrating: setting lock_timeout", err)
	}
	// A current schema needs no lock: read it as it is. Nothing a tenant
	// can hold conflicts with a read of schema_migrations.
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('dislock.schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, r.h.Classify("migrating: looking for schema dislock", err)
	}
	if exists {
		if done, err := r.nothingToApply(ctx, tx, len(ms)); done || err != nil {
			return nil, err
		}
	}
	// Multi-statement DDL goes through the simple protocol. On a fresh
	// database two migrators may both create: the second waits for the
	// first's commit (within lock_timeout) and then fails on the catalog's
	// unique index; tried again, it finds both.
	if err := tx.Conn().PgConn().Exec(ctx, qCreateSchemaMigrations).Close(); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P06" || pgErr.Code == "42P07") {
			return nil, fmt.Errorf("migrating: %w: %w", errCreatedMeanwhile, err)
		}
		return nil, r.h.Classify("migrating: creating schema dislock", err)
	}
	if _, err := tx.Exec(ctx, qMigrationLock); err != nil {
		return nil, r.h.Classify("migrating: taking the migration lock (a table lock on dislock.schema_migrations)", err)
	}
	// Read again under the lock: a migrator that held it may have applied
	// what the read above missed.
	if done, err := r.nothingToApply(ctx, tx, len(ms)); done || err != nil {
		return nil, err
	}
	if err := r.tryOldMigrationLock(ctx, tx); err != nil {
		return nil, err
	}
	var current int
	if err := tx.QueryRow(ctx, qSchemaVersion).Scan(&current); err != nil {
		return nil, r.h.Classify("migrating: reading the schema version", err)
	}
	var applied []int
	for _, m := range ms[current:] {
		if err := tx.Conn().PgConn().Exec(ctx, m.sql).Close(); err != nil {
			return nil, r.h.Classify("migrating: applying "+m.name, err)
		}
		// The rows of the migrations before the column existed stay NULL:
		// compatible from their own version only.
		record, args := `INSERT INTO dislock.schema_migrations (version, name) VALUES ($1::int, $2::text)`, []any{m.version, m.name}
		if m.version >= firstDeclaredVersion {
			record = `INSERT INTO dislock.schema_migrations (version, name, compatible_from) VALUES ($1::int, $2::text, $3::int)`
			args = append(args, m.compatibleFrom)
		}
		if _, err := tx.Exec(ctx, record, args...); err != nil {
			return nil, r.h.Classify("migrating: recording "+m.name, err)
		}
		applied = append(applied, m.version)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, r.h.Classify("migrating: commit", err)
	}
	return applied, nil
}

// nothingToApply reads the schema's version through q and tells whether
// this build has nothing to apply: the schema is at its version, or newer
// (another cluster's newer dislock migrated first: clusters are upgraded one
// at a time). Nothing here may change a newer schema; this build only tells
// whether it can work against it, and an error if not.
func (r run) nothingToApply(ctx context.Context, q db.Querier, known int) (bool, error) {
	st, err := schemaState(ctx, q, known)
	switch {
	case err != nil:
		return false, r.h.Classify("migrating: reading the schema version", err)
	case st.Current < known:
		return false, nil
	case st.Incompatible != nil:
		return true, fmt.Errorf("migrating: %w", st.Incompatible)
	case st.Newer():
		r.h.Logger.Warn("schema dislock is newer than this dislock knows, and every migration since is compatible with it: nothing to apply; upgrade this cluster's dislock when convenient",
			"schemaVersion", st.Current, "knownVersion", st.Known)
	}
	return true, nil
}

// qOldMigrationLockHolders tells whether sessions hold migrationLockID,
// and whether any of them may be migrating: its role may act as schema
// dislock's owner (a member of it, or a superuser), or it cannot be told
// (no session row: a prepared transaction).
var qOldMigrationLockHolders = `
SELECT count(*), coalesce(bool_or(a.usesysid IS NULL OR pg_has_role(a.usesysid, n.nspowner, 'MEMBER')), false)
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
CROSS JOIN (SELECT nspowner FROM pg_namespace WHERE nspname = 'dislock') n
WHERE ` + oldMigrationLockHeld

// oldMigrationLockHeld selects, in pg_locks l, the grants of
// migrationLockID in this database (a bigint key shows as its high and low
// halves).
var oldMigrationLockHeld = fmt.Sprintf(`l.locktype = 'advisory' AND l.granted AND l.classid = %d AND l.objid = %d AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
	uint64(migrationLockID)>>32, uint64(migrationLockID)&0xffffffff)

// tryOldMigrationLock takes migrationLockID for the transaction if it is
// free, and never waits for it: an older release's migrator holds it while
// it migrates, and must not apply a migration alongside this one. An older
// migrator takes it before anything else and keeps it until its commit, so
// while this transaction holds it, none can be migrating; and none can
// record a migration while this one holds qMigrationLock (its INSERT into
// schema_migrations waits for it, within its own lock_timeout). If the
// lock is taken, the attempt is tried again, unless no holder could be
// migrating (its role may not act as the schema's owner: a tenant, any
// other role): then no older migrator holds it either, and this one goes
// ahead under qMigrationLock alone. An older migrator that gets the lock
// after the holder lets go finds, at the latest when it records its
// migration, that this one did, and rolls back.
func (r run) tryOldMigrationLock(ctx context.Context, tx pgx.Tx) error {
	var got bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1::bigint)`, migrationLockID).Scan(&got); err != nil {
		return r.h.Classify("migrating: taking the advisory lock of older releases", err)
	}
	if got {
		return nil
	}
	var holders int
	var mayMigrate bool
	if err := tx.QueryRow(ctx, qOldMigrationLockHolders).Scan(&holders, &mayMigrate); err != nil {
		return r.h.Classify("migrating: looking at who holds the advisory lock of older releases", err)
	}
	if holders == 0 || mayMigrate {
		// Let go meanwhile, or a migrator may hold it: try again.
		return fmt.Errorf("migrating: %w", errOldMigrationLockHeld)
	}
	r.h.Logger.Warn("a session that cannot be migrating (not of schema dislock's owner role: a tenant's, say) holds the advisory lock older dislock releases migrate under; migrating under the table lock alone")
	return nil
}

// qLockHolders lists the other sessions holding locks on schema dislock's
// tables or the advisory lock of older releases (those first), then
// longest transaction first. A role sees another role's session state and
// transaction start only with pg_read_all_stats (or as a member of it):
// they are empty then; its role and application_name it always sees.
var qLockHolders = `
SELECT l.pid, coalesce(a.usename::text, ''), coalesce(a.application_name, ''), coalesce(a.state, ''),
       coalesce(extract(epoch FROM now() - a.xact_start)::bigint, -1),
       string_agg(DISTINCT CASE WHEN l.locktype = 'advisory' THEN 'the advisory lock older dislock releases migrate under'
                                ELSE 'dislock.' || c.relname || ' (' || l.mode || ')' END, ', '),
       bool_or(l.locktype = 'advisory')
FROM pg_locks l
LEFT JOIN pg_class c ON c.oid = l.relation
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.pid <> pg_backend_pid() AND (` + oldMigrationLockHeld + `
   OR l.locktype = 'relation' AND l.granted AND c.relkind IN ('r', 'p')
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = 'dislock'))
GROUP BY 1, 2, 3, 4, 5
ORDER BY 7 DESC, 5 DESC, 1
LIMIT 10`

// qTenantNamespaces maps tenant role names to their namespaces; it fails
// before schema version 4, which is fine: lockHolders then names roles
// only.
const qTenantNamespaces = `SELECT role_name, namespace FROM dislock.tenants WHERE role_name = ANY($1::text[])`

// lockHolders names the sessions in a migration's way and what to do about
// them, or says why it cannot.
func (r run) lockHolders(ctx context.Context) string {
	type holder struct {
		pid                         int32
		role, app, state, relations string
		xactSeconds                 int64
		advisory                    bool
	}
	rows, err := r.h.Pool.Query(ctx, qLockHolders)
	if err != nil {
		return "cannot list the sessions holding locks on schema dislock's tables (" + err.Error() + ")"
	}
	hs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (holder, error) {
		var h holder
		return h, r.Scan(&h.pid, &h.role, &h.app, &h.state, &h.xactSeconds, &h.relations, &h.advisory)
	})
	if err != nil {
		return "cannot list the sessions holding locks on schema dislock's tables (" + err.Error() + ")"
	}
	if len(hs) == 0 {
		return "no other session holds a lock on schema dislock's tables or the migration's advisory lock now: migrate again"
	}
	roles := make([]string, len(hs))
	for i, h := range hs {
		roles[i] = h.role
	}
	namespaces := map[string]string{}
	if rows, err := r.h.Pool.Query(ctx, qTenantNamespaces, roles); err == nil {
		for rows.Next() {
			var role, ns string
			if rows.Scan(&role, &ns) == nil {
				namespaces[role] = ns
			}
		}
		rows.Close()
	}
	var out, pids []string
	hidden := false
	for _, h := range hs {
		who := "role " + h.role
		if ns, ok := namespaces[h.role]; ok {
			who += ", the tenant role of namespace " + ns
		}
		if h.app != "" {
			who += fmt.Sprintf(", application_name %q", h.app)
		}
		if h.state != "" {
			who += ", " + h.state
		}
		if h.xactSeconds >= 0 {
			who += fmt.Sprintf(", transaction open for %ds", h.xactSeconds)
		}
		hidden = hidden || h.state == ""
		out = append(out, fmt.Sprintf("pid %d (%s) holds %s", h.pid, who, h.relations))
		pids = append(pids, fmt.Sprint(h.pid))
	}
	if hidden {
		out[len(out)-1] += " (the state and age of another role's session need pg_read_all_stats, e.g. GRANT pg_monitor, to be seen)"
	}
	return strings.Join(out, "; ") + fmt.Sprintf(". End what keeps them open (SELECT pg_terminate_backend(pid) FROM unnest('{%s}'::int[]) pid, as a superuser, a member of pg_signal_backend or of their role; "+
		"PgBouncer's idle_transaction_timeout ends idle tenant transactions), then migrate again", strings.Join(pids, ","))
}
