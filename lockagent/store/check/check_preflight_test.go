package check_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/test/tlstest"
)

// finding returns rep's finding of check, failing the test without one.
func finding(t *testing.T, rep check.RoleReport, name string) check.Finding {
	t.Helper()
	for _, f := range rep.Findings {
		if f.Check == name {
			return f
		}
	}
	t.Fatalf("no %q finding in %s", name, dump(rep))
	return check.Finding{}
}

func dump(rep check.RoleReport) string {
	b, _ := json.MarshalIndent(rep, "", "  ")
	return string(b)
}

// wantFinding holds a finding to its status and to words of its detail
// and fix.
func wantFinding(t *testing.T, rep check.RoleReport, name string, status check.Status, detail, fix []string) check.Finding {
	t.Helper()
	f := finding(t, rep, name)
	if f.Status != status {
		t.Errorf("%s is %s, want %s: %+v", name, f.Status, status, f)
	}
	for _, w := range detail {
		if !strings.Contains(f.Detail, w) {
			t.Errorf("%s's detail lacks %q: %s", name, w, f.Detail)
		}
	}
	for _, w := range fix {
		if !strings.Contains(f.Fix, w) {
			t.Errorf("%s's fix lacks %q: %s", name, w, f.Fix)
		}
	}
	return f
}

// noPassword fails the test if the password appears anywhere in rep.
func noPassword(t *testing.T, rep check.RoleReport, password string) {
	t.Helper()
	if s := dump(rep); strings.Contains(s, password) {
		t.Fatalf("the report holds the password %q:\n%s", password, s)
	}
}

// withPassword is dsn with its password replaced.
func withPassword(t *testing.T, dsn, password string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String()
}

// withQuery is dsn with query parameter key set to value.
func withQuery(t *testing.T, dsn, key, value string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// A fresh install as it should be, checked with the owner's URL and a
// tenant's: every check passes; directly it says so, through PgBouncer it
// sees transaction pooling; the tenant's probe claim leaves no row behind.
func TestCheckURLPassesAGoodInstallDirectAndThroughPgBouncer(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		owner := storetest.Open(t, dsn, 2)
		rep := check.URL(ctx, dsn, check.Options{AllowAsync: true})
		if check.Failed(rep.Findings) || rep.Kind != check.RoleOwner || rep.Role != pgtest.AppUser {
			t.Fatalf("owner: %s", dump(rep))
		}
		wantFinding(t, rep, "connection", check.StatusOK, []string{"logged in as role " + pgtest.AppUser}, nil)
		wantFinding(t, rep, "tls", check.StatusOK, []string{"loopback"}, nil)
		wantFinding(t, rep, "clock", check.StatusOK, []string{"round trip"}, nil)
		wantFinding(t, rep, "privileges", check.StatusOK, []string{"may create roles"}, nil)
		pooling := []string{"directly to PostgreSQL"}
		if strings.Contains(t.Name(), "pgbouncer") {
			pooling = []string{"transaction", "clients share server connections per transaction"}
		}
		wantFinding(t, rep, "pooling", check.StatusOK, pooling, nil)
		noPassword(t, rep, pgtest.AppPassword)

		ns := storetest.Namespace(t, "check")
		c := storetest.Provision(t, owner, ns)
		trep := check.URL(ctx, storetest.TenantDSN(t, dsn, c), check.Options{AllowAsync: true})
		if check.Failed(trep.Findings) || trep.Kind != check.RoleTenant || trep.Namespace != ns || trep.Role != c.Role {
			t.Fatalf("tenant: %s", dump(trep))
		}
		if h := trep.Heading(); !strings.Contains(h, c.Role) || !strings.Contains(h, "tenant of namespace "+ns) {
			t.Errorf("heading %q", h)
		}
		wantFinding(t, trep, "privileges", check.StatusOK, []string{"claims windows and takes leases of namespace " + ns, "rolled back"}, nil)
		noPassword(t, trep, c.Password)
		assertNoProbeRows(t, owner, ns)
	})
}

// assertNoProbeRows fails the test if a check left a window or a lease of
// namespace ns's probe key (or any key of ns).
func assertNoProbeRows(t *testing.T, owner *store.Store, ns string) {
	t.Helper()
	ctx := context.Background()
	windows, _, err := owner.ListWindowsIn(ctx, store.WindowFilter{Key: ns + "/dislock-check-probe"})
	if err != nil {
		t.Fatal(err)
	}
	if len(windows) > 0 {
		t.Errorf("the check left windows %+v", windows)
	}
	leases, _, err := owner.ListLeases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		if strings.HasPrefix(l.Key, ns+"/") {
			t.Errorf("the check left lease %+v", l)
		}
	}
}

