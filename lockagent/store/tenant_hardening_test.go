package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/test/pgtest"
)

// What a hostile review of the tenant roles proved a tenant could do to
// every other namespace, and what now stops it: a tenant role resolves names
// in pg_catalog first and may create nothing in public (an operator planted
// there ran in other roles' statements); its sessions are bounded; it cannot
// take the lock that serialises provisioning (an advisory lock any role could
// hold stalled every namespace's provisioning); a view it writes is bounded
// (one huge view blew the memory of every webhook leader reading views); and
// a view that does not decode hides no other key's disagreement.
func TestATenantCannotReachBeyondItsNamespace(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		ns := storetest.Namespace(t, "hard-a")
		cred := storetest.Provision(t, own, ns)
		tenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, cred))

		var path string
		var createInPublic bool
		var limit int
		if err := tenant.QueryRow(ctx, `SELECT current_setting('search_path'), has_schema_privilege('public', 'CREATE'),
			(SELECT rolconnlimit FROM pg_catalog.pg_roles WHERE rolname = current_user)`).Scan(&path, &createInPublic, &limit); err != nil {
			t.Fatal(err)
		}
		if path != "pg_catalog, pg_temp" || createInPublic || limit != store.TenantConnectionLimit {
			t.Errorf("tenant role: search_path %q, may create in public %v, connection limit %d; want \"pg_catalog, pg_temp\", false, %d",
				path, createInPublic, limit, store.TenantConnectionLimit)
		}
		tx, err := tenant.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE dislock.tenants IN SHARE ROW EXCLUSIVE MODE`); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("the tenant taking the lock that serialises provisioning: %v, want permission denied", err)
		}
		tx.Rollback(ctx) //nolint:errcheck // the transaction failed already

		big := `{"schedule":"` + strings.Repeat("x", 8192) + `"}`
		if _, err := tenant.Exec(ctx, `INSERT INTO dislock.views (lock_key, cluster, view, seen_at) VALUES ($1, 'dc-z', $2::jsonb, now())`,
			ns+"/big", big); err == nil || !strings.Contains(err.Error(), "views_size") {
			t.Errorf("the tenant writing an 8 KiB view: %v, want refused by views_size", err)
		}

		// A view that does not decode, next to a real disagreement of
		// another key: the disagreement is still reported.
		if _, err := tenant.Exec(ctx, `INSERT INTO dislock.views (lock_key, cluster, view, seen_at) VALUES ($1, 'dc-y', '{"standby":"yes"}', now()),
			($1, 'dc-z', '{"standby":true}', now())`, ns+"/odd"); err != nil {
			t.Fatal(err)
		}
		other := storetest.Namespace(t, "hard-b")
		for _, c := range []struct{ cluster, zone string }{{"dc-a", "UTC"}, {"dc-b", "Europe/Berlin"}} {
			if _, err := own.RecordView(ctx, other+"/report", c.cluster, store.View{Schedule: "0 2 * * *", TimeZone: c.zone, Mode: "schedule"}, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		views, err := own.ListDisagreements(ctx, time.Hour)
		if err != nil {
			t.Fatalf("listing disagreements next to a view that does not decode: %v", err)
		}
		found := false
		for _, v := range views {
			found = found || v.Key == other+"/report"
		}
		if !found {
			t.Errorf("the disagreement of %s/report is not reported: %+v", other, views)
		}
	})
}

// A tenant may write the token column of its own rows (a takeover draws a
// new token), but never a token above the high water: the largest token
// next_token() can have handed out so far. A forged huge token would break
// the owner's `dislock check` (a token above the epoch) and outrank every
// token the namespace is handed later. Tokens the agent's statements draw
// in the same statement, on every path (insert, takeover, re-acquired
// lease), and tokens drawn earlier in the same transaction still pass.
func TestATenantCannotWriteATokenAboveTheHighWater(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		ns := storetest.Namespace(t, "forge")
		cred := storetest.Provision(t, own, ns)
		s := storetest.TenantStore(t, dsn, cred)
		key := ns + "/report"
		job := func(pod string) store.Owner {
			return store.Owner{Cluster: "dc-a", Namespace: ns, Job: "report-1", JobUID: "uid-1", Pod: pod}
		}

		// The agent's paths: a claim, the Job's retry taking the failed
		// window over (ON CONFLICT DO UPDATE draws the token), a lease
		// taken, released and taken again.
		first := storetest.MustClaim(t, s, key, storetest.WindowAt(0), job("pod-1"), false, ttl, store.Claimed)
		if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, first.Window.Token, store.StateFailed, storetest.Ptr(1)); err != nil {
			t.Fatal(err)
		}
		retry := storetest.MustClaim(t, s, key, storetest.WindowAt(0), job("pod-2"), false, ttl, store.TookOver)
		if retry.Window.Token <= first.Window.Token {
			t.Fatalf("the takeover's token %d is not above %d", retry.Window.Token, first.Window.Token)
		}
		g, err := s.AcquireLease(ctx, key, job("pod-2"), ttl)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := s.ReleaseLease(ctx, key, g.Lease.Token); err != nil || !ok {
			t.Fatalf("release: %v %v", ok, err)
		}
		if _, err := s.AcquireLease(ctx, key, job("pod-2"), ttl); err != nil {
			t.Fatalf("re-acquiring the released lease (a token drawn in DO UPDATE): %v", err)
		}

		conn := storetest.RawConn(t, storetest.TenantDSN(t, dsn, cred))
		ownerConn := storetest.RawConn(t, dsn)
		before := rowsOf(t, ownerConn, ns)
		ins := `INSERT INTO dislock.windows (lock_key, window_start, owner, cluster, pod, token, state, claimed_at, alive_until)
			VALUES ('` + key + `', '2027-01-01T00:00:00Z', 'x', 'dc-a', 'x', %s, 'running', now(), now())`
		insLease := `INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at) VALUES ('` + key + `-shards#9', 'x', %s, now(), now())`
		for _, tc := range []struct{ name, sql string }{
			{"the largest bigint into its window", `UPDATE dislock.windows SET token = 9223372036854775807 WHERE lock_key = '` + key + `'`},
			{"a token of the next epoch into its window", `UPDATE dislock.windows SET token = token + (1::bigint << 40) WHERE lock_key = '` + key + `'`},
			{"one above the token drawn in the same statement", `UPDATE dislock.windows SET token = dislock.next_token() + 1 WHERE lock_key = '` + key + `'`},
			{"a new window with a huge token", fmt.Sprintf(ins, "(1::bigint << 62)")},
			{"a huge token into its window through ON CONFLICT DO UPDATE", strings.Replace(fmt.Sprintf(ins, "1"), "2027-01-01T00:00:00Z", storetest.WindowAt(0).Format(time.RFC3339), 1) +
				` ON CONFLICT (lock_key, window_start, job_index) DO UPDATE SET token = 1::bigint << 62`},
			{"the largest bigint into its lease", `UPDATE dislock.leases SET token = 9223372036854775807 WHERE lock_key = '` + key + `'`},
			{"a new lease with a huge token", fmt.Sprintf(insLease, "(1::bigint << 62)")},
		} {
			t.Run(tc.name, func(t *testing.T) {
				err := conn.PgConn().Exec(ctx, tc.sql).Close()
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "42501" || !strings.Contains(pgErr.Message, "row-level security") {
					t.Fatalf("%v, want refused by the row-level security policy (42501)", err)
				}
			})
		}
		if after := rowsOf(t, ownerConn, ns); strings.Join(after, "\n") != strings.Join(before, "\n") {
			t.Errorf("the refused writes changed rows:\nbefore:\n%s\nafter:\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
		}

		// The high water itself passes: a token drawn in the same
		// statement, or earlier in the same transaction.
		var drawn, stored int64
		if err := conn.QueryRow(ctx, `UPDATE dislock.windows SET token = dislock.next_token() WHERE lock_key = $1 RETURNING token`, key).Scan(&stored); err != nil {
			t.Fatalf("writing a token drawn in the same statement: %v", err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, `SELECT dislock.next_token()`).Scan(&drawn); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(insLease, "$1::bigint"), drawn); err != nil {
			t.Fatalf("writing a token drawn earlier in the transaction: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if drawn <= stored {
			t.Errorf("token %d drawn after %d", drawn, stored)
		}

		// The owner's check finds no token above the epoch.
		fs, err := own.CheckDatabase(ctx, store.CheckOptions{AllowAsync: true})
		if err != nil {
			t.Fatal(err)
		}
		if f := byCheck(fs)["tokens"]; f.Status != store.StatusOK {
			t.Errorf("tokens after the attempts: %+v", f)
		}
	})
}

// Every namespace draws its tokens from one counter (2^40 values per
// epoch), and a tenant may draw as fast as its connections allow. dislock
// check reports how much of it is spent: a warning above half, a failure
// above 90 %, each with what the operator does.
func TestCheckReportsTheSharedTokenCounterFilling(t *testing.T) {
	t.Parallel() // its own server: the counter of the shared one must not jump
	srv := pgtest.New(t, pgtest.Options{Name: "counter"})
	ctx := context.Background()
	own := storetest.Open(t, srv.DirectDSN(), 2)
	ownerConn := storetest.RawConn(t, srv.DirectDSN())
	const counterMax = 1<<40 - 1
	for _, tc := range []struct {
		name   string
		setval int64 // 0: as migrated
		want   store.Status
	}{
		{"a fresh counter", 0, store.StatusOK},
		{"half spent", counterMax / 2, store.StatusOK},
		{"60 % spent", counterMax / 10 * 6, store.StatusWarn},
		{"95 % spent", counterMax / 100 * 95, store.StatusFail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setval > 0 {
				if _, err := ownerConn.Exec(ctx, `SELECT setval('dislock.token_counter', $1::bigint)`, tc.setval); err != nil {
					t.Fatal(err)
				}
			}
			for _, tg := range srv.Targets() {
				s := own
				if tg.Name != "direct" {
					s = storetest.Open(t, tg.DSN, 1)
				}
				fs, err := s.CheckDatabase(ctx, store.CheckOptions{AllowAsync: true})
				if err != nil {
					t.Fatal(err)
				}
				f := byCheck(fs)["token counter"]
				if f.Status != tc.want || !strings.Contains(f.Detail, fmt.Sprint(counterMax)) || store.Failed(fs) != (tc.want == store.StatusFail) {
					t.Errorf("%s: token counter %+v, want %s", tg.Name, f, tc.want)
				}
				if tc.want == store.StatusOK {
					continue
				}
				t.Logf("%s: %s: %s; fix: %s", tg.Name, f.Status, f.Detail, f.Fix)
				for _, w := range []string{"pg_stat_statements", "dislock.tenants", "NOLOGIN", "new epoch", "docs/operations.md"} {
					if !strings.Contains(f.Fix, w) {
						t.Errorf("%s: the fix does not say %q: %s", tg.Name, w, f.Fix)
					}
				}
			}
		})
	}
	// Nearly full, the counter still hands out growing tokens.
	key := storetest.UniqueKey(t)
	c := storetest.MustClaim(t, own, key, storetest.WindowAt(0), storetest.Owner("dc-a", "job", "pod"), false, ttl, store.Claimed)
	if _, n := store.TokenEpoch(c.Window.Token); n <= counterMax/100*95 {
		t.Errorf("token %d: counter %d, want above the setval", c.Window.Token, n)
	}
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
	for v := version; v <= store.SchemaVersion(); v++ {
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
	migrate := func(opts store.Options, dsn string) <-chan result {
		s, err := store.Open(ctx, dsn, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		done := make(chan result, 1)
		go func() {
			applied, err := s.Migrate(ctx)
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
				done := migrate(store.Options{MaxConns: 2, MigrationRetryFor: 5 * time.Minute}, tg.DSN)
				var slowest time.Duration
				for i := range 3 {
					// Each claim queues behind a waiting attempt: the one
					// after the first is a retry.
					storetest.AwaitCond(t, "the migration waiting for its lock on dislock.windows", ddlWaiting)
					cctx, cancel := context.WithTimeout(ctx, time.Minute)
					began := time.Now()
					_, err := claimer.ClaimWindow(cctx, store.ClaimRequest{Key: key, Window: storetest.WindowAt(i), Index: store.NotIndexed,
						Owner: store.Owner{Cluster: "dc-a", Namespace: nsB, Job: "report", JobUID: "uid", Pod: "pod"}, TTL: ttl})
					took := time.Since(began)
					cancel()
					if err != nil {
						t.Fatalf("claim %d while the migration waits (after %s): %v", i, took, err)
					}
					slowest = max(slowest, took)
				}
				t.Logf("slowest of 3 claims queued behind the waiting migration: %s (lock_timeout %s)", slowest, store.DefaultMigrationLockTimeout)
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
				r := <-migrate(store.Options{MaxConns: 2, MigrationLockTimeout: 100 * time.Millisecond, MigrationRetryFor: time.Second}, tg.DSN)
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
				if applied, err := own.Migrate(ctx); err != nil || !slices.Equal(applied, again) {
					t.Fatalf("Migrate once the reader committed: %v, %v", applied, err)
				}
			})
		})
	}
}

// A tenant may write every column of its own rows on INSERT and the time
// columns on UPDATE, and the policies check only the key and the token. A
// timestamptz column takes 'infinity' and '-infinity', which no time.Time
// holds: one such row of one namespace made the owner's listings of every
// namespace fail (the webhook's disagreement report, `dislock windows`,
// `dislock leases`: "cannot scan Infinity into *time.Time"). Migration 4's
// CHECK constraints refuse non-finite times and unbounded text in every
// table a tenant writes, on INSERT and UPDATE alike, and the owner's
// listings go on reporting every other namespace.
func TestATenantCannotWriteATimestampTheOwnersListingsCannotRead(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		ns := storetest.Namespace(t, "inf-a")
		cred := storetest.Provision(t, own, ns)
		tenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, cred))
		key := ns + "/report"

		// The tenant's own rows as its agent writes them.
		ts := storetest.TenantStore(t, dsn, cred)
		job := store.Owner{Cluster: "dc-a", Namespace: ns, Job: "report-1", JobUID: "uid-1", Pod: "pod-1"}
		storetest.MustClaim(t, ts, key, storetest.WindowAt(0), job, false, ttl, store.Claimed)
		if _, err := ts.AcquireLease(ctx, key, job, ttl); err != nil {
			t.Fatal(err)
		}
		if _, err := ts.RecordView(ctx, key, "dc-a", store.View{Schedule: "0 2 * * *", TimeZone: "UTC", Mode: "schedule"}, time.Hour); err != nil {
			t.Fatal(err)
		}
		// A real disagreement of another namespace, which must be reported.
		other := storetest.Namespace(t, "inf-b")
		for _, c := range []struct{ cluster, zone string }{{"dc-a", "UTC"}, {"dc-b", "Europe/Berlin"}} {
			if _, err := own.RecordView(ctx, other+"/report", c.cluster, store.View{Schedule: "0 2 * * *", TimeZone: c.zone, Mode: "schedule"}, time.Hour); err != nil {
				t.Fatal(err)
			}
		}

		refused := func(what, constraint, sql string, args ...any) {
			t.Helper()
			_, err := tenant.Exec(ctx, sql, args...)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != constraint {
				t.Errorf("the tenant %s: %v, want refused by %s (check_violation)", what, err, constraint)
			}
		}
		const now = "2026-12-02T12:00:00Z"
		const insertWindow = `INSERT INTO dislock.windows (lock_key, window_start, job_index, owner, cluster, pod, token, state,
			claimed_at, alive_until, finished_at) VALUES ($1, $2::text::timestamptz, -1, 'o', 'c', 'p', 1, 'failed',
			$3::text::timestamptz, $4::text::timestamptz, $5::text::timestamptz)`
		const insertLease = `INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at)
			VALUES ($1, 'o', 1, $2::text::timestamptz, $3::text::timestamptz)`
		for _, v := range []string{"infinity", "-infinity"} {
			refused("inserting a window starting at "+v, "windows_finite_times", insertWindow, ns+"/w1"+v, v, now, now, now)
			refused("inserting a window claimed at "+v, "windows_finite_times", insertWindow, ns+"/w2"+v, now, v, now, now)
			refused("inserting a window alive until "+v, "windows_finite_times", insertWindow, ns+"/w3"+v, now, now, v, now)
			refused("inserting a window finished at "+v, "windows_finite_times", insertWindow, ns+"/w4"+v, now, now, now, v)
			refused("inserting a lease acquired at "+v, "leases_finite_times", insertLease, ns+"/l1"+v, v, now)
			refused("inserting a lease expiring at "+v, "leases_finite_times", insertLease, ns+"/l2"+v, now, v)
			refused("inserting a view seen at "+v, "views_finite_times",
				`INSERT INTO dislock.views (lock_key, cluster, view, seen_at) VALUES ($1, 'dc-y', '{"mode":"lease"}', $2::text::timestamptz)`, ns+"/v"+v, v)
			// The columns it may update on its own rows.
			for _, col := range []string{"claimed_at", "alive_until", "finished_at"} {
				refused("setting its window's "+col+" to "+v, "windows_finite_times",
					`UPDATE dislock.windows SET `+col+` = $2::text::timestamptz WHERE lock_key = $1`, key, v)
			}
			for _, col := range []string{"acquired_at", "expire_at"} {
				refused("setting its lease's "+col+" to "+v, "leases_finite_times",
					`UPDATE dislock.leases SET `+col+` = $2::text::timestamptz WHERE lock_key = $1`, key, v)
			}
			refused("setting its view's seen_at to "+v, "views_finite_times",
				`UPDATE dislock.views SET seen_at = $2::text::timestamptz WHERE lock_key = $1`, key, v)
		}
		long, longer := strings.Repeat("x", 513), strings.Repeat("x", 1025)
		const insertWindowText = `INSERT INTO dislock.windows (lock_key, window_start, job_index, owner, cluster, pod, token, state,
			claimed_at, alive_until) VALUES ($1, now(), -1, $2, $3, $4, 1, 'failed', now(), now())`
		refused("inserting a window of a 513-byte key", "windows_text_size", insertWindowText, ns+"/"+long, "o", "c", "p")
		refused("inserting a window of a 1025-byte owner", "windows_text_size", insertWindowText, ns+"/t1", longer, "c", "p")
		refused("inserting a window of a 513-byte cluster", "windows_text_size", insertWindowText, ns+"/t2", "o", long, "p")
		refused("inserting a window of a 513-byte pod", "windows_text_size", insertWindowText, ns+"/t3", "o", "c", long)
		refused("setting its window's owner to 1025 bytes", "windows_text_size", `UPDATE dislock.windows SET owner = $2 WHERE lock_key = $1`, key, longer)
		refused("inserting a lease of a 1025-byte owner", "leases_text_size",
			`INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at) VALUES ($1, $2, 1, now(), now())`, ns+"/t4", longer)
		refused("setting its lease's owner to 1025 bytes", "leases_text_size", `UPDATE dislock.leases SET owner = $2 WHERE lock_key = $1`, key, longer)
		refused("inserting a view of a 513-byte cluster", "views_text_size",
			`INSERT INTO dislock.views (lock_key, cluster, view, seen_at) VALUES ($1, $2, '{}', now())`, ns+"/t5", long)

		// The owner's listings still read every namespace's rows.
		views, err := own.ListDisagreements(ctx, time.Hour)
		if err != nil {
			t.Fatalf("the owner listing disagreements: %v", err)
		}
		found := false
		for _, v := range views {
			found = found || v.Key == other+"/report"
		}
		if !found {
			t.Errorf("the disagreement of %s/report is not reported: %+v", other, views)
		}
		if ws, _, err := own.ListWindows(ctx, key, 10); err != nil || len(ws) != 1 || ws[0].Owner != job.String() {
			t.Errorf("the owner listing the tenant's windows: %+v, %v; want its one claim", ws, err)
		}
		leases, _, err := own.ListLeases(ctx)
		found = false
		for _, l := range leases {
			found = found || l.Key == key
		}
		if err != nil || !found {
			t.Errorf("the owner listing leases: %v; the tenant's lease found: %v", err, found)
		}
	})
}

// Should a row no time.Time can hold get in anyway (by hand, or written
// before the constraints on a database where they were dropped), each owner
// listing leaves that row out, logs it naming the key and the column, and
// counts it, instead of failing for every namespace; a read of the row
// itself fails naming the column. Its own server: the constraints are
// dropped there.
func TestOwnersListingsLeaveOutARowTheyCannotRead(t *testing.T) {
	t.Parallel()
	srv := pgtest.New(t, pgtest.Options{Name: "unreadable"})
	ctx := context.Background()
	storetest.Open(t, srv.DirectDSN(), 1) // migrates
	ownerConn := storetest.RawConn(t, srv.DirectDSN())
	for _, c := range []string{"windows_finite_times ON dislock.windows", "leases_finite_times ON dislock.leases", "views_finite_times ON dislock.views"} {
		table, constraint := strings.Split(c, " ON ")[1], strings.Split(c, " ON ")[0]
		if _, err := ownerConn.Exec(ctx, `ALTER TABLE `+table+` DROP CONSTRAINT `+constraint); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ownerConn.Exec(ctx, `
		INSERT INTO dislock.windows (lock_key, window_start, job_index, owner, cluster, pod, token, state, claimed_at, alive_until) VALUES
			('good/report', '2026-12-02T12:00:00Z', -1, 'o', 'c', 'p', 1, 'failed', now(), now()),
			('bad/report', 'infinity', -1, 'o', 'c', 'p', 1, 'failed', now(), now());
		INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at) VALUES
			('good/report', 'o', 1, now(), now()), ('bad/report', 'o', 1, now(), '-infinity');
		INSERT INTO dislock.views (lock_key, cluster, view, seen_at) VALUES
			('good/report', 'dc-a', '{"timeZone":"UTC"}', now()), ('good/report', 'dc-b', '{"timeZone":"Europe/Berlin"}', now()),
			('bad/report', 'dc-a', '{"timeZone":"UTC"}', 'infinity'), ('bad/report', 'dc-b', '{"timeZone":"Asia/Tokyo"}', 'infinity')`); err != nil {
		t.Fatal(err)
	}
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			var logged strings.Builder
			s, err := store.Open(ctx, tg.DSN, store.Options{MaxConns: 1, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			keys := func(n int, key func(int) string) []string {
				var out []string
				for i := range n {
					out = append(out, key(i))
				}
				return out
			}
			ws, _, err := s.ListWindows(ctx, "", 10)
			if got := keys(len(ws), func(i int) string { return ws[i].Key }); err != nil || fmt.Sprint(got) != "[good/report]" {
				t.Errorf("ListWindows: %v, %v; want [good/report]", got, err)
			}
			ls, _, err := s.ListLeases(ctx)
			if got := keys(len(ls), func(i int) string { return ls[i].Key }); err != nil || fmt.Sprint(got) != "[good/report]" {
				t.Errorf("ListLeases: %v, %v; want [good/report]", got, err)
			}
			vs, err := s.ListDisagreements(ctx, time.Hour)
			if got := keys(len(vs), func(i int) string { return vs[i].Key + "@" + vs[i].Cluster }); err != nil ||
				fmt.Sprint(got) != "[good/report@dc-a good/report@dc-b]" {
				t.Errorf("ListDisagreements: %v, %v; want good/report's two views", got, err)
			}
			if n := s.SkippedRows(); n != 4 {
				t.Errorf("SkippedRows: %d, want 4 (a window, a lease, two views)", n)
			}
			for _, want := range []string{`key=bad/report`, "window_start is infinity", "expire_at is -infinity", "seen_at is infinity", "table=dislock.views"} {
				if !strings.Contains(logged.String(), want) {
					t.Errorf("the log does not say %q:\n%s", want, logged.String())
				}
			}
			if _, _, err := s.GetLease(ctx, "bad/report"); err == nil || !strings.Contains(err.Error(), "expire_at is -infinity") {
				t.Errorf("reading the unreadable lease: %v, want an error naming expire_at", err)
			}
		})
	}
}

// A tenant can hold a lock on its own role (ALTER ROLE CURRENT_USER SET
// ..., which any role may do for itself, in a transaction it keeps busy).
// DROP ROLE waits for that lock, and it runs holding the table lock that
// serialises every namespace's provisioning in every cluster: every other
// namespace's ProvisionTenant waited behind it, even after the retiring
// client gave up, since the server does not notice a closed connection
// while it waits for a lock. Each provisioning transaction now bounds its
// lock waits on the server: the drop gives up after TenantLockTimeout, the
// error names the role and the cause, the role stays live, another
// namespace's provisioning goes through well within the tenant's hold, and
// the retirement succeeds once the tenant lets go.
func TestATenantHoldingALockOnItsOwnRoleDoesNotStallOtherNamespacesProvisioning(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 4)
		ownerConn := storetest.RawConn(t, dsn)
		ns := storetest.Namespace(t, "stall-a")
		g1 := storetest.Provision(t, own, ns)

		// The tenant locks its own role and keeps the transaction busy
		// (idle timeouts do not end it) until the test lets go.
		tx, err := storetest.RawConn(t, storetest.TenantDSN(t, dsn, g1)).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `ALTER ROLE CURRENT_USER SET application_name = 'x'`); err != nil {
			t.Fatalf("the tenant altering its own role: %v", err)
		}
		letGo, released := make(chan struct{}), make(chan error, 1)
		go func() {
			for {
				select {
				case <-letGo:
					released <- tx.Rollback(ctx)
					return
				default:
				}
				if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.2)`); err != nil {
					released <- err
					return
				}
			}
		}()
		const hold = 2 * time.Minute // the tenant would hold it this long
		stopped := sync.OnceFunc(func() {
			close(letGo)
			if err := <-released; err != nil {
				t.Errorf("the tenant letting go: %v", err)
			}
		})
		t.Cleanup(stopped)
		holdUntil := time.Now().Add(hold)

		for range 3 {
			storetest.Provision(t, own, ns)
		}
		// The webhook makes room for a new generation (keep 3): g1 is due.
		retired := make(chan error, 1)
		go func() {
			rctx, cancel := context.WithTimeout(ctx, hold)
			defer cancel()
			_, err := own.RetireTenantRolesBeyond(rctx, "dc-a", ns, 3)
			retired <- err
		}()
		storetest.AwaitCond(t, "DROP ROLE waiting for the tenant's lock on its role", func() bool {
			var n int
			err := ownerConn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE query LIKE 'DROP ROLE%' AND wait_event_type = 'Lock'`).Scan(&n)
			return err == nil && n > 0
		})

		// Another namespace, another cluster, queued behind the drop.
		other := storetest.Namespace(t, "stall-b")
		began := time.Now()
		pctx, cancel := context.WithTimeout(ctx, hold)
		defer cancel()
		_, perr := own.ProvisionTenant(pctx, "dc-b", other)
		took := time.Since(began)
		if perr != nil {
			t.Fatalf("provisioning namespace %s in cluster dc-b while the drop waits (after %s): %v", other, took, perr)
		}
		t.Logf("provisioning namespace %s in cluster dc-b queued behind the drop took %s (lock_timeout %s, the tenant holds its lock for %s)",
			other, took.Round(time.Millisecond), store.TenantLockTimeout, hold)
		if limit := 5 * store.TenantLockTimeout; took > limit {
			t.Errorf("provisioning another namespace took %s, want well under the tenant's hold (%s), at most %s", took, hold, limit)
		}

		rerr := <-retired
		var pgErr *pgconn.PgError
		if !errors.As(rerr, &pgErr) || pgErr.Code != "55P03" || errors.Is(rerr, store.ErrUnavailable) {
			t.Fatalf("retiring %s while its tenant holds its lock: %v, want a lock timeout (55P03), not unavailable", g1.Role, rerr)
		}
		for _, want := range []string{g1.Role, "lock_timeout", "ALTER ROLE CURRENT_USER", "stays live"} {
			if !strings.Contains(rerr.Error(), want) {
				t.Errorf("the error does not say %q: %v", want, rerr)
			}
		}
		t.Logf("retiring while the tenant holds its lock: %v", rerr)
		if time.Now().After(holdUntil) {
			t.Fatalf("the retirement returned only after the tenant's hold")
		}
		storetest.AwaitCond(t, "no DROP ROLE left waiting on the server", func() bool {
			var n int
			err := ownerConn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'DROP ROLE%' AND state = 'active'`).Scan(&n)
			return err == nil && n == 0
		})
		roles, err := own.TenantRoles(ctx, "dc-a", ns)
		if err != nil || len(roles) != 4 || roles[3].Role != g1.Role {
			t.Fatalf("the namespace's live roles after the failed drop: %+v, %v; want 4, %s still among them", roles, err, g1.Role)
		}

		// The tenant lets go: the next reconcile drops the role.
		stopped()
		dropped, err := own.RetireTenantRolesBeyond(ctx, "dc-a", ns, 3)
		if err != nil || len(dropped) != 1 || dropped[0].Role != g1.Role {
			t.Fatalf("retiring once the tenant let go: %+v, %v; want %s dropped", dropped, err, g1.Role)
		}
		var exists bool
		if err := ownerConn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1)`, g1.Role).Scan(&exists); err != nil || exists {
			t.Errorf("role %s exists after the retirement: %v, %v", g1.Role, exists, err)
		}
	})
}

// A tenant role's sessions start bounded: a statement ends after
// TenantRoleStatementTimeout, a session idle in a transaction after
// TenantRoleIdleInTransactionTimeout, so that a careless tenant's long
// snapshot or open transaction does not hold back every namespace's
// cleanup. Both are the tenant's own to lift (docs/install.md says so, and
// what binds it). temp_file_limit binds it for good, where a superuser let
// the owner set it (GRANT SET ON PARAMETER, PostgreSQL 15 and later): the
// tenant can neither SET it nor change its role's default, and a sort
// that spills more fails instead of filling the disk every namespace
// shares. Without the grant, provisioning goes on without it.
func TestATenantRoleStartsWithBoundedSessions(t *testing.T) {
	srv := pgtest.Need(t)
	su := storetest.Superuser(t, srv)
	ctx := context.Background()
	settings := func(t *testing.T, c interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (stmt, idle, temp string) {
		t.Helper()
		if err := c.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('idle_in_transaction_session_timeout'),
			current_setting('temp_file_limit')`).Scan(&stmt, &idle, &temp); err != nil {
			t.Fatal(err)
		}
		return stmt, idle, temp
	}
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		own := storetest.Open(t, dsn, 2)

		t.Run("without the grant, the timeouts only", func(t *testing.T) {
			tenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, storetest.Provision(t, own, storetest.Namespace(t, "bounded"))))
			if stmt, idle, temp := settings(t, tenant); stmt != "1min" || idle != "30s" || temp != "-1" {
				t.Fatalf("statement_timeout %s, idle_in_transaction_session_timeout %s, temp_file_limit %s; want 1min, 30s, -1", stmt, idle, temp)
			}
		})

		t.Run("with the grant, temp_file_limit too, for good", func(t *testing.T) {
			if _, err := su.Exec(ctx, `GRANT SET ON PARAMETER temp_file_limit TO `+pgtest.AppUser); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if _, err := su.Exec(ctx, `REVOKE SET ON PARAMETER temp_file_limit FROM `+pgtest.AppUser); err != nil {
					t.Error(err)
				}
			})
			tenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, storetest.Provision(t, own, storetest.Namespace(t, "bounded"))))
			if stmt, idle, temp := settings(t, tenant); stmt != "1min" || idle != "30s" || temp != store.TenantRoleTempFileLimit {
				t.Fatalf("statement_timeout %s, idle_in_transaction_session_timeout %s, temp_file_limit %s; want 1min, 30s, %s",
					stmt, idle, temp, store.TenantRoleTempFileLimit)
			}
			for _, stmt := range []string{`SET temp_file_limit = -1`, `ALTER ROLE CURRENT_USER SET temp_file_limit = -1`, `ALTER ROLE CURRENT_USER RESET temp_file_limit`} {
				var pgErr *pgconn.PgError
				if _, err := tenant.Exec(ctx, stmt); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
					t.Errorf("the tenant ran %q: %v; want permission denied", stmt, err)
				}
			}
			tx, err := tenant.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // read only
			var n int64
			var pgErr *pgconn.PgError
			err = tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT g FROM generate_series(1, 3000000) g ORDER BY g DESC) s
				CROSS JOIN set_config('work_mem', '64kB', true)`).Scan(&n)
			if !errors.As(err, &pgErr) || pgErr.Code != "53400" {
				t.Fatalf("a sort spilling past %s: %d, %v; want refused (temp_file_limit, SQLSTATE 53400)", store.TenantRoleTempFileLimit, n, err)
			}
		})
	})
}

// pg_stats shows, to any role that may read a column, the column's most
// common values and histogram: for dislock.windows, other namespaces' keys
// and owners. PostgreSQL leaves out a table whose row-level security applies
// to the reader, so a tenant reads the statistics of no table it shares
// with others (only schema_migrations, which it may read whole).
func TestATenantReadsNoStatisticsOfOtherNamespacesRows(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		ownerConn := storetest.RawConn(t, dsn)
		other := storetest.Namespace(t, "secretive")
		for i := range 200 {
			storetest.MustClaim(t, own, fmt.Sprintf("%s/payroll-%d", other, i%5), storetest.WindowAt(i), store.Owner{Cluster: "dc-z", Namespace: other, Job: "payroll",
				JobUID: "uid", Pod: "pod"}, false, ttl, store.Claimed)
		}
		for _, table := range []string{"windows", "leases", "views", "decisions", "decision_counts", "key_stats", "schema_migrations"} {
			if _, err := ownerConn.Exec(ctx, `ANALYZE dislock.`+table); err != nil {
				t.Fatal(err)
			}
		}
		var seen int
		if err := ownerConn.QueryRow(ctx, `SELECT count(*) FROM pg_stats WHERE schemaname = 'dislock' AND tablename = 'windows'
			AND most_common_vals::text LIKE '%' || $1 || '%'`, other).Scan(&seen); err != nil || seen == 0 {
			t.Fatalf("the owner sees %d statistics of dislock.windows naming %s, %v; want some (else this test proves nothing)", seen, other, err)
		}

		tenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, storetest.Provision(t, own, storetest.Namespace(t, "curious"))))
		rows, err := tenant.Query(ctx, `SELECT tablename, attname, coalesce(most_common_vals::text, '') || coalesce(histogram_bounds::text, '')
			FROM pg_stats WHERE schemaname = 'dislock'`)
		if err != nil {
			t.Fatal(err)
		}
		type stat struct{ table, column, values string }
		stats, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stat, error) {
			var s stat
			return s, r.Scan(&s.table, &s.column, &s.values)
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range stats {
			if s.table != "schema_migrations" || strings.Contains(s.values, other) {
				t.Errorf("the tenant reads the statistics of dislock.%s.%s: %.200s", s.table, s.column, s.values)
			}
		}
		var denied *pgconn.PgError
		if _, err := tenant.Exec(ctx, `SELECT count(*) FROM pg_catalog.pg_statistic`); !errors.As(err, &denied) || denied.Code != "42501" {
			t.Errorf("the tenant read pg_statistic: %v", err)
		}
	})
}
