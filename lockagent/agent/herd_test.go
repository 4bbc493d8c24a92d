package agent

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/benchscale"
	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/pgtest"
)

// The herd: every CronJob of every cluster fires on the same instant, and
// each of its pods runs the agent. `make bench-scale` runs BenchmarkHerd.
var (
	herdKeys        = flag.String("herd.keys", "100,1000,3000,10000", "BenchmarkHerd: CronJobs per cluster, one herd each (comma-separated)")
	herdClusters    = flag.Int("herd.clusters", 3, "BenchmarkHerd: clusters, each with its own PgBouncer")
	herdNamespaces  = flag.Int("herd.namespaces", 10, "BenchmarkHerd: namespaces per cluster, each with its own tenant role (and PgBouncer pool)")
	herdPoolSize    = flag.Int("herd.pool", 2, "BenchmarkHerd: each PgBouncer's default_pool_size (server connections per tenant role)")
	herdMaxDBConns  = flag.Int("herd.max-db-connections", 0, "BenchmarkHerd: each PgBouncer's max_db_connections (0: none), the ceiling on its server connections across the namespaces' pools")
	herdMode        = flag.String("herd.mode", "schedule", "BenchmarkHerd: the CronJobs' dislock.io/mode")
	herdRun         = flag.Duration("herd.run", 20*time.Second, "BenchmarkHerd: how long the winners' apps run, heartbeating")
	herdDrainLimit  = flag.Duration("herd.drain-limit", 45*time.Second, "BenchmarkHerd: pods undecided this long after the herd began count as errors")
	herdRecordLimit = flag.Duration("herd.record-limit", 20*time.Second, "BenchmarkHerd: winners still recording this long after their apps ended count as errors")
	herdBaseline    = flag.Duration("herd.pgbench", 10*time.Second, "BenchmarkHerd: how long pgbench runs the heartbeat statement")
	herdCold        = flag.Bool("herd.cold", false, "BenchmarkHerd: after each herd, the same herd again with every PgBouncer's server connections closed first, as an hourly job finds them after server_idle_timeout")
)

// herdTTL is the default lease TTL (dislock.io/lease-ttl): a heartbeat
// every 10 s.
const herdTTL = 30 * time.Second

// herdPod is one simulated pod: the agent's own run() in a goroutine, with
// its own shared directory, database connection and logger, as in a pod.
type herdPod struct {
	key, cluster string
	dir          protocol.Dir
	env          map[string]string
	cancel       context.CancelFunc
	done         chan struct{}

	decidedOnce sync.Once
	decided     chan struct{}
	decidedAt   time.Time
	action      protocol.Action
	retries     atomic.Int64
	problems    atomic.Int64
	firstIssue  atomic.Pointer[string]
	firstRetry  atomic.Pointer[string]
	causes      *causes // the process's, shared by its pods
}

// causes tallies why pods retried or warned, by operation and error with
// numbers, addresses and keys blanked: what a herd past capacity runs into.
type causes struct {
	mu sync.Mutex
	n  map[string]int64
}

var blanks = regexp.MustCompile(`[0-9]+`)

func (c *causes) add(line []byte) {
	var l struct {
		Msg    string `json:"msg"`
		Op     string `json:"op"`
		Err    string `json:"err"`
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(line, &l)
	// A revocation says why in its reason, not an error: which one tells
	// a renewal refused from one that never got through.
	k := blanks.ReplaceAllString(strings.TrimSpace(l.Msg+" "+l.Op)+": "+cmp.Or(l.Err, l.Reason), "#")
	c.mu.Lock()
	c.n[k]++
	c.mu.Unlock()
}

// Write receives the agent's JSON log lines: the decision line times the
// decision; retries, warnings and errors are counted.
func (p *herdPod) Write(b []byte) (int, error) {
	switch {
	case bytes.Contains(b, []byte(`"msg":"decision"`)):
		var l struct {
			Action protocol.Action `json:"action"`
		}
		_ = json.Unmarshal(b, &l)
		p.decidedOnce.Do(func() {
			p.decidedAt, p.action = time.Now(), l.Action
			close(p.decided)
		})
	case bytes.Contains(b, []byte("database unavailable, retrying")):
		p.retries.Add(1)
		p.causes.add(b)
		s := string(bytes.TrimSpace(b))
		p.firstRetry.CompareAndSwap(nil, &s)
	case bytes.Contains(b, []byte(`"level":"WARN"`)), bytes.Contains(b, []byte(`"level":"ERROR"`)):
		p.problems.Add(1)
		p.causes.add(b)
		s := string(bytes.TrimSpace(b))
		p.firstIssue.CompareAndSwap(nil, &s)
	}
	return len(b), nil
}

func (p *herdPod) getenv(k string) string { return p.env[k] }

// herdRow is one line of the capacity table.
type herdRow struct {
	via                    herdPath
	cold                   bool // the bouncers' server connections closed before the herd
	keys, pods             int
	drain, p50, p99, pmax  time.Duration
	errors, retries, warns int64
	undecided              int64 // not decided within -herd.drain-limit
	// late: a cluster process did not answer within its limit, starved
	// by its own pods; ledgered is then how many decisions the ledger
	// holds for the window, the only count left.
	late                   bool
	ledgered               int64
	herd                   benchscale.Counters
	herdWaits              string
	hbWall                 time.Duration
	hb                     benchscale.Counters
	hbPerSec, pgbenchTPS   float64
	record                 time.Duration
	recordErrors           int64
	topHerd, topHeartbeats []string
	firstIssue, firstRetry string
	causes                 map[string]int64
	// revoked counts the winners that stopped their apps, their lease
	// lost.
	revoked int64
	// What the herd's connections were: the most server connections at
	// once, the tenants' logins to PgBouncer, and, through gateways, what
	// they counted.
	conns, connsAtWork serverConns
	tenantLogins       int64
	gateway            herdGatewayCounted
}

// BenchmarkHerd runs, for each -herd.keys M, -herd.clusters N × M pods that
// all start at once for the same window, each through its cluster's own
// PgBouncer (transaction pooling) as its namespace's tenant role, to one
// PostgreSQL: the top of the minute in N clusters with M CronJobs each.
// Each pod is the agent's run() in this process with its own connection,
// shared directory and logger: it reads the database's clock, records its
// cluster's view, claims the window, publishes the decision and writes the
// ledger, as the sidecar does. The skipping pods then end; the winners run
// for -herd.run, heartbeating at the default TTL's interval, and then end
// with their apps' success recorded. The same PostgreSQL's pgbench
// throughput on the heartbeat statement, measured before the herds, is the
// heartbeats' baseline. It fails if a window ran twice, or ran nowhere
// although every pod of its key decided without error, or if winners ran
// a heartbeat interval and no heartbeat was counted. Past capacity, errors
// and undecided pods are the finding, not a failure: the table counts them.
// With -herd.gateway the pods call their cluster's lock gateway instead, a
// process of its own logged in as the owner through the same PgBouncer
// (herd_gateway_test.go); -herd.compare runs every size both ways, straight
// to PgBouncer first, so that their ratios come from one database and run.
func BenchmarkHerd(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Fatal("BenchmarkHerd reads /proc: Linux only")
	}
	var sizes []int
	for _, s := range strings.Split(*herdKeys, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			b.Fatalf("-herd.keys: %q is not a positive number of CronJobs", s)
		}
		sizes = append(sizes, n)
	}
	mode, err := contract.ParseMode(*herdMode)
	if err != nil {
		b.Fatalf("-herd.mode: %v", err)
	}
	// A cluster's process holds a connection per pod (two while its
	// ledger writes beside a claim), and so does its PgBouncer.
	if err := benchscale.RaiseFileLimit(uint64(slices.Max(sizes) + 2000)); err != nil {
		b.Fatal(err)
	}
	h := newHerd(b, slices.Max(sizes), *herdClusters, *herdPoolSize)
	paths := herdPaths()
	if slices.Contains(paths, viaGateway) {
		h.startGateways(b, slices.Max(sizes))
	}
	// The heartbeats' baseline, on the database before any herd: a herd
	// past capacity leaves it busy with its leftovers for a while.
	h.heartbeatTPS = h.pgbenchHeartbeat(b, 0)
	limit := h.pgbenchDecisions(b, 0, 0)
	// The same limit with fewer of the namespaces' pools at work: what the
	// number of server connections costs each decision.
	var byConnections []decisionLimit
	for _, n := range herdFewerNamespaces(len(h.dsn[0])) {
		byConnections = append(byConnections, h.pgbenchDecisions(b, 0, n))
	}
	byConnections = append(byConnections, limit)
	var rows []herdRow
	for _, via := range paths {
		if via == viaGateway {
			h.warmGatewayBackends(b, mode)
		}
		for _, m := range sizes {
			name := fmt.Sprintf("keys=%d", m)
			if via == viaGateway {
				name = "gateway/" + name
			}
			rows = append(rows, h.bench(b, name, m, mode, via, false)...)
			if *herdCold {
				rows = append(rows, h.bench(b, name+"/cold", m, mode, via, true)...)
			}
		}
	}
	h.report(rows, limit, byConnections)
}