// A PgBouncer in session pooling mode works, but each pod holds a server
// connection for its whole run: check says so and how to fix it.
func TestCheckURLWarnsOfSessionPooling(t *testing.T) {
	srv := pgtest.Need(t)
	storetest.Open(t, srv.DirectDSN(), 2)
	b, err := srv.AddSessionBouncer(storetest.Namespace(t, "check-session"))
	if err != nil {
		t.Fatal(err)
	}
	rep := check.URL(context.Background(), b.DSN(), check.Options{AllowAsync: true})
	wantFinding(t, rep, "pooling", check.StatusWarn, []string{"session mode", "whole run"}, []string{"pool_mode = transaction"})
	noPassword(t, rep, pgtest.AppPassword)
}

// A session-mode PgBouncer whose pool is nearly full (two free server
// connections: a pool of 2, or running pods holding the rest) is the very
// misconfiguration the pooling check names. The check's own connection
// holds one server connection while the pooling probe opens two more, so
// the probe waits for PgBouncer's query_wait_timeout and then says it
// cannot tell, with the fix "run dislock check again".
func TestCheckURLNamesASessionPoolThatIsNearlyFull(t *testing.T) {
	srv := pgtest.Need(t)
	storetest.Open(t, srv.DirectDSN(), 2)
	b, err := srv.AddSessionBouncer(storetest.Namespace(t, "h17b-sess"))
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
	rep := check.URL(cctx, b.DSN(), check.Options{AllowAsync: true})
	t.Logf("took %s", time.Since(start))
	wantFinding(t, rep, "pooling", check.StatusWarn, []string{"session mode"}, []string{"pool_mode = transaction"})
}

// Nothing listens at the URL's port: a finding, not an error, naming the
// address and what to look at.
func TestCheckURLNamesAnUnreachableHost(t *testing.T) {
	t.Parallel()
	port := storetest.ClosedPort(t)
	const password = "Unreach-Pa55-9c1d"
	rep := check.URL(context.Background(), pgtest.DSN(pgtest.AppUser, password, port), check.Options{})
	if !check.Failed(rep.Findings) || len(rep.Findings) != 1 {
		t.Fatalf("%s", dump(rep))
	}
	wantFinding(t, rep, "connection", check.StatusFail, []string{"cannot reach 127.0.0.1:" + strconv.Itoa(port)},
		[]string{"host and port", "listens", "NetworkPolicy or firewall"})
	noPassword(t, rep, password)
}

// A wrong password, from PostgreSQL (28P01) or from PgBouncer (08P01 "password
// authentication failed"), and an unknown role: the fix names the Secret and
// ALTER ROLE; the password is nowhere.
func TestCheckURLNamesAWrongPasswordAndTheSecret(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		const password = "Wr0ng-Pa55-check-7f3a"
		rep := check.URL(context.Background(), withPassword(t, dsn, password), check.Options{})
		wantFinding(t, rep, "login", check.StatusFail, []string{"refused role " + pgtest.AppUser},
			[]string{"dislock-db", "url", "database.existingSecret", "ALTER ROLE " + pgtest.AppUser + " PASSWORD"})
		noPassword(t, rep, password)

		u, _ := url.Parse(withPassword(t, dsn, password))
		u.User = url.UserPassword("no_such_role_check", password)
		rep = check.URL(context.Background(), u.String(), check.Options{})
		wantFinding(t, rep, "login", check.StatusFail, []string{"refused role no_such_role_check"}, []string{"ALTER ROLE no_such_role_check PASSWORD"})
		noPassword(t, rep, password)
	})
}

// libpq's key=value syntax allows blanks around '=' and a backslash-escaped
// quote inside a quoted value. An operator's URL with a typo elsewhere
// (sslmode=bogus) must not have its password printed back.
func TestCheckURLNeverPrintsAKeyValuePassword(t *testing.T) {
	for _, c := range []struct{ url, secret string }{
		{`host=127.0.0.1 user=u password = S3cretPw-kv1 sslmode=bogus`, "S3cretPw-kv1"},
		{`host=127.0.0.1 user=u password= S3cretPw-kv2 sslmode=bogus`, "S3cretPw-kv2"},
		{`host=127.0.0.1 user=u password='it\'s S3cretPw-kv3' sslmode=bogus`, "S3cretPw-kv3"},
	} {
		rep := check.URL(context.Background(), c.url, check.Options{})
		if s := dump(rep) + rep.Heading(); strings.Contains(s, c.secret) {
			t.Errorf("URL %q: the report holds the password:\n%s", c.url, s)
		}
	}
}

