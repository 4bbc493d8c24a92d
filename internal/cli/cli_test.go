package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/internal/cli"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, pgtest.Options{Name: "cli"})) }

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cli.Main(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestWindowsTellWhichClusterRanWhichTick(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			if code, out, errOut := run(t, "migrate", "--database-url", tg.DSN); code != 0 || !strings.Contains(out, "schema dislock") {
				t.Fatalf("migrate: %d %q %q", code, out, errOut)
			}
			if code, out, _ := run(t, "migrate", "--database-url", tg.DSN, "-o", "json"); code != 0 || !strings.Contains(out, `"applied": []`) {
				t.Fatalf("second migrate applied something: %d %s", code, out)
			}
			s, err := store.Open(context.Background(), tg.DSN, store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			key := "cli-" + tg.Name + "/report"
			tick := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
			a := store.Owner{Cluster: "dc-a", Namespace: "cli-" + tg.Name, Job: "report-1", JobUID: "u1", Pod: "p1"}
			b := store.Owner{Cluster: "dc-b", Namespace: "cli-" + tg.Name, Job: "report-1", JobUID: "u2", Pod: "p2"}
			c, err := s.ClaimWindow(context.Background(), store.ClaimRequest{Key: key, Window: tick, Index: store.NotIndexed, Owner: a, TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			code := 0
			if _, err := s.Finish(context.Background(), key, tick, store.NotIndexed, c.Window.Token, store.StateSucceeded, &code); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ClaimWindow(context.Background(), store.ClaimRequest{Key: key, Window: tick.Add(time.Minute), Index: store.NotIndexed, Owner: b, TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}

			code, out, errOut := run(t, "windows", "--database-url", tg.DSN, "--key", key)
			if code != 0 {
				t.Fatalf("windows: %d %s", code, errOut)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 3 || !strings.HasPrefix(lines[0], "KEY") {
				t.Fatalf("windows table:\n%s", out)
			}
			// Newest first: dc-b is running the 12:01 tick, dc-a ran 12:00 and succeeded.
			for i, want := range [][]string{{"2026-12-02T12:01:00Z", "running", "dc-b", "so far"}, {"2026-12-02T12:00:00Z", "succeeded", "dc-a", " 0 "}} {
				for _, w := range want {
					if !strings.Contains(lines[i+1], w) {
						t.Errorf("row %d %q lacks %q", i+1, lines[i+1], w)
					}
				}
			}

			_, out, _ = run(t, "windows", "--database-url", tg.DSN, "--key", key, "-o", "json", "--limit", "1")
			var rows []store.Window
			if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 1 || rows[0].Cluster != "dc-b" {
				t.Fatalf("json windows: %v %+v\n%s", err, rows, out)
			}

			// The two clusters' CronJobs differ in time zone: the table warns.
			for cluster, tz := range map[string]string{"dc-a": "Europe/Berlin", "dc-b": ""} {
				if _, err := s.RecordView(context.Background(), key, cluster, store.View{Schedule: "0 2 * * *", TimeZone: tz, Mode: "schedule", LeaseTTL: "30s"}, time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			_, out, _ = run(t, "windows", "--database-url", tg.DSN, "--key", key)
			if !strings.Contains(out, "WARNING clusters disagree about "+key) || !strings.Contains(out, `dc-a: schedule "0 2 * * *" timeZone "Europe/Berlin"`) {
				t.Fatalf("windows table does not warn about the clusters' time zones:\n%s", out)
			}

			// An operator deletes the 12:00 window: the next claim runs it again.
			if code, out, errOut := run(t, "release", "--database-url", tg.DSN, "--key", key, "--window", "2026-12-02T12:00:00Z"); code != 0 || !strings.Contains(out, "runs it again") {
				t.Fatalf("release window: %d %q %q", code, out, errOut)
			}
			if got, err := s.ClaimWindow(context.Background(), store.ClaimRequest{Key: key, Window: tick, Index: store.NotIndexed, Owner: b, TTL: time.Minute}); err != nil || got.Outcome != store.Claimed {
				t.Fatalf("claim after release: %+v %v", got, err)
			}
		})
	}
}

func TestLeasesShowHolderAndReleaseExpiresIt(t *testing.T) {
	srv := pgtest.Need(t)
	dsn := srv.BouncerDSN()
	if code, _, errOut := run(t, "migrate", "--database-url", dsn); code != 0 {
		t.Fatal(errOut)
	}
	s, err := store.Open(context.Background(), dsn, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := store.Owner{Cluster: "dc-a", Namespace: "leases", Job: "sync-1", JobUID: "u1", Pod: "p1"}
	if _, err := s.AcquireLease(context.Background(), "leases/sync", a, time.Hour); err != nil {
		t.Fatal(err)
	}
	_, out, _ := run(t, "leases", "--database-url", dsn)
	if !strings.Contains(out, "leases/sync") || !strings.Contains(out, "held") || !strings.Contains(out, a.LeaseOwner()) {
		t.Fatalf("leases:\n%s", out)
	}
	if code, _, errOut := run(t, "release", "--database-url", dsn, "--key", "leases/sync"); code != 0 {
		t.Fatalf("release: %s", errOut)
	}
	_, out, _ = run(t, "leases", "--database-url", dsn, "-o", "json")
	var leases []struct {
		Key  string `json:"key"`
		Live bool   `json:"live"`
	}
	if err := json.Unmarshal([]byte(out), &leases); err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		if l.Key == "leases/sync" && l.Live {
			t.Fatalf("lease still live after release: %s", out)
		}
	}
	if code, _, errOut := run(t, "release", "--database-url", dsn, "--key", "leases/sync"); code != 1 || !strings.Contains(errOut, "not found") {
		t.Fatalf("releasing a free lease: %d %q", code, errOut)
	}
}

func TestBadInvocationsSayWhatIsWrong(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		want     string
		password string
	}{
		{"unknown command", []string{"windowz"}, 2, `unknown command "windowz"`, ""},
		{"bad output format", []string{"windows", "-o", "xml"}, 2, `-o "xml" is not a format of dislock windows (want table, wide, json or yaml)`, ""},
		{"a format another command has", []string{"leases", "-o", "yaml"}, 2, `-o "yaml" is not a format of dislock leases (want table or json)`, ""},
		{"wide is for windows only", []string{"missed", "-o", "wide"}, 2, `-o "wide" is not a format of dislock missed (want table, json or yaml)`, ""},
		{"key without namespace", []string{"windows", "--key", "report", "--database-url", "postgres://u:pw-9x7@127.0.0.1:1/d"}, 2, "not <namespace>/<name>", "pw-9x7"},
		{"release needs a key", []string{"release", "--database-url", "postgres://u:p@h/d"}, 2, "--key is required", ""},
		{"bad window time", []string{"release", "--key", "a/b", "--window", "noon", "--database-url", "postgres://u:p@h/d"}, 2, "not an RFC 3339 time", ""},
		{"no database URL", []string{"windows", "--database-url", ""}, 1, "DISLOCK_DATABASE_URL", ""},
		{"bad database URL", []string{"leases", "--database-url", "postgres://u:pw-9x7@h:port/d"}, 1, "invalid database URL", "pw-9x7"},
		{"unreachable database", []string{"leases", "--database-url", "postgres://u:pw-9x7@127.0.0.1:1/d?connect_timeout=2"}, 1, "127.0.0.1:1", "pw-9x7"},
		{"stray argument", []string{"leases", "extra"}, 2, `unexpected argument "extra"`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, errOut := run(t, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", code, errOut, tc.code, tc.want)
			}
			if tc.password != "" && strings.Contains(errOut, tc.password) {
				t.Fatalf("stderr echoes the password: %q", errOut)
			}
		})
	}
}

// dislock check exits non-zero on a database a failover can lose claims on,
// says which setting and how to fix it, and passes once the operator
// explicitly accepts the risk; migrate succeeds but repeats the warning.
func TestCheckNamesTheSettingAndTheFix(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			code, out, errOut := run(t, "migrate", "--database-url", tg.DSN)
			if code != 0 || !strings.Contains(out, "synchronous_standby_names is empty") {
				t.Fatalf("migrate: exit %d, stdout %q, stderr %q: want success with the replication warning", code, out, errOut)
			}
			code, out, errOut = run(t, "check", "--database-url", tg.DSN)
			if code != 3 || !strings.Contains(out, "fail  replication") || !strings.Contains(out, "fix: make replication synchronous") ||
				!strings.Contains(errOut, "found problems") {
				t.Fatalf("check: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			for _, ok := range []string{"ok    primary", "ok    schema", "ok    tokens", "ok    synchronous_commit"} {
				if !strings.Contains(out, ok) {
					t.Errorf("check output lacks %q:\n%s", ok, out)
				}
			}
			code, out, errOut = run(t, "check", "--database-url", tg.DSN, "--allow-async-replication", "-o", "json")
			var findings []check.Finding
			if err := json.Unmarshal([]byte(out), &findings); code != 0 || err != nil {
				t.Fatalf("check --allow-async-replication: exit %d, %v, stdout %q, stderr %q", code, err, out, errOut)
			}
			for _, f := range findings {
				if f.Check == "replication" && f.Status != check.StatusAccepted {
					t.Errorf("replication with the acknowledgement: %+v", f)
				}
			}
		})
	}
}

// What tenants wrote into their own rows reaches an operator's terminal
// quoted, never raw: a newline in a tenant's cluster name cannot print a
// forged line saying another namespace's window ran, nor a tab or an escape
// sequence shift or hide columns.
func TestATenantsRowsCannotForgeLinesOfTheOperatorsListing(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			ctx := context.Background()
			if code, _, errOut := run(t, "migrate", "--database-url", tg.DSN); code != 0 {
				t.Fatal(errOut)
			}
			owner, err := store.Open(ctx, tg.DSN, store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer owner.Close()
			victim, hostile := "victim-"+tg.Name, "hostile-"+tg.Name
			tick := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
			if _, err := owner.ClaimWindow(ctx, store.ClaimRequest{Key: victim + "/report", Window: tick, Index: store.NotIndexed, TTL: time.Minute,
				Owner: store.Owner{Cluster: "dc-a", Namespace: victim, Job: "report-1", JobUID: "u1", Pod: "p1"}}); err != nil {
				t.Fatal(err)
			}
			cred, err := tenant.Provision(ctx, owner, "dc-a", hostile)
			if err != nil {
				t.Fatal(err)
			}
			tenantURL, err := tenant.DSN(tg.DSN, cred)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := store.ParseDatabaseURL(tenantURL)
			if err != nil {
				t.Fatal(err)
			}
			tenant, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
			if err != nil {
				t.Fatal(err)
			}
			defer tenant.Close(ctx)
			forged := victim + "/report  2026-12-02T13:00:00Z  -  succeeded  dc-b  42"
			cluster := "dc-a\n" + forged + "\t\x1b[2K"
			// Its own key, any cluster name it likes: the database lets a
			// tenant write that, with SQL of its own.
			if _, err := tenant.Exec(ctx, `INSERT INTO dislock.windows (lock_key, window_start, job_index, owner, cluster, pod, token, state, claimed_at, alive_until)
VALUES ($1, $2, -1, $3, $3, 'p9', 1, 'failed', now(), now())`, hostile+"/x", tick, cluster); err != nil {
				t.Fatalf("the tenant writing its own window: %v", err)
			}
			code, out, errOut := run(t, "windows", "--database-url", tg.DSN)
			if code != 0 {
				t.Fatalf("windows: %d %s", code, errOut)
			}
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, forged) || strings.ContainsAny(l, "\t\x1b") {
					t.Errorf("the listing printed a tenant's bytes raw: %q", l)
				}
			}
			if !strings.Contains(out, strconv.Quote(cluster)) {
				t.Errorf("the tenant's cluster name is not shown quoted:\n%s", out)
			}
		})
	}
}
