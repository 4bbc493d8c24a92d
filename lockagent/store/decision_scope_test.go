package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
)

// A pod's decision (its claim, with its cluster's view, and its ledger row)
// runs with the owner's rights, past row-level security, so the functions
// check the caller's namespace themselves: a tenant of another namespace,
// a role in the tenants' group with no live namespace, and a role granted
// the schema's functions wholesale are refused as row-level security
// refused them (ErrForbidden, naming the key), write nothing, and cannot
// reach the unchecked functions behind the check either.
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
			"a role granted every function of the schema": wholesale} {
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
				_, err := s.Handle().Pool.Exec(ctx, q, key)
				if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
					t.Errorf("%s: %s: %v, want permission denied", name, q, err)
				}
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

		// The namespace's own pods decide as before.
		storetest.MustClaim(t, b, key, storetest.WindowAt(1), ob, false, storetest.TTL, store.Claimed)
		if err := b.RecordDecision(ctx, store.Decision{Key: key, Window: storetest.WindowAt(1), Index: store.NotIndexed,
			Cluster: "dc-b", Job: "job", Pod: "pod-b", Action: store.ActionRun, Reason: "window claimed"}); err != nil {
			t.Fatal(err)
		}
	})
}