// bench runs one size's herd as a sub-benchmark and reports its metrics.
func (h *herd) bench(b *testing.B, name string, m int, mode contract.Mode, via herdPath, cold bool) []herdRow {
	var rows []herdRow
	b.Run(name, func(b *testing.B) {
		for range b.N {
			r := h.run(b, m, mode, *herdRun, via, cold)
			r.pgbenchTPS = h.heartbeatTPS
			rows = append(rows, r)
			b.ReportMetric(r.herd.WALBytes/float64(m), "WAL-B/window")
			if r.late {
				// No drain, latency or heartbeats to report: the
				// table says what the database saw.
				b.ReportMetric(float64(int64(r.pods)-r.ledgered), "undecided-per-ledger")
				b.ReportMetric(0, "ns/op")
				continue
			}
			b.ReportMetric(r.drain.Seconds(), "drain-s")
			b.ReportMetric(float64(r.p99)/float64(time.Millisecond), "claim-p99-ms")
			b.ReportMetric(float64(r.errors+r.undecided), "errors")
			b.ReportMetric(100*r.hbPerSec/r.pgbenchTPS, "heartbeat-%-of-pgbench")
			b.ReportMetric(0, "ns/op")
		}
	})
	return rows
}

// serverConnections is how many server connections the bouncers keep at
// work for namespaces busy namespaces each: their pools, up to each
// bouncer's max_db_connections.
func (h *herd) serverConnections(namespaces int) int {
	per := namespaces * h.pool
	if *herdMaxDBConns > 0 {
		per = min(per, *herdMaxDBConns)
	}
	return len(h.dsn) * per
}

// herdFewerNamespaces are the namespace counts below all the herd's
// namespaces at which the limit is measured again: one, and three when
// that is fewer than all.
func herdFewerNamespaces(all int) []int {
	var ns []int
	for _, n := range []int{1, 3} {
		if n < all {
			ns = append(ns, n)
		}
	}
	return ns
}

// heartbeatStatement is the heartbeat's statement as pg_stat_statements
// counts it: up to its first constant, which it holds as a parameter (the
// call of schema 20 has none, and is counted whole). Heartbeats sent with
// an older schema's statement are not counted.
func heartbeatStatement() string {
	before, _, _ := strings.Cut(store.RenewSQL, "'")
	return before
}

// herd is the database and bouncers the herds share.
type herd struct {
	srv      *pgtest.Server
	bouncers []*pgtest.Bouncer
	watch    *benchscale.Watch
	// dsn[c][n] is namespace n's tenant URL through cluster c's bouncer.
	dsn [][]string
	// pgbenchDSN is the first cluster's first namespace's tenant URL
	// straight to PostgreSQL: the baseline measures the database, not a
	// pool.
	pgbenchDSN string
	pool       int    // each bouncer's default_pool_size
	root       string // the pods' shared directories live under it (tmpfs)
	binary     string // what install copies
	runs       int
	// heartbeatTPS is pgbench's throughput on the heartbeat statement,
	// measured before the herds.
	heartbeatTPS float64
	// gateways are the clusters' lock gateways (startGateways), and
	// gatewayURL[c][n] namespace n's URL of cluster c's.
	gateways   []*herdGatewayProc
	gatewayURL [][]string
}