// A database name that does not exist, on PostgreSQL (3D000) or PgBouncer
// (08P01 "no such database").
func TestCheckURLNamesAWrongDatabase(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		u, _ := url.Parse(dsn)
		u.Path = "/no_such_db_check"
		rep := check.URL(context.Background(), u.String(), check.Options{})
		wantFinding(t, rep, "database name", check.StatusFail, []string{`no database "no_such_db_check"`}, []string{"URL's path", "CREATE DATABASE"})
		noPassword(t, rep, pgtest.AppPassword)
	})
}

// A tenant role whose grant was revoked cannot claim: check tries the
// agent's own claim, fails it, and names the grant to restore. Its own
// server: the revoke would break every other tenant of a shared one.
func TestCheckURLNamesATenantsMissingGrant(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "check-grant"})
	super := storetest.RawConn(t, srv.SuperuserDSN())
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			ctx := context.Background()
			owner := storetest.Open(t, tg.DSN, 2)
			ns := storetest.Namespace(t, "grant")
			c := storetest.Provision(t, owner, ns)
			dsn := storetest.TenantDSN(t, tg.DSN, c)
			// The claim of this release's agents.
			if _, err := super.Exec(ctx, "REVOKE EXECUTE ON FUNCTION dislock.claim_unless_paused FROM "+tenant.GroupRole); err != nil {
				t.Fatal(err)
			}
			rep := check.URL(ctx, dsn, check.Options{AllowAsync: true})
			if _, err := super.Exec(ctx, "GRANT EXECUTE ON FUNCTION dislock.claim_unless_paused TO "+tenant.GroupRole); err != nil {
				t.Fatal(err)
			}
			wantFinding(t, rep, "privileges", check.StatusFail, []string{"namespace " + ns, "missing: EXECUTE on the agent's functions"},
				[]string{"GRANT EXECUTE ON FUNCTION dislock.claim_guarded, dislock.claim_unless_paused"})
			noPassword(t, rep, c.Password)

			// Without the group role, every grant is missing at once.
			if _, err := super.Exec(ctx, "REVOKE "+tenant.GroupRole+" FROM "+c.Role); err != nil {
				t.Fatal(err)
			}
			rep = check.URL(ctx, dsn, check.Options{AllowAsync: true})
			wantFinding(t, rep, "privileges", check.StatusFail, []string{"membership in role " + tenant.GroupRole},
				[]string{"GRANT " + tenant.GroupRole + " TO " + c.Role})
			noPassword(t, rep, c.Password)
			assertNoProbeRows(t, owner, ns)
		})
	}
}

// An agent also renews what it holds and writes its ledger: a tenant role
// that can claim but not renew would have every run longer than the TTL
// revoked, so check's probe renews and writes a ledger row too, and names
// the grant that is missing.
func TestCheckURLFailsATenantThatCannotRenewOrWriteItsLedger(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "check-renew"})
	super := storetest.RawConn(t, srv.SuperuserDSN())
	ctx := context.Background()
	owner := storetest.Open(t, srv.DirectDSN(), 2)
	for _, c := range []struct {
		revoke, restore, missing, fix string
	}{
		{"REVOKE EXECUTE ON FUNCTION dislock.renew FROM ", "GRANT EXECUTE ON FUNCTION dislock.renew TO ",
			"missing: EXECUTE on the agent's functions", "GRANT EXECUTE ON FUNCTION dislock.claim_guarded, dislock.claim_unless_paused, dislock.claim_window, dislock.pause_of, dislock.window_takeable, dislock.acquire_lease, dislock.renew_guarded, dislock.renew, dislock.renew_window"},

		{"REVOKE EXECUTE ON FUNCTION dislock.record_decision FROM ", "GRANT EXECUTE ON FUNCTION dislock.record_decision TO ",
			"missing: EXECUTE on the agent's functions", "dislock.record_decision TO " + tenant.GroupRole},
	} {
		t.Run(strings.Fields(c.revoke)[len(strings.Fields(c.revoke))-2], func(t *testing.T) {
			ns := storetest.Namespace(t, "renew")
			cred := storetest.Provision(t, owner, ns)
			dsn := storetest.TenantDSN(t, srv.BouncerDSN(), cred)
			if rep := check.URL(ctx, dsn, check.Options{AllowAsync: true}); !strings.Contains(fmt.Sprint(rep), "the role claims windows") {
				t.Fatalf("before the revoke the probe should pass: %+v", rep)
			}
			if _, err := super.Exec(ctx, c.revoke+tenant.GroupRole); err != nil {
				t.Fatal(err)
			}
			rep := check.URL(ctx, dsn, check.Options{AllowAsync: true})
			if _, err := super.Exec(ctx, c.restore+tenant.GroupRole); err != nil {
				t.Fatal(err)
			}
			wantFinding(t, rep, "privileges", check.StatusFail, []string{"namespace " + ns, c.missing}, []string{c.fix})
			assertNoProbeRows(t, owner, ns)
		})
	}
}

