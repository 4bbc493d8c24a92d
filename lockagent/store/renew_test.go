package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/pause"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"
)

// A pod holding a window and a lease renews both in one call, each by its
// own token; what it lost is reported so that the pod stops, and once the
// window is lost nothing is renewed.
func TestRenewExtendsTheWindowAndTheLeaseByTheirOwnTokens(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		key, c, g, both := holdWindowAndLease(t, s)
		r, err := s.Renew(ctx, both)
		if err != nil {
			t.Fatal(err)
		}
		if r.WindowUntil != r.DBTime.Add(time.Hour) || r.LeaseUntil != r.DBTime.Add(time.Hour) {
			t.Fatalf("renewed %+v; want both expiries an hour after the database time", r)
		}
		w, err := s.GetWindow(ctx, key, storetest.WindowAt(0), store.NotIndexed)
		if err != nil || !w.AliveUntil.Equal(r.WindowUntil) {
			t.Fatalf("the window's row: %+v, %v; want alive until %s", w, err, r.WindowUntil)
		}

		// A token that is not the pod's renews nothing.
		stale := both
		stale.WindowToken, stale.LeaseToken = c.Window.Token+1, g.Lease.Token+1
		if _, err := s.Renew(ctx, stale); !errors.Is(err, store.ErrWindowLost) {
			t.Fatalf("renewal by tokens the pod was not granted: %v, want ErrWindowLost", err)
		}
		if w, err := s.GetWindow(ctx, key, storetest.WindowAt(0), store.NotIndexed); err != nil || !w.AliveUntil.Equal(r.WindowUntil) {
			t.Fatalf("after a renewal by another token the window is alive until %s (%v), want %s", w.AliveUntil, err, r.WindowUntil)
		}

		// The window finished: its loss is reported, and the lease is left
		// to expire (the pod stops; kept alive, it would only hold the key
		// longer).
		if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, c.Window.Token, store.StateSucceeded, nil); err != nil {
			t.Fatal(err)
		}
		both.TTL = 2 * time.Hour
		if _, err := s.Renew(ctx, both); !errors.Is(err, store.ErrWindowLost) {
			t.Fatalf("renewing a finished window: %v, want ErrWindowLost", err)
		}
		l, _, err := s.GetLease(ctx, key)
		if err != nil || !l.ExpireAt.Equal(r.LeaseUntil) {
			t.Fatalf("the lease: %+v, %v; want it left expiring at %s", l, err, r.LeaseUntil)
		}
		lease := store.Renewal{LeaseKey: key, LeaseToken: g.Lease.Token, TTL: time.Hour}
		if _, err := s.Renew(ctx, lease); err != nil {
			t.Fatalf("renewing the lease alone: %v", err)
		}
	})
}

// The renewal runs with its owner's rights, past row-level security, so it
// checks the caller's namespace itself: a tenant role renews nothing of
// another namespace, even with the right tokens, and a role in the tenants'
// group with no live namespace (made by hand, or retired), or one an
// operator granted the schema's functions wholesale, renews nothing at all,
// as the policies show them no row.
func TestARenewalReachesOnlyTheCallersNamespace(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		owner := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		nsA, nsB := storetest.Namespace(t, "renew-a"), storetest.Namespace(t, "renew-b")
		a := storetest.TenantStore(t, dsn, storetest.Provision(t, owner, nsA))
		key := nsB + "/job"
		o := storetest.Owner("dc-a", "job", "pod")
		c := storetest.MustClaim(t, owner, key, storetest.WindowAt(0), o, false, storetest.TTL, store.Claimed)
		g, err := owner.AcquireLease(ctx, key, o, storetest.TTL)
		if err != nil {
			t.Fatal(err)
		}
		foreign := store.Renewal{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed, WindowToken: c.Window.Token,
			LeaseKey: key, LeaseToken: g.Lease.Token, TTL: time.Hour}

		byHand, wholesale := rolesWithoutANamespace(t, dsn, nsA[len(nsA)-4:])

		for name, s := range map[string]*store.Store{"a tenant of another namespace": a, "a role in the group without a namespace": byHand,
			"a reader past row-level security granted every function": wholesale} {
			if _, err := s.Renew(ctx, foreign); !errors.Is(err, store.ErrWindowLost) {
				t.Fatalf("%s renewing %s's window and lease: %v, want ErrWindowLost", name, nsB, err)
			}
			lease := foreign
			lease.WindowToken = 0
			if _, err := s.Renew(ctx, lease); !errors.Is(err, store.ErrLeaseLost) {
				t.Fatalf("%s renewing %s's lease: %v, want ErrLeaseLost", name, nsB, err)
			}
		}
		w, err := owner.GetWindow(ctx, key, storetest.WindowAt(0), store.NotIndexed)
		if err != nil || !w.AliveUntil.Equal(c.Window.AliveUntil) {
			t.Fatalf("the window is alive until %s (%v), want %s: someone outside its namespace renewed it", w.AliveUntil, err, c.Window.AliveUntil)
		}
		l, _, err := owner.GetLease(ctx, key)
		if err != nil || !l.ExpireAt.Equal(g.Lease.ExpireAt) {
			t.Fatalf("the lease expires at %s (%v), want %s: someone outside its namespace renewed it", l.ExpireAt, err, g.Lease.ExpireAt)
		}
	})
}

