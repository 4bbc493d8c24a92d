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
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/ledger"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"
)

// rowsOf reads, as the owner, every row of every table tenants touch whose
// key is in namespace ns, as JSON text: what must stay byte for byte.
func rowsOf(t testing.TB, owner *pgx.Conn, ns string) []string {
	t.Helper()
	var out []string
	for _, table := range []string{"windows", "leases", "views"} {
		rows, err := owner.Query(context.Background(),
			`SELECT '`+table+`: ' || row_to_json(t)::text FROM dislock.`+table+` t WHERE starts_with(t.lock_key, $1::text) ORDER BY 1`, ns+"/")
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got...)
	}
	return out
}

// A tenant role claims, heartbeats, finishes and leases in its own
// namespace as the owner does, and its tokens still grow and carry the
// epoch.
func TestTenantLocksItsOwnNamespace(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		ns := storetest.Namespace(t, "team-a")
		s := storetest.TenantStore(t, dsn, storetest.Provision(t, own, ns))
		o := store.Owner{Cluster: "dc-a", Namespace: ns, Job: "report-1", JobUID: "uid-1", Pod: "pod-1"}
		key := ns + "/report"

		var last int64
		grew := func(what string, token int64) {
			t.Helper()
			if epoch, _ := store.TokenEpoch(token); epoch != 1 {
				t.Errorf("%s: token %d is in epoch %d, want 1", what, token, epoch)
			}
			if token <= last {
				t.Errorf("%s: token %d after %d", what, token, last)
			}
			last = token
		}
		c := storetest.MustClaim(t, s, key, storetest.WindowAt(0), o, false, storetest.TTL, store.Claimed)
		grew("claim", c.Window.Token)
		again := storetest.MustClaim(t, s, key, storetest.WindowAt(0), o, false, storetest.TTL, store.Reentered)
		if again.Window.Token != c.Window.Token {
			t.Errorf("re-entry changed the token: %d then %d", c.Window.Token, again.Window.Token)
		}
		storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), storetest.Owner("dc-b", "other", "pod"), true, o.WindowOwner())
		if _, _, err := s.Heartbeat(ctx, key, storetest.WindowAt(0), store.NotIndexed, c.Window.Token, storetest.TTL); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, c.Window.Token, store.StateSucceeded, storetest.Ptr(0)); err != nil {
			t.Fatalf("finish: %v", err)
		}
		if w, err := s.GetWindow(ctx, key, storetest.WindowAt(0), store.NotIndexed); err != nil || w.State != store.StateSucceeded {
			t.Fatalf("reading the finished window: %+v, %v", w, err)
		}
		for i := range 3 {
			grew("claim of the next windows", storetest.MustClaim(t, s, key, storetest.WindowAt(i+1), o, false, storetest.TTL, store.Claimed).Window.Token)
		}

		// A lease, and one of an Indexed Job's completion index.
		for _, k := range []string{key, key + "#3"} {
			g, err := s.AcquireLease(ctx, k, o, storetest.TTL)
			if err != nil {
				t.Fatalf("acquire %s: %v", k, err)
			}
			grew("lease "+k, g.Lease.Token)
			if _, _, err := s.RenewLease(ctx, k, g.Lease.Token, storetest.TTL); err != nil {
				t.Fatalf("renew %s: %v", k, err)
			}
			if ok, err := s.ReleaseLease(ctx, k, g.Lease.Token); err != nil || !ok {
				t.Fatalf("release %s: %v %v", k, ok, err)
			}
			next, err := s.AcquireLease(ctx, k, o, storetest.TTL)
			if err != nil {
				t.Fatalf("acquire %s after release: %v", k, err)
			}
			grew("lease "+k+" again", next.Lease.Token)
			// A live "key" refuses "key#3" (one completion mode at a time).
			if ok, err := s.ReleaseLease(ctx, k, next.Lease.Token); err != nil || !ok {
				t.Fatalf("release %s again: %v %v", k, ok, err)
			}
		}
		if _, err := s.RecordView(ctx, key, "dc-a", store.View{Schedule: "* * * * *", Mode: "schedule"}, store.DefaultViewRecency); err != nil {
			t.Fatalf("recording the view: %v", err)
		}
		if _, err := own.RecordView(ctx, key, "dc-b", store.View{Schedule: "*/5 * * * *", Mode: "schedule"}, store.DefaultViewRecency); err != nil {
			t.Fatal(err)
		}
		others, err := s.RecordView(ctx, key, "dc-a", store.View{Schedule: "* * * * *", Mode: "schedule"}, store.DefaultViewRecency)
		if err != nil || len(others) != 1 || others[0].Cluster != "dc-b" {
			t.Fatalf("the other cluster's view of the tenant's own key: %+v, %v", others, err)
		}
		// The owner's view is unchanged: it sees everything.
		ws, _, err := own.ListWindows(ctx, key, 10)
		if err != nil || len(ws) != 4 {
			t.Fatalf("the owner sees %d windows of %s (%v), want 4", len(ws), key, err)
		}
	})
}

