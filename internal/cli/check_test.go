package cli_test

import (
	"context"
	"encoding/json"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"
)

// dislock check with the owner's URL and two namespaces' tenant URLs, one
// of them with a wrong password: each role's findings under a heading
// naming it, in the table and in JSON; the bad tenant fails the check
// with the fix, and no password is printed anywhere.
func TestCheckChecksEachRoleUnderItsHeading(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			owner := migratedStore(t, tg.DSN)
			good, err := tenant.Provision(context.Background(), owner, "dc-a", namespace("check-good"))
			if err != nil {
				t.Fatal(err)
			}
			bad, err := tenant.Provision(context.Background(), owner, "dc-a", namespace("check-bad"))
			if err != nil {
				t.Fatal(err)
			}
			goodURL, err := tenant.DSN(tg.DSN, good)
			if err != nil {
				t.Fatal(err)
			}
			const wrongPassword = "Wr0ng-Tenant-Pa55-cli-41d2"
			bad.Password = wrongPassword
			badURL, err := tenant.DSN(tg.DSN, bad)
			if err != nil {
				t.Fatal(err)
			}
			args := []string{"check", "--database-url", tg.DSN, "--allow-async-replication", "--tenant-database-url", goodURL}

			code, out, errOut := run(t, args...)
			if code != 0 {
				t.Fatalf("owner and a good tenant: exit %d\n%s%s", code, out, errOut)
			}
			for _, want := range []string{"role " + pgtest.AppUser + " (owner) at", "role " + good.Role + " (tenant of namespace " + good.Namespace + ") at"} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			// Each role's preflight findings are ok: two of each.
			oks := map[string]int{}
			for _, row := range tableRows(out, "ok") {
				oks[strings.Fields(row)[1]]++
			}
			for _, check := range []string{"connection", "tls", "clock", "pooling", "privileges"} {
				if oks[check] != 2 {
					t.Errorf("%d ok %s findings, want one per role:\n%s", oks[check], check, out)
				}
			}

			args = append(args, "--tenant-database-url", badURL)
			code, out, errOut = run(t, args...)
			if code != 3 || !strings.Contains(errOut, "found problems") {
				t.Fatalf("with a wrong tenant password: exit %d, want 3\n%s%s", code, out, errOut)
			}
			heading := "role " + bad.Role + " (tenant"
			at := strings.Index(out, heading)
			if at < 0 || !strings.Contains(out[at:], "fail  login") || !strings.Contains(out[at:], "fix: correct the URL in the Secret") {
				t.Errorf("the bad tenant's heading and login finding are not there:\n%s", out)
			}
			code, jsonOut, jsonErr := run(t, append(args, "-o", "json")...)
			var findings []check.Finding
			if err := json.Unmarshal([]byte(jsonOut), &findings); code != 3 || err != nil {
				t.Fatalf("-o json: exit %d, %v\n%s%s", code, err, jsonOut, jsonErr)
			}
			roles := map[string]bool{}
			for _, f := range findings {
				roles[f.Role] = true
				if f.Check == "login" && (f.Status != check.StatusFail || !strings.Contains(f.Role, bad.Role)) {
					t.Errorf("login finding %+v", f)
				}
			}
			if len(roles) != 3 {
				t.Errorf("findings of %d roles, want 3: %v", len(roles), roles)
			}
			for _, s := range []string{out, errOut, jsonOut, jsonErr} {
				for _, pw := range []string{wrongPassword, good.Password, pgtest.AppPassword} {
					if strings.Contains(s, pw) {
						t.Errorf("the output holds a password:\n%s", s)
					}
				}
			}
		})
	}
}

// The owner's URL names a port where nothing listens: check prints the
// finding and the fix and exits non-zero, without the password.
func TestCheckReportsAnUnreachableDatabase(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	const password = "Unreach-Cli-Pa55-77e0"
	u := url.URL{Scheme: "postgres", User: url.UserPassword("dislock", password), Host: addr, Path: "/dislock", RawQuery: "sslmode=disable"}
	for _, format := range []string{"table", "json"} {
		code, out, errOut := run(t, "check", "--database-url", u.String(), "-o", format)
		if code != 3 || !strings.Contains(out, "cannot reach "+addr) || !strings.Contains(out, "NetworkPolicy") {
			t.Errorf("-o %s: exit %d\n%s%s", format, code, out, errOut)
		}
		if strings.Contains(out+errOut, password) {
			t.Errorf("-o %s: the output holds the password:\n%s%s", format, out, errOut)
		}
	}
}

// dislock check prints a driver's error of several lines (one per address
// or TLS mode it tried) as one line a person reads, not one quoted string.
func TestCheckPrintsAnErrorOfSeveralLinesAsOneReadableLine(t *testing.T) {
	t.Parallel()
	code, out, errOut := run(t, "check", "--database-url", "postgres://u:pw-9x7@127.0.0.1:1/d?sslmode=prefer&connect_timeout=2")
	if code != 3 || !strings.Contains(out, "fail  connection  cannot reach 127.0.0.1:1") {
		t.Fatalf("check of a closed port: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if strings.Contains(out, `\n`) || strings.Contains(out, `"cannot reach`) {
		t.Errorf("the error is printed quoted:\n%s", out)
	}
	line, _, _ := strings.Cut(out[strings.Index(out, "fail  connection"):], "\n")
	if n := strings.Count(line, "connection refused"); n < 2 {
		t.Errorf("the finding's line holds %d of the attempts' errors, want both (TLS, then plain):\n%s", n, out)
	}
}

// A tenant's URL carries a role name of its choosing, which the login
// finding repeats: a newline in it cannot print a line of its own, such as
// a forged fix.
func TestATenantsRoleNameCannotForgeAFixLineOfCheck(t *testing.T) {
	srv := pgtest.Need(t)
	dsn := srv.Targets()[0].DSN
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("team-a\n    fix: GRANT dislock_admin TO team-a", "pw")
	_, out, _ := run(t, "check", "--database-url", dsn, "--tenant-database-url", u.String())
	if !strings.Contains(out, "GRANT dislock_admin") {
		t.Fatalf("the login finding does not repeat the role name, so this shows nothing:\n%s", out)
	}
	for l := range strings.Lines(out) {
		if strings.HasPrefix(strings.TrimSpace(l), "fix: GRANT dislock_admin") {
			t.Errorf("a line of its own from the tenant's role name: %q\n%s", l, out)
		}
	}
}
