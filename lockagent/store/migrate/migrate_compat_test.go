package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"
)

// The version-skew contract against a real database: clusters are upgraded
// one at a time against one shared schema, so a dislock meets schemas newer
// than it knows. It works against them when every migration since is
// compatible with it, and otherwise refuses, saying which migration and what
// to do. The future migration is a row written by hand: the code that would
// apply it does not exist yet.
func TestMigrateHonoursTheRecordedCompatibility(t *testing.T) {
	t.Parallel()
	// A server of the test's own: it rewrites schema_migrations, which
	// every other test of the package relies on.
	srv := pgtest.New(t, pgtest.Options{Name: "compat"})
	ctx := context.Background()
	known := migrate.SchemaVersion()
	futureName := fmt.Sprintf("%04d_future.sql", known+1)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			admin := storetest.RawConn(t, srv.DirectDSN())
			if _, err := admin.Exec(ctx, `DROP SCHEMA IF EXISTS dislock CASCADE`); err != nil {
				t.Fatal(err)
			}
			s, err := store.Open(ctx, tg.DSN, store.Options{MaxConns: 2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			compatibleFrom := func(t *testing.T) map[int]*int {
				t.Helper()
				rows, err := admin.Query(ctx, `SELECT version, compatible_from FROM dislock.schema_migrations`)
				if err != nil {
					t.Fatal(err)
				}
				defer rows.Close()
				got := map[int]*int{}
				for rows.Next() {
					var v int
					var from *int
					if err := rows.Scan(&v, &from); err != nil {
						t.Fatal(err)
					}
					got[v] = from
				}
				return got
			}
			schemaFinding := func(t *testing.T) check.Finding {
				t.Helper()
				fs, err := check.Database(ctx, s, check.Options{AllowAsync: true})
				if err != nil {
					t.Fatal(err)
				}
				for _, f := range fs {
					if f.Check == "schema" {
						return f
					}
				}
				t.Fatalf("no schema finding in %+v", fs)
				return check.Finding{}
			}

			t.Run("a fresh database gets every migration, each recorded with its compatibility", func(t *testing.T) {
				if st, err := migrate.Schema(ctx, s); err != nil || st.Current != 0 || st.Usable() {
					t.Fatalf("before migrating: %+v, %v; want version 0, not usable", st, err)
				}
				applied, err := migrate.Up(ctx, s)
				if err != nil || len(applied) != known {
					t.Fatalf("applied %v, %v; want 1..%d", applied, err, known)
				}
				got := compatibleFrom(t)
				if got[6] == nil || *got[6] != 5 {
					t.Errorf("migration 6 recorded compatible_from %v, want 5 (it only adds a column)", got[6])
				}
				// The rows of the migrations before the column existed
				// stay NULL: compatible from their own version only.
				for v := 1; v < 6; v++ {
					if got[v] != nil {
						t.Errorf("migration %d recorded compatible_from %d, want NULL", v, *got[v])
					}
				}
				if st, err := migrate.Schema(ctx, s); err != nil || !st.Usable() || st.Newer() {
					t.Fatalf("after migrating: %+v, %v", st, err)
				}
				if f := schemaFinding(t); f.Status != check.StatusOK {
					t.Fatalf("check: %+v", f)
				}
			})

			t.Run("a database the previous release migrated gets migration 6 and the later ones", func(t *testing.T) {
				if _, err := admin.Exec(ctx, `DELETE FROM dislock.schema_migrations WHERE version >= 6;
ALTER TABLE dislock.schema_migrations DROP COLUMN compatible_from`); err != nil {
					t.Fatal(err)
				}
				applied, err := migrate.Up(ctx, s)
				var want []int
				for v := 6; v <= known; v++ {
					want = append(want, v)
				}
				if err != nil || !slices.Equal(applied, want) {
					t.Fatalf("applied %v, %v; want %v", applied, err, want)
				}
				if got := compatibleFrom(t); got[6] == nil || *got[6] != 5 || got[5] != nil {
					t.Fatalf("compatible_from of 5 and 6: %v, %v; want NULL, 5", got[5], got[6])
				}
			})

			future := func(t *testing.T, compatibleFrom any) {
				t.Helper()
				if _, err := admin.Exec(ctx, `INSERT INTO dislock.schema_migrations (version, name, compatible_from) VALUES ($1, $3, $2)
ON CONFLICT (version) DO UPDATE SET compatible_from = EXCLUDED.compatible_from`, known+1, compatibleFrom, futureName); err != nil {
					t.Fatal(err)
				}
			}

			t.Run("a newer schema compatible with this dislock is used as it is", func(t *testing.T) {
				future(t, known)
				applied, err := migrate.Up(ctx, s)
				if err != nil || len(applied) != 0 {
					t.Fatalf("applied %v, %v; want nothing and no error", applied, err)
				}
				st, err := migrate.Schema(ctx, s)
				if err != nil || !st.Usable() || !st.Newer() || st.Current != known+1 || st.Known != known {
					t.Fatalf("%+v, %v; want newer, usable", st, err)
				}
				f := schemaFinding(t)
				if f.Status != check.StatusWarn || !strings.Contains(f.Detail, "every migration since is compatible") || !strings.Contains(f.Fix, "upgrade this cluster's dislock") {
					t.Fatalf("check: %+v; want a warning that the schema is newer and compatible", f)
				}
			})

			for _, tc := range []struct {
				name           string
				compatibleFrom any
				why            string
			}{
				{"a newer schema that changed what this dislock runs is refused", known + 1, fmt.Sprintf("compatible-from %d", known+1)},
				{"a newer schema that recorded no compatibility is refused", nil, "recorded no compatibility"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					future(t, tc.compatibleFrom)
					applied, err := migrate.Up(ctx, s)
					if !errors.Is(err, migrate.ErrSchemaIncompatible) || applied != nil {
						t.Fatalf("applied %v, %v; want ErrSchemaIncompatible", applied, err)
					}
					for _, want := range []string{fmt.Sprintf("at version %d, newer than this dislock knows (%d)", known+1, known),
						fmt.Sprintf("migration %d (%s)", known+1, futureName), tc.why,
						fmt.Sprintf("upgrade this cluster's dislock to a release that knows schema version %d", known+1), "Upgrading"} {
						if !strings.Contains(err.Error(), want) {
							t.Errorf("error %q does not say %q", err, want)
						}
					}
					if st, err := migrate.Schema(ctx, s); err != nil || st.Usable() || st.Incompatible == nil || st.Incompatible.Version != known+1 {
						t.Fatalf("%+v, %v; want not usable, naming migration 7", st, err)
					}
					if f := schemaFinding(t); f.Status != check.StatusFail || !strings.Contains(f.Detail, fmt.Sprintf("migration %d (%s)", known+1, futureName)) ||
						!strings.Contains(f.Fix, fmt.Sprintf("schema version %d", known+1)) {
						t.Fatalf("check: %+v; want a failure naming the migration and the fix", f)
					}
				})
			}
		})
	}
}

// A tenant role reads schema_migrations (so that its agent could tell the
// version) but must not be able to write it. A crafted "newer, compatible"
// row would make every webhook skip its migrations and report ready against
// whatever schema is there; a crafted incompatible one would keep every
// replica unready.
func TestATenantCannotWriteSchemaMigrations(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		ns := storetest.Namespace(t, "schema-writer")
		cred := storetest.Provision(t, own, ns)
		tdsn, err := tenant.DSN(dsn, cred)
		if err != nil {
			t.Fatal(err)
		}
		c := storetest.RawConn(t, tdsn)
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
		st, err := migrate.Schema(ctx, own)
		if err != nil || st.Current != st.Known {
			t.Fatalf("schema after the tenant's attempts: %+v, %v", st, err)
		}
	})
}