// This release's agents claim on a database still at schema 10 (its claim
// is schema 10's), so they must renew there too: through schema 10's two
// functions, with the same answers, rather than fail every heartbeat and
// stop their apps mid-run.
func TestRenewWorksOnASchema10Database(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "schema10"})
	storetest.Open(t, srv.DirectDSN(), 1) // migrated to this release's schema
	super := storetest.RawConn(t, srv.SuperuserDSN())
	ctx := context.Background()
	schema10, err := os.ReadFile(filepath.Join("migrate", "migrations", "0010_one_call_per_decision.sql"))
	if err != nil {
		t.Fatal(err)
	}
	// Back to schema 10's functions: its claim and renewals as they were,
	// and none of schema 11's, 16's, 17's or 20's.
	for _, q := range []string{
		`DROP FUNCTION dislock.claim_guarded(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint)`,
		`DROP FUNCTION dislock.renew_guarded(text, timestamptz, int, bigint, text, bigint, bigint)`,
		`DROP FUNCTION dislock.commit_guard()`,
		`DROP FUNCTION dislock.acquire_lease(text, text, bigint)`,
		`DROP FUNCTION dislock.claim_unless_paused(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint)`,
		`DROP FUNCTION dislock.pause_of(text)`,
		string(schema10),
		`DROP FUNCTION dislock.renew(text, timestamptz, int, bigint, text, bigint, bigint)`,
		`DROP FUNCTION dislock.session_scope()`,
		`DELETE FROM dislock.schema_migrations WHERE version > 10`} {
		storetest.Exec(t, super, q)
	}
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			// Not migrated: the database stays at schema 10.
			s, err := store.Open(ctx, tg.DSN, store.Options{MaxConns: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			_, _, _, both := holdWindowAndLease(t, s)
			// Schema 10 renews the window, then the lease, each at its
			// own now(); DBTime is the lease's.
			r, err := s.Renew(ctx, both)
			if err != nil || r.LeaseUntil != r.DBTime.Add(time.Hour) || r.WindowUntil.After(r.LeaseUntil) || r.LeaseUntil.Sub(r.WindowUntil) > time.Second {
				t.Fatalf("renewing on schema 10: %+v, %v", r, err)
			}
			stale := both
			stale.LeaseToken++
			if _, err := s.Renew(ctx, stale); !errors.Is(err, store.ErrLeaseLost) {
				t.Fatalf("renewing another token's lease on schema 10: %v, want ErrLeaseLost", err)
			}
			stale = both
			stale.WindowToken++
			if _, err := s.Renew(ctx, stale); !errors.Is(err, store.ErrWindowLost) {
				t.Fatalf("renewing another token's window on schema 10: %v, want ErrWindowLost", err)
			}
		})
	}
}

