package lock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/lock"
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
	eachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		own := openStore(t, dsn, 2)
		ns := namespace(t, "hard-a")
		cred := provision(t, own, ns)
		tenant := rawConn(t, mustTenantDSN(t, dsn, cred))

		var path string
		var createInPublic bool
		var limit int
		if err := tenant.QueryRow(ctx, `SELECT current_setting('search_path'), has_schema_privilege('public', 'CREATE'),
			(SELECT rolconnlimit FROM pg_catalog.pg_roles WHERE rolname = current_user)`).Scan(&path, &createInPublic, &limit); err != nil {
			t.Fatal(err)
		}
		if path != "pg_catalog, pg_temp" || createInPublic || limit != lock.TenantConnectionLimit {
			t.Errorf("tenant role: search_path %q, may create in public %v, connection limit %d; want \"pg_catalog, pg_temp\", false, %d",
				path, createInPublic, limit, lock.TenantConnectionLimit)
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
		other := namespace(t, "hard-b")
		for _, c := range []struct{ cluster, zone string }{{"dc-a", "UTC"}, {"dc-b", "Europe/Berlin"}} {
			if _, err := own.RecordView(ctx, other+"/report", c.cluster, lock.View{Schedule: "0 2 * * *", TimeZone: c.zone, Mode: "schedule"}, time.Hour); err != nil {
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
