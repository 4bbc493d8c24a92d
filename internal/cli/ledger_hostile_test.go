package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/test/pgtest"
)

// The wide listing picks the newest windows of the ledger and of the
// owners' rows. A tenant writes decisions of its own keys for windows in the
// future (any finite time): `dislock windows -o wide --since 2h`, the
// operator's "what happened in the last two hours", must still show another
// namespace's window of a minute ago: --since ends at now.
func TestATenantsFutureWindowsDoNotFillTheWideListingOfTheLastHours(t *testing.T) {
	srv := pgtest.Need(t)
	dsn := srv.DirectDSN()
	ctx := context.Background()
	owner := migratedStore(t, dsn)
	hostile := namespace("hostile")
	cred, err := owner.ProvisionTenant(ctx, "dc-a", hostile)
	if err != nil {
		t.Fatal(err)
	}
	tenantURL, err := lock.TenantDSN(dsn, cred)
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := lock.Open(ctx, tenantURL, lock.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tenant.Close()
	far := time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < 60; i++ {
		record(t, tenant, lock.Decision{Key: hostile + "/x", Window: far.Add(time.Duration(i) * time.Minute), Index: lock.NotIndexed,
			Cluster: "dc-a", Action: lock.ActionSkip, Reason: "noise"})
	}
	victim := namespace("victim") + "/report"
	w := dbNow(t, owner).Truncate(time.Minute).Add(-time.Minute)
	record(t, owner, lock.Decision{Key: victim, Window: w, Index: lock.NotIndexed, Cluster: "dc-b", Action: lock.ActionError, Reason: "database unreachable"})
	code, out, errOut := run(t, "windows", "--database-url", dsn, "-o", "wide", "--since", "2h")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, victim) {
		t.Errorf("`dislock windows -o wide --since 2h` does not show %s's window of a minute ago; it shows namespace %s's windows of the year 2200 (%d lines)",
			victim, hostile, strings.Count(out, hostile+"/x"))
	}
}