// A renewal the pod gave up on may still land after the pod's next one
// succeeded (a lock gateway runs a started call to its end): landing
// last, with an earlier now(), it must not move the expiries back before
// those the pod was answered, which its safety deadline counts on.
func TestARenewalLandingLateDoesNotMoveTheExpiriesBack(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		key, _, _, both := holdWindowAndLease(t, s)
		// The late renewal: its transaction, and so its now(), began first.
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		late, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer late.Rollback(ctx) //nolint:errcheck // committed below
		var lateNow time.Time
		if err := late.QueryRow(ctx, "SELECT now()").Scan(&lateNow); err != nil {
			t.Fatal(err)
		}
		r, err := s.Renew(ctx, both)
		if err != nil {
			t.Fatal(err)
		}
		if !lateNow.Before(r.DBTime) {
			t.Fatalf("the late renewal's now() %s is not before the answered one's %s: the story proves nothing", lateNow, r.DBTime)
		}
		var windowUntil, leaseUntil time.Time
		if err := late.QueryRow(ctx, `SELECT window_until, lease_until FROM dislock.renew($1, $2, $3, $4, $5, $6, $7)`,
			both.Key, both.Window, both.Index, both.WindowToken, both.LeaseKey, both.LeaseToken, both.TTL.Microseconds()).Scan(&windowUntil, &leaseUntil); err != nil {
			t.Fatal(err)
		}
		if err := late.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		w, err := s.GetWindow(ctx, key, storetest.WindowAt(0), store.NotIndexed)
		if err != nil {
			t.Fatal(err)
		}
		l, _, err := s.GetLease(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !w.AliveUntil.Equal(r.WindowUntil) || !l.ExpireAt.Equal(r.LeaseUntil) {
			t.Fatalf("after the late renewal (now() %s) the window is alive until %s and the lease until %s; the pod was answered %s and %s",
				lateNow, w.AliveUntil, l.ExpireAt, r.WindowUntil, r.LeaseUntil)
		}
		// What ends a hold still ends it.
		if _, err := s.ReleaseLease(ctx, key, both.LeaseToken); err != nil {
			t.Fatal(err)
		}
		if l, now, err := s.GetLease(ctx, key); err != nil || l.ExpireAt.After(now) {
			t.Fatalf("after its release the lease expires at %s (now %s, %v)", l.ExpireAt, now, err)
		}
	})
}

// holdWindowAndLease claims window 0 of a fresh key and takes its lease, as
// one pod, and returns the renewal of both by an hour.
func holdWindowAndLease(t *testing.T, s *store.Store) (string, store.Claim, store.LeaseGrant, store.Renewal) {
	t.Helper()
	key := storetest.UniqueKey(t)
	o := storetest.Owner("dc-a", "job", "pod")
	c := storetest.MustClaim(t, s, key, storetest.WindowAt(0), o, false, storetest.TTL, store.Claimed)
	g, err := s.AcquireLease(context.Background(), key, o, storetest.TTL)
	if err != nil {
		t.Fatal(err)
	}
	return key, c, g, store.Renewal{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed, WindowToken: c.Window.Token,
		LeaseKey: key, LeaseToken: g.Lease.Token, TTL: time.Hour}
}

// rolesWithoutANamespace makes, by hand, two login roles no policy grants a
// row: one in the tenants' group, and one an operator granted every table
// and function of the schema to read, past row-level security (a
// monitoring role, say: BYPASSRLS, no grant to write). suffix keeps their
// names apart between tests.
func rolesWithoutANamespace(t *testing.T, dsn, suffix string) (byHand, wholesale *store.Store) {
	t.Helper()
	ctx := context.Background()
	super := storetest.Superuser(t, pgtest.Need(t))
	made := func(name string, grants ...string) *store.Store {
		role := pgx.Identifier{name + suffix}.Sanitize()
		for _, q := range append([]string{"CREATE ROLE " + role + " LOGIN PASSWORD 'by-hand'",
			"ALTER ROLE " + role + " SET search_path = pg_catalog, pg_temp"}, grants...) {
			if _, err := super.Exec(ctx, strings.ReplaceAll(q, "$role", role)); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			super.Exec(context.Background(), "DROP OWNED BY "+role) //nolint:errcheck // best effort
			super.Exec(context.Background(), "DROP ROLE "+role)     //nolint:errcheck // best effort
		})
		return storetest.TenantStore(t, dsn, tenant.Credential{Role: name + suffix, Password: "by-hand"})
	}
	return made("by_hand_", "GRANT "+tenant.GroupRole+" TO $role"),
		made("monitoring_", "ALTER ROLE $role BYPASSRLS", "GRANT USAGE ON SCHEMA dislock TO $role",
			"GRANT SELECT ON ALL TABLES IN SCHEMA dislock TO $role", "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA dislock TO $role")
}