// team-a, with its own role and everything that role may do, tries every
// way to reach team-b's locks, the tokens and the schema. Each attempt is
// refused (an error, or no row at all), and team-b's rows are unchanged
// byte for byte.
func TestTenantCannotTouchAnotherNamespace(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		nsA, nsB := storetest.Namespace(t, "team-a"), storetest.Namespace(t, "team-b")
		credA, credB := storetest.Provision(t, own, nsA), storetest.Provision(t, own, nsB)
		a, b := storetest.TenantStore(t, dsn, credA), storetest.TenantStore(t, dsn, credB)
		oa := store.Owner{Cluster: "dc-a", Namespace: nsA, Job: "evil", JobUID: "uid-a", Pod: "pod-a"}
		ob := store.Owner{Cluster: "dc-b", Namespace: nsB, Job: "report", JobUID: "uid-b", Pod: "pod-b"}
		keyB := nsB + "/report"
		short := 200 * time.Millisecond

		// team-b: a live window, a failed one (a standby may take it), a
		// lapsed one; a live lease, an expired one; a view.
		live := storetest.MustClaim(t, b, keyB, storetest.WindowAt(0), ob, false, time.Hour, store.Claimed)
		failed := storetest.MustClaim(t, b, keyB, storetest.WindowAt(1), ob, false, time.Hour, store.Claimed)
		if _, err := b.Finish(ctx, keyB, storetest.WindowAt(1), store.NotIndexed, failed.Window.Token, store.StateFailed, storetest.Ptr(1)); err != nil {
			t.Fatal(err)
		}
		lapsed := storetest.MustClaim(t, b, keyB, storetest.WindowAt(2), ob, false, short, store.Claimed)
		held, err := b.AcquireLease(ctx, keyB, ob, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.AcquireLease(ctx, keyB+"-shards#1", ob, short); err != nil { // expires
			t.Fatal(err)
		}
		if _, err := b.RecordView(ctx, keyB, "dc-b", store.View{Schedule: "0 * * * *", Mode: "schedule,lease"}, store.DefaultViewRecency); err != nil {
			t.Fatal(err)
		}
		storetest.AwaitDBPast(t, own, lapsed.Window.AliveUntil.Add(short))
		ownerConn := storetest.RawConn(t, dsn)
		before := rowsOf(t, ownerConn, nsB)
		if len(before) != 6 {
			t.Fatalf("team-b has %d rows, want 6:\n%s", len(before), strings.Join(before, "\n"))
		}

		refused := func(t *testing.T, err error, sentinels ...error) {
			t.Helper()
			if err == nil {
				t.Fatal("succeeded")
			}
			for _, s := range sentinels {
				if errors.Is(err, s) {
					return
				}
			}
			if len(sentinels) > 0 {
				t.Fatalf("%v, want one of %v", err, sentinels)
			}
		}
		standbyClaim := func(w time.Time) error {
			_, err := a.ClaimWindow(ctx, store.ClaimRequest{Key: keyB, Window: w, Index: store.NotIndexed, Owner: oa, TTL: storetest.TTL, Standby: true})
			return err
		}
		t.Run("lock API", func(t *testing.T) {
			for _, tc := range []struct {
				name      string
				attempt   func() error
				sentinels []error
			}{
				{"claim the live window", func() error { return standbyClaim(storetest.WindowAt(0)) }, []error{store.ErrForbidden}},
				{"take over the failed window as a standby", func() error { return standbyClaim(storetest.WindowAt(1)) }, []error{store.ErrForbidden}},
				{"take over the lapsed window as a standby", func() error { return standbyClaim(storetest.WindowAt(2)) }, []error{store.ErrForbidden}},
				{"claim a window nobody claimed yet", func() error { return standbyClaim(storetest.WindowAt(3)) }, []error{store.ErrForbidden}},
				{"heartbeat the live window", func() error {
					_, _, err := a.Heartbeat(ctx, keyB, storetest.WindowAt(0), store.NotIndexed, live.Window.Token, time.Hour)
					return err
				}, []error{store.ErrWindowLost}},
				{"finish the live window", func() error {
					_, err := a.Finish(ctx, keyB, storetest.WindowAt(0), store.NotIndexed, live.Window.Token, store.StateSucceeded, storetest.Ptr(0))
					return err
				}, []error{store.ErrWindowLost}},
				{"read the live window", func() error { _, err := a.GetWindow(ctx, keyB, storetest.WindowAt(0), store.NotIndexed); return err }, []error{store.ErrNotFound}},
				{"delete a window", func() error { return a.DeleteWindow(ctx, keyB, storetest.WindowAt(0)) }, []error{store.ErrForbidden}},
				{"acquire the held lease", func() error { _, err := a.AcquireLease(ctx, keyB, oa, storetest.TTL); return err }, []error{store.ErrForbidden}},
				{"acquire the expired lease", func() error { _, err := a.AcquireLease(ctx, keyB+"-shards#1", oa, storetest.TTL); return err }, []error{store.ErrForbidden}},
				{"acquire a lease nobody holds yet", func() error { _, err := a.AcquireLease(ctx, keyB+"#2", oa, storetest.TTL); return err }, []error{store.ErrForbidden}},
				{"renew the held lease", func() error { _, _, err := a.RenewLease(ctx, keyB, held.Lease.Token, time.Hour); return err }, []error{store.ErrLeaseLost}},
				{"release the held lease", func() error {
					ok, err := a.ReleaseLease(ctx, keyB, held.Lease.Token)
					if err == nil && !ok {
						err = errors.New("nothing released")
					}
					return err
				}, nil},
				{"force-release the held lease", func() error { return a.ForceReleaseLease(ctx, keyB) }, []error{store.ErrNotFound}},
				{"read the held lease", func() error { _, _, err := a.GetLease(ctx, keyB); return err }, []error{store.ErrNotFound}},
				{"record a view of team-b's key", func() error {
					_, err := a.RecordView(ctx, keyB, "dc-a", store.View{Schedule: "* * * * *"}, store.DefaultViewRecency)
					return err
				}, []error{store.ErrForbidden}},
				{"delete old windows", func() error { _, err := ledger.DeleteOldWindows(ctx, a, store.MinRetention); return err }, []error{store.ErrForbidden}},
				{"provision a role", func() error { _, err := tenant.Provision(ctx, a, "dc-a", nsB); return err }, []error{store.ErrForbidden}},
				{"list team-b's roles", func() error { _, err := tenant.Roles(ctx, a, "dc-a", nsB); return err }, []error{store.ErrForbidden}},
				{"supersede team-b's roles", func() error { return tenant.Supersede(ctx, a, "dc-a", nsB) }, []error{store.ErrForbidden}},
				{"retire team-b's roles", func() error { _, err := tenant.Retire(ctx, a, "dc-a", nsB, 0); return err }, []error{store.ErrForbidden}},
				{"retire team-b's roles beyond a count", func() error { _, err := tenant.RetireBeyond(ctx, a, "dc-a", nsB, 0); return err }, []error{store.ErrForbidden}},
			} {
				t.Run(tc.name, func(t *testing.T) { refused(t, tc.attempt(), tc.sentinels...) })
			}
			ws, _, err := a.ListWindows(ctx, "", 1000)
			if err != nil {
				t.Fatal(err)
			}
			ls, _, err := a.ListLeases(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range ws {
				if !strings.HasPrefix(w.Key, nsA+"/") {
					t.Errorf("team-a lists window %s of %s", w.Start, w.Key)
				}
			}
			for _, l := range ls {
				if !strings.HasPrefix(l.Key, nsA+"/") {
					t.Errorf("team-a lists lease %s", l.Key)
				}
			}
			if ds, err := a.ListDisagreements(ctx, store.DefaultViewRecency); err != nil || len(ds) != 0 {
				t.Errorf("team-a lists disagreements %+v, %v", ds, err)
			}
		})

		t.Run("SQL", func(t *testing.T) {
			conn := storetest.RawConn(t, storetest.TenantDSN(t, dsn, credA))
			// Statements that must fail outright.
			for _, q := range []string{
				`DELETE FROM dislock.windows WHERE lock_key = '` + keyB + `'`,
				`DELETE FROM dislock.leases`,
				`DELETE FROM dislock.views`,
				`TRUNCATE dislock.windows`,
				`UPDATE dislock.windows SET lock_key = '` + keyB + `' WHERE lock_key = '` + nsA + `/x'`,
				`INSERT INTO dislock.windows (lock_key, window_start, owner, cluster, pod, token, state, claimed_at, alive_until)
				 VALUES ('` + keyB + `', now(), 'x', 'x', 'x', 1, 'running', now(), now())`,
				`INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at)
				 VALUES ('` + keyB + `', 'x', 1, now(), now()) ON CONFLICT DO NOTHING`,
				`INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at)
				 VALUES ('` + keyB + `', 'x', 1, now(), now()) ON CONFLICT (lock_key) DO UPDATE SET owner = 'x'`,
				`INSERT INTO dislock.views (lock_key, cluster, view, seen_at) VALUES ('` + keyB + `', 'dc-b', '{}', now())
				 ON CONFLICT (lock_key, cluster) DO UPDATE SET view = '{}'`,
				`SELECT setval('dislock.token_counter', 1)`,
				`SELECT nextval('dislock.token_counter')`,
				`SELECT last_value FROM dislock.token_counter`,
				`ALTER SEQUENCE dislock.token_counter RESTART WITH 1`,
				`UPDATE dislock.token_epoch SET last_epoch = 0, base_epoch = 0`,
				`SELECT * FROM dislock.token_epoch`,
				`SELECT dislock.token_epoch_now()`,
				`SELECT dislock.wal_timeline()`,
				`SELECT * FROM dislock.tenants`,
				`INSERT INTO dislock.tenants (role_name, cluster, namespace, generation) VALUES (session_user, 'dc-a', '` + nsB + `', 99)`,
				`UPDATE dislock.tenants SET namespace = '` + nsB + `'`,
				`DELETE FROM dislock.schema_migrations`,
				`ALTER TABLE dislock.windows DISABLE ROW LEVEL SECURITY`,
				`ALTER TABLE dislock.windows ADD COLUMN evil int`,
				`DROP POLICY tenant_namespace ON dislock.leases`,
				`CREATE POLICY evil ON dislock.leases USING (true)`,
				`DROP TABLE dislock.leases`,
				`DROP SCHEMA dislock CASCADE`,
				`CREATE TABLE dislock.evil (i int)`,
				`CREATE FUNCTION dislock.evil() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
				`CREATE OR REPLACE FUNCTION dislock.tenant_namespace() RETURNS text LANGUAGE sql AS $$SELECT '` + nsB + `'$$`,
				`ALTER FUNCTION dislock.next_token() SECURITY INVOKER`,
				`CREATE ROLE evil LOGIN PASSWORD 'evil'`,
				`ALTER ROLE ` + credB.Role + ` PASSWORD 'known'`,
				`GRANT dislock_tenant TO ` + credA.Role,
				`BEGIN; LOCK TABLE dislock.windows IN ACCESS EXCLUSIVE MODE; COMMIT`,
				`BEGIN; SET LOCAL row_security = off; SELECT count(*) FROM dislock.windows; COMMIT`,
			} {
				t.Run(q, func(t *testing.T) {
					err := conn.PgConn().Exec(ctx, q).Close()
					_ = conn.PgConn().Exec(ctx, "ROLLBACK").Close() // after a failed BEGIN; ...
					// Refused for want of a right, not for a typo.
					var pgErr *pgconn.PgError
					if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
						t.Fatalf("%v, want insufficient_privilege (42501)", err)
					}
				})
			}
			// Statements allowed to run that must find none of team-b's rows.
			for _, q := range []string{
				`SELECT count(*) FROM dislock.windows WHERE lock_key = '` + keyB + `'`,
				`SELECT count(*) FROM dislock.windows WHERE NOT starts_with(lock_key, '` + nsA + `/')`,
				`SELECT count(*) FROM dislock.leases WHERE NOT starts_with(lock_key, '` + nsA + `/')`,
				`SELECT count(*) FROM dislock.views WHERE NOT starts_with(lock_key, '` + nsA + `/')`,
				`WITH u AS (UPDATE dislock.windows SET state = 'succeeded', alive_until = now() WHERE lock_key = '` + keyB + `' RETURNING 1) SELECT count(*) FROM u`,
				`WITH u AS (UPDATE dislock.leases SET expire_at = now(), owner = 'x' WHERE lock_key LIKE '` + nsB + `/%' RETURNING 1) SELECT count(*) FROM u`,
				`WITH u AS (UPDATE dislock.views SET view = '{}' WHERE true RETURNING 1) SELECT count(*) FROM u`,
				// SET ROLE to the group changes current_user, not session_user.
				`BEGIN; SET LOCAL ROLE dislock_tenant; SELECT count(*) FROM dislock.windows WHERE lock_key = '` + keyB + `'; COMMIT`,
			} {
				t.Run(q, func(t *testing.T) {
					results, err := conn.PgConn().Exec(ctx, q).ReadAll()
					if err != nil {
						t.Fatal(err)
					}
					for _, r := range results {
						if len(r.Rows) == 1 && string(r.Rows[0][0]) != "0" {
							t.Fatalf("%s rows of team-b", r.Rows[0][0])
						}
					}
				})
			}
			// The only way to a token: next_token(), which still carries
			// the epoch and grows.
			var t1, t2 int64
			if err := conn.QueryRow(ctx, `SELECT dislock.next_token()`).Scan(&t1); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRow(ctx, `SELECT dislock.next_token()`).Scan(&t2); err != nil {
				t.Fatal(err)
			}
			if e, _ := store.TokenEpoch(t1); e != 1 || t2 <= t1 || t1 <= held.Lease.Token {
				t.Errorf("tokens %d then %d (epoch %d) after team-b's %d", t1, t2, e, held.Lease.Token)
			}
		})

		if after := rowsOf(t, ownerConn, nsB); strings.Join(after, "\n") != strings.Join(before, "\n") {
			t.Errorf("team-b's rows changed:\nbefore:\n%s\nafter:\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
		}
		// team-b still runs, and its lease is still its own.
		if _, _, err := b.Heartbeat(ctx, keyB, storetest.WindowAt(0), store.NotIndexed, live.Window.Token, time.Hour); err != nil {
			t.Errorf("team-b's heartbeat after the attempts: %v", err)
		}
		if _, _, err := b.RenewLease(ctx, keyB, held.Lease.Token, time.Hour); err != nil {
			t.Errorf("team-b's renewal after the attempts: %v", err)
		}
	})
}

// Rotation: a new generation works at once while the old one keeps working
// until it is retired; a retired generation can no longer log in, nor do
// anything on a session it already had; generations are never reused.
func TestRetiredTenantRoleCannotLogIn(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		ns := storetest.Namespace(t, "team-a")
		o := store.Owner{Cluster: "dc-a", Namespace: ns, Job: "job", JobUID: "uid", Pod: "pod"}
		g1 := storetest.Provision(t, own, ns)
		old := storetest.TenantStore(t, dsn, g1)
		storetest.MustClaim(t, old, ns+"/job", storetest.WindowAt(0), o, false, storetest.TTL, store.Claimed)
		g2 := storetest.Provision(t, own, ns)
		if g1.Generation != 1 || g2.Generation != 2 || g1.Role == g2.Role || g1.Password == g2.Password {
			t.Fatalf("generations %+v then %+v", g1, g2)
		}
		roles, err := tenant.Roles(ctx, own, "dc-a", ns)
		if err != nil || len(roles) != 2 || roles[0].Role != g2.Role || roles[0].SupersededAt != nil ||
			roles[1].Role != g1.Role || roles[1].SupersededAt == nil || roles[1].SupersededAt.Before(roles[1].CreatedAt) {
			t.Fatalf("roles: %+v, %v", roles, err)
		}
		// Within the grace the old generation still works.
		if dropped, err := tenant.Retire(ctx, own, "dc-a", ns, time.Hour); err != nil || len(dropped) != 0 {
			t.Fatalf("retiring within the grace dropped %v, %v", dropped, err)
		}
		storetest.MustClaim(t, old, ns+"/job", storetest.WindowAt(1), o, false, storetest.TTL, store.Claimed)

		dropped, err := tenant.Retire(ctx, own, "dc-a", ns, 0)
		if err != nil || len(dropped) != 1 || dropped[0] != g1.Role {
			t.Fatalf("retire: dropped %v, %v; want [%s]", dropped, err, g1.Role)
		}
		if _, err := storetest.Claim(t, old, ns+"/job", storetest.WindowAt(2), o, false, storetest.TTL); err == nil {
			t.Error("a session of the retired role still claims")
		}
		fresh, err := store.Open(ctx, storetest.TenantDSN(t, dsn, g1), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer fresh.Close()
		if err := fresh.Ping(ctx); err == nil {
			t.Error("the retired role still logs in")
		}
		storetest.MustClaim(t, storetest.TenantStore(t, dsn, g2), ns+"/job", storetest.WindowAt(2), o, false, storetest.TTL, store.Claimed)

		// Opting out supersedes every generation; a later one never reuses
		// a name.
		if err := tenant.Supersede(ctx, own, "dc-a", ns); err != nil {
			t.Fatal(err)
		}
		if dropped, err := tenant.Retire(ctx, own, "dc-a", ns, 0); err != nil || len(dropped) != 1 || dropped[0] != g2.Role {
			t.Fatalf("retiring after opting out: %v, %v", dropped, err)
		}
		if roles, err := tenant.Roles(ctx, own, "dc-a", ns); err != nil || len(roles) != 0 {
			t.Fatalf("roles after opting out: %+v, %v", roles, err)
		}
		if g3 := storetest.Provision(t, own, ns); g3.Generation != 3 {
			t.Fatalf("the next generation is %d, want 3", g3.Generation)
		}
	})
}

// A namespace whose Secret is replaced again and again keeps at most its
// newest few generations: the older superseded ones are dropped at once,
// inside their grace, and can no longer log in, while the kept ones and the
// generation in use keep working. The generation in use is never dropped,
// whatever the count; after opting out the newest are kept the same way.
func TestTenantRolesBeyondTheNewestFewAreRetiredInsideTheGrace(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		ns, other := storetest.Namespace(t, "team-a"), storetest.Namespace(t, "team-b")
		o := store.Owner{Cluster: "dc-a", Namespace: ns, Job: "job", JobUID: "uid", Pod: "pod"}
		var gens []tenant.Credential
		for range 6 {
			gens = append(gens, storetest.Provision(t, own, ns))
		}
		bystander := storetest.Provision(t, own, other)
		generations := func(roles []tenant.Role) []int {
			var out []int
			for _, r := range roles {
				out = append(out, r.Generation)
			}
			return out
		}
		live := func() []int {
			t.Helper()
			roles, err := tenant.Roles(ctx, own, "dc-a", ns)
			if err != nil {
				t.Fatal(err)
			}
			return generations(roles)
		}
		// Every generation is inside the grace: the grace retires none.
		if dropped, err := tenant.Retire(ctx, own, "dc-a", ns, time.Hour); err != nil || len(dropped) != 0 {
			t.Fatalf("retiring within the grace dropped %v, %v", dropped, err)
		}

		dropped, err := tenant.RetireBeyond(ctx, own, "dc-a", ns, 4)
		if err != nil || fmt.Sprint(generations(dropped)) != "[1 2]" {
			t.Fatalf("keeping the newest 4 of 6 dropped generations %v, %v; want [1 2]", generations(dropped), err)
		}
		for _, r := range dropped {
			if r.Namespace != ns || r.Cluster != "dc-a" || r.SupersededAt == nil || r.Role != gens[r.Generation-1].Role {
				t.Errorf("dropped %+v", r)
			}
		}
		if got := fmt.Sprint(live()); got != "[6 5 4 3]" {
			t.Fatalf("live generations %s, want [6 5 4 3]", got)
		}
		fresh, err := store.Open(ctx, storetest.TenantDSN(t, dsn, gens[0]), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer fresh.Close()
		if err := fresh.Ping(ctx); err == nil {
			t.Error("a generation retired early still logs in")
		}
		storetest.MustClaim(t, storetest.TenantStore(t, dsn, gens[2]), ns+"/job", storetest.WindowAt(0), o, false, storetest.TTL, store.Claimed)
		if dropped, err := tenant.RetireBeyond(ctx, own, "dc-a", ns, 4); err != nil || len(dropped) != 0 {
			t.Fatalf("a second call dropped %v, %v", generations(dropped), err)
		}

		// Keeping none still keeps the generation in use.
		if dropped, err := tenant.RetireBeyond(ctx, own, "dc-a", ns, 0); err != nil || fmt.Sprint(generations(dropped)) != "[3 4 5]" {
			t.Fatalf("keeping none dropped generations %v, %v; want [3 4 5]", generations(dropped), err)
		}
		storetest.MustClaim(t, storetest.TenantStore(t, dsn, gens[5]), ns+"/job", storetest.WindowAt(1), o, false, storetest.TTL, store.Claimed)
		if _, err := tenant.RetireBeyond(ctx, own, "dc-a", ns, -1); err == nil || !strings.Contains(err.Error(), "-1") {
			t.Errorf("keep -1: %v, want an error naming it", err)
		}

		// After opting out every generation is superseded: the newest are
		// kept all the same, and a generation number is never reused.
		storetest.Provision(t, own, ns)
		if err := tenant.Supersede(ctx, own, "dc-a", ns); err != nil {
			t.Fatal(err)
		}
		if dropped, err := tenant.RetireBeyond(ctx, own, "dc-a", ns, 1); err != nil || fmt.Sprint(generations(dropped)) != "[6]" {
			t.Fatalf("keeping 1 after opting out dropped %v, %v; want [6]", generations(dropped), err)
		}
		if got := fmt.Sprint(live()); got != "[7]" {
			t.Fatalf("live generations %s, want [7]", got)
		}
		if g := storetest.Provision(t, own, ns); g.Generation != 8 {
			t.Fatalf("the next generation is %d, want 8", g.Generation)
		}

		// Another namespace's roles are untouched throughout.
		if err := storetest.TenantStore(t, dsn, bystander).Ping(ctx); err != nil {
			t.Errorf("the other namespace's role: %v", err)
		}
	})
}

// Webhook replicas provisioning the same namespace at once each get a
// generation of their own, and every one logs in.
func TestConcurrentProvisioningGivesDistinctGenerations(t *testing.T) {
	srv := pgtest.Need(t)
	dsn := srv.BouncerDSN()
	own := storetest.Open(t, dsn, 4)
	ns := storetest.Namespace(t, "team-a")
	creds := make([]tenant.Credential, 4)
	var wg sync.WaitGroup
	for i := range creds {
		wg.Go(func() {
			c, err := tenant.Provision(context.Background(), own, "dc-a", ns)
			if err != nil {
				t.Error(err)
			}
			creds[i] = c
		})
	}
	wg.Wait()
	seen := map[int]bool{}
	for _, c := range creds {
		if seen[c.Generation] {
			t.Fatalf("generation %d handed out twice: %+v", c.Generation, creds)
		}
		seen[c.Generation] = true
		if err := storetest.TenantStore(t, dsn, c).Ping(context.Background()); err != nil {
			t.Errorf("generation %d: %v", c.Generation, err)
		}
	}
}

// No function of schema dislock is executable by PUBLIC; a later migration
// that adds one must revoke it too.
func TestNoFunctionOfTheSchemaIsPublic(t *testing.T) {
	srv := pgtest.Need(t)
	storetest.Open(t, srv.DirectDSN(), 1)
	rows, err := storetest.RawConn(t, srv.DirectDSN()).Query(context.Background(), `
SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE p.pronamespace = 'dislock'::regnamespace
  AND (p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0))`)
	if err != nil {
		t.Fatal(err)
	}
	public, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(public) > 0 {
		t.Errorf("executable by PUBLIC: %v", public)
	}
}

func TestTenantInputsAreValidatedNamingTheField(t *testing.T) {
	t.Parallel()
	s, err := store.Open(context.Background(), "postgres://u:p@127.0.0.1:1/db", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name, cluster, namespace string
		want                     []string
	}{
		{"empty cluster", "", "team-a", []string{"cluster is empty"}},
		{"cluster with a slash", "dc/a", "team-a", []string{`cluster "dc/a"`}},
		{"upper case namespace", "dc-a", "Team-A", []string{`namespace "Team-A" is not a DNS label`}},
		{"namespace with a slash", "dc-a", "team/a", []string{`namespace "team/a"`}},
		{"empty namespace", "dc-a", "", []string{`namespace ""`}},
		{"long namespace", "dc-a", strings.Repeat("a", 64), []string{"is not a DNS label"}},
		{"both", "", "-a", []string{"cluster is empty", `namespace "-a"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := tenant.Provision(context.Background(), s, tc.cluster, tc.namespace)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
			if errors.Is(err, store.ErrUnavailable) {
				t.Errorf("%v: validated only after trying the database", err)
			}
		})
	}
}

func TestTenantDSNReplacesOnlyTheCredentials(t *testing.T) {
	t.Parallel()
	c := tenant.Credential{Role: "dislock_t_0123_g2", Password: "pw-_AZaz09", Namespace: "team-a", Cluster: "dc-a", Generation: 2}
	for _, tc := range []struct{ name, owner, want string }{
		{"URL", "postgres://owner:s3cr3t@db:6432/dislock?sslmode=require",
			"postgres://dislock_t_0123_g2:pw-_AZaz09@db:6432/dislock?sslmode=require"},
		{"postgresql URL without credentials", "postgresql://db/dislock",
			"postgresql://dislock_t_0123_g2:pw-_AZaz09@db/dislock"},
		{"URL with user only", "postgres://owner@db", "postgres://dislock_t_0123_g2:pw-_AZaz09@db"},
		{"URL with an escaped '@' and ':' in the password", "postgres://owner:p%40ss%3Aw@db:5432/dislock",
			"postgres://dislock_t_0123_g2:pw-_AZaz09@db:5432/dislock"},
		{"multi-host URL", "postgres://owner:s3cr3t@pg-a:5432,pg-b:5433,[::1]:5434/dislock?target_session_attrs=read-write&connect_timeout=5",
			"postgres://dislock_t_0123_g2:pw-_AZaz09@pg-a:5432,pg-b:5433,[::1]:5434/dislock?target_session_attrs=read-write&connect_timeout=5"},
		{"URL naming the user and password in the query", "postgres://db/dislock?user=owner&sslmode=verify-full&password=s3cr3t&application_name=x",
			"postgres://dislock_t_0123_g2:pw-_AZaz09@db/dislock?sslmode=verify-full&application_name=x"},
		// sslmode=disable: pgx would otherwise read the files.
		{"URL with the owner's client certificate", "postgres://owner@db/dislock?sslmode=disable&sslcert=/c.crt&sslkey=/c.key&sslpassword=s3cr3t&application_name=x",
			"postgres://dislock_t_0123_g2:pw-_AZaz09@db/dislock?sslmode=disable&application_name=x"},
		{"key=value", "host=db port=6432 user=owner password=s3cr3t dbname=dislock sslmode=disable",
			"host=db port=6432 dbname=dislock sslmode=disable user=dislock_t_0123_g2 password=pw-_AZaz09"},
		{"key=value with quotes, escapes and spaces", `host = db  password='s3 cr\'3t' user=owner options='-c search_path=x' application_name=a\ b`,
			`host=db options='-c search_path=x' application_name='a b' user=dislock_t_0123_g2 password=pw-_AZaz09`},
		{"key=value separated by every blank libpq skips", "host=db\tport=6432\nuser=owner\vpassword=s3cr3t\fdbname=dislock\rsslmode=disable",
			"host=db port=6432 dbname=dislock sslmode=disable user=dislock_t_0123_g2 password=pw-_AZaz09"},
		{"multi-host key=value", "host=pg-a,pg-b port=5432,5433 user=owner passfile=/p target_session_attrs=read-write",
			"host=pg-a,pg-b port=5432,5433 target_session_attrs=read-write user=dislock_t_0123_g2 password=pw-_AZaz09"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := tenant.DSN(tc.owner, c)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("TenantDSN(%q)\n = %q\nwant %q", tc.owner, got, tc.want)
			}
			sameButCredentials(t, tc.owner, got, c)
		})
	}
	for _, bad := range []string{"", "postgres://owner:s3cr3t@db:notaport/x", "host='db"} {
		if _, err := tenant.DSN(bad, c); err == nil {
			t.Errorf("TenantDSN(%q) succeeded", bad)
		} else if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("TenantDSN(%q): the error echoes the owner's password: %v", bad, err)
		}
	}
	if _, err := tenant.DSN("postgres://db", tenant.Credential{Role: "r"}); err == nil {
		t.Error("a credential without a password was accepted")
	}
}

