package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/pgtest"
)

// oldMigrationLockID is the advisory lock every release before the table
// lock took, without bound, to serialise its migrations ("dislock" in
// ASCII). It is public, and any role may take any advisory lock.
const oldMigrationLockID int64 = 0x646973_6c6f636b

// qAdvisoryHolders lists the sessions holding oldMigrationLockID.
const qAdvisoryHolders = `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
  AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// awaitAdvisoryHolder waits until a session holds oldMigrationLockID and
// returns its pid.
func awaitAdvisoryHolder(t *testing.T, c *pgx.Conn) int32 {
	t.Helper()
	var pid int32
	storetest.AwaitCond(t, "a session holding the migration's advisory lock", func() bool {
		return c.QueryRow(context.Background(), qAdvisoryHolders, oldMigrationLockID).Scan(&pid) == nil
	})
	return pid
}

// unapplyLast deletes the newest migration's record, so that Migrate
// applies it again (migrations are idempotent).
func unapplyLast(t *testing.T, c *pgx.Conn) {
	t.Helper()
	if _, err := c.Exec(context.Background(), `DELETE FROM dislock.schema_migrations WHERE version = $1`, migrate.SchemaVersion()); err != nil {
		t.Fatal(err)
	}
}

// newestMigration reads the newest migration's file name and SQL.
func newestMigration(t *testing.T) (name, body string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("migrations", fmt.Sprintf("%04d_*.sql", migrate.SchemaVersion())))
	if err != nil || len(files) != 1 {
		t.Fatalf("the newest migration's file: %v, %v", files, err)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Base(files[0]), string(b)
}

type migrated struct {
	applied []int
	err     error
	took    time.Duration
}

// migrateIn runs m.Up with a fresh Store of one connection in the
// background, cut by the client after limit (a migrator that never returns
// fails the test instead of hanging it).
func migrateIn(t *testing.T, dsn string, m migrate.Migrator, limit time.Duration) <-chan migrated {
	t.Helper()
	s, err := store.Open(context.Background(), dsn, store.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	done := make(chan migrated, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		start := time.Now()
		applied, err := m.Up(ctx, s)
		done <- migrated{applied, err, time.Since(start)}
	}()
	return done
}

// A schema at this build's version needs no lock at all: every replica
// that starts, in every cluster, reads schema_migrations and is done. While
// another session holds both the table lock migrators serialise on and the
// advisory lock older releases took, Migrate still answers at once.
func TestMigrateOnACurrentSchemaTakesNoLock(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		storetest.Open(t, dsn, 2)
		tx, err := storetest.RawConn(t, pgtest.Need(t).DirectDSN()).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // ends the holder's transaction
		if _, err := tx.Exec(ctx, `LOCK TABLE dislock.schema_migrations IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::bigint)`, oldMigrationLockID); err != nil {
			t.Fatal(err)
		}
		r := <-migrateIn(t, dsn, migrate.Migrator{}, 20*time.Second)
		if r.err != nil || r.applied != nil || r.took >= migrate.DefaultLockTimeout {
			t.Fatalf("Migrate on a current schema while another session holds the migration locks: applied %v, %v after %s; want nothing, at once",
				r.applied, r.err, r.took)
		}
	})
}

// A tenant takes the advisory lock every earlier release migrated under,
// for its session: through PgBouncer the lock stays with the server
// connection, past any idle timeout. Earlier, every replica that started
// (and `dislock migrate`) waited for it for ever, in every cluster. Now a
// current schema takes no lock, and a pending migration is serialised by a
// lock no tenant may take: the tenant's advisory lock keeps no migrator
// waiting, since no migrator can hold it meanwhile.
func TestMigrateIsNotStalledByATenantsAdvisoryLock(t *testing.T) {
	t.Parallel() // a server of its own: it re-applies a migration
	srv := pgtest.New(t, pgtest.Options{Name: "migrate-tenant"})
	ctx := context.Background()
	own := storetest.Open(t, srv.DirectDSN(), 2)
	su := storetest.Superuser(t, srv)
	cred := storetest.Provision(t, own, storetest.Namespace(t, "advisory"))
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			asTenant := storetest.RawConn(t, storetest.TenantDSN(t, tg.DSN, cred))
			if _, err := asTenant.Exec(ctx, `SELECT pg_advisory_lock($1::bigint)`, oldMigrationLockID); err != nil {
				t.Fatal(err)
			}
			pid := awaitAdvisoryHolder(t, su)
			t.Cleanup(func() {
				if _, err := su.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
					t.Error(err)
				}
			})

			t.Run("a replica starting against a current schema is ready at once", func(t *testing.T) {
				r := <-migrateIn(t, tg.DSN, migrate.Migrator{}, 20*time.Second)
				if r.err != nil || r.applied != nil || r.took >= migrate.DefaultLockTimeout {
					t.Fatalf("applied %v, %v after %s; want nothing, at once", r.applied, r.err, r.took)
				}
			})
			t.Run("a pending migration is applied", func(t *testing.T) {
				unapplyLast(t, su)
				r := <-migrateIn(t, tg.DSN, migrate.Migrator{}, 30*time.Second)
				if r.err != nil || !slices.Equal(r.applied, []int{migrate.SchemaVersion()}) {
					t.Fatalf("applied %v, %v after %s; want [%d]", r.applied, r.err, r.took, migrate.SchemaVersion())
				}
			})
			if held := awaitAdvisoryHolder(t, su); held != pid {
				t.Fatalf("the advisory lock moved from pid %d to %d", pid, held)
			}
		})
	}
}

// Migrators of every release serialise: this one on a table lock no tenant
// may take, and with a release before it, which takes the advisory lock
// (without bound), by taking that lock too, but only if it is free at once.
// Concurrent migrators of a fresh database apply each migration once; a
// migrator of an older release that holds the advisory lock is waited for,
// and what it applied is not applied again; and a migrator that gives up
// names the session in its way.
func TestMigrateSerialisesWithEveryOtherMigrator(t *testing.T) {
	t.Parallel() // a server of its own: it drops the schema
	srv := pgtest.New(t, pgtest.Options{Name: "migrate-serial"})
	ctx := context.Background()
	su := storetest.Superuser(t, srv)
	all := make([]int, migrate.SchemaVersion())
	for i := range all {
		all[i] = i + 1
	}

	t.Run("concurrent migrators of a fresh database apply each migration once", func(t *testing.T) {
		if _, err := su.Exec(ctx, `DROP SCHEMA IF EXISTS dislock CASCADE`); err != nil {
			t.Fatal(err)
		}
		var runs []<-chan migrated
		for i := range 4 {
			runs = append(runs, migrateIn(t, srv.Targets()[i%2].DSN, migrate.Migrator{}, time.Minute))
		}
		var got []int
		for _, run := range runs {
			r := <-run
			if r.err != nil {
				t.Fatalf("a concurrent migrator: %v", r.err)
			}
			got = append(got, r.applied...)
		}
		slices.Sort(got)
		if !slices.Equal(got, all) {
			t.Fatalf("the migrators together applied %v; want %v, each once", got, all)
		}
	})

	t.Run("an older release's migrator is waited for and nothing is applied twice", func(t *testing.T) {
		unapplyLast(t, su)
		// What every earlier release's migrateOnce does, stopped after
		// reading the version: it holds the advisory lock, and is about
		// to apply the newest migration.
		old, err := storetest.RawConn(t, srv.DirectDSN()).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer old.Rollback(ctx) //nolint:errcheck // committed below
		var current int
		if err := old.QueryRow(ctx, `SELECT pg_advisory_xact_lock($1::bigint), max(version) FROM dislock.schema_migrations`,
			oldMigrationLockID).Scan(nil, &current); err != nil {
			t.Fatal(err)
		}
		if current != migrate.SchemaVersion()-1 {
			t.Fatalf("the older migrator reads version %d, want %d", current, migrate.SchemaVersion()-1)
		}
		watcher := storetest.RawConn(t, srv.DirectDSN())
		done := migrateIn(t, srv.BouncerDSN()+"&application_name=dislock-new-migrate", migrate.Migrator{RetryFor: time.Minute}, 2*time.Minute)
		// Its first attempt asked for the advisory lock, found a session
		// of the owner's role holding it, and rolled back.
		storetest.AwaitCond(t, "the migrator's first attempt asking for the advisory lock", func() bool {
			var n int
			return watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dislock-new-migrate'
				AND (query LIKE '%pg_try_advisory_xact_lock%' OR query LIKE '%pg_has_role%' OR lower(query) = 'rollback')`).Scan(&n) == nil && n > 0
		})
		select {
		case r := <-done:
			t.Fatalf("Migrate returned while an older release's migrator holds the advisory lock: %v, %v", r.applied, r.err)
		default:
		}
		name, body := newestMigration(t)
		if err := old.Conn().PgConn().Exec(ctx, body).Close(); err != nil {
			t.Fatalf("the older migrator applying %s: %v", name, err)
		}
		if _, err := old.Exec(ctx, `INSERT INTO dislock.schema_migrations (version, name) VALUES ($1::int, $2::text)`,
			migrate.SchemaVersion(), name); err != nil {
			t.Fatalf("the older migrator recording %s: %v", name, err)
		}
		if err := old.Commit(ctx); err != nil {
			t.Fatalf("the older migrator's commit: %v", err)
		}
		if r := <-done; r.err != nil || r.applied != nil {
			t.Fatalf("Migrate once the older migrator committed: applied %v, %v; want nothing (it was applied)", r.applied, r.err)
		}
	})

	t.Run("giving up, Migrate names the session holding the migration lock", func(t *testing.T) {
		unapplyLast(t, su)
		// A session of the owner's role (an older release's migrator stuck
		// mid-way, an operator's forgotten psql) holds the advisory lock:
		// it may be migrating, so it is waited for, within the bound.
		holder := storetest.RawConn(t, srv.DirectDSN()+"&application_name=dislock-0.4-migrate")
		if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1::bigint)`, oldMigrationLockID); err != nil {
			t.Fatal(err)
		}
		pid := awaitAdvisoryHolder(t, su)
		r := <-migrateIn(t, srv.BouncerDSN(), migrate.Migrator{LockTimeout: 100 * time.Millisecond, RetryFor: time.Second}, 30*time.Second)
		if r.err == nil || errors.Is(r.err, store.ErrUnavailable) || errors.Is(r.err, context.DeadlineExceeded) {
			t.Fatalf("Migrate: applied %v, %v after %s; want it to give up, naming the holder", r.applied, r.err, r.took)
		}
		for _, want := range []string{fmt.Sprintf("pid %d", pid), "role " + pgtest.AppUser, `application_name "dislock-0.4-migrate"`,
			"advisory lock", "pg_terminate_backend"} {
			if !strings.Contains(r.err.Error(), want) {
				t.Errorf("the error does not say %q: %v", want, r.err)
			}
		}
		t.Logf("Migrate gave up after %s: %v", r.took, r.err)
		if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
			t.Fatal(err)
		}
		if r := <-migrateIn(t, srv.BouncerDSN(), migrate.Migrator{}, 30*time.Second); r.err != nil || !slices.Equal(r.applied, []int{migrate.SchemaVersion()}) {
			t.Fatalf("Migrate once the holder let go: %v, %v", r.applied, r.err)
		}
	})
}

// A tenant holding a transaction open on its own rows of dislock.windows
// makes a migration's ALTER TABLE wait, and PostgreSQL queues every later
// claim behind the waiting DDL. Migrate cuts each wait at lock_timeout, so
// claims of every namespace pass within it while Migrate retries, and the
// migration goes through once the reader commits. Migration 4 is re-applied
// (its record deleted) on a server of the test's own.
func TestAMigrationWaitingForATenantDoesNotHoldUpClaims(t *testing.T) {
	t.Parallel() // its own server: the shared one's DDL must not wait
	srv := pgtest.New(t, pgtest.Options{Name: "ddl-wait"})
	ctx := context.Background()
	own := storetest.Open(t, srv.DirectDSN(), 2)
	ownerConn := storetest.RawConn(t, srv.DirectDSN())
	nsA, nsB := storetest.Namespace(t, "reader"), storetest.Namespace(t, "claimer")
	credA, credB := storetest.Provision(t, own, nsA), storetest.Provision(t, own, nsB)
	// Migration 4 alters dislock.windows, the table the tenant reads; the
	// ones after it are applied again with it.
	const version = 4
	var again []int
	for v := version; v <= migrate.SchemaVersion(); v++ {
		again = append(again, v)
	}

	unapply := func(t *testing.T) {
		t.Helper()
		if _, err := ownerConn.Exec(ctx, `DELETE FROM dislock.schema_migrations WHERE version >= $1`, version); err != nil {
			t.Fatal(err)
		}
	}
	// openReader begins team-a's transaction that read its own windows and
	// stays open; the returned function commits it.
	openReader := func(t *testing.T, dsn string) func() {
		t.Helper()
		tx, err := storetest.RawConn(t, storetest.TenantDSN(t, dsn, credA)).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM dislock.windows`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return func() {
			t.Helper()
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// ddlWaiting: a session waits for an ACCESS EXCLUSIVE lock on
	// dislock.windows (the migration's ALTER TABLE).
	ddlWaiting := func() bool {
		var n int
		err := ownerConn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'relation'
			AND relation = 'dislock.windows'::regclass AND mode = 'AccessExclusiveLock'`).Scan(&n)
		return err == nil && n > 0
	}
	type result struct {
		applied []int
		err     error
	}
	migrateWith := func(m migrate.Migrator, dsn string) <-chan result {
		s, err := store.Open(ctx, dsn, store.Options{MaxConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		done := make(chan result, 1)
		go func() {
			applied, err := m.Up(ctx, s)
			done <- result{applied, err}
		}()
		return done
	}

	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			claimer := storetest.TenantStore(t, tg.DSN, credB)
			key := nsB + "/report-" + tg.Name

			t.Run("claims pass while Migrate waits, and it applies once the reader commits", func(t *testing.T) {
				unapply(t)
				commit := openReader(t, tg.DSN)
				done := migrateWith(migrate.Migrator{RetryFor: 5 * time.Minute}, tg.DSN)
				var slowest time.Duration
				for i := range 3 {
					// Each claim queues behind a waiting attempt: the one
					// after the first is a retry.
					storetest.AwaitCond(t, "the migration waiting for its lock on dislock.windows", ddlWaiting)
					cctx, cancel := context.WithTimeout(ctx, time.Minute)
					began := time.Now()
					_, err := claimer.ClaimWindow(cctx, store.ClaimRequest{Key: key, Window: storetest.WindowAt(i), Index: store.NotIndexed,
						Owner: store.Owner{Cluster: "dc-a", Namespace: nsB, Job: "report", JobUID: "uid", Pod: "pod"}, TTL: storetest.TTL})
					took := time.Since(began)
					cancel()
					if err != nil {
						t.Fatalf("claim %d while the migration waits (after %s): %v", i, took, err)
					}
					slowest = max(slowest, took)
				}
				t.Logf("slowest of 3 claims queued behind the waiting migration: %s (lock_timeout %s)", slowest, migrate.DefaultLockTimeout)
				select {
				case r := <-done:
					t.Fatalf("Migrate returned while the reader still holds its transaction: %v, %v", r.applied, r.err)
				default:
				}
				commit()
				select {
				case r := <-done:
					if r.err != nil || !slices.Equal(r.applied, again) {
						t.Fatalf("Migrate after the reader committed: applied %v, %v; want %v", r.applied, r.err, again)
					}
				case <-time.After(2 * time.Minute):
					t.Fatal("Migrate did not finish within 2 minutes of the reader's commit")
				}
			})

			t.Run("giving up, Migrate names the lock timeout and the tenant in the way", func(t *testing.T) {
				unapply(t)
				commit := openReader(t, tg.DSN)
				r := <-migrateWith(migrate.Migrator{LockTimeout: 100 * time.Millisecond, RetryFor: time.Second}, tg.DSN)
				commit()
				var pgErr *pgconn.PgError
				if r.err == nil || !errors.As(r.err, &pgErr) || pgErr.Code != "55P03" || errors.Is(r.err, store.ErrUnavailable) {
					t.Fatalf("Migrate: %v, want the lock timeout (55P03), not unavailable", r.err)
				}
				for _, w := range []string{"SQLSTATE 55P03", "lock_timeout", credA.Role, "namespace " + nsA, "dislock.windows", "pg_terminate_backend", "idle_transaction_timeout"} {
					if !strings.Contains(r.err.Error(), w) {
						t.Errorf("the error does not say %q: %v", w, r.err)
					}
				}
				t.Logf("Migrate gave up: %v", r.err)
				if applied, err := migrate.Up(ctx, own); err != nil || !slices.Equal(applied, again) {
					t.Fatalf("Migrate once the reader committed: %v, %v", applied, err)
				}
			})
		})
	}
}

// An owner that may not create roles cannot take the schema to version 4;
// the error says so and names the fix, and once it is applied the
// migration goes through.
func TestMigratingWithoutCreateroleNamesTheFix(t *testing.T) {
	t.Parallel() // its own server starts while the shared one's tests run
	srv := pgtest.New(t, pgtest.Options{Name: "nocreaterole"})
	su := storetest.Superuser(t, srv)
	ctx := context.Background()
	if _, err := su.Exec(ctx, `ALTER ROLE `+pgtest.AppUser+` NOCREATEROLE`); err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(ctx, srv.DirectDSN(), store.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := migrate.Up(ctx, s); err == nil || !strings.Contains(err.Error(), "ALTER ROLE dislock CREATEROLE") {
		t.Fatalf("migrate: %v, want an error naming the fix", err)
	}
	if _, err := su.Exec(ctx, `ALTER ROLE `+pgtest.AppUser+` CREATEROLE`); err != nil {
		t.Fatal(err)
	}
	if applied, err := migrate.Up(ctx, s); err != nil || len(applied) != migrate.SchemaVersion() {
		t.Fatalf("migrate after the fix: applied %v, %v", applied, err)
	}
}