// A Store that found the database without pauses (schema 15, the
// migrations of 16 and 17 not committed yet) keeps to schema 15's
// statements only a while: a lock gateway lives through the migration,
// and must hear of a pause set after it.
func TestAStoreThatFoundNoPausesAsksAgainAfterTheMigration(t *testing.T) {
	store.SetProbeInterval(t, 200*time.Millisecond)
	srv := pgtest.New(t, pgtest.Options{Name: "reprobe"})
	s := storetest.Open(t, srv.DirectDSN(), 2)
	super := storetest.RawConn(t, srv.SuperuserDSN())
	ctx := context.Background()
	exec := func(q string) { t.Helper(); storetest.Exec(t, super, q) }
	key := storetest.UniqueKey(t)
	o := storetest.Owner("dc-a", "job-a", "pod-a")
	exec(`ALTER FUNCTION dislock.acquire_lease(text, text, bigint) RENAME TO acquire_lease_not_yet`)
	exec(`ALTER FUNCTION dislock.pause_of(text) RENAME TO pause_of_not_yet`)
	exec(`ALTER FUNCTION dislock.claim_unless_paused(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) RENAME TO claim_unless_paused_not_yet`)
	exec(`ALTER FUNCTION dislock.claim_guarded(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) RENAME TO claim_guarded_not_yet`)
	if _, err := s.AcquireLease(ctx, key+"-before", o, time.Minute); err != nil {
		t.Fatalf("a lease on a database without pause_of: %v", err)
	}
	exec(`ALTER FUNCTION dislock.acquire_lease_not_yet(text, text, bigint) RENAME TO acquire_lease`)
	exec(`ALTER FUNCTION dislock.pause_of_not_yet(text) RENAME TO pause_of`)
	exec(`ALTER FUNCTION dislock.claim_unless_paused_not_yet(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) RENAME TO claim_unless_paused`)
	exec(`ALTER FUNCTION dislock.claim_guarded_not_yet(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) RENAME TO claim_guarded`)
	if _, err := pause.Set(ctx, s, pause.Request{Key: key, By: "alice"}); err != nil {
		t.Fatal(err)
	}
	// Another lease of the key each time (an Indexed Job's index): one
	// granted before the Store asked again is live, and a live lease is
	// answered as held, paused or not.
	n := 0
	storetest.AwaitCond(t, "the Store to hear of the pause", func() bool {
		n++
		_, err := s.AcquireLease(ctx, fmt.Sprintf("%s#%d", key, n), o, time.Minute)
		return errors.Is(err, store.ErrKeyPaused)
	})
}

// This release's agents claim and renew with the calls of schema 20, which
// answer the commit guard themselves, and on a database not migrated yet
// with the statements that carry the guard: each answer is the same on
// both, and a role setting that weakens commits makes a claim and a
// renewal uncertain on both.
func TestClaimsAndRenewalsAreAnsweredAlikeOnSchemas19And20(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "guarded19"})
	storetest.Open(t, srv.DirectDSN(), 1) // migrated to this release's schema
	su := storetest.Superuser(t, srv)
	ctx := context.Background()
	exec := func(q string) { t.Helper(); storetest.Exec(t, su, q) }
	scenario := func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		key := storetest.UniqueKey(t)
		w := storetest.WindowAt(0)
		a, b := storetest.Owner("dc-a", "job-a", "pod-a"), storetest.Owner("dc-b", "job-b", "pod-b")
		c := storetest.MustClaim(t, s, key, w, a, false, ttl, store.Claimed)
		if again := storetest.MustClaim(t, s, key, w, a, false, ttl, store.Reentered); again.Window.Token != c.Window.Token {
			t.Fatalf("the re-entry's token %d, want the claim's %d", again.Window.Token, c.Window.Token)
		}
		storetest.MustBeTaken(t, s, key, w, b, false, a.WindowOwner())
		renewal := store.Renewal{Key: key, Window: w, Index: store.NotIndexed, WindowToken: c.Window.Token, TTL: ttl}
		r, err := s.Renew(ctx, renewal)
		if err != nil || r.WindowUntil.Before(c.Window.AliveUntil) || r.DBTime.IsZero() {
			t.Fatalf("the holder's renewal: %+v, %v (claimed alive until %s)", r, err, c.Window.AliveUntil)
		}
		stale := renewal
		stale.WindowToken++
		if _, err := s.Renew(ctx, stale); !errors.Is(err, store.ErrWindowLost) {
			t.Fatalf("a renewal with another token: %v, want ErrWindowLost", err)
		}
		withRoleSetting(t, srv, su, dsn, "client_min_messages", "error", func(s *store.Store) {
			_, err := s.ClaimWindow(ctx, store.ClaimRequest{Key: key + "-weak", Window: w, Index: store.NotIndexed, Owner: a, TTL: ttl})
			if !errors.Is(err, store.ErrUncertainCommit) || !strings.Contains(err.Error(), "client_min_messages = error") {
				t.Fatalf("a claim under client_min_messages = error: %v, want ErrUncertainCommit naming the setting", err)
			}
			if _, err := s.Renew(ctx, renewal); !errors.Is(err, store.ErrUncertainCommit) || !strings.Contains(err.Error(), "client_min_messages = error") {
				t.Fatalf("a renewal under client_min_messages = error: %v, want ErrUncertainCommit naming the setting", err)
			}
		})
	}
	t.Run("schema20", func(t *testing.T) {
		for _, tg := range srv.Targets() {
			t.Run(tg.Name, func(t *testing.T) { scenario(t, tg.DSN) })
		}
	})
	exec(`ALTER FUNCTION dislock.claim_guarded(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) RENAME TO claim_guarded_not_yet`)
	exec(`ALTER FUNCTION dislock.renew_guarded(text, timestamptz, int, bigint, text, bigint, bigint) RENAME TO renew_guarded_not_yet`)
	defer exec(`ALTER FUNCTION dislock.claim_guarded_not_yet(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) RENAME TO claim_guarded`)
	defer exec(`ALTER FUNCTION dislock.renew_guarded_not_yet(text, timestamptz, int, bigint, text, bigint, bigint) RENAME TO renew_guarded`)
	t.Run("schema19", func(t *testing.T) {
		for _, tg := range srv.Targets() {
			t.Run(tg.Name, func(t *testing.T) { scenario(t, tg.DSN) })
		}
	})
}

