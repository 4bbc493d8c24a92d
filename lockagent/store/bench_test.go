package store_test

import (
	"bufio"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/test/benchmark"
	"github.com/dislock/dislock/test/benchscale"
	"github.com/dislock/dislock/test/pgtest"
)

// The benchmarks measure through PgBouncer (what users run) at 1 and 8
// concurrent clients. Baselines in the same run: a bare SELECT 1 round trip,
// and pgbench executing the identical claim and lease statements, which is the
// database's own price for a durable write.
var benchClients = []int{1, 8}

// BenchmarkSelect1 is the round-trip floor: the same pool and exec mode, no work.
func BenchmarkSelect1(b *testing.B) {
	srv := pgtest.Need(b)
	for _, clients := range benchClients {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			cfg, err := store.ParseDatabaseURL(srv.BouncerDSN())
			if err != nil {
				b.Fatal(err)
			}
			cfg.MaxConns = int32(clients)
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
			measure(b, clients, func(ctx context.Context, _ int64) error {
				var one int
				return pool.QueryRow(ctx, "SELECT 1").Scan(&one)
			})
		})
	}
}

func BenchmarkClaimWindow(b *testing.B) {
	srv := pgtest.Need(b)
	for _, clients := range benchClients {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			s := storetest.Open(b, srv.BouncerDSN(), int32(clients))
			key := storetest.UniqueKey(b)
			o := storetest.Owner("dc-a", "job", "pod")
			measure(b, clients, func(ctx context.Context, i int64) error {
				_, err := s.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: storetest.WindowAt(0).Add(time.Duration(i) * time.Minute), Index: store.NotIndexed, Owner: o, TTL: ttl})
				return err
			})
		})
	}
}

func BenchmarkAcquireLease(b *testing.B) {
	srv := pgtest.Need(b)
	for _, clients := range benchClients {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			s := storetest.Open(b, srv.BouncerDSN(), int32(clients))
			prefix := storetest.UniqueKey(b)
			o := storetest.Owner("dc-a", "job", "pod")
			measure(b, clients, func(ctx context.Context, i int64) error {
				_, err := s.AcquireLease(ctx, prefix+strconv.FormatInt(i, 10), o, ttl)
				return err
			})
		})
	}
}

// pgbenchBaseline is one of the Store's statements as pgbench runs it
// (extended protocol, unnamed statements: the same wire shape as the
// Store), through the same PgBouncer: what the statement costs the
// database, without the Store's client.
type pgbenchBaseline struct {
	query   string
	prelude string // pgbench \set lines
	// args binds the statement's parameters for keys starting with prefix.
	args func(prefix string) []string
	// written counts the rows a run wrote for keys starting with $1 (empty
	// when the statement writes none).
	written string
}

// pgbenchBaselines are the benchmarks' baselines, by name.
// TestPgbenchBaselinesRunTheStoresStatements runs each, so that a
// statement cannot change without its baseline.
var pgbenchBaselines = map[string]pgbenchBaseline{
	"ClaimWindow": {
		query:   store.ClaimWindowSQL,
		prelude: "\\set w random(1, 1000000000000)\n",
		args: func(prefix string) []string {
			return []string{"'" + prefix + "claim'", "'2026-01-01T00:00:00Z'::timestamptz + :w * interval '1 second'", "-1",
				"'dc-a/ns/job/uid/pod'", "'dc-a'", "'pod'", "30000000", "'dc-a/ns/job/uid/'", "false",
				`'{"schedule":"0 * * * *","mode":"schedule"}'`, "604800000000", "21600000000", "NULL"}
		},
		written: `SELECT count(*) FROM dislock.windows WHERE starts_with(lock_key, $1)`,
	},
	"AcquireLease": {
		query:   store.AcquireLeaseSQL,
		prelude: "\\set w random(1, 1000000000000)\n",
		args: func(prefix string) []string {
			return []string{"'" + prefix + "lease-' || :w", "'dc-a/ns/job/uid/pod'", "30000000"}
		},
		written: `SELECT count(*) FROM dislock.leases WHERE starts_with(lock_key, $1)`,
	},
	"Select1": {query: "SELECT 1", args: func(string) []string { return nil }},
}