// An owner role that may not create roles cannot provision tenant roles:
// check names the path that works (the lock gateway) and the ALTER ROLE for
// the other. Without the group role it cannot even migrate: check names the
// CREATE ROLE a managed database's admin runs once.
func TestCheckURLNamesTheAccessPathsTheOwnerCanServe(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "check-owner"})
	super := storetest.RawConn(t, srv.SuperuserDSN())
	ctx := context.Background()
	storetest.Open(t, srv.DirectDSN(), 2)
	if _, err := super.Exec(ctx, "ALTER ROLE "+pgtest.AppUser+" NOCREATEROLE"); err != nil {
		t.Fatal(err)
	}
	rep := check.URL(ctx, srv.DirectDSN(), check.Options{AllowAsync: true})
	wantFinding(t, rep, "privileges", check.StatusWarn, []string{"lacks CREATEROLE", "lock gateway yes, tenant roles no"},
		[]string{"gateway.enabled", "--tenant-gateway-url", "ALTER ROLE " + pgtest.AppUser + " CREATEROLE"})
	noPassword(t, rep, pgtest.AppPassword)

	fresh := pgtest.New(t, pgtest.Options{Name: "check-owner-fresh"})
	su := storetest.RawConn(t, fresh.SuperuserDSN())
	if _, err := su.Exec(ctx, "ALTER ROLE "+pgtest.AppUser+" NOCREATEROLE"); err != nil {
		t.Fatal(err)
	}
	rep = check.URL(ctx, fresh.DirectDSN(), check.Options{AllowAsync: true})
	wantFinding(t, rep, "privileges", check.StatusFail, []string{"the group role " + tenant.GroupRole},
		[]string{"CREATE ROLE " + tenant.GroupRole + " NOLOGIN"})
}

// The URL insists on TLS and the server has none: named, with the URL
// settings and the chart's values to fix it.
func TestCheckURLNamesAServerWithoutTLS(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		rep := check.URL(context.Background(), withQuery(t, dsn, "sslmode", "require"), check.Options{})
		wantFinding(t, rep, "tls", check.StatusFail, []string{"does not support TLS"},
			[]string{"sslmode=verify-full", "sslrootcert", "database.tls.caSecret", "--database-ca-file"})
		noPassword(t, rep, pgtest.AppPassword)
	})
}

// Over TLS: verify-full is ok; require encrypts but does not verify whom
// it talks to (warn); a CA that did not sign the server's certificate fails
// the connection, named with the fix.
func TestCheckURLJudgesTLS(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "check-tls", TLS: true})
	otherCA := filepath.Join(t.TempDir(), "other-ca.crt")
	if err := os.WriteFile(otherCA, tlstest.NewCA(t).CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			ctx := context.Background()
			storetest.Open(t, tg.DSN, 2)
			rep := check.URL(ctx, tg.DSN, check.Options{AllowAsync: true})
			wantFinding(t, rep, "tls", check.StatusOK, []string{"verify-full"}, nil)

			u, _ := url.Parse(tg.DSN)
			q := u.Query()
			q.Set("sslmode", "require")
			q.Del("sslrootcert")
			u.RawQuery = q.Encode()
			rep = check.URL(ctx, u.String(), check.Options{AllowAsync: true})
			wantFinding(t, rep, "tls", check.StatusWarn, []string{"server identity not verified"}, []string{"sslmode=verify-full", "sslrootcert"})

			rep = check.URL(ctx, withQuery(t, tg.DSN, "sslrootcert", otherCA), check.Options{})
			wantFinding(t, rep, "tls", check.StatusFail, []string{"did not verify"}, []string{"sslrootcert", "database.tls.caSecret", "--database-ca-file"})
			noPassword(t, rep, pgtest.AppPassword)
		})
	}
}