// A Store that found the database without schema 20's calls (a lock
// gateway, or a webhook, living through the migration) sends the older
// statements only a while, and the calls again once the migration is in.
func TestAStoreThatFoundNoGuardedCallsSendsThemAfterTheMigration(t *testing.T) {
	store.SetProbeInterval(t, 200*time.Millisecond)
	srv := pgtest.New(t, pgtest.Options{Name: "reprobe20"})
	s := storetest.Open(t, srv.DirectDSN(), 2)
	su := storetest.Superuser(t, srv)
	ctx := context.Background()
	exec := func(q string) { t.Helper(); storetest.Exec(t, su, q) }
	exec(`ALTER SYSTEM SET track_functions = 'pl'`)
	exec(`SELECT pg_reload_conf()`)
	calls := func(f string) int64 {
		t.Helper()
		var n int64
		if err := su.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_user_functions WHERE schemaname = 'dislock' AND funcname = $1`, f).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	key := storetest.UniqueKey(t)
	o := storetest.Owner("dc-a", "job-a", "pod-a")
	exec(`ALTER FUNCTION dislock.claim_guarded(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) RENAME TO claim_guarded_not_yet`)
	exec(`ALTER FUNCTION dislock.renew_guarded(text, timestamptz, int, bigint, text, bigint, bigint) RENAME TO renew_guarded_not_yet`)
	c := storetest.MustClaim(t, s, key, storetest.WindowAt(0), o, false, ttl, store.Claimed)
	renewal := store.Renewal{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed, WindowToken: c.Window.Token, TTL: ttl}
	if _, err := s.Renew(ctx, renewal); err != nil {
		t.Fatalf("a renewal on a database without renew_guarded: %v", err)
	}
	exec(`ALTER FUNCTION dislock.claim_guarded_not_yet(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint) RENAME TO claim_guarded`)
	exec(`ALTER FUNCTION dislock.renew_guarded_not_yet(text, timestamptz, int, bigint, text, bigint, bigint) RENAME TO renew_guarded`)
	storetest.AwaitCond(t, "the Store to claim and renew with schema 20's calls", func() bool {
		storetest.MustClaim(t, s, key, storetest.WindowAt(0), o, false, ttl, store.Reentered)
		if _, err := s.Renew(ctx, renewal); err != nil {
			t.Fatalf("a renewal during the migration: %v", err)
		}
		return calls("claim_guarded") > 0 && calls("renew_guarded") > 0
	})
}