func BenchmarkPgbenchClaimWindow(b *testing.B)  { pgbenchBench(b, "ClaimWindow") }
func BenchmarkPgbenchAcquireLease(b *testing.B) { pgbenchBench(b, "AcquireLease") }
func BenchmarkPgbenchSelect1(b *testing.B)      { pgbenchBench(b, "Select1") }

// TestPgbenchBaselinesRunTheStoresStatements runs each baseline's script
// for a few transactions, as make bench runs it for thousands, and checks
// that it wrote what the statement writes: a baseline that errs, or that
// measures a statement doing nothing, would make make bench's ratios lie.
func TestPgbenchBaselinesRunTheStoresStatements(t *testing.T) {
	srv := pgtest.Need(t)
	if srv.Pgbench() == "" {
		t.Fatal("pgbench is not installed (apt-get install -y postgresql-client)")
	}
	owner := storetest.Open(t, srv.DirectDSN(), 1)
	const clients, transactions = 2, 3
	for name, bl := range pgbenchBaselines {
		t.Run(name, func(t *testing.T) {
			prefix := storetest.UniqueKey(t) + "/"
			script, err := benchscale.PgbenchScript(bl.query, bl.prelude, bl.args(prefix))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := benchscale.PgbenchTransactions(context.Background(), srv.Pgbench(), srv.BouncerDSN(), script, clients, transactions); err != nil {
				t.Fatal(err)
			}
			if bl.written == "" {
				return
			}
			var n int
			if err := owner.Handle().Pool.QueryRow(context.Background(), bl.written, prefix).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != clients*transactions {
				t.Fatalf("pgbench ran the statement %d times and it wrote %d rows", clients*transactions, n)
			}
		})
	}
}

