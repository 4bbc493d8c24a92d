package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/ledger"
)

// freshAlertingRow deletes the one row of dislock.alerting_cluster: each
// test of the role starts with no cluster ever having held it.
func freshAlertingRow(t *testing.T, dsn string) {
	t.Helper()
	if _, err := storetest.RawConn(t, dsn).Exec(context.Background(), `DELETE FROM dislock.alerting_cluster`); err != nil {
		t.Fatal(err)
	}
}

// mustAlerting ends the test when what, whose answer it is given, failed.
func mustAlerting(t *testing.T, what string) func(ledger.AlertingCluster, error) ledger.AlertingCluster {
	return func(a ledger.AlertingCluster, err error) ledger.AlertingCluster {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return a
	}
}

// One cluster at a time holds the role of alerting cluster: the first to
// claim it, until its claim lapses or it leaves. Another cluster's claim
// meanwhile is refused and told the holder; the holder's renewal keeps when
// it began; keeping never takes the role; and a cluster taking it over may
// alert only once the settle time has passed since the claim before it
// lapsed.
func TestOneClusterAtATimeHoldsTheAlertingRole(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 2)
		freshAlertingRow(t, dsn)
		const long = time.Hour

		a := mustAlerting(t, "dc-a's first claim")(ledger.ClaimAlerting(ctx, own, "dc-a", long, long))
		if !a.Alerting("dc-a") || a.Left <= long-time.Minute {
			t.Fatalf("the first claim of a role nobody held: %+v, want dc-a alerting at once for about %s", a, long)
		}
		b := mustAlerting(t, "dc-b's claim")(ledger.ClaimAlerting(ctx, own, "dc-b", long, long))
		if b.Alerting("dc-b") || b.Cluster != "dc-a" {
			t.Fatalf("dc-b claiming a role dc-a holds: %+v, want refused and told dc-a holds it", b)
		}
		if b := mustAlerting(t, "dc-b keeping")(ledger.KeepAlerting(ctx, own, "dc-b", long)); b.Cluster != "dc-a" {
			t.Fatalf("dc-b keeping a role it does not hold: %+v, want dc-a's", b)
		}
		if a := mustAlerting(t, "dc-a's renewal")(ledger.KeepAlerting(ctx, own, "dc-a", long)); !a.Alerting("dc-a") {
			t.Fatalf("dc-a renewing: %+v, want it still alerting", a)
		}

		// dc-a leaves. Keeping never takes the role; claiming does, and
		// dc-b may alert only an hour (the settle time) after dc-a's claim
		// ended, which its renewal does not move.
		if a := mustAlerting(t, "dc-a leaving")(ledger.LeaveAlerting(ctx, own, "dc-a")); a.Alerting("dc-a") || a.Left > 0 {
			t.Fatalf("dc-a leaving: %+v, want its claim ended", a)
		}
		if b := mustAlerting(t, "dc-b keeping")(ledger.KeepAlerting(ctx, own, "dc-b", long)); b.Cluster != "dc-a" {
			t.Fatalf("dc-b keeping a lapsed role: %+v, want it left to a claim", b)
		}
		b = mustAlerting(t, "dc-b's claim")(ledger.ClaimAlerting(ctx, own, "dc-b", long, long))
		if b.Cluster != "dc-b" || b.Alerting("dc-b") || b.From <= long-time.Minute {
			t.Fatalf("dc-b taking the role dc-a left: %+v, want dc-b holding it, alerting in about %s", b, long)
		}
		if a := mustAlerting(t, "dc-a's claim")(ledger.ClaimAlerting(ctx, own, "dc-a", long, 0)); a.Cluster != "dc-b" || a.Alerting("dc-a") {
			t.Fatalf("dc-a claiming while dc-b settles: %+v, want dc-b's", a)
		}
		if again := mustAlerting(t, "dc-b's renewal")(ledger.ClaimAlerting(ctx, own, "dc-b", long, 0)); again.From <= long-time.Minute {
			t.Fatalf("dc-b renewing while it settles: %+v, want it still alerting only in about %s", again, long)
		}

		// A claim that lapsed is taken without a word from its holder.
		if b := mustAlerting(t, "dc-b's short claim")(ledger.KeepAlerting(ctx, own, "dc-b", 50*time.Millisecond)); b.Cluster != "dc-b" {
			t.Fatalf("dc-b shortening its claim: %+v", b)
		}
		now, err := own.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		storetest.AwaitDBPast(t, own, now.Add(50*time.Millisecond))
		if a := mustAlerting(t, "dc-a's claim")(ledger.ClaimAlerting(ctx, own, "dc-a", long, 0)); !a.Alerting("dc-a") {
			t.Fatalf("dc-a claiming after dc-b's claim lapsed, with no settle time: %+v, want dc-a alerting", a)
		}
		if r := mustAlerting(t, "reading")(ledger.ReadAlerting(ctx, own)); !r.Alerting("dc-a") || r.Alerting("dc-b") {
			t.Fatalf("reading the role: %+v, want dc-a's", r)
		}
	})
}

// Clusters claiming a role nobody ever held, all at once, have one winner.
func TestConcurrentFirstClaimsOfTheAlertingRoleHaveOneWinner(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		own := storetest.Open(t, dsn, 8)
		freshAlertingRow(t, dsn)
		answers := make([]ledger.AlertingCluster, 8)
		errs := make([]error, len(answers))
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() {
				answers[i], errs[i] = ledger.ClaimAlerting(context.Background(), own, fmt.Sprintf("dc-%d", i), time.Hour, time.Hour)
			})
		}
		wg.Wait()
		var winners []string
		for i, a := range answers {
			if errs[i] != nil {
				t.Fatalf("dc-%d: %v", i, errs[i])
			}
			if a.Alerting(fmt.Sprintf("dc-%d", i)) {
				winners = append(winners, a.Cluster)
			}
		}
		r := mustAlerting(t, "reading")(ledger.ReadAlerting(context.Background(), own))
		if len(winners) != 1 || !r.Alerting(winners[0]) {
			t.Fatalf("winners %v, the row %+v: want one, the row's holder", winners, r)
		}
	})
}

// The role is the owner's: a tenant can neither read nor claim it.
func TestATenantCannotTouchTheAlertingRole(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := storetest.Open(t, dsn, 1)
		tenant := storetest.TenantStore(t, dsn, storetest.Provision(t, own, storetest.Namespace(t, "alerting")))
		calls := []struct {
			what string
			call func() (ledger.AlertingCluster, error)
		}{
			{"reading", func() (ledger.AlertingCluster, error) { return ledger.ReadAlerting(ctx, tenant) }},
			{"claiming", func() (ledger.AlertingCluster, error) {
				return ledger.ClaimAlerting(ctx, tenant, "dc-evil", time.Hour, 0)
			}},
			{"keeping", func() (ledger.AlertingCluster, error) { return ledger.KeepAlerting(ctx, tenant, "dc-evil", time.Hour) }},
			{"leaving", func() (ledger.AlertingCluster, error) { return ledger.LeaveAlerting(ctx, tenant, "dc-a") }},
		}
		for _, c := range calls {
			if a, err := c.call(); !errors.Is(err, store.ErrForbidden) {
				t.Errorf("a tenant %s the alerting cluster: %+v, %v; want ErrForbidden", c.what, a, err)
			}
		}
	})
}