// A database whose clock is an hour ahead: decisions are still right
// (they use the database clock), but CronJob controllers fire by the
// nodes' clocks, so check warns with the offset and the round trip.
func TestCheckURLWarnsOfASkewedDatabaseClock(t *testing.T) {
	env, err := pgtest.FakeClockEnv(time.Hour)
	if err != nil {
		pgtest.Missing(t, err)
	}
	srv := pgtest.New(t, pgtest.Options{Name: "check-clock", PostgresEnv: env})
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			rep := check.URL(context.Background(), tg.DSN, check.Options{AllowAsync: true})
			f := wantFinding(t, rep, "clock", check.StatusWarn, []string{"ahead of this host's", "round trip"}, []string{"NTP", "chrony"})
			if !strings.Contains(f.Detail, "1h0m") && !strings.Contains(f.Detail, "59m59") {
				t.Errorf("the detail does not say the offset is an hour: %s", f.Detail)
			}
			noPassword(t, rep, pgtest.AppPassword)
		})
	}
}

// Plain text to an address off this host: warned, with the URL settings
// that fix it. PostgreSQL here listens on loopback only, so the test
// reaches it through a TCP forwarder on this host's non-loopback address,
// which is also what a TCP proxy in front of PostgreSQL looks like: check
// still sees each connection's own backend.
func TestCheckURLWarnsOfPlainTextOffThisHost(t *testing.T) {
	srv := pgtest.Need(t)
	storetest.Open(t, srv.DirectDSN(), 2)
	ip := nonLoopbackIP(t)
	direct, _ := url.Parse(srv.DirectDSN())
	fwd := harness.Forward(t, net.JoinHostPort(ip.String(), "0"), direct.Host)
	u := *direct
	u.Host = fwd
	rep := check.URL(context.Background(), u.String(), check.Options{AllowAsync: true})
	wantFinding(t, rep, "tls", check.StatusWarn, []string{"plain text to " + ip.String()}, []string{"sslmode=verify-full", "sslrootcert"})
	wantFinding(t, rep, "pooling", check.StatusOK, []string{"directly to PostgreSQL or through a TCP proxy"}, nil)
	noPassword(t, rep, pgtest.AppPassword)
}

// nonLoopbackIP is an IPv4 address of this host off loopback. A machine
// without one cannot run the test, which then fails.
func nonLoopbackIP(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP
		}
	}
	t.Fatal("this host has no non-loopback IPv4 address to test plain text off the host with")
	return nil
}

// Agents of earlier releases renew with dislock.renew_window and
// renew_lease (schema 10), or claim and write the ledger with their own
// statements (schemas 7-9): while a cluster is not upgraded yet they still
// run, so a tenant role without those grants gets a warning naming the
// grant, though it can do all an agent of this release does.
func TestCheckURLWarnsOfATenantEarlierReleasesAgentsCouldNotUse(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "check-previous"})
	super := storetest.RawConn(t, srv.SuperuserDSN())
	ctx := context.Background()
	owner := storetest.Open(t, srv.DirectDSN(), 2)
	ns := storetest.Namespace(t, "previous")
	dsn := storetest.TenantDSN(t, srv.BouncerDSN(), storetest.Provision(t, owner, ns))
	for _, c := range []struct{ grant, on, missing, fix string }{
		// Agents of schema 10 renew with renew_window and renew_lease.
		{"EXECUTE", "FUNCTION dislock.renew_lease", "missing: EXECUTE on the agent's functions", "dislock.renew_lease"},
		// Agents of schemas 7-9 claim and write the ledger with their own
		// statements, under row-level security.
		{"INSERT", "dislock.windows", "missing: INSERT on dislock.windows", "GRANT INSERT ON dislock.windows TO " + tenant.GroupRole},
		{"INSERT", "dislock.decisions", "missing: INSERT on the ledger", "GRANT SELECT, INSERT ON dislock.decisions, dislock.decision_counts, dislock.key_stats TO " + tenant.GroupRole},
	} {
		t.Run(c.grant+" on "+c.on, func(t *testing.T) {
			if _, err := super.Exec(ctx, "REVOKE "+c.grant+" ON "+c.on+" FROM "+tenant.GroupRole); err != nil {
				t.Fatal(err)
			}
			rep := check.URL(ctx, dsn, check.Options{AllowAsync: true})
			if _, err := super.Exec(ctx, "GRANT "+c.grant+" ON "+c.on+" TO "+tenant.GroupRole); err != nil {
				t.Fatal(err)
			}
			wantFinding(t, rep, "privileges", check.StatusWarn, []string{"agents of earlier releases", c.missing}, []string{c.fix})
			assertNoProbeRows(t, owner, ns)
		})
	}
}
