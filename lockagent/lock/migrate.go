package lock

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLockID serialises migrations across every webhook replica and CLI
// run of every cluster that share the database ("dislock" in ASCII).
const migrationLockID int64 = 0x646973_6c6f636b

type migration struct {
	version int
	name    string
	sql     string
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
		out = append(out, migration{version: v, name: e.Name(), sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration %s: want version %d (no gaps or duplicates)", m.name, i+1)
		}
	}
	return out, nil
}

// SchemaVersion is the newest schema version this build knows.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil {
		panic(err) // the embedded files are fixed at build time and tested
	}
	return len(ms)
}

// Migrate brings schema dislock up to this build's version in one
// transaction, holding a transaction-level advisory lock so that concurrent
// callers (webhook replicas in several clusters) apply each migration once.
// A transaction-level lock, unlike a session lock, is safe behind PgBouncer's
// transaction pooling. It returns the versions it applied.
func (s *Store) Migrate(ctx context.Context) ([]int, error) {
	ms, err := migrations()
	if err != nil {
		return nil, err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, s.classify("migrating", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::bigint)`, migrationLockID); err != nil {
		return nil, s.classify("migrating: taking the migration lock", err)
	}
	// Multi-statement DDL goes through the simple protocol.
	if err := tx.Conn().PgConn().Exec(ctx, `
CREATE SCHEMA IF NOT EXISTS dislock;
CREATE TABLE IF NOT EXISTS dislock.schema_migrations (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now())`).Close(); err != nil {
		return nil, s.classify("migrating: creating schema dislock", err)
	}
	var current int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM dislock.schema_migrations`).Scan(&current); err != nil {
		return nil, s.classify("migrating: reading the schema version", err)
	}
	if current > len(ms) {
		return nil, fmt.Errorf("migrating: the database schema is at version %d, newer than this dislock knows (%d); upgrade dislock", current, len(ms))
	}
	var applied []int
	for _, m := range ms[current:] {
		if err := tx.Conn().PgConn().Exec(ctx, m.sql).Close(); err != nil {
			return nil, s.classify("migrating: applying "+m.name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO dislock.schema_migrations (version, name) VALUES ($1::int, $2::text)`, m.version, m.name); err != nil {
			return nil, s.classify("migrating: recording "+m.name, err)
		}
		applied = append(applied, m.version)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, s.classify("migrating: commit", err)
	}
	return applied, nil
}
