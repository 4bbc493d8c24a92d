package pgtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) {
	os.Exit(Main(m, Options{Name: "pgtest"}))
}

// query runs sql with psql against dsn and returns its unaligned output.
func query(t *testing.T, s *Server, dsn, sql string) (string, error) {
	t.Helper()
	out, err := s.run(s.bin.psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", sql)
	return strings.TrimSpace(out), err
}

func mustQuery(t *testing.T, s *Server, dsn, sql string) string {
	t.Helper()
	out, err := query(t, s, dsn, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}

// selectOneWithin connects to dsn and runs a query, giving up after d.
func selectOneWithin(dsn string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	conn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var one int
	return conn.QueryRow(ctx, "select 1").Scan(&one)
}

// connect opens a pgx connection that works through transaction pooling:
// named prepared statements do not survive it in PgBouncer 1.18.
func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	return pgx.ConnectConfig(ctx, cfg)
}

// processAlive reports whether pid is a live process; a zombie (exited, not
// yet reaped by its new parent) counts as gone.
func processAlive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

func TestTargetsAuthenticateWithSCRAMAsTheirRoles(t *testing.T) {
	t.Parallel()
	s := Need(t)
	cases := []struct {
		name    string
		dsn     string
		sql     string
		want    string
		wantErr bool
	}{
		{name: "direct connects as the application role", dsn: s.Targets()[0].DSN,
			sql: "select current_user || ' ' || current_database()", want: "dislock dislock"},
		{name: "pgbouncer connects as the application role", dsn: s.Targets()[1].DSN,
			sql: "select current_user || ' ' || current_database()", want: "dislock dislock"},
		{name: "superuser connects directly as postgres", dsn: s.SuperuserDSN(),
			sql: "select current_user || ' ' || current_database()", want: "postgres dislock"},
		{name: "the application role owns the database and has a SCRAM password", dsn: s.SuperuserDSN(),
			sql: "select pg_get_userbyid(datdba) || ' ' || (select left(rolpassword, 13) from pg_authid where rolname = 'dislock')" +
				" from pg_database where datname = 'dislock'",
			want: "dislock SCRAM-SHA-256"},
		{name: "direct refuses a wrong password", dsn: DSN(AppUser, "wrong", s.pgPort), sql: "select 1", wantErr: true},
		{name: "pgbouncer refuses a wrong password", dsn: DSN(AppUser, "wrong", s.bouncerPort), sql: "select 1", wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := query(t, s, tc.dsn, tc.sql)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("query succeeded with %q, want an authentication error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// A role created after PgBouncer started (as dislock creates a namespace's
// role) logs in through it without a reload: PgBouncer looks it up with
// auth_query. A wrong password still fails, and so does a role that was
// dropped.
func TestBouncerLogsInRolesCreatedAfterItStarted(t *testing.T) {
	t.Parallel()
	s := Need(t)
	mustQuery(t, s, s.DirectDSN(), "CREATE ROLE pgtest_late LOGIN PASSWORD 'late-secret'")
	if got := mustQuery(t, s, DSN("pgtest_late", "late-secret", s.bouncerPort), "select current_user"); got != "pgtest_late" {
		t.Errorf("logged in as %q", got)
	}
	if _, err := query(t, s, DSN("pgtest_late", "wrong", s.bouncerPort), "select 1"); err == nil {
		t.Error("a wrong password logged in")
	}
	mustQuery(t, s, s.DirectDSN(), "DROP ROLE pgtest_late")
	if _, err := query(t, s, DSN("pgtest_late", "late-secret", s.bouncerPort), "select 1"); err == nil {
		t.Error("a dropped role logged in")
	}
}

func TestTargetsAreDirectThenPgbouncer(t *testing.T) {
	t.Parallel()
	s := Need(t)
	got := s.Targets()
	want := []Target{
		{Name: "direct", DSN: "postgres://dislock:dislock-secret@127.0.0.1:" + strconv.Itoa(s.pgPort) + "/dislock?sslmode=disable"},
		{Name: "pgbouncer", DSN: "postgres://dislock:dislock-secret@127.0.0.1:" + strconv.Itoa(s.bouncerPort) + "/dislock?sslmode=disable"},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Targets() = %+v, want %+v", got, want)
	}
	if s.pgPort == s.bouncerPort {
		t.Errorf("postgres and pgbouncer share port %d", s.pgPort)
	}
}

// In session pooling a client keeps its server connection until it
// disconnects, so with default_pool_size=20 the 21st connected client could not
// run a query. In transaction pooling it can: clients hold a server connection
// only while a transaction runs.
func TestBouncerPoolsPerTransaction(t *testing.T) {
	t.Parallel()
	s := Need(t)
	const clients = 2*20 + 1

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range clients {
		conn, err := connect(ctx, s.BouncerDSN())
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		defer conn.Close(context.Background())
		qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
		var got int
		err = conn.QueryRow(qctx, "select $1::int", i).Scan(&got)
		qcancel()
		if err != nil {
			t.Fatalf("client %d of %d (all still connected) could not run a query: %v", i+1, clients, err)
		}
		if got != i {
			t.Fatalf("client %d: got %d", i, got)
		}
	}

	t.Run("admin console reports pool_mode transaction", func(t *testing.T) {
		admin := strings.Replace(DSN(Superuser, SuperuserPassword, s.bouncerPort), "/"+Database+"?", "/pgbouncer?", 1)
		out := mustQuery(t, s, admin, "SHOW CONFIG")
		for _, line := range strings.Split(out, "\n") {
			if key, rest, _ := strings.Cut(line, "|"); key == "pool_mode" {
				if value, _, _ := strings.Cut(rest, "|"); value != "transaction" {
					t.Errorf("pool_mode = %q, want transaction", value)
				}
				return
			}
		}
		t.Errorf("SHOW CONFIG has no pool_mode row:\n%s", out)
	})
}

func TestStopPostgresRejectsUnknownMode(t *testing.T) {
	t.Parallel()
	s := Need(t)
	if err := s.StopPostgres("sudden"); err == nil {
		t.Fatal("StopPostgres(\"sudden\") succeeded, want an error")
	}
	mustQuery(t, s, s.DirectDSN(), "select 1")
}

func TestCrashAndRestartKeepCommittedRows(t *testing.T) {
	t.Parallel()
	s := New(t, Options{Name: "crash"})
	mustQuery(t, s, s.DirectDSN(), "create table crash_probe (id int primary key)")
	mustQuery(t, s, s.BouncerDSN(), "insert into crash_probe select generate_series(1, 100)")
	crashed, ok := PostmasterPID(s.dataDir())
	if !ok {
		t.Fatal("no postmaster.pid while postgres runs")
	}

	if err := s.StopPostgres("immediate"); err != nil {
		t.Fatal(err)
	}
	if processAlive(crashed) {
		t.Errorf("postmaster %d still alive after StopPostgres", crashed)
	}
	if err := dial(s.pgPort); err == nil {
		t.Error("postgres port accepts connections after StopPostgres")
	}
	// pgbouncer queues the query rather than failing it: hence the deadline.
	for _, target := range s.Targets() {
		if err := selectOneWithin(target.DSN, 2*time.Second); err == nil {
			t.Errorf("%s: query succeeded while postgres is down", target.Name)
		}
	}
	if err := s.StopPostgres("immediate"); err != nil {
		t.Errorf("stopping a stopped postgres: %v", err)
	}

	if err := s.StartPostgres(); err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(s.path("postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "automatic recovery in progress") {
		t.Errorf("postgres.log shows no crash recovery, so the stop was not a crash:\n%s", log)
	}
	for _, target := range s.Targets() {
		if got := mustQuery(t, s, target.DSN, "select count(*) from crash_probe"); got != "100" {
			t.Errorf("%s: %s rows after the crash, want 100", target.Name, got)
		}
	}
}

func TestStopBouncerRefusesConnectionsUntilStartBouncer(t *testing.T) {
	t.Parallel()
	s := New(t, Options{Name: "bouncer"})

	if err := s.StopBouncer(); err != nil {
		t.Fatal(err)
	}
	if err := dial(s.bouncerPort); err == nil {
		t.Error("pgbouncer port accepts connections after StopBouncer")
	}
	if out, err := query(t, s, s.BouncerDSN(), "select 1"); err == nil {
		t.Errorf("query through a stopped pgbouncer succeeded: %q", out)
	}
	mustQuery(t, s, s.DirectDSN(), "select 1")
	if err := s.StopBouncer(); err != nil {
		t.Errorf("stopping a stopped pgbouncer: %v", err)
	}

	if err := s.StartBouncer(); err != nil {
		t.Fatal(err)
	}
	if got := mustQuery(t, s, s.BouncerDSN(), "select 1"); got != "1" {
		t.Errorf("got %q, want 1", got)
	}
	if err := s.StartBouncer(); err != nil {
		t.Errorf("starting a running pgbouncer: %v", err)
	}
}

func TestAddedBouncerPausesStopsAndRestartsOnItsOwn(t *testing.T) {
	t.Parallel()
	s := Need(t)
	b, err := s.AddBouncer("smoke")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddBouncer("smoke"); err == nil {
		t.Error("a second bouncer with the same name was added")
	}
	if err := selectOneWithin(b.DSN(), 5*time.Second); err != nil {
		t.Fatalf("query through the added bouncer: %v", err)
	}

	if err := b.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := selectOneWithin(b.DSN(), 500*time.Millisecond); err == nil {
		t.Error("query through a paused bouncer succeeded")
	}
	if err := selectOneWithin(s.BouncerDSN(), 5*time.Second); err != nil {
		t.Errorf("the server's own bouncer stopped answering while another was paused: %v", err)
	}
	if err := b.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := selectOneWithin(b.DSN(), 5*time.Second); err != nil {
		t.Errorf("query after Resume: %v", err)
	}

	if err := b.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(); err != nil {
		t.Fatalf("stopping a paused bouncer: %v", err)
	}
	if err := dial(b.port); err == nil {
		t.Error("the stopped bouncer's port accepts connections")
	}
	if err := b.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := selectOneWithin(b.DSN(), 5*time.Second); err != nil {
		t.Errorf("query after Restart: %v", err)
	}
}

func TestCloseAfterCrashStopsEverythingAndRemovesTheDirectory(t *testing.T) {
	t.Parallel()
	s, err := Start(Options{Name: "close", Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	postmaster, _ := PostmasterPID(s.dataDir())
	bouncer := s.bouncer.Process.Pid
	if err := s.StopPostgres("immediate"); err != nil {
		t.Fatal(err)
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := os.Stat(s.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists (stat: %v)", s.dir, err)
	}
	for name, pid := range map[string]int{"postmaster": postmaster, "pgbouncer": bouncer} {
		if processAlive(pid) {
			t.Errorf("%s (pid %d) still alive after Close", name, pid)
		}
	}
	for _, port := range []int{s.pgPort, s.bouncerPort} {
		if dial(port) == nil {
			t.Errorf("port %d accepts connections after Close", port)
		}
	}
	if err := s.StartPostgres(); !errors.Is(err, errClosed) {
		t.Errorf("StartPostgres after Close = %v, want %v", err, errClosed)
	}
}

// The watchdog stands in for Close when the test process dies without calling
// it; losing its lifeline is what the process's death looks like to it.
func TestWatchdogStopsAnAbandonedServer(t *testing.T) {
	t.Parallel()
	s, err := Start(Options{Name: "abandoned", Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	postmaster, _ := PostmasterPID(s.dataDir())
	bouncer := s.bouncer.Process.Pid

	s.wd.Abandon()
	err = retry(func() error {
		if _, err := os.Stat(s.dir); err == nil {
			return errors.New(s.dir + " still exists")
		}
		if processAlive(postmaster) {
			return errors.New("postmaster still alive")
		}
		if processAlive(bouncer) {
			return errors.New("pgbouncer still alive")
		}
		return nil
	})
	if err != nil {
		t.Errorf("watchdog did not clean up: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close after the watchdog cleaned up: %v", err)
	}
}

func TestLookupBinaries(t *testing.T) {
	t.Parallel()
	noPath := func(name string) (string, error) { return "", errors.New("not on PATH") }
	pgTools := []string{"initdb", "pg_ctl", "postgres", "psql", "pgbench"}

	cases := []struct {
		name string
		// files to create as executables, relative to a temp root.
		files       []string
		wantInitdb  string
		wantPgbench string
		// wantErr lists substrings of the error; nil means success.
		wantErr []string
	}{
		{
			name:        "the newest PostgreSQL with initdb wins and pgbouncer comes from sbin",
			files:       append(append(prefixed("pg/9.6/bin/", pgTools), prefixed("pg/16/bin/", pgTools)...), "pg/17/bin/psql", "sbin/pgbouncer"),
			wantInitdb:  "pg/16/bin/initdb",
			wantPgbench: "pg/16/bin/pgbench",
		},
		{
			name:       "pgbench is optional",
			files:      append(prefixed("pg/15/bin/", pgTools[:4]), "sbin/pgbouncer"),
			wantInitdb: "pg/15/bin/initdb",
		},
		{
			name:    "a missing pgbouncer names its apt package",
			files:   prefixed("pg/15/bin/", pgTools),
			wantErr: []string{"pgbouncer (apt package pgbouncer)", "apt-get install -y pgbouncer"},
		},
		{
			name: "nothing installed names every package once",
			wantErr: []string{"initdb (apt package postgresql)", "psql (apt package postgresql-client)",
				"apt-get install -y postgresql postgresql-client pgbouncer"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			for _, f := range tc.files {
				p := filepath.Join(root, f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			dirs, err := filepath.Glob(filepath.Join(root, "pg/*/bin"))
			if err != nil {
				t.Fatal(err)
			}
			got, err := lookupBinaries(newestFirst(dirs), []string{filepath.Join(root, "sbin")}, noPath)
			if tc.wantErr != nil {
				if !errors.Is(err, ErrMissingBinary) {
					t.Fatalf("err = %v, want ErrMissingBinary", err)
				}
				for _, want := range tc.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not mention %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(root, tc.wantInitdb); got.initdb != want {
				t.Errorf("initdb = %q, want %q", got.initdb, want)
			}
			wantPgbench := ""
			if tc.wantPgbench != "" {
				wantPgbench = filepath.Join(root, tc.wantPgbench)
			}
			if got.pgbench != wantPgbench {
				t.Errorf("pgbench = %q, want %q", got.pgbench, wantPgbench)
			}
		})
	}
}

func prefixed(prefix string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = prefix + n
	}
	return out
}

func TestNewestFirstOrdersVersionsNumerically(t *testing.T) {
	t.Parallel()
	got := newestFirst([]string{"/p/9.6/bin", "/p/15/bin", "/p/devel/bin", "/p/16/bin", "/p/10/bin"})
	want := []string{"/p/16/bin", "/p/15/bin", "/p/10/bin", "/p/9.6/bin", "/p/devel/bin"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestDirLabel(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, in, want string }{
		{"empty becomes pg", "", "pg"},
		{"simple names pass through", "crash", "crash"},
		{"unsafe characters become dashes", "Lock/Agent test", "lock-agent-test"},
		{"long names are cut to 20 bytes", strings.Repeat("x", 40), strings.Repeat("x", 20)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := dirLabel(tc.in); got != tc.want {
				t.Errorf("dirLabel(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
