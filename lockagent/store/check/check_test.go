package check_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/ledger"
	"github.com/dislock/dislock/test/pgtest"
)

// A single PostgreSQL has nobody to fail over to: dislock check says so and
// names the setting and the fix, and passes once the operator explicitly
// accepts it.
func TestCheckRefusesAnUnreplicatedDatabase(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		fs, err := check.Database(context.Background(), s, check.Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := storetest.ByCheck(fs)
		if f := got["replication"]; f.Status != check.StatusFail || !strings.Contains(f.Detail, "synchronous_standby_names") || !strings.Contains(f.Fix, "synchronous_mode: true") {
			t.Errorf("replication finding: %+v", f)
		}
		for _, c := range []string{"primary", "synchronous_commit", "schema", "tokens"} {
			if got[c].Status != check.StatusOK {
				t.Errorf("%s: %+v, want ok", c, got[c])
			}
		}
		if !check.Failed(fs) {
			t.Error("Failed(findings) = false for an unreplicated database")
		}
		fs, err = check.Database(context.Background(), s, check.Options{AllowAsync: true})
		if err != nil {
			t.Fatal(err)
		}
		if f := storetest.ByCheck(fs)["replication"]; f.Status != check.StatusAccepted || check.Failed(fs) {
			t.Errorf("with AllowAsync: %+v", fs)
		}
	})
}

// A row holds a token above every token the epoch can give (an
// asynchronous failover lost the record of the epoch): check finds it,
// names the row and prints the command that fixes it; after it, tokens
// grow again.
func TestCheckFindsTokensThatWouldGoBack(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "epoch"})
	ctx := context.Background()
	s := storetest.Open(t, srv.DirectDSN(), 2)
	key := storetest.UniqueKey(t)
	c := storetest.MustClaim(t, s, key, storetest.WindowAt(0), storetest.Owner("dc-a", "job", "pod"), false, storetest.TTL, store.Claimed)
	su := storetest.Superuser(t, srv)
	restored := int64(5)<<40 + 77 // a token handed out on timeline 5 of the old cluster
	if _, err := su.Exec(ctx, `UPDATE dislock.windows SET token = $1 WHERE lock_key = $2`, restored, key); err != nil {
		t.Fatal(err)
	}
	fs, err := check.Database(ctx, s, check.Options{AllowAsync: true})
	if err != nil {
		t.Fatal(err)
	}
	f := storetest.ByCheck(fs)["tokens"]
	// The detail names the row, so that the operator checks it first.
	if f.Status != check.StatusFail || !strings.Contains(f.Detail, "epoch 5") || !strings.Contains(f.Detail, "window "+key+" at ") ||
		f.Fix != fmt.Sprintf("dislock tokens --token-floor %d", restored) {
		t.Fatalf("tokens finding: %+v (first token %d)", f, c.Window.Token)
	}
	// What the printed command runs.
	if st, err := ledger.KeepTokens(ctx, s, restored, false); err != nil || st.Moved == "" || st.Epoch <= 5 {
		t.Fatalf("the printed fix: %+v %v", st, err)
	}
	if fs, _ := check.Database(ctx, s, check.Options{AllowAsync: true}); check.Failed(fs) {
		t.Fatalf("after the fix: %+v", fs)
	}
	next := storetest.MustClaim(t, s, key, storetest.WindowAt(1), storetest.Owner("dc-a", "job", "pod"), false, storetest.TTL, store.Claimed)
	if next.Window.Token <= restored {
		t.Fatalf("token %d after the fix, not above the restored %d", next.Window.Token, restored)
	}
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
		want   check.Status
	}{
		{"a fresh counter", 0, check.StatusOK},
		{"half spent", counterMax / 2, check.StatusOK},
		{"60 % spent", counterMax / 10 * 6, check.StatusWarn},
		{"95 % spent", counterMax / 100 * 95, check.StatusFail},
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
				fs, err := check.Database(ctx, s, check.Options{AllowAsync: true})
				if err != nil {
					t.Fatal(err)
				}
				f := storetest.ByCheck(fs)["token counter"]
				if f.Status != tc.want || !strings.Contains(f.Detail, fmt.Sprint(counterMax)) || check.Failed(fs) != (tc.want == check.StatusFail) {
					t.Errorf("%s: token counter %+v, want %s", tg.Name, f, tc.want)
				}
				if tc.want == check.StatusOK {
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
	c := storetest.MustClaim(t, own, key, storetest.WindowAt(0), storetest.Owner("dc-a", "job", "pod"), false, storetest.TTL, store.Claimed)
	if _, n := store.TokenEpoch(c.Window.Token); n <= counterMax/100*95 {
		t.Errorf("token %d: counter %d, want above the setval", c.Window.Token, n)
	}
}

// dislock check with a tenant's URL reports what it can see and fails only
// for what fails for everyone (here: a database without a standby).
func TestCheckAsATenantReportsLessButDoesNotFail(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		own := storetest.Open(t, dsn, 2)
		ns := storetest.Namespace(t, "team-a")
		s := storetest.TenantStore(t, dsn, storetest.Provision(t, own, ns))
		fs, err := check.Database(context.Background(), s, check.Options{AllowAsync: true})
		if err != nil {
			t.Fatal(err)
		}
		if check.Failed(fs) {
			t.Errorf("findings fail: %+v", fs)
		}
		got := storetest.ByCheck(fs)
		if got["schema"].Status != check.StatusOK {
			t.Errorf("schema: %+v", got["schema"])
		}
		if f := got["tokens"]; f.Status != check.StatusWarn || !strings.Contains(f.Detail, ns) || !strings.Contains(f.Fix, "owner") {
			t.Errorf("tokens: %+v, want a warning naming the namespace and the owner's URL as the fix", f)
		}
	})
}
