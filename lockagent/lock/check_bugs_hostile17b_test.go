package lock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/jackc/pgx/v5"
)

// libpq's key=value syntax allows blanks around '=' and a backslash-escaped
// quote inside a quoted value. An operator's URL with a typo elsewhere
// (sslmode=bogus) must not have its password printed back.
func TestHostile17bKeyValuePasswordNeverPrinted(t *testing.T) {
	for _, c := range []struct{ url, secret string }{
		{`host=127.0.0.1 user=u password = S3cretPw-kv1 sslmode=bogus`, "S3cretPw-kv1"},
		{`host=127.0.0.1 user=u password= S3cretPw-kv2 sslmode=bogus`, "S3cretPw-kv2"},
		{`host=127.0.0.1 user=u password='it\'s S3cretPw-kv3' sslmode=bogus`, "S3cretPw-kv3"},
	} {
		rep := lock.CheckURL(context.Background(), c.url, lock.CheckOptions{})
		if s := dump(rep) + rep.Heading(); strings.Contains(s, c.secret) {
			t.Errorf("URL %q: the report holds the password:\n%s", c.url, s)
		}
	}
}

// A session-mode PgBouncer whose pool is nearly full (two free server
// connections: a pool of 2, or running pods holding the rest) is the very
// misconfiguration the pooling check names. The check's own connection
// holds one server connection while the pooling probe opens two more, so
// the probe waits for PgBouncer's query_wait_timeout and then says it
// cannot tell, with the fix "run dislock check again".
func TestHostile17bSessionPoolNearlyFullIsStillNamed(t *testing.T) {
	srv := pgtest.Need(t)
	openStore(t, srv.DirectDSN(), 2)
	b, err := srv.AddSessionBouncer(namespace(t, "h17b-sess"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Two "pods" hold two of the pool's four server connections.
	for range 2 {
		c, err := pgx.Connect(ctx, b.DSN())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	start := time.Now()
	rep := lock.CheckURL(cctx, b.DSN(), lock.CheckOptions{AllowAsync: true})
	t.Logf("took %s", time.Since(start))
	wantFinding(t, rep, "pooling", lock.StatusWarn, []string{"session mode"}, []string{"pool_mode = transaction"})
}
