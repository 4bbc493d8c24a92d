package check_test

import (
	"context"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
)

// A tenant's real CronJob named dislock-check-probe holds this minute's
// window and a lease while `dislock check` probes the same key: the check
// passes, and the real window and lease are exactly as before (owner,
// token, liveness, expiry), directly and through PgBouncer.
func TestTheProbeLeavesARealJobOfItsKeyAsItWas(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		owner := storetest.Open(t, dsn, 2)
		ns := storetest.Namespace(t, "h17b")
		c := storetest.Provision(t, owner, ns)
		tdsn := storetest.TenantDSN(t, dsn, c)
		asTenant, err := store.Open(ctx, tdsn, store.Options{MaxConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer asTenant.Close()
		key := ns + "/dislock-check-probe"
		o := store.Owner{Cluster: "dc-a", Namespace: ns, Job: "dislock-check-probe-29000000", JobUID: "uid-real", Pod: "pod-real"}
		var windows []time.Time
		now := time.Now().UTC().Truncate(time.Minute)
		for _, w := range []time.Time{now.Add(-time.Minute), now, now.Add(time.Minute)} {
			if _, err := asTenant.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: w, Index: store.NotIndexed, Owner: o, TTL: time.Hour}); err != nil {
				t.Fatalf("real claim %s: %v", w, err)
			}
			windows = append(windows, w)
		}
		g, err := asTenant.AcquireLease(ctx, key, o, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		var before []store.Window
		for _, w := range windows {
			row, err := owner.GetWindow(ctx, key, w, store.NotIndexed)
			if err != nil {
				t.Fatal(err)
			}
			before = append(before, row)
		}
		rep := check.URL(ctx, tdsn, check.Options{AllowAsync: true})
		wantFinding(t, rep, "privileges", check.StatusOK, []string{"rolled back"}, nil)
		for i, w := range windows {
			row, err := owner.GetWindow(ctx, key, w, store.NotIndexed)
			if err != nil {
				t.Fatal(err)
			}
			b := before[i]
			if row.Owner != b.Owner || row.Token != b.Token || !row.AliveUntil.Equal(b.AliveUntil) || row.State != b.State {
				t.Errorf("window %s changed by the check: %+v -> %+v", w, b, row)
			}
		}
		l, _, err := owner.GetLease(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if l.Owner != g.Lease.Owner || l.Token != g.Lease.Token || !l.ExpireAt.Equal(g.Lease.ExpireAt) {
			t.Errorf("lease changed by the check: %+v -> %+v", g.Lease, l)
		}
		// The real agent still renews and re-enters as before.
		if _, _, err := asTenant.RenewLease(ctx, key, g.Lease.Token, time.Hour); err != nil {
			t.Errorf("renewal after the check: %v", err)
		}
	})
}

// Running the probe again and again, as a loop of `dislock check` during a
// herd would, while a real agent of another key claims: every real token
// is above the one before it (the probe's rolled-back draws only leave
// gaps), and no probe row is ever committed.
func TestTheProbeDuringAHerdKeepsTokensGrowing(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		owner := storetest.Open(t, dsn, 2)
		ns := storetest.Namespace(t, "h17b-herd")
		c := storetest.Provision(t, owner, ns)
		tdsn := storetest.TenantDSN(t, dsn, c)
		asTenant, err := store.Open(ctx, tdsn, store.Options{MaxConns: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer asTenant.Close()
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range 5 {
				rep := check.URL(ctx, tdsn, check.Options{AllowAsync: true})
				if f := finding(t, rep, "privileges"); f.Status != check.StatusOK {
					t.Errorf("probe: %+v", f)
				}
			}
		}()
		var last int64
		key := ns + "/real"
		base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
		for i := 0; ; i++ {
			o := store.Owner{Cluster: "dc-a", Namespace: ns, Job: "real", JobUID: "u", Pod: "p"}
			cl, err := asTenant.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: base.Add(time.Duration(i) * time.Minute), Index: store.NotIndexed, Owner: o, TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if cl.Window.Token <= last {
				t.Fatalf("token %d after %d", cl.Window.Token, last)
			}
			last = cl.Window.Token
			select {
			case <-done:
				for _, w := range []time.Duration{-time.Minute, 0, time.Minute} {
					if _, err := owner.GetWindow(ctx, ns+"/dislock-check-probe", time.Now().UTC().Truncate(time.Minute).Add(w), store.NotIndexed); err == nil {
						t.Errorf("a probe window was committed")
					}
				}
				if l, _, err := owner.GetLease(ctx, ns+"/dislock-check-probe"); err == nil {
					t.Errorf("a probe lease was committed: %+v", l)
				}
				return
			default:
			}
		}
	})
}

// A tenant role whose sessions default to repeatable read would claim and
// take leases at one snapshot per call, where a pause could not undo what
// waited for its row: the agent's calls refuse to start a run, and dislock
// check fails the probe and the setting, naming the fix (the isolation
// finding is every URL's, a lock gateway's owner role's too).
func TestTheProbeFailsForARoleThatDefaultsAboveReadCommitted(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		owner := storetest.Open(t, dsn, 2)
		ns := storetest.Namespace(t, "iso")
		c := storetest.ProvisionDefaulting(t, owner, ns, "repeatable read")
		rep := check.URL(ctx, storetest.TenantDSN(t, dsn, c), check.Options{AllowAsync: true})
		wantFinding(t, rep, "privileges", check.StatusFail, []string{"isolation level repeatable read", "read committed"},
			[]string{"RESET default_transaction_isolation"})
		wantFinding(t, rep, "isolation", check.StatusFail, []string{"default_transaction_isolation = repeatable read"},
			[]string{"RESET default_transaction_isolation"})
	})
}
