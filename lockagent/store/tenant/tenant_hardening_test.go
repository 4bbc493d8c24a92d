package tenant_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"
)

// What a tenant could once do to every other namespace through its role,
// and what now stops it: a tenant role resolves names
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
		asTenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, cred))

		var path string
		var createInPublic bool
		var limit int
		if err := asTenant.QueryRow(ctx, `SELECT current_setting('search_path'), has_schema_privilege('public', 'CREATE'),
			(SELECT rolconnlimit FROM pg_catalog.pg_roles WHERE rolname = current_user)`).Scan(&path, &createInPublic, &limit); err != nil {
			t.Fatal(err)
		}
		if path != "pg_catalog, pg_temp" || createInPublic || limit != tenant.ConnectionLimit {
			t.Errorf("tenant role: search_path %q, may create in public %v, connection limit %d; want \"pg_catalog, pg_temp\", false, %d",
				path, createInPublic, limit, tenant.ConnectionLimit)
		}
		tx, err := asTenant.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE dislock.tenants IN SHARE ROW EXCLUSIVE MODE`); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("the tenant taking the lock that serialises provisioning: %v, want permission denied", err)
		}
		tx.Rollback(ctx) //nolint:errcheck // the transaction failed already

		big := `{"schedule":"` + strings.Repeat("x", 8192) + `"}`
		if _, err := asTenant.Exec(ctx, `INSERT INTO dislock.views (lock_key, cluster, view, seen_at) VALUES ($1, 'dc-z', $2::jsonb, now())`,
			ns+"/big", big); err == nil || !strings.Contains(err.Error(), "views_size") {
			t.Errorf("the tenant writing an 8 KiB view: %v, want refused by views_size", err)
		}

		// A view that does not decode, next to a real disagreement of
		// another key: the disagreement is still reported.
		if _, err := asTenant.Exec(ctx, `INSERT INTO dislock.views (lock_key, cluster, view, seen_at) VALUES ($1, 'dc-y', '{"standby":"yes"}', now()),
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
		first := storetest.MustClaim(t, s, key, storetest.WindowAt(0), job("pod-1"), false, storetest.TTL, store.Claimed)
		if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, first.Window.Token, store.StateFailed, storetest.Ptr(1)); err != nil {
			t.Fatal(err)
		}
		retry := storetest.MustClaim(t, s, key, storetest.WindowAt(0), job("pod-2"), false, storetest.TTL, store.TookOver)
		if retry.Window.Token <= first.Window.Token {
			t.Fatalf("the takeover's token %d is not above %d", retry.Window.Token, first.Window.Token)
		}
		g, err := s.AcquireLease(ctx, key, job("pod-2"), storetest.TTL)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := s.ReleaseLease(ctx, key, g.Lease.Token); err != nil || !ok {
			t.Fatalf("release: %v %v", ok, err)
		}
		if _, err := s.AcquireLease(ctx, key, job("pod-2"), storetest.TTL); err != nil {
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
		fs, err := check.Database(ctx, own, check.Options{AllowAsync: true})
		if err != nil {
			t.Fatal(err)
		}
		if f := storetest.ByCheck(fs)["tokens"]; f.Status != check.StatusOK {
			t.Errorf("tokens after the attempts: %+v", f)
		}
	})
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
		asTenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, cred))
		key := ns + "/report"

		// The tenant's own rows as its agent writes them.
		ts := storetest.TenantStore(t, dsn, cred)
		job := store.Owner{Cluster: "dc-a", Namespace: ns, Job: "report-1", JobUID: "uid-1", Pod: "pod-1"}
		storetest.MustClaim(t, ts, key, storetest.WindowAt(0), job, false, storetest.TTL, store.Claimed)
		if _, err := ts.AcquireLease(ctx, key, job, storetest.TTL); err != nil {
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
			_, err := asTenant.Exec(ctx, sql, args...)
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
			_, err := tenant.RetireBeyond(rctx, own, "dc-a", ns, 3)
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
		_, perr := tenant.Provision(pctx, own, "dc-b", other)
		took := time.Since(began)
		if perr != nil {
			t.Fatalf("provisioning namespace %s in cluster dc-b while the drop waits (after %s): %v", other, took, perr)
		}
		t.Logf("provisioning namespace %s in cluster dc-b queued behind the drop took %s (lock_timeout %s, the tenant holds its lock for %s)",
			other, took.Round(time.Millisecond), tenant.LockTimeout, hold)
		if limit := 5 * tenant.LockTimeout; took > limit {
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
		roles, err := tenant.Roles(ctx, own, "dc-a", ns)
		if err != nil || len(roles) != 4 || roles[3].Role != g1.Role {
			t.Fatalf("the namespace's live roles after the failed drop: %+v, %v; want 4, %s still among them", roles, err, g1.Role)
		}

		// The tenant lets go: the next reconcile drops the role.
		stopped()
		dropped, err := tenant.RetireBeyond(ctx, own, "dc-a", ns, 3)
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
			asTenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, storetest.Provision(t, own, storetest.Namespace(t, "bounded"))))
			if stmt, idle, temp := settings(t, asTenant); stmt != "1min" || idle != "30s" || temp != "-1" {
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
			asTenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, storetest.Provision(t, own, storetest.Namespace(t, "bounded"))))
			if stmt, idle, temp := settings(t, asTenant); stmt != "1min" || idle != "30s" || temp != tenant.TempFileLimit {
				t.Fatalf("statement_timeout %s, idle_in_transaction_session_timeout %s, temp_file_limit %s; want 1min, 30s, %s",
					stmt, idle, temp, tenant.TempFileLimit)
			}
			for _, stmt := range []string{`SET temp_file_limit = -1`, `ALTER ROLE CURRENT_USER SET temp_file_limit = -1`, `ALTER ROLE CURRENT_USER RESET temp_file_limit`} {
				var pgErr *pgconn.PgError
				if _, err := asTenant.Exec(ctx, stmt); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
					t.Errorf("the tenant ran %q: %v; want permission denied", stmt, err)
				}
			}
			tx, err := asTenant.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // read only
			var n int64
			var pgErr *pgconn.PgError
			err = tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT g FROM generate_series(1, 3000000) g ORDER BY g DESC) s
				CROSS JOIN set_config('work_mem', '64kB', true)`).Scan(&n)
			if !errors.As(err, &pgErr) || pgErr.Code != "53400" {
				t.Fatalf("a sort spilling past %s: %d, %v; want refused (temp_file_limit, SQLSTATE 53400)", tenant.TempFileLimit, n, err)
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
				JobUID: "uid", Pod: "pod"}, false, storetest.TTL, store.Claimed)
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

		asTenant := storetest.RawConn(t, storetest.TenantDSN(t, dsn, storetest.Provision(t, own, storetest.Namespace(t, "curious"))))
		rows, err := asTenant.Query(ctx, `SELECT tablename, attname, coalesce(most_common_vals::text, '') || coalesce(histogram_bounds::text, '')
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
		if _, err := asTenant.Exec(ctx, `SELECT count(*) FROM pg_catalog.pg_statistic`); !errors.As(err, &denied) || denied.Code != "42501" {
			t.Errorf("the tenant read pg_statistic: %v", err)
		}
	})
}