// pgbenchBench runs the named baseline under pgbench, b.N transactions
// split over the clients, and reports the same metrics as measure.
func pgbenchBench(b *testing.B, name string) {
	srv := pgtest.Need(b)
	if srv.Pgbench() == "" {
		b.Fatal("pgbench is not installed (apt-get install -y postgresql-client)")
	}
	storetest.Open(b, srv.DirectDSN(), 1) // migrated
	bl := pgbenchBaselines[name]
	script, err := benchscale.PgbenchScript(bl.query, bl.prelude, bl.args(storetest.UniqueKey(b)+"/"))
	if err != nil {
		b.Fatal(err)
	}
	for _, clients := range benchClients {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			dir := b.TempDir()
			file := filepath.Join(dir, "script.sql")
			if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
				b.Fatal(err)
			}
			u, err := url.Parse(srv.BouncerDSN())
			if err != nil {
				b.Fatal(err)
			}
			pw, _ := u.User.Password()
			perClient := max(1, b.N/clients)
			threads := min(clients, runtime.GOMAXPROCS(0))
			cmd := exec.Command(srv.Pgbench(), "-n", "-M", "extended", "-f", file,
				"-c", strconv.Itoa(clients), "-j", strconv.Itoa(threads), "-t", strconv.Itoa(perClient),
				"-l", "--log-prefix", filepath.Join(dir, "log"),
				"-h", u.Hostname(), "-p", u.Port(), "-U", u.User.Username(), strings.TrimPrefix(u.Path, "/"))
			cmd.Env = append(os.Environ(), "PGPASSWORD="+pw)
			b.ResetTimer()
			out, err := cmd.CombinedOutput()
			b.StopTimer()
			if err != nil {
				b.Fatalf("pgbench: %v\n%s", err, out)
			}
			m := regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`).FindSubmatch(out)
			if m == nil {
				b.Fatalf("no tps in pgbench output:\n%s", out)
			}
			tps, _ := strconv.ParseFloat(string(m[1]), 64)
			benchmark.Report(b, pgbenchLatencies(b, dir), time.Microsecond, "ops/s", tps)
		})
	}
}

// pgbenchLatencies reads the per-transaction logs (-l): the third field is
// the latency in microseconds.
func pgbenchLatencies(b *testing.B, dir string) []time.Duration {
	logs, _ := filepath.Glob(filepath.Join(dir, "log.*"))
	var lat []time.Duration
	for _, name := range logs {
		f, err := os.Open(name)
		if err != nil {
			b.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 3 {
				continue
			}
			us, err := strconv.ParseInt(fields[2], 10, 64)
			if err == nil {
				lat = append(lat, time.Duration(us)*time.Microsecond)
			}
		}
		f.Close()
	}
	if len(lat) == 0 {
		b.Fatalf("pgbench wrote no per-transaction log in %s", dir)
	}
	return lat
}

// measure runs b.N operations on `clients` goroutines and reports latency
// percentiles and throughput.
func measure(b *testing.B, clients int, op func(ctx context.Context, i int64) error) {
	lat, elapsed := benchmark.Run(b, clients, func(i int64) error { return op(context.Background(), i) })
	benchmark.Report(b, lat, time.Microsecond, "ops/s", float64(len(lat))/elapsed.Seconds())
}

// BenchmarkRenewal is what a running pod's heartbeat costs PostgreSQL, as
// the tenant role it runs as, with a window and a lease to renew: this
// release's one call (dislock.renew, schema 11) against the two statements
// agents of schema 9 and older still send, each under row-level security
// and each its own commit, measured in the same run by pgbench through
// PgBouncer. It reports PostgreSQL's CPU per renewal (/proc).
func BenchmarkRenewal(b *testing.B) {
	r := newRenewalBench(b)
	const clients = 4
	for _, st := range renewalStatements {
		b.Run("statements="+st.name, func(b *testing.B) {
			tps, cpu := r.measure(b, func() (float64, int) { return r.run(b, st.name, st.script, clients, max(1, b.N/clients)) })
			b.ReportMetric(tps, "renewals/s")
			b.ReportMetric(float64(cpu)/float64(time.Millisecond), "PG-CPU-ms/renewal")
		})
	}
}

// TestRenewalBaselinesRenew runs BenchmarkRenewal's scripts for a few
// transactions each, as make bench runs them for thousands: a renewal that
// changed must not leave a baseline that errs or renews nothing.
func TestRenewalBaselinesRenew(t *testing.T) {
	r := newRenewalBench(t)
	for _, st := range renewalStatements {
		t.Run(st.name, func(t *testing.T) { r.run(t, st.name, st.script, 2, 3) })
	}
}

// renewalWindow is the window of every row BenchmarkRenewal renews, and
// renewalAt the same as an SQL literal.
var (
	renewalWindow = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	renewalAt     = "'" + renewalWindow.Format(time.RFC3339) + "'::timestamptz"
)

// renewalDay is a day in microseconds: a renewal moves an expiry from an
// hour to a day.
const renewalDay = "86400000000"

// renewalStatements are what BenchmarkRenewal compares: each script renews
// the window and the lease of one of the rows key names, alive for an hour.
var renewalStatements = []struct {
	name   string
	script func(key string) (string, error)
}{
	{"schema-9-statements", func(key string) (string, error) {
		return "UPDATE dislock.windows SET alive_until = now() + " + renewalDay + " * interval '1 microsecond' " +
			"WHERE lock_key = " + key + " AND window_start = " + renewalAt + " AND job_index = -1 AND token = :k AND state = 'running' RETURNING alive_until, now();\n" +
			"UPDATE dislock.leases SET expire_at = now() + " + renewalDay + " * interval '1 microsecond' " +
			"WHERE lock_key = " + key + " AND token = :k AND expire_at > clock_timestamp() RETURNING expire_at, now();\n", nil
	}},
	{"renew", func(key string) (string, error) {
		return benchscale.PgbenchScript(store.RenewSQL, "", []string{key, renewalAt, "-1", ":k", key, ":k", renewalDay})
	}},
}

// tenantBench is a tenant role reaching PostgreSQL through PgBouncer, as a
// pod does, for pgbench to run the agent's calls with.
type tenantBench struct {
	srv     *pgtest.Server
	pid     int
	owner   *store.Store
	ns, dsn string
	role    string // the tenant role, quoted
}

func newTenantBench(tb testing.TB, team string) *tenantBench {
	srv := pgtest.Need(tb)
	if srv.Pgbench() == "" {
		tb.Fatal("pgbench is not installed (apt-get install -y postgresql-client)")
	}
	pid, err := srv.PostmasterPID()
	if err != nil {
		tb.Fatal(err)
	}
	owner := storetest.Open(tb, srv.DirectDSN(), 1)
	ns := storetest.Namespace(tb, team)
	cred := storetest.Provision(tb, owner, ns)
	return &tenantBench{srv: srv, pid: pid, owner: owner, ns: ns, dsn: storetest.TenantDSN(tb, srv.BouncerDSN(), cred),
		role: pgx.Identifier{cred.Role}.Sanitize()}
}

// measure times pgbench's run as the benchmark's and returns its
// transactions per second and PostgreSQL's CPU (/proc) per transaction.
func (t *tenantBench) measure(b *testing.B, run func() (tps float64, transactions int)) (float64, time.Duration) {
	before, err := benchscale.TreeCPU(t.pid)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	tps, n := run()
	b.StopTimer()
	after, err := benchscale.TreeCPU(t.pid)
	if err != nil {
		b.Fatal(err)
	}
	return tps, (after - before) / time.Duration(n)
}

// renewalBench renews rows of its namespace.
type renewalBench struct{ *tenantBench }

func newRenewalBench(tb testing.TB) renewalBench { return renewalBench{newTenantBench(tb, "renewal")} }

// run makes 1 000 running jobs of its own, each holding a window and a
// lease for an hour, has pgbench renew them clients × transactions times
// with script, checks that rows were renewed, and returns pgbench's
// transactions per second and their number.
func (r renewalBench) run(tb testing.TB, name string, script func(key string) (string, error), clients, transactions int) (float64, int) {
	const rows = 1000
	ctx := context.Background()
	prefix := r.ns + "/" + name + "-" + strconv.FormatInt(storetest.Seq(), 10) + "-"
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO dislock.windows (lock_key, window_start, job_index, owner, cluster, pod, token, state, claimed_at, alive_until)
		 SELECT $1::text || i, $2::timestamptz, -1, 'dc-a/' || $1::text || 'job/uid/pod', 'dc-a', 'pod', i, 'running', now(), now() + interval '1 hour'
		 FROM generate_series(1, $3::int) i`, []any{prefix, renewalWindow, rows}},
		{`INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at)
		 SELECT $1::text || i, 'dc-a/' || $1::text || 'job/uid/pod', i, now(), now() + interval '1 hour' FROM generate_series(1, $2::int) i`,
			[]any{prefix, rows}},
	} {
		if _, err := r.owner.Handle().Pool.Exec(ctx, q.sql, q.args...); err != nil {
			tb.Fatal(err)
		}
	}
	one, err := script("'" + prefix + "' || :k")
	if err != nil {
		tb.Fatal(err)
	}
	tps, err := benchscale.PgbenchTransactions(ctx, r.srv.Pgbench(), r.dsn, fmt.Sprintf("\\set k random(1, %d)\n", rows)+one, clients, transactions)
	if err != nil {
		tb.Fatal(err)
	}
	var windows, leases int
	if err := r.owner.Handle().Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM dislock.windows WHERE starts_with(lock_key, $1) AND alive_until > now() + interval '12 hours'),
		(SELECT count(*) FROM dislock.leases WHERE starts_with(lock_key, $1) AND expire_at > now() + interval '12 hours')`, prefix).Scan(&windows, &leases); err != nil {
		tb.Fatal(err)
	}
	if windows == 0 || leases == 0 {
		tb.Fatalf("pgbench renewed %d windows and %d leases: the benchmark measured renewals that wrote nothing", windows, leases)
	}
	return tps, clients * transactions
}

// BenchmarkDecision measures what a pod's decision costs PostgreSQL: pgbench
// through PgBouncer as a tenant role, each transaction one key's pods of
// three clusters claiming a fresh window (one wins) and adding their
// decisions to the ledger, as benchscale.DecisionScript sends them. The
// baseline, in the same run on the same database, is the same two calls
// with the caller's rights under row-level security, as schema 10 ran them
// (the functions behind the check, granted to this benchmark's role alone).
func BenchmarkDecision(b *testing.B) {
	d := newDecisionBench(b)
	const clients = 4
	for _, v := range decisionCalls {
		b.Run("calls="+v.name, func(b *testing.B) {
			tps, cpu := d.measure(b, func() (float64, int) { return d.run(b, v.calls, clients, max(1, b.N/clients)) })
			b.ReportMetric(decisionClusters*tps, "decisions/s")
			b.ReportMetric(float64(cpu)/float64(time.Millisecond)/decisionClusters, "PG-CPU-ms/decision")
		})
	}
}

// TestDecisionBaselinesDecide runs BenchmarkDecision's scripts for a few
// transactions each, as make bench runs them for thousands: a call that
// changed must not leave a baseline that errs or decides nothing.
func TestDecisionBaselinesDecide(t *testing.T) {
	d := newDecisionBench(t)
	for _, v := range decisionCalls {
		t.Run(v.name, func(t *testing.T) { d.run(t, v.calls, 2, 3) })
	}
}

// decisionClusters is how many clusters' pods each transaction decides for.
const decisionClusters = 3

// decisionCalls are what BenchmarkDecision compares.
var decisionCalls = []struct {
	name  string
	calls benchscale.DecisionStatements
}{
	{"schema-10-row-level-security", benchscale.DecisionStatements{
		Claim:  strings.Replace(store.ClaimWindowSchema15SQL, "dislock.claim_window(", "dislock.claim_window_unchecked(", 1),
		Record: strings.Replace(store.RecordDecisionSQL, "dislock.record_decision(", "dislock.record_decision_unchecked(", 1)}},
	{"checked", benchscale.AgentDecision},
}

// decisionBench decides for keys of its namespace, and may call both.
type decisionBench struct{ *tenantBench }

func newDecisionBench(tb testing.TB) decisionBench {
	d := decisionBench{newTenantBench(tb, "decision")}
	if _, err := d.owner.Handle().Pool.Exec(context.Background(), `GRANT EXECUTE ON FUNCTION
		dislock.claim_window_unchecked(text, timestamptz, int, text, text, text, bigint, text, boolean, jsonb, bigint, bigint, bigint),
		dislock.record_decision_unchecked(text, timestamptz, int, text, text, text, text, text, bigint, float8, float8[]) TO `+d.role); err != nil {
		tb.Fatal(err)
	}
	return d
}

// run has pgbench decide clients × transactions times with calls on keys of
// its own, checks that each transaction claimed and recorded, and returns
// pgbench's transactions per second and their number.
func (d decisionBench) run(tb testing.TB, calls benchscale.DecisionStatements, clients, transactions int) (float64, int) {
	ctx := context.Background()
	tag := "t" + strconv.FormatInt(storetest.Seq(), 10)
	script, err := benchscale.DecisionScript(calls, d.ns, tag, decisionClusters, time.Minute)
	if err != nil {
		tb.Fatal(err)
	}
	tps, err := benchscale.PgbenchTransactions(ctx, d.srv.Pgbench(), d.dsn, script, clients, transactions)
	if err != nil {
		tb.Fatal(err)
	}
	n := clients * transactions
	var windows, decisions int
	if err := d.owner.Handle().Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM dislock.windows WHERE starts_with(lock_key, $1)),
		(SELECT count(*) FROM dislock.decisions WHERE starts_with(lock_key, $1))`, d.ns+"/"+tag+"-").Scan(&windows, &decisions); err != nil {
		tb.Fatal(err)
	}
	// Two transactions may draw the same window (pgbench's random key and
	// start), and then the second's three pods are all refused.
	if windows == 0 || windows > n || decisions != decisionClusters*n {
		tb.Fatalf("%d pgbench transactions claimed %d windows and recorded %d decisions; want 1 to %d, and %d", n, windows, decisions, n, decisionClusters*n)
	}
	return tps, n
}

