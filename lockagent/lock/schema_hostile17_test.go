package lock_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/test/tlstest"
)

// Hostile review of issue 17 (schema compatibility): a tenant role reads
// schema_migrations (so that its agent could tell the version) but must not
// be able to write it. A crafted "newer, compatible" row would make every
// webhook skip its migrations and report ready against whatever schema is
// there; a crafted incompatible one would keep every replica unready.
// HELD if this passes.
func TestHostile17_TenantCannotWriteSchemaMigrations(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := openStore(t, dsn, 2)
		ns := namespace(t, "hostile17")
		cred := provision(t, own, ns)
		tdsn, err := lock.TenantDSN(dsn, cred)
		if err != nil {
			t.Fatal(err)
		}
		c := rawConn(t, tdsn)
		for _, stmt := range []string{
			`INSERT INTO dislock.schema_migrations (version, name, compatible_from) VALUES (9999, '9999_evil.sql', 1)`,
			`UPDATE dislock.schema_migrations SET compatible_from = 1`,
			`UPDATE dislock.schema_migrations SET version = version + 1000`,
			`DELETE FROM dislock.schema_migrations`,
			`TRUNCATE dislock.schema_migrations`,
			`ALTER TABLE dislock.schema_migrations DROP CONSTRAINT IF EXISTS schema_migrations_compatible_from_check`,
			`CREATE TABLE dislock.schema_migrations_x (version int)`,
		} {
			if _, err := c.Exec(ctx, stmt); err == nil {
				t.Errorf("tenant role ran %q", stmt)
			}
		}
		st, err := own.Schema(ctx)
		if err != nil || st.Current != st.Known {
			t.Fatalf("schema after the tenant's attempts: %+v, %v", st, err)
		}
	})
}

// Hostile review of issue 17 (database CA, careless operator): the operator
// gives --database-ca-file, believing every connection now verifies the
// server, but keeps the sslmode=prefer (psql's and pgx's default, common in
// copied URLs) in --database-url. WithRootCA keeps the chosen mode, and pgx
// under prefer/allow skips verification entirely and falls back to plain
// text: the CA is silently unused, for the owner's connection and (since
// ReplaceRootCA keeps the mode too) every tenant URL the webhook writes.
// Fixed: the combination is refused at start.
func TestHostile17_CAGivenButURLModeSilentlySkipsVerification(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, tlstest.NewCA(t).CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"prefer", "allow", "disable"} {
		t.Run(mode, func(t *testing.T) {
			_, err := lock.WithRootCA("postgres://dislock:s3cret@db.internal:5432/dislock?sslmode="+mode, caFile)
			if err == nil || !strings.Contains(err.Error(), "sslmode="+mode) || !strings.Contains(err.Error(), "verify-full") || strings.Contains(err.Error(), "s3cret") {
				t.Errorf("with --database-ca-file and sslmode=%s: %v; want a refusal naming the mode and verify-full, without the password", mode, err)
			}
		})
	}
}
