package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"
)

// A pod's decision (its claim, with its cluster's view, and its ledger row)
// runs with the owner's rights, past row-level security, so the functions
// check the caller's namespace themselves: a tenant of another namespace,
// a role in the tenants' group with no live namespace, and a role that
// reads every namespace past row-level security (BYPASSRLS, granted the
// schema's functions wholesale, no table to write) are refused as
// row-level security and the table grants refused them (ErrForbidden,
// naming the key), write nothing, and cannot reach the unchecked functions
// behind the check either. A NULL key is refused too.
func TestADecisionReachesOnlyTheCallersNamespace(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		owner := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		nsA, nsB := storetest.Namespace(t, "decide-a"), storetest.Namespace(t, "decide-b")
		a := storetest.TenantStore(t, dsn, storetest.Provision(t, owner, nsA))
		b := storetest.TenantStore(t, dsn, storetest.Provision(t, owner, nsB))
		byHand, wholesale := rolesWithoutANamespace(t, dsn, nsA[len(nsA)-4:])
		key := nsB + "/job"
		ob := store.Owner{Cluster: "dc-b", Namespace: nsB, Job: "job", JobUID: "uid-b", Pod: "pod-b"}
		oa := store.Owner{Cluster: "dc-a", Namespace: nsA, Job: "job", JobUID: "uid-a", Pod: "pod-a"}
		// Window 0 is team-b's, failed: a standby may take it. Window 1 is
		// nobody's yet.
		failed := storetest.MustClaim(t, b, key, storetest.WindowAt(0), ob, false, storetest.TTL, store.Claimed)
		if _, err := b.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, failed.Window.Token, store.StateFailed, storetest.Ptr(1)); err != nil {
			t.Fatal(err)
		}
		view := &store.View{Schedule: "* * * * *", Mode: "schedule"}

		for name, s := range map[string]*store.Store{"a tenant of another namespace": a, "a role in the group without a namespace": byHand,
			"a reader past row-level security granted every function": wholesale} {
			for w := range 2 {
				_, err := s.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: storetest.WindowAt(w), Index: store.NotIndexed,
					Owner: oa, TTL: storetest.TTL, Standby: true, View: view})
				if !errors.Is(err, store.ErrForbidden) || !strings.Contains(err.Error(), key) {
					t.Errorf("%s claiming window %d of %s: %v, want ErrForbidden naming the key", name, w, key, err)
				}
			}
			err := s.RecordDecision(ctx, store.Decision{Key: key, Window: storetest.WindowAt(1), Index: store.NotIndexed,
				Cluster: "dc-a", Job: "job", Pod: "pod-a", Action: store.ActionRun, Reason: "forged"})
			if !errors.Is(err, store.ErrForbidden) || !strings.Contains(err.Error(), key) {
				t.Errorf("%s recording a decision of %s: %v, want ErrForbidden naming the key", name, key, err)
			}
			for _, q := range []string{
				`SELECT * FROM dislock.claim_window_unchecked($1, now(), -1, 'dc-a/x/job/uid/pod', 'dc-a', 'pod', 60000000, 'dc-a/', true, NULL, 0, 0, NULL)`,
				`SELECT dislock.record_decision_unchecked($1, now(), -1, 'dc-a', 'job', 'pod', 'run', 'forged', 0, NULL, '{}')`,
			} {
				if _, err := s.Handle().Pool.Exec(ctx, q, key); !isInsufficientPrivilege(err) {
					t.Errorf("%s: %s: %v, want permission denied", name, q, err)
				}
			}
		}

		asA := storetest.RawConn(t, storetest.TenantDSN(t, dsn, storetest.Provision(t, owner, nsA)))
		for _, q := range []string{
			`SELECT * FROM dislock.claim_window(NULL, now() - interval '1 day', -1, 'dc-a/x/job/uid/pod', 'dc-a', 'pod', 60000000, 'dc-a/', true, NULL, 0, 0, 1)`,
			`SELECT dislock.record_decision(NULL, now(), -1, 'dc-a', 'job', 'pod', 'run', 'forged', 0, NULL, '{}')`,
		} {
			if _, err := asA.Exec(ctx, q); !isInsufficientPrivilege(err) {
				t.Errorf("a tenant: %s: %v, want insufficient_privilege", q, err)
			}
		}

		var windows, decisions, views int
		if err := owner.Handle().Pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM dislock.windows WHERE lock_key = $1),
			(SELECT count(*) FROM dislock.decisions WHERE lock_key = $1),
			(SELECT count(*) FROM dislock.views WHERE lock_key = $1)`, key).Scan(&windows, &decisions, &views); err != nil {
			t.Fatal(err)
		}
		if windows != 1 || decisions != 0 || views != 0 {
			t.Errorf("%s has %d windows, %d decisions, %d views after the refusals; want team-b's 1, 0, 0", key, windows, decisions, views)
		}
		if w, err := owner.GetWindow(ctx, key, storetest.WindowAt(0), store.NotIndexed); err != nil || w.State != store.StateFailed || w.Token != failed.Window.Token {
			t.Errorf("team-b's failed window is now %+v (%v): taken from outside its namespace", w, err)
		}

		// A login role whose sessions start as the owner (a NOINHERIT
		// member, as operators make them) decides for any key, as the
		// owner may write every row anyway.
		super := storetest.Superuser(t, pgtest.Need(t))
		asOwner := "as_owner_" + nsA[len(nsA)-4:]
		role := pgx.Identifier{asOwner}.Sanitize()
		for _, q := range []string{"CREATE ROLE " + role + " LOGIN NOINHERIT PASSWORD 'by-hand'", "GRANT " + pgtest.AppUser + " TO " + role,
			"ALTER ROLE " + role + " SET role = " + pgtest.AppUser} {
			if _, err := super.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { super.Exec(context.Background(), "DROP ROLE "+role) }) //nolint:errcheck // best effort
		operator := storetest.TenantStore(t, dsn, tenant.Credential{Role: asOwner, Password: "by-hand"})
		storetest.MustClaim(t, operator, key, storetest.WindowAt(2), ob, false, storetest.TTL, store.Claimed)

		// The namespace's own pods decide as before.
		storetest.MustClaim(t, b, key, storetest.WindowAt(1), ob, false, storetest.TTL, store.Claimed)
		if err := b.RecordDecision(ctx, store.Decision{Key: key, Window: storetest.WindowAt(1), Index: store.NotIndexed,
			Cluster: "dc-b", Job: "job", Pod: "pod-b", Action: store.ActionRun, Reason: "window claimed"}); err != nil {
			t.Fatal(err)
		}
	})
}

// A row whose token is above the high water (two asynchronous failovers in
// a row can leave one) can no longer be written by its tenant: the running
// job's re-entry fails closed, as its renewals do, rather than telling the
// pod to run on a claim its next heartbeat would call lost. Nothing of the
// row changes (the attempt draws a token, a gap in the counter).
func TestATenantsReentryAboveTheHighWaterFailsClosed(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		owner := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		ns := storetest.Namespace(t, "above")
		s := storetest.TenantStore(t, dsn, storetest.Provision(t, owner, ns))
		key := ns + "/job"
		o := store.Owner{Cluster: "dc-a", Namespace: ns, Job: "job", JobUID: "uid", Pod: "pod"}
		c := storetest.MustClaim(t, s, key, storetest.WindowAt(0), o, false, storetest.TTL, store.Claimed)
		if _, err := storetest.Superuser(t, pgtest.Need(t)).Exec(ctx, `UPDATE dislock.windows SET token = token + (16::bigint << 40)
			WHERE lock_key = $1 AND window_start = $2`, key, storetest.WindowAt(0)); err != nil {
			t.Fatal(err)
		}
		_, err := s.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed, Owner: o, TTL: time.Hour})
		if !errors.Is(err, store.ErrForbidden) || !strings.Contains(err.Error(), "above the high water") {
			t.Fatalf("re-entering a claim whose token is above the high water: %v, want ErrForbidden naming the high water", err)
		}
		w, err := owner.GetWindow(ctx, key, storetest.WindowAt(0), store.NotIndexed)
		if err != nil || !w.AliveUntil.Equal(c.Window.AliveUntil) {
			t.Fatalf("the window is alive until %s (%v), want %s: the refused re-entry renewed it", w.AliveUntil, err, c.Window.AliveUntil)
		}
	})
}

// isInsufficientPrivilege tells PostgreSQL's refusal of a privilege.
func isInsufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}