// BenchmarkLeaseDecision measures what a lease-mode pod's decision costs
// PostgreSQL: pgbench through PgBouncer as a tenant role, each transaction
// one key's pods of three clusters asking for a fresh lease (one is
// granted, two refused), as AcquireLease sends it: one call of
// dislock.acquire_lease (schema 17), against the baseline, in the same run
// on the same database, of schema 16's statements (the grant under
// row-level security, and for a refusal a second statement to read who
// holds the lease and whether the key is paused).
func BenchmarkLeaseDecision(b *testing.B) {
	l := leaseBench{newTenantBench(b, "lease")}
	const clients = 4
	for _, v := range leaseCalls {
		b.Run("calls="+v.name, func(b *testing.B) {
			tps, cpu := l.measure(b, func() (float64, int) { return l.run(b, v.pod, clients, max(1, b.N/clients)) })
			b.ReportMetric(decisionClusters*tps, "decisions/s")
			b.ReportMetric(float64(cpu)/float64(time.Millisecond)/decisionClusters, "PG-CPU-ms/decision")
		})
	}
}

// TestLeaseBaselinesDecide runs BenchmarkLeaseDecision's scripts for a few
// transactions each, as make bench runs them for thousands.
func TestLeaseBaselinesDecide(t *testing.T) {
	l := leaseBench{newTenantBench(t, "lease")}
	for _, v := range leaseCalls {
		t.Run(v.name, func(t *testing.T) { l.run(t, v.pod, 2, 3) })
	}
}