// sameButCredentials checks that tenant connects where owner does, with the
// same options, as c.
func sameButCredentials(t *testing.T, owner, asTenant string, c tenant.Credential) {
	t.Helper()
	o, err := pgconn.ParseConfig(owner)
	if err != nil {
		t.Fatalf("owner %q: %v", owner, err)
	}
	g, err := pgconn.ParseConfig(asTenant)
	if err != nil {
		t.Fatalf("tenant URL %q: %v", asTenant, err)
	}
	if g.User != c.Role || g.Password != c.Password {
		t.Errorf("tenant URL %q logs in as %q/%q", asTenant, g.User, g.Password)
	}
	if g.Database != o.Database || g.Host != o.Host || g.Port != o.Port || len(g.Fallbacks) != len(o.Fallbacks) {
		t.Errorf("tenant URL %q reaches %s:%d/%s (%d fallbacks), owner %s:%d/%s (%d)", asTenant,
			g.Host, g.Port, g.Database, len(g.Fallbacks), o.Host, o.Port, o.Database, len(o.Fallbacks))
	}
	for i := range min(len(g.Fallbacks), len(o.Fallbacks)) {
		if g.Fallbacks[i].Host != o.Fallbacks[i].Host || g.Fallbacks[i].Port != o.Fallbacks[i].Port {
			t.Errorf("fallback %d: %s:%d, owner's %s:%d", i, g.Fallbacks[i].Host, g.Fallbacks[i].Port, o.Fallbacks[i].Host, o.Fallbacks[i].Port)
		}
	}
	if fmt.Sprint(g.RuntimeParams) != fmt.Sprint(o.RuntimeParams) || g.ConnectTimeout != o.ConnectTimeout ||
		(g.TLSConfig == nil) != (o.TLSConfig == nil) {
		t.Errorf("options differ: tenant %v %v tls=%v, owner %v %v tls=%v", g.RuntimeParams, g.ConnectTimeout, g.TLSConfig != nil,
			o.RuntimeParams, o.ConnectTimeout, o.TLSConfig != nil)
	}
}