func newHerd(b testing.TB, maxKeys, clusters, pool int) *herd {
	ctx := context.Background()
	// Room for every namespace's pool in every bouncer (the limit's
	// pgbench fills them all), and for the gateways', the owner's and
	// the watchers' beside them.
	maxConns := max(400, clusters**herdNamespaces*pool+200)
	srv := pgtest.New(b, pgtest.Options{Name: "herd", Conf: fmt.Sprintf(
		"shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track_planning = on\nmax_connections = %d\n", maxConns)})
	h := &herd{srv: srv, pool: pool}
	pgWatch, err := pgx.Connect(ctx, srv.SuperuserDSN())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pgWatch.Close(ctx) })
	if _, err := pgWatch.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		b.Fatal(err)
	}
	pmPID, err := srv.PostmasterPID()
	if err != nil {
		b.Fatal(err)
	}
	h.watch = &benchscale.Watch{Postmaster: pmPID, DB: pgWatch}
	// A bouncer per cluster. max_client_conn: every pod of the cluster at
	// once, with its ledger's second connection. The tenant roles' pools
	// are what PostgreSQL sees: namespaces × pool size per bouncer.
	conf := fmt.Sprintf("max_client_conn = %d\ndefault_pool_size = %d\nlisten_backlog = 4096\n", 2*maxKeys+100, pool)
	if *herdMaxDBConns > 0 {
		conf += fmt.Sprintf("max_db_connections = %d\n", *herdMaxDBConns)
	}
	// Last: it opens a section of its own.
	gwConf, err := gatewayBouncerConf(srv.DirectDSN(), *herdGatewayDecisionConns+*herdGatewayRenewalConns)
	if err != nil {
		b.Fatal(err)
	}
	conf += gwConf
	owner, err := store.Open(ctx, srv.DirectDSN(), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer owner.Close()
	if _, err := migrate.Up(ctx, owner); err != nil {
		b.Fatal(err)
	}
	for c := range clusters {
		bn, err := srv.AddBouncerConf(fmt.Sprintf("dc-%d", c), conf)
		if err != nil {
			b.Fatal(err)
		}
		h.bouncers = append(h.bouncers, bn)
		pid, err := bn.PID()
		if err != nil {
			b.Fatal(err)
		}
		h.watch.Bouncers = append(h.watch.Bouncers, pid)
		admin, err := pgx.Connect(ctx, srv.DSN(pgtest.Superuser, pgtest.SuperuserPassword, bn.Port())+"&dbname=pgbouncer&default_query_exec_mode=simple_protocol")
		if err != nil {
			b.Fatalf("pgbouncer admin console: %v", err)
		}
		b.Cleanup(func() { admin.Close(ctx) })
		h.watch.Admin = append(h.watch.Admin, admin)
		var dsns []string
		for n := range *herdNamespaces {
			cred, err := tenant.Provision(ctx, owner, fmt.Sprintf("dc-%d", c), fmt.Sprintf("ns-%d", n))
			if err != nil {
				b.Fatal(err)
			}
			dsn, err := tenant.DSN(bn.DSN(), cred)
			if err != nil {
				b.Fatal(err)
			}
			if c == 0 && n == 0 {
				if h.pgbenchDSN, err = tenant.DSN(srv.DirectDSN(), cred); err != nil {
					b.Fatal(err)
				}
			}
			dsns = append(dsns, dsn)
		}
		h.dsn = append(h.dsn, dsns)
	}
	// Shared directories on tmpfs, as an emptyDir's writes cost a node's
	// page cache, not this machine's one disk, where PostgreSQL's WAL is.
	root, err := os.MkdirTemp("/dev/shm", "dislock-herd-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(root) })
	h.root = root
	h.binary = filepath.Join(root, "dislock-agent")
	if err := os.WriteFile(h.binary, []byte("#!/bin/true\n"), 0o755); err != nil {
		b.Fatal(err)
	}
	return h
}

// run is one herd of m CronJobs per cluster. Each cluster's pods run in a
// process of their own (herdChild): this machine allows a process 20 000
// open files and no more (no CAP_SYS_RESOURCE), and a cluster's 10 000 pods
// each hold a connection, as its PgBouncer holds one per pod. The pods
// reach the database as via says.
//
// With cold, every PgBouncer's server connections are closed before the
// herd: the pools as an hourly job finds them, PgBouncer having closed
// them after server_idle_timeout. Its clients' connections to PgBouncer
// stay, as a gateway's do.
func (h *herd) run(b testing.TB, m int, mode contract.Mode, hold time.Duration, via herdPath, cold bool) herdRow {
	ctx := context.Background()
	h.runs++
	var now time.Time
	if err := h.watch.DB.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		b.Fatal(err)
	}
	window := now.UTC().Truncate(time.Second)
	var clusters []*herdCluster
	for c := range h.dsn {
		cluster := fmt.Sprintf("dc-%d", c)
		spec := herdSpec{Dir: filepath.Join(h.root, strconv.Itoa(h.runs), cluster), Binary: h.binary, DrainLimit: *herdDrainLimit, RecordLimit: *herdRecordLimit}
		for i := range m {
			ns := i % *herdNamespaces
			job := fmt.Sprintf("job-%d-%d", i, h.runs)
			spec.Pods = append(spec.Pods, map[string]string{
				"DISLOCK_MODE": mode.String(), "DISLOCK_KEY": fmt.Sprintf("ns-%d/job-%d", ns, i), "DISLOCK_WINDOW": window.Format(time.RFC3339),
				"DISLOCK_SCHEDULE": "* * * * *", "DISLOCK_LEASE_TTL": herdTTL.String(), "DISLOCK_CLUSTER": cluster,
				"DISLOCK_JOB_NAME": job, "DISLOCK_JOB_UID": fmt.Sprintf("uid-%s-%s", cluster, job), "DISLOCK_POD_NAME": job + "-x",
				"DISLOCK_DATABASE_URL": h.databaseURL(via, c, ns),
			})
		}
		hc, err := startHerdCluster(spec)
		if err != nil {
			b.Fatalf("%s: %v", cluster, err)
		}
		b.Cleanup(hc.kill)
		clusters = append(clusters, hc)
	}
	prepared := time.Now().Add(2 * time.Minute)
	for _, hc := range clusters {
		if err := hc.await("ready", prepared); err != nil {
			b.Fatal(err)
		}
	}
	var gwBefore herdGatewayCounted
	if via == viaGateway {
		h.warmGateways(b)
		gwBefore = h.gatewayStats(b)
	} else {
		h.warm(b)
	}
	if cold {
		h.closeServerConnections(b)
	}
	if err := benchscale.ResetStatements(ctx, h.watch.DB); err != nil {
		b.Fatal(err)
	}
	waits := benchscale.SampleWaits(h.sampler(b), 50*time.Millisecond)
	conns := sampleServerConns(h.sampler(b), 50*time.Millisecond)
	before := h.read(b)
	t0 := time.Now()
	for _, hc := range clusters {
		hc.send("go")
	}
	var r herdRow
	r.keys, r.pods, r.via, r.cold = m, m*len(clusters), via, cold
	var lat []time.Duration
	runs := map[string]int{}
	// A key whose own pods all decided without error must have run
	// exactly once; one with an error or an undecided pod may have run
	// nowhere (that pod is the row's error), never twice.
	excused := map[string]bool{}
	for _, hc := range clusters {
		// A skipping pod ends as soon as it decided, as the kubelet stops
		// the sidecar once the wrapper exited 0; "decided" comes once
		// every pod decided and the skipping ones ended (their ledger
		// written).
		err := hc.await("decided", t0.Add(*herdDrainLimit+answerMargin))
		if errors.Is(err, errLate) {
			// The load generator, not the database, is the limit: what
			// the row can say comes from the database.
			b.Logf("%s: %v", filepath.Base(hc.spec.Dir), err)
			r.late = true
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		for i, d := range hc.decisions {
			key := hc.spec.Pods[i]["DISLOCK_KEY"]
			if d.At == 0 {
				r.undecided++
				excused[key] = true
				continue
			}
			at := time.Unix(0, d.At).Sub(t0)
			r.drain = max(r.drain, at)
			switch d.Action {
			case protocol.ActionRun:
				runs[key]++
			case protocol.ActionError:
				r.errors++
				excused[key] = true
				continue // not a claim's latency
			}
			lat = append(lat, at)
		}
	}
	r.herdWaits, _ = waits.Stop()
	r.conns, r.connsAtWork = conns()
	r.herd = h.read(b).Sub(before)
	if via == viaGateway {
		r.gateway = h.gatewayStats(b).Sub(gwBefore)
	}
	for _, hc := range clusters {
		if r.late {
			if hc.decidedCPU == 0 { // it did not say
				hc.decidedCPU = hc.cpu()
			}
			hc.kill()
		}
		r.herd.Self += hc.decidedCPU - hc.readyCPU
	}
	var err error
	if r.topHerd, err = benchscale.TopStatements(ctx, h.watch.DB, 6); err != nil {
		b.Fatal(err)
	}
	// PgBouncer looks up a tenant role's secret once per login; the
	// owner's (the gateways') is in its auth_file.
	if r.tenantLogins, err = benchscale.Calls(ctx, h.watch.DB, pgtest.AuthQuery[:strings.Index(pgtest.AuthQuery, "$")]); err != nil {
		b.Fatal(err)
	}
	if r.late {
		r.drain = r.herd.At.Sub(t0)
		if err := h.watch.DB.QueryRow(ctx, `SELECT count(*) FROM dislock.decisions WHERE window_start = $1`, window).Scan(&r.ledgered); err != nil {
			b.Fatal(err)
		}
		// The processes' reports are lost; the ledger still shows a
		// window that ran twice.
		var twice []string
		rows, err := h.watch.DB.Query(ctx, `SELECT lock_key FROM dislock.decisions WHERE window_start = $1 AND action IN ('run', 'takeover')
			GROUP BY lock_key HAVING count(*) > 1 ORDER BY 1`, window)
		if err == nil {
			twice, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			b.Fatal(err)
		}
		for _, key := range twice {
			b.Errorf("window %s of %s ran more than once (the ledger has two runs)", window.Format(time.RFC3339), key)
		}
		return r
	}
	// An undecided pod is slower than the limit: it is in the
	// percentiles as the limit, so that p99 says "past the limit" when
	// more than 1 % were.
	for range r.undecided {
		lat = append(lat, *herdDrainLimit)
	}
	if sorted := benchscale.Sorted(lat); len(sorted) > 0 {
		r.p50, r.p99, r.pmax = benchscale.Percentile(sorted, 0.50), benchscale.Percentile(sorted, 0.99), sorted[len(sorted)-1]
	}
	for _, p := range clusters[0].spec.Pods {
		if key := p["DISLOCK_KEY"]; runs[key] > 1 || runs[key] == 0 && !excused[key] {
			b.Errorf("window %s of %s ran %d times (must be exactly once)", window.Format(time.RFC3339), key, runs[key])
		}
	}

	// The winners run, heartbeating.
	if err := benchscale.ResetStatements(ctx, h.watch.DB); err != nil {
		b.Fatal(err)
	}
	hbBefore := h.read(b)
	time.Sleep(hold) // the phase's length is what is measured: nothing to await
	r.hb = h.read(b).Sub(hbBefore)
	r.hbWall = r.hb.At.Sub(hbBefore.At)
	if r.topHeartbeats, err = benchscale.TopStatements(ctx, h.watch.DB, 4); err != nil {
		b.Fatal(err)
	}
	heartbeats, err := benchscale.Calls(ctx, h.watch.DB, heartbeatStatement())
	if err != nil {
		b.Fatal(err)
	}
	r.hbPerSec = float64(heartbeats) / r.hbWall.Seconds()
	// A herd within capacity renews; past it, renewals that do not
	// finish within the phase are not counted, and that is the finding.
	if heartbeats == 0 && len(runs) > 0 && hold > herdTTL/3 && r.errors == 0 && r.undecided == 0 {
		b.Errorf("%d winners ran for %s, a heartbeat every %s, and no heartbeat was counted", len(runs), hold, herdTTL/3)
	}

	// The apps succeed and the kubelet stops the sidecars: each records
	// its window succeeded and ends.
	recordStart := time.Now()
	for _, hc := range clusters {
		hc.send("end")
	}
	for _, hc := range clusters {
		if err := hc.await("ended", recordStart.Add(*herdRecordLimit+answerMargin)); err != nil {
			b.Fatal(err)
		}
		r.retries += hc.ended.Retries
		r.recordErrors += hc.ended.Unfinished
		r.warns += hc.ended.Problems
		r.firstRetry = cmp.Or(r.firstRetry, hc.ended.FirstRetry)
		r.firstIssue = cmp.Or(r.firstIssue, hc.ended.FirstIssue)
		for k, n := range hc.ended.Causes {
			if r.causes == nil {
				r.causes = map[string]int64{}
			}
			r.causes[k] += n
			if strings.HasPrefix(k, revokedCause) {
				r.revoked += n
			}
		}
	}
	r.record = time.Since(recordStart)
	if n := h.succeeded(b, window); n != len(runs) {
		r.recordErrors = int64(len(runs) - n)
	}
	return r
}

// revokedCause starts the cause (causes.add) of a winner that stopped its
// app because its renewals did not reach the database in time.
const revokedCause = "lease lost"

// databaseURL is the DISLOCK_DATABASE_URL of cluster c's pods of namespace
// ns.
func (h *herd) databaseURL(via herdPath, c, ns int) string {
	if via == viaGateway {
		return h.gatewayURL[c][ns]
	}
	return h.dsn[c][ns]
}

// serverConns counts PostgreSQL's client backends by role: the owner's
// (the gateways'), the tenant roles', and PgBouncer's auth_user's.
type serverConns struct{ owner, tenants, auth int64 }

func (c serverConns) String() string {
	return fmt.Sprintf("%d (owner %d, tenants %d, auth %d)", c.owner+c.tenants+c.auth, c.owner, c.tenants, c.auth)
}

// sampleServerConns samples through db (its own connection), every
// interval until the returned func is called, the server connections the
// bouncers hold: the most of each kind connected at once, and how many of
// each were seen at work (a statement or transaction in progress). Idle
// ones are the other path's leftovers (PgBouncer keeps them for
// server_idle_timeout), or a pool larger than its load.
func sampleServerConns(db *pgx.Conn, interval time.Duration) func() (connected, atWork serverConns) {
	var peak serverConns
	busy := map[int32]string{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			rows, err := db.Query(context.Background(), `SELECT pid, usename, state <> 'idle' FROM pg_stat_activity
				WHERE backend_type = 'client backend' AND usename <> $1`, pgtest.Superuser)
			if err == nil {
				var now serverConns
				for rows.Next() {
					var pid int32
					var user string
					var working bool
					if rows.Scan(&pid, &user, &working) != nil {
						continue
					}
					now.count(user)
					if working {
						busy[pid] = user
					}
				}
				rows.Close()
				peak = serverConns{max(peak.owner, now.owner), max(peak.tenants, now.tenants), max(peak.auth, now.auth)}
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() (serverConns, serverConns) {
		close(stop)
		<-done
		var work serverConns
		for _, user := range busy {
			work.count(user)
		}
		return peak, work
	}
}

// count counts one backend of user.
func (c *serverConns) count(user string) {
	switch user {
	case pgtest.AppUser:
		c.owner++
	case pgtest.AuthUser:
		c.auth++
	default:
		c.tenants++
	}
}

// herdSpec is what a cluster's process runs: each pod's DISLOCK_*
// environment (the shared directory and termination log are added).
type herdSpec struct {
	Dir, Binary string
	Pods        []map[string]string
	// DrainLimit bounds the herd: a pod undecided by then is counted so
	// and stopped; RecordLimit bounds the winners' recording.
	DrainLimit, RecordLimit time.Duration
}

// herdEvent is a line a cluster's process writes.
type herdEvent struct {
	Event      string         `json:"event"` // ready, decided, ended, failed
	Decisions  []herdDecision `json:"decisions,omitempty"`
	Retries    int64          `json:"retries,omitempty"`
	Problems   int64          `json:"problems,omitempty"`
	FirstRetry string         `json:"firstRetry,omitempty"`
	// Causes counts retries and warnings by what they said (causes.add).
	Causes     map[string]int64 `json:"causes,omitempty"`
	FirstIssue string           `json:"firstIssue,omitempty"`
	Error      string           `json:"error,omitempty"`
	// Unfinished counts the winners still recording at RecordLimit.
	Unfinished int64 `json:"unfinished,omitempty"`
	// CPU is the process's CPU time so far (ready and decided): the
	// cluster's share of the load generator.
	CPU time.Duration `json:"cpu,omitempty"`
}

type herdDecision struct {
	At     int64           `json:"at"` // Unix ns, the machine's one clock
	Action protocol.Action `json:"action"`
}

// herdCluster is a running cluster process, seen from the benchmark.
type herdCluster struct {
	*child[herdEvent]
	spec      herdSpec
	decisions []herdDecision
	ended     herdEvent
	// The process's CPU time when it was ready and when all had decided.
	readyCPU, decidedCPU time.Duration
}

func startHerdCluster(spec herdSpec) (*herdCluster, error) {
	// The pods log to their herdPods, so the process's stderr holds only
	// the Go runtime's words: a panic, or the stacks SIGQUIT dumps when it
	// does not answer in time (tens of thousands of goroutines, a file's
	// worth, not a terminal's).
	c, err := startChild[herdEvent](herdChildEnv, "dislock-herd-"+filepath.Base(spec.Dir), spec)
	if err != nil {
		return nil, err
	}
	return &herdCluster{child: c, spec: spec}, nil
}

// child is a child process of the test binary (runChild), seen from the
// benchmark: its stdin, the events it sends, and the file its stderr goes
// to.
type child[E any] struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	stderr string
	events chan E
}

// startChild starts the test binary as the child env names, with its
// stderr in a temporary file named after name, and sends it spec.
func startChild[E any](env, name string, spec any) (*child[E], error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"=1", "GOTRACEBACK=all")
	// A benchmark that dies (its -timeout, a panic) takes its children
	// with it: nothing else would stop 10 000 pods' worth of connections.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := os.CreateTemp("", name+"-*.stderr")
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child[E]{cmd: cmd, in: in, stderr: stderr.Name(), events: make(chan E, 4)}
	go func() {
		defer close(c.events)
		dec := json.NewDecoder(out)
		for {
			var e E
			if err := dec.Decode(&e); err != nil {
				return
			}
			c.events <- e
		}
	}()
	if err := json.NewEncoder(in).Encode(spec); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	return c, nil
}

// answerMargin is how long after its phase's limit a cluster process may
// take to answer.
const answerMargin = 15 * time.Second

// await waits until deadline for the process's next event, which must be
// want. A process that does not answer in time is made to dump its stacks,
// and the error (errLate) sums them up. The clusters of a phase share one
// deadline: two late ones cost one wait, not two.
func (hc *herdCluster) await(want string, deadline time.Time) error {
	select {
	case e, ok := <-hc.events:
		switch {
		case !ok:
			return fmt.Errorf("the cluster process exited before %q: %v\n%s", want, hc.cmd.Wait(), harness.LogTail(hc.stderr, 40, 4096))
		case e.Event != want:
			return fmt.Errorf("the cluster process said %q (%s), not %q", e.Event, e.Error, want)
		}
		switch want {
		case "ready":
			hc.readyCPU = e.CPU
		case "decided":
			hc.decidedCPU = e.CPU
			hc.decisions = e.Decisions
		case "ended":
			hc.ended = e
		}
		return nil
	case <-time.After(time.Until(deadline)):
		_ = hc.cmd.Process.Signal(syscall.SIGQUIT)
		_ = hc.cmd.Wait()
		return fmt.Errorf("%w: no %q by %s; %s", errLate, want, deadline.Format(time.TimeOnly), stacks(hc.stderr))
	}
}

// errLate: a cluster process did not answer in time (await).
var errLate = errors.New("the cluster process is late")

// stacks sums up the Go runtime's dump of all goroutines in file: how many
// there were, how many waited for a CPU, and the main goroutine's stack.
func stacks(file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	all := bytes.Count(b, []byte("\ngoroutine "))
	runnable := bytes.Count(b, []byte(" [runnable]:\n"))
	main := "(not in the dump)"
	if _, g1, ok := bytes.Cut(b, []byte("\ngoroutine 1 ")); ok {
		g1, _, _ = bytes.Cut(g1, []byte("\n\n"))
		main = "goroutine 1 " + string(g1)
	}
	return fmt.Sprintf("%d goroutines, %d of them runnable (waiting for a CPU); its main goroutine:\n%s", all, runnable, main)
}

// cpu is the process's CPU time so far, or in all once it exited.
func (hc *herdCluster) cpu() time.Duration {
	if st := hc.cmd.ProcessState; st != nil {
		return st.UserTime() + st.SystemTime()
	}
	cpu, _ := benchscale.TreeCPU(hc.cmd.Process.Pid)
	return cpu
}

func (hc *herdCluster) send(cmd string) { fmt.Fprintln(hc.in, cmd) }

func (hc *herdCluster) kill() {
	_ = hc.in.Close()
	_ = hc.cmd.Process.Kill()
	_ = hc.cmd.Wait()
	os.Remove(hc.stderr) // await's errors carry what it said
}

// herdChildEnv makes the test binary a cluster's process (HerdChild).
const herdChildEnv = "DISLOCK_HERD_CLUSTER"

// HerdChild runs the test binary as one cluster of BenchmarkHerd when the
// benchmark started it so (TestMain asks first). It reads a herdSpec on
// stdin, prepares every pod, says ready, and on "go" runs each pod's agent
// (run(), the sidecar's code) in a goroutine; it reports every decision once
// all pods decided and the skipping ones ended, and on "end" finishes the
// winners' apps and reports once every agent returned.
func HerdChild() (code int, isChild bool) { return runChild(herdChildEnv, herdChild) }

// runChild runs the test binary as the child process env names, when it
// was started so: run reads its orders on stdin and answers on stdout with
// JSON events, and a failure is the event "failed" with its error.
func runChild(env string, run func(in *bufio.Reader, out *json.Encoder) error) (code int, isChild bool) {
	if os.Getenv(env) == "" {
		return 0, false
	}
	out := json.NewEncoder(os.Stdout)
	if err := run(bufio.NewReader(os.Stdin), out); err != nil {
		_ = out.Encode(struct {
			Event string `json:"event"`
			Error string `json:"error"`
		}{"failed", err.Error()})
		return 1, true
	}
	return 0, true
}

func herdChild(in *bufio.Reader, out *json.Encoder) error {
	var spec herdSpec
	line, err := in.ReadBytes('\n')
	if err != nil {
		return err
	}
	if err := json.Unmarshal(line, &spec); err != nil {
		return err
	}
	executable = func() (string, error) { return spec.Binary, nil }
	tally := &causes{n: map[string]int64{}}
	pods := make([]*herdPod, len(spec.Pods))
	for i, env := range spec.Pods {
		dir := filepath.Join(spec.Dir, strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		env["DISLOCK_SHARED_DIR"], env["DISLOCK_TERMINATION_LOG"] = dir, filepath.Join(dir, "termination-log")
		pods[i] = &herdPod{key: env["DISLOCK_KEY"], cluster: env["DISLOCK_CLUSTER"], dir: protocol.Dir(dir), env: env,
			done: make(chan struct{}), decided: make(chan struct{}), causes: tally}
	}
	defer os.RemoveAll(spec.Dir)
	start := make(chan struct{})
	settled := make([]<-chan struct{}, len(pods))
	for i, p := range pods {
		pctx, cancel := context.WithCancel(context.Background())
		p.cancel = cancel
		go func() {
			defer close(p.done)
			<-start
			run(pctx, nil, p.getenv, p)
		}()
		// Settled: decided, and ended too when it does not run the app.
		s := make(chan struct{})
		settled[i] = s
		go func() {
			<-p.decided
			if p.action != protocol.ActionRun {
				p.cancel()
				<-p.done
			}
			close(s)
		}()
	}
	if err := out.Encode(herdEvent{Event: "ready", CPU: benchscale.SelfCPU()}); err != nil {
		return err
	}
	if err := expect(in, "go"); err != nil {
		return err
	}
	close(start)
	limit := time.NewTimer(spec.DrainLimit)
	defer limit.Stop()
	select {
	case <-allClosed(settled):
	case <-limit.C:
	}
	ev := herdEvent{Event: "decided"}
	for _, p := range pods {
		d := herdDecision{} // undecided within the limit
		if harness.Closed(p.decided) {
			d = herdDecision{At: p.decidedAt.UnixNano(), Action: p.action}
		}
		ev.Decisions = append(ev.Decisions, d)
	}
	ev.CPU = benchscale.SelfCPU()
	if err := out.Encode(ev); err != nil {
		return err
	}
	// The pods undecided by the limit count as such and are stopped, as
	// a Job's activeDeadlineSeconds would stop them: past capacity they
	// are thousands of goroutines connecting and retrying, which would
	// crowd the winners' heartbeats. After the report: waking them all
	// first kept this process's main goroutine from its turn for minutes.
	for i, p := range pods {
		if ev.Decisions[i].At == 0 {
			p.cancel() // stopped before a decision: it writes none
		}
	}
	if err := expect(in, "end"); err != nil {
		return err
	}
	limit.Reset(spec.RecordLimit)
	var winners []<-chan struct{}
	for i, p := range pods {
		if ev.Decisions[i].At == 0 || p.action != protocol.ActionRun {
			continue
		}
		at := time.Now()
		if err := p.dir.MarkStarted("app", at); err != nil {
			return err
		}
		if err := p.dir.WriteResult("app", protocol.Result{Ran: true, Started: at, Finished: at}); err != nil {
			return err
		}
		p.cancel()
		winners = append(winners, p.done)
	}
	select {
	case <-allClosed(winners):
	case <-limit.C:
	}
	decided := ev.Decisions
	tally.mu.Lock()
	ev = herdEvent{Event: "ended", Causes: maps.Clone(tally.n)}
	tally.mu.Unlock()
	for i, p := range pods {
		if decided[i].Action == protocol.ActionRun && !harness.Closed(p.done) {
			ev.Unfinished++
		}
		ev.Retries += p.retries.Load()
		ev.Problems += p.problems.Load()
		if s := p.firstRetry.Load(); s != nil && ev.FirstRetry == "" {
			ev.FirstRetry = p.key + ": " + *s
		}
		if s := p.firstIssue.Load(); s != nil && ev.FirstIssue == "" {
			ev.FirstIssue = p.key + ": " + *s
		}
	}
	return out.Encode(ev)
}

// allClosed is closed once every one of chs is. The process's main
// goroutine waits on it once instead of on each pod in turn: with
// thousands of runnable goroutines (a herd past capacity connecting and
// retrying), every wait costs it a turn behind all of them, and a
// 10 000-pod cluster's phase outlasted its limit by minutes.
func allClosed(chs []<-chan struct{}) <-chan struct{} {
	var wg sync.WaitGroup
	for _, c := range chs {
		wg.Go(func() { <-c })
	}
	all := make(chan struct{})
	go func() {
		wg.Wait()
		close(all)
	}()
	return all
}

// expect reads the next command line, which must be want.
func expect(in *bufio.Reader, want string) error {
	line, err := in.ReadString('\n')
	if err != nil {
		return fmt.Errorf("waiting for %q: %w", want, err)
	}
	if got := strings.TrimSpace(line); got != want {
		return fmt.Errorf("got %q, want %q", got, want)
	}
	return nil
}

// warm fills every tenant role's pool in every bouncer with its server
// connections, as the previous minute's pods left them: a PostgreSQL
// backend costs this machine ~35 ms to start (300 connections straight to
// PostgreSQL took 10.6 s), which the top of the minute does not pay in
// production, where PgBouncer keeps its server connections for
// server_idle_timeout.
func (h *herd) warm(b testing.TB) {
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, len(h.dsn)*len(h.dsn[0])*h.pool)
	for _, dsns := range h.dsn {
		for _, dsn := range dsns {
			for range h.pool {
				wg.Go(func() {
					c, err := pgx.Connect(ctx, dsn)
					if err != nil {
						errs <- err
						return
					}
					defer c.Close(ctx)
					// Held across a sleep so that every connection of the
					// pool is in use at once and PgBouncer opens them all.
					_, err = c.Exec(ctx, "SELECT pg_sleep(0.2)")
					if err != nil {
						errs <- err
					}
				})
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("warming the pools: %v", err)
	}
}

// path names the row's path in the tables: "gateway", "PgBouncer, cold"…
func (r herdRow) path() string {
	if r.cold {
		return string(r.via) + ", cold"
	}
	return string(r.via)
}

// closeServerConnections has every bouncer close its server connections
// (RECONNECT: each once released, and they all are between herds) and
// waits until none is left.
func (h *herd) closeServerConnections(b testing.TB) {
	ctx := context.Background()
	for _, admin := range h.watch.Admin {
		if _, err := admin.Exec(ctx, "RECONNECT"); err != nil {
			b.Fatalf("closing the bouncers' server connections: %v", err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		open := 0
		for _, admin := range h.watch.Admin {
			rows, err := admin.Query(ctx, "SHOW SERVERS")
			if err != nil {
				b.Fatalf("counting the bouncers' server connections: %v", err)
			}
			for rows.Next() {
				open++
			}
			if err := rows.Err(); err != nil {
				b.Fatalf("counting the bouncers' server connections: %v", err)
			}
		}
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d server connections still open 30 s after RECONNECT", open)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// read takes the counters, failing the benchmark on error.
func (h *herd) read(b testing.TB) benchscale.Counters {
	c, err := h.watch.Read(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// sampler is a superuser connection of its own for the wait sampling.
func (h *herd) sampler(b testing.TB) *pgx.Conn {
	c, err := pgx.Connect(context.Background(), h.srv.SuperuserDSN())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// succeeded counts the window's keys recorded succeeded.
func (h *herd) succeeded(b testing.TB, window time.Time) int {
	var n int
	err := h.watch.DB.QueryRow(context.Background(), `SELECT count(*) FROM dislock.windows WHERE window_start = $1 AND state = 'succeeded'`, window).Scan(&n)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// pgbenchHeartbeat is the baseline: pgbench running the heartbeat
// statement as fast as it can from 32 clients straight to PostgreSQL (what
// the database can do, not what one pool passes) as the first namespace's
// tenant role, against running claims made for it. With transactions > 0
// each client runs it that many times instead of for -herd.pgbench.
func (h *herd) pgbenchHeartbeat(b testing.TB, transactions int) float64 {
	ctx := context.Background()
	const rows = 1000
	window := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC) // no herd's
	_, err := h.watch.DB.Exec(ctx, `INSERT INTO dislock.windows (lock_key, window_start, job_index, owner, cluster, pod, token, state, claimed_at, alive_until)
		SELECT 'ns-0/pgbench-' || i, $1, 0, 'dc-0/ns-0/pgbench/uid/pod', 'dc-0', 'pod', i, 'running', now(), now()
		FROM generate_series(1, $2) i ON CONFLICT DO NOTHING`, window, rows)
	if err != nil {
		b.Fatal(err)
	}
	script, err := benchscale.PgbenchScript(store.RenewSQL, fmt.Sprintf("\\set k random(1, %d)\n", rows),
		[]string{"'ns-0/pgbench-' || :k", fmt.Sprintf("'%s'::timestamptz", window.Format(time.RFC3339)), "0", ":k", "NULL", "NULL", strconv.FormatInt(herdTTL.Microseconds(), 10)})
	if err != nil {
		b.Fatal(err)
	}
	pgbench := func() (float64, error) {
		return benchscale.Pgbench(ctx, h.srv.Pgbench(), h.pgbenchDSN, script, 32, *herdBaseline)
	}
	if transactions > 0 {
		pgbench = func() (float64, error) {
			return benchscale.PgbenchTransactions(ctx, h.srv.Pgbench(), h.pgbenchDSN, script, 32, transactions)
		}
	}
	tps, err := pgbench()
	if err != nil {
		b.Fatal(err)
	}
	return tps
}

// decisionLimit is the herds' limit, measured on the same database before
// them: what pgbench doing the pods' work made of it.
type decisionLimit struct {
	// namespaces is how many namespaces of each cluster ran pgbench, and
	// connections how many server connections they kept busy (clusters ×
	// namespaces × the pool, up to max_db_connections per bouncer).
	namespaces, connections int
	perSec                  float64 // decisions per second
	backends                int64   // PostgreSQL backends started meanwhile
	// starved counts the pgbenches (a cluster's namespace each) that
	// completed no transaction: their pools never got a server connection.
	starved int
	// CPU per decision of PostgreSQL, the bouncers and pgbench itself.
	pg, bouncers, client time.Duration
}

// pgbenchDecisions measures the limit: pgbench doing, for fresh windows of
// the herd's namespaces, what the three pods of a key do: three clusters'
// claims (the first claims, the others are refused; each cluster's view of
// the key is recorded by the first pass and only read after) and each
// one's ledger write, its bounds and row in one pipeline as the agent sends
// them. One pgbench per cluster and namespace, through that cluster's
// PgBouncer as that namespace's tenant role, with as many clients as the
// pool has server connections: the herd's own connections, each kept busy.
// With transactions > 0 each client runs it that many times instead of for
// -herd.pgbench. Only the first namespaces of each cluster run pgbench (all
// when namespaces is 0): fewer namespaces, fewer server connections at work.
func (h *herd) pgbenchDecisions(b testing.TB, transactions, namespaces int) decisionLimit {
	ctx := context.Background()
	if namespaces <= 0 || namespaces > len(h.dsn[0]) {
		namespaces = len(h.dsn[0])
	}
	l := decisionLimit{namespaces: namespaces, connections: h.serverConnections(namespaces)}
	h.warm(b) // as the herds find them: a backend's start is no decision's cost
	before := h.read(b)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var n int64
	var errs []error
	for c, dsns := range h.dsn {
		for i, dsn := range dsns[:namespaces] {
			script, err := benchscale.DecisionScript(benchscale.AgentDecision, fmt.Sprintf("ns-%d", i), fmt.Sprintf("limit-%d", c), len(h.dsn), herdTTL)
			if err != nil {
				b.Fatal(err)
			}
			wg.Go(func() {
				var r benchscale.PgbenchResult
				if transactions > 0 {
					var tps float64
					tps, err = benchscale.PgbenchTransactions(ctx, h.srv.Pgbench(), dsn, script, h.pool, transactions)
					r = benchscale.PgbenchResult{TPS: tps, Transactions: int64(h.pool * transactions)}
				} else {
					r, err = benchscale.PgbenchRun(ctx, h.srv.Pgbench(), dsn, script, h.pool, *herdBaseline)
				}
				mu.Lock()
				defer mu.Unlock()
				if errors.Is(err, benchscale.ErrNoTransactions) && *herdMaxDBConns > 0 {
					// Its pool never got a server connection under the
					// ceiling: what the table reports.
					l.starved++
					return
				}
				if err != nil {
					errs = append(errs, err)
					return
				}
				l.perSec += 3 * r.TPS
				l.client += r.CPU
				n += 3 * r.Transactions
			})
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	used := h.read(b).Sub(before)
	if n > 0 {
		l.pg, l.bouncers, l.client = used.PostgreSQL/time.Duration(n), used.Bouncers/time.Duration(n), l.client/time.Duration(n)
		l.backends = used.Sessions
	}
	return l
}

// report prints the capacity table and the evidence behind it.
func (h *herd) report(rows []herdRow, limit decisionLimit, byConnections []decisionLimit) {
	cpus := runtime.NumCPU()
	fmt.Printf("\nThe limit, before the herds: pgbench doing what the pods do (claim, ledger) through the same PgBouncers and pools: %.0f decisions/s; CPU per decision: PostgreSQL %s, bouncers %s, pgbench %s\n",
		limit.perSec, msf(limit.pg), msf(limit.bouncers), msf(limit.client))
	t := [][]string{{"namespaces/cluster", "server connections", "decisions/s", "PG CPU/decision", "bouncers CPU/decision", "pgbench CPU/decision", "backends started", "namespaces starved"}}
	for _, l := range byConnections {
		t = append(t, []string{strconv.Itoa(l.namespaces), strconv.Itoa(l.connections), fmt.Sprintf("%.0f", l.perSec),
			msf(l.pg), msf(l.bouncers), msf(l.client), strconv.FormatInt(l.backends, 10), fmt.Sprintf("%d of %d", l.starved, len(h.dsn)*l.namespaces)})
	}
	ceiling := "none"
	if *herdMaxDBConns > 0 {
		ceiling = strconv.Itoa(*herdMaxDBConns)
	}
	fmt.Printf("\nThe limit by server connections at work (each namespace's pool of %d in each PgBouncer, max_db_connections %s; same run, same database)\n", h.pool, ceiling)
	_ = benchscale.Table(os.Stdout, t)
	t = [][]string{{"path", "keys/cluster", "pods", "drain", "decisions/s", "÷ limit", "claim p50", "p99", "max", "errors", "undecided", "retries", "PG CPU", "PG CPU/decision", "PG CPU share", "bouncers CPU", "gateways CPU", "gateways CPU/decision", "generator CPU", "WAL/window", "WAL syncs", "PgBouncer wait/pod"}}
	for _, r := range rows {
		wall := r.drain
		drain := ms(r.drain)
		if r.undecided > 0 {
			drain = "> " + ms(*herdDrainLimit)
		}
		p50, p99, pmax, errs, undecided := latency(r.p50), latency(r.p99), latency(r.pmax), strconv.FormatInt(r.errors, 10), strconv.FormatInt(r.undecided, 10)
		if r.late {
			// What the database saw: the decisions in its ledger.
			drain, p50, p99, pmax, errs = "generator-bound", "–", "–", "–", "–"
			undecided = fmt.Sprintf("~%d (ledger)", int64(r.pods)-r.ledgered)
		}
		rate, share := "–", "–"
		if !r.late && r.undecided == 0 && r.drain > 0 {
			perSec := float64(r.pods) / r.drain.Seconds()
			rate, share = fmt.Sprintf("%.0f", perSec), fmt.Sprintf("%.2f", perSec/limit.perSec)
		}
		gwCPU, gwPer := "–", "–"
		if r.via == viaGateway {
			gwCPU, gwPer = fmt.Sprintf("%.1f s", r.herd.Gateways.Seconds()), msf(r.herd.Gateways/time.Duration(r.pods))
		}
		t = append(t, []string{r.path(), strconv.Itoa(r.keys), strconv.Itoa(r.pods), drain, rate, share, p50, p99, pmax,
			errs, undecided, strconv.FormatInt(r.retries, 10),
			fmt.Sprintf("%.1f s", r.herd.PostgreSQL.Seconds()), msf(r.herd.PostgreSQL / time.Duration(r.pods)),
			fmt.Sprintf("%.0f%%", benchscale.Share(r.herd.PostgreSQL, wall, cpus)),
			fmt.Sprintf("%.1f s", r.herd.Bouncers.Seconds()), gwCPU, gwPer, fmt.Sprintf("%.1f s", r.herd.Self.Seconds()),
			fmt.Sprintf("%.0f B", r.herd.WALBytes/float64(r.keys)), strconv.FormatInt(r.herd.WALSyncs, 10),
			fmt.Sprintf("%.1f ms", float64(r.herd.WaitMicros)/1000/float64(r.pods))})
	}
	fmt.Println("\nHerd: every CronJob of every cluster fires at once (first start → last decision)")
	_ = benchscale.Table(os.Stdout, t)
	t = [][]string{{"path", "keys/cluster", "backends started", "server connections at work", "connected (most at once)", "tenant logins to PgBouncer", "TLS connections to gateways", "gateway calls", "gateway calls unavailable", "most calls in a gateway at once (sum)", "gateways' database logins"}}
	for _, r := range rows {
		gw := []string{"–", "–", "–", "–", "–"}
		if r.via == viaGateway {
			g := r.gateway
			gw = []string{strconv.FormatInt(g.Connections, 10), strconv.FormatInt(g.Calls, 10), strconv.FormatInt(g.Unavailable, 10),
				strconv.FormatInt(g.PeakInFlight, 10), strconv.FormatInt(g.DatabaseLogins, 10)}
		}
		t = append(t, append([]string{r.path(), strconv.Itoa(r.keys), strconv.FormatInt(r.herd.Sessions, 10), r.connsAtWork.String(), r.conns.String(), strconv.FormatInt(r.tenantLogins, 10)}, gw...))
	}
	fmt.Printf("\nConnections during the herd (gateways: %d decision and %d renewal connections each, through an owner's pool of %d in its PgBouncer)\n",
		*herdGatewayDecisionConns, *herdGatewayRenewalConns, *herdGatewayDecisionConns+*herdGatewayRenewalConns)
	_ = benchscale.Table(os.Stdout, t)
	t = [][]string{{"path", "running jobs", "heartbeat statements/s", "PG CPU share", "pgbench, same statement (before the herds)", "heartbeats ÷ pgbench", "record (apps end)", "record errors", "winners revoked"}}
	for _, r := range rows {
		if r.late {
			t = append(t, []string{r.path(), strconv.Itoa(r.keys), "–", "–", fmt.Sprintf("%.0f/s", r.pgbenchTPS), "–", "–", "–", "–"})
			continue
		}
		t = append(t, []string{r.path(), strconv.Itoa(r.keys), fmt.Sprintf("%.0f", r.hbPerSec),
			fmt.Sprintf("%.1f%%", benchscale.Share(r.hb.PostgreSQL, r.hbWall, cpus)), fmt.Sprintf("%.0f/s", r.pgbenchTPS),
			ratio(r.hbPerSec, r.pgbenchTPS), ms(r.record), strconv.FormatInt(r.recordErrors, 10), strconv.FormatInt(r.revoked, 10)})
	}
	fmt.Printf("\nHeartbeats of the winners (TTL %s, one every %s) over %s, then their success recorded\n", herdTTL, herdTTL/3, *herdRun)
	_ = benchscale.Table(os.Stdout, t)
	for _, r := range rows {
		row := fmt.Sprintf("%s, keys=%d", r.path(), r.keys)
		fmt.Printf("\n%s: backends during the herd: %s\n", row, r.herdWaits)
		fmt.Printf("%s: statements by time, herd:\n  %s\n", row, strings.Join(r.topHerd, "\n  "))
		fmt.Printf("%s: statements by time, heartbeats:\n  %s\n", row, strings.Join(r.topHeartbeats, "\n  "))
		if r.firstRetry != "" {
			fmt.Printf("%s: a retry: %s\n", row, r.firstRetry)
		}
		if len(r.causes) > 0 {
			fmt.Printf("%s: retries and warnings by cause (numbers blanked):\n", row)
			for _, k := range slices.SortedFunc(maps.Keys(r.causes), func(a, b string) int { return cmp.Compare(r.causes[b], r.causes[a]) })[:min(8, len(r.causes))] {
				fmt.Printf("  %7d  %s\n", r.causes[k], k)
			}
		}
		if r.firstIssue != "" {
			fmt.Printf("%s: a warning or error: %s\n", row, r.firstIssue)
		}
		fmt.Printf("%s: during the herd: %d commits, %d WAL flushes, %d full-page images, %d backends started\n", row, r.herd.Commits, r.herd.WALSyncs, r.herd.WALFPI, r.herd.Sessions)
	}
}

// msf is d in milliseconds with two decimals: a CPU time per decision.
func msf(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// ratio is a as a percentage of b, or "–" without a baseline.
func ratio(a, b float64) string {
	if b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*a/b)
}

// latency is a decision's latency, or "> the limit" for the undecided.
func latency(d time.Duration) string {
	if d >= *herdDrainLimit {
		return "> " + ms(*herdDrainLimit)
	}
	return ms(d)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

// TestAHerdRunsEveryWindowOnceWithoutErrors is make test's slice of
// BenchmarkHerd: 3 clusters of CronJobs whose pods all start at once for
// one window, through their clusters' PgBouncers (200 each, mode
// schedule,lease) and through their clusters' lock gateways (30 each, mode
// schedule, held past one heartbeat: a winner's heartbeat names its
// lease's key with no lease token, which the gateway must renew as the
// window alone). Every pod decides without an error or a retry, every
// key's window runs exactly once (run checks it), every winner's success
// is recorded once its app ended; through the gateways no pod logs in to
// PgBouncer and no call is refused.
func TestAHerdRunsEveryWindowOnceWithoutErrors(t *testing.T) {
	for _, tc := range []struct {
		path herdPath
		keys int
		mode string
		hold time.Duration
	}{
		{viaBouncer, 200, "schedule,lease", 0},
		{viaGateway, 30, "schedule", herdTTL/3 + time.Second},
	} {
		t.Run(string(tc.path), func(t *testing.T) {
			if err := benchscale.RaiseFileLimit(uint64(tc.keys + 2000)); err != nil {
				t.Fatal(err)
			}
			mode, err := contract.ParseMode(tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			h := newHerd(t, tc.keys, 3, 1)
			if tc.path == viaGateway {
				h.startGateways(t, tc.keys)
			}
			r := h.run(t, tc.keys, mode, tc.hold, tc.path, false)
			if r.late || r.errors != 0 || r.undecided != 0 || r.retries != 0 || r.warns != 0 || r.recordErrors != 0 {
				t.Fatalf("late cluster process: %t; %d error decisions, %d undecided, %d retries, %d warnings, %d successes not recorded; a retry: %s; a warning: %s",
					r.late, r.errors, r.undecided, r.retries, r.warns, r.recordErrors, r.firstRetry, r.firstIssue)
			}
			if tc.path == viaGateway && (r.tenantLogins != 0 || r.gateway.Connections < int64(r.pods) || r.gateway.Unavailable != 0) {
				t.Fatalf("%d pods: %d tenant logins to PgBouncer (want 0), %d TLS connections to the gateways (want one a pod at least), %d calls unavailable (want 0)",
					r.pods, r.tenantLogins, r.gateway.Connections, r.gateway.Unavailable)
			}
			t.Logf("%d pods decided in %s (p50 %s, p99 %s); CPU: PostgreSQL %.1f s, gateways %.1f s",
				r.pods, r.drain, r.p50, r.p99, r.herd.PostgreSQL.Seconds(), r.herd.Gateways.Seconds())
		})
	}
}

// The heartbeats' row of the capacity table divides the winners' heartbeat
// statements by pgbench's throughput on the same statement. Both halves
// can flatter dislock without failing anything: a baseline whose UPDATE
// matches no row (a wrong parameter, a row-level security policy hiding
// the rows, a token above the tenant's high water) commits no WAL and runs
// many times faster than a real renewal, and a count of heartbeats that
// does not match the statement the agent sends reads 0/s. This holds both
// to what a user sizing a database reads: pgbench renews the rows it was
// given, as the tenant role, and the heartbeat phase counts one renewal
// per winner per interval.
func TestHerdHeartbeatFiguresCountRealRenewals(t *testing.T) {
	const keys = 20
	if err := benchscale.RaiseFileLimit(keys + 2000); err != nil {
		t.Fatal(err)
	}
	mode, err := contract.ParseMode("schedule")
	if err != nil {
		t.Fatal(err)
	}
	h := newHerd(t, keys, 3, 1)
	ctx := context.Background()

	// A count, not a time: on a loaded machine 32 clients' logins could
	// take a short run's whole time.
	tps := h.pgbenchHeartbeat(t, 20)
	if tps <= 0 {
		t.Fatalf("pgbench's baseline is %.0f/s", tps)
	}
	// The rows were inserted alive until their claim (the renewal's
	// statement does not look at liveness); a renewal sets them alive for
	// the TTL from its own now(). Rows alive until their claim were never
	// renewed.
	var renewed, all int
	if err := h.watch.DB.QueryRow(ctx, `SELECT count(*) FILTER (WHERE alive_until > claimed_at), count(*)
		FROM dislock.windows WHERE window_start = '2000-01-01T00:00:00Z'`).Scan(&renewed, &all); err != nil {
		t.Fatal(err)
	}
	// How many depends on the machine's load; none renewed means the
	// baseline measured a no-op.
	if renewed == 0 {
		t.Fatalf("pgbench ran the heartbeat at %.0f/s but renewed %d of its %d rows: the baseline measures a statement that does not write", tps, renewed, all)
	}

	// A heartbeat every TTL/3 = 10 s: over 11 s of running each winner
	// renews once (its first beat falls 10 s after its decision, and the
	// phase starts after the last decision, within the first second here).
	r := h.run(t, keys, mode, 11*time.Second, viaBouncer, false)
	if r.errors != 0 || r.undecided != 0 || r.recordErrors != 0 {
		t.Fatalf("%d error decisions, %d undecided, %d successes not recorded", r.errors, r.undecided, r.recordErrors)
	}
	got := r.hbPerSec * r.hbWall.Seconds()
	if got < keys || got > 2*keys {
		// What pg_stat_statements holds for the heartbeat: it replaces the
		// statement's constants with $n, so its text is not the source's.
		var texts []string
		rows, err := h.watch.DB.Query(ctx, `SELECT calls || ' calls: ' || query FROM pg_stat_statements WHERE query LIKE '%dislock.renew%'`)
		if err == nil {
			for rows.Next() {
				var s string
				if rows.Scan(&s) == nil {
					texts = append(texts, s)
				}
			}
			rows.Close()
		}
		prefix := strings.TrimSpace(heartbeatStatement())
		trimmed, _ := benchscale.Calls(ctx, h.watch.DB, prefix)
		t.Logf("benchscale.Calls(the heartbeat up to its first constant, trimmed) = %d", trimmed)
		t.Logf("statements by time over the heartbeat phase:\n  %s\nthe heartbeat as pg_stat_statements holds it:\n  %s",
			strings.Join(r.topHeartbeats, "\n  "), strings.Join(texts, "\n  "))
		t.Fatalf("the heartbeat phase counted %.1f heartbeats (%.2f/s over %s) from %d running winners, want %d..%d: the heartbeat row of the capacity table does not count the winners' renewals",
			got, r.hbPerSec, r.hbWall, keys, keys, 2*keys)
	}
	t.Logf("pgbench %.0f/s renewed %d of %d rows; %d winners renewed %.0f times in %s", tps, renewed, all, keys, got, r.hbWall)
}

// The herd's limit is pgbench doing what the pods do, and the table's
// ratio against it means something only if it does: per transaction one of
// three clusters' claims of a fresh window is granted, the other two are
// refused, and all three decisions reach the ledger.
func TestHerdDecisionLimitDoesWhatThePodsDo(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Fatal("the herd reads /proc: Linux only")
	}
	h := newHerd(t, 20, 3, 1)
	const transactions = 3
	l := h.pgbenchDecisions(t, transactions, 0)
	if l.perSec <= 0 || l.pg <= 0 {
		t.Fatalf("limit %+v: no decisions or no PostgreSQL CPU measured", l)
	}
	per := len(h.dsn) * len(h.dsn[0]) * h.pool * transactions // pgbench transactions
	var windows, foreign, decisions, runs int
	err := h.watch.DB.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM dislock.windows WHERE lock_key LIKE '%/limit-%'),
		(SELECT count(*) FROM dislock.windows WHERE lock_key LIKE '%/limit-%' AND cluster <> 'dc-0'),
		(SELECT count(*) FROM dislock.decisions WHERE job LIKE 'limit-%'),
		(SELECT count(*) FROM dislock.decisions WHERE job LIKE 'limit-%' AND action = 'run')`).Scan(&windows, &foreign, &decisions, &runs)
	if err != nil {
		t.Fatal(err)
	}
	if windows != per || foreign != 0 || decisions != 3*per || runs != per {
		t.Fatalf("%d pgbench transactions left %d windows (%d claimed by a refused cluster), %d ledger rows (%d runs); want %d, 0, %d (%d)",
			per, windows, foreign, decisions, runs, per, 3*per, per)
	}
	t.Logf("limit %.0f decisions/s, PostgreSQL %s per decision", l.perSec, msf(l.pg))
}