// leaseCalls are what BenchmarkLeaseDecision compares: what one pod of
// cluster sends for lease key, granted when it is the first to ask.
var leaseCalls = []struct {
	name string
	pod  func(key, cluster string, first bool) (string, error)
}{
	{"schema-16-statements", func(key, cluster string, first bool) (string, error) {
		grant, err := benchscale.PgbenchScript(store.AcquireLeaseSchema16SQL, "", []string{key, "'" + cluster + "/ns/job/uid/pod'", "60000000", key})
		if err != nil || first {
			return grant, err
		}
		refusal, err := benchscale.PgbenchScript(store.LeaseRefusalSQL, "", []string{key, key})
		return grant + refusal, err
	}},
	{"acquire_lease", func(key, cluster string, _ bool) (string, error) {
		return benchscale.PgbenchScript(store.AcquireLeaseSQL, "", []string{key, "'" + cluster + "/ns/job/uid/pod'", "60000000"})
	}},
}

// leaseBench takes leases of its namespace.
type leaseBench struct{ *tenantBench }

// run has pgbench decide clients × transactions times with pod on fresh
// lease keys of its own, checks that each transaction granted one lease,
// and returns pgbench's transactions per second and their number.
func (l leaseBench) run(tb testing.TB, pod func(key, cluster string, first bool) (string, error), clients, transactions int) (float64, int) {
	ctx := context.Background()
	prefix := l.ns + "/t" + strconv.FormatInt(storetest.Seq(), 10) + "-"
	key := "'" + prefix + "' || :w"
	script := "\\set w random(1, 1000000000000)\n"
	for c := range decisionClusters {
		one, err := pod(key, fmt.Sprintf("dc-%d", c), c == 0)
		if err != nil {
			tb.Fatal(err)
		}
		script += one
	}
	tps, err := benchscale.PgbenchTransactions(ctx, l.srv.Pgbench(), l.dsn, script, clients, transactions)
	if err != nil {
		tb.Fatal(err)
	}
	n := clients * transactions
	var leases, first int
	if err := l.owner.Handle().Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE starts_with(owner, 'dc-0/'))
		FROM dislock.leases WHERE starts_with(lock_key, $1)`, prefix).Scan(&leases, &first); err != nil {
		tb.Fatal(err)
	}
	if leases != n || first != n {
		tb.Fatalf("%d pgbench transactions left %d leases, %d of them the first cluster's; want %d each", n, leases, first, n)
	}
	return tps, n
}