func FuzzTenantDSN(f *testing.F) {
	for _, s := range []string{
		"postgres://owner:pw@db:5432/dislock?sslmode=disable",
		"postgresql://a,b:5433,[::1]/d?target_session_attrs=read-write&user=x",
		"postgres://o%40x:p%2Fw@h/d?password=y&application_name=z",
		"host=db user=o password='a b\\' c' dbname=d",
		"host=a,b port=1,2 user=o application_name=x\\ y",
		" user = o password = p ",
		"postgres://@db",
		"0=",
		"application_name= host=db",
	} {
		f.Add(s)
	}
	c := tenant.Credential{Role: "dislock_t_fuzz_g1", Password: "Zq7pW9xK-_", Namespace: "ns", Cluster: "dc", Generation: 1}
	f.Fuzz(func(t *testing.T, owner string) {
		if _, err := pgconn.ParseConfig(owner); err != nil {
			return // TenantDSN must fail too; that is all
		}
		got, err := tenant.DSN(owner, c)
		if err != nil {
			// pgconn reads some strings ParseDatabaseURL refuses (none
			// expected); never a password in the message.
			if strings.Contains(err.Error(), c.Password) {
				t.Fatalf("error echoes the tenant's password: %v", err)
			}
			if _, perr := store.ParseDatabaseURL(owner); perr == nil {
				t.Fatalf("TenantDSN(%q): %v", owner, err)
			}
			return
		}
		sameButCredentials(t, owner, got, c)
	})
}

// The verifier is the one RFC 7677 (SCRAM-SHA-256) derives for its example
// password and salt: its ServerKey signs the example exchange's
// AuthMessage into the server signature the RFC shows, and its StoredKey
// accepts the example client proof.
func TestSCRAMVerifierMatchesRFC7677(t *testing.T) {
	t.Parallel()
	v, err := tenant.SCRAMVerifier("pencil", "W22ZaJ0SNY7soEsUEjb6gQ==", 4096)
	if err != nil {
		t.Fatal(err)
	}
	const authMessage = "n=user,r=rOprNGfwEbeRWgbNEkqO," +
		"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096," +
		"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
	if err := tenant.VerifySCRAMExchange(v, authMessage,
		"dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="); err != nil {
		t.Fatalf("verifier %s: %v", v, err)
	}
	if !strings.HasPrefix(v, "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$") {
		t.Errorf("verifier %s", v)
	}
}

func TestTenantRoleNamesFitAndDiffer(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 300)
	names := map[string]bool{}
	for _, in := range [][2]string{{"dc-a", "team-a"}, {"dc-b", "team-a"}, {"dc-a", "team-b"}, {long, strings.Repeat("n", 63)}, {"dc-a/team", "a"}} {
		n := tenant.RoleName(in[0], in[1], 2147483647)
		if len(n) > 63 || !strings.HasPrefix(n, "dislock_t_") || !strings.HasSuffix(n, "_g2147483647") {
			t.Errorf("%v: %q (%d bytes)", in, n, len(n))
		}
		if names[n] {
			t.Errorf("%v: %q again", in, n)
		}
		names[n] = true
	}
	if tenant.RoleName("dc-a", "team-a", 1) != tenant.RoleName("dc-a", "team-a", 1) {
		t.Error("role names are not stable")
	}
}
