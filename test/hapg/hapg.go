// Package hapg starts a highly available PostgreSQL for tests: a Patroni
// cluster of two or three PostgreSQL nodes, one per simulated data centre,
// with etcd as its DCS, HAProxy in front of whichever node is primary, and a
// PgBouncer per data centre in front of HAProxy. Tests use it to show what a
// failover of the database does to the lock agents, through each of the
// ways a deployment may reach the primary: HAProxy, a PgBouncer, or a
// libpq multi-host connection string.
//
// It also starts an asynchronous primary/standby pair without Patroni
// (StartAsyncPair), whose standby can be cut off from the WAL and promoted:
// the deterministic way to lose committed transactions in a failover.
//
// Everything listens on 127.0.0.1, on ports picked at start, and lives in
// temp directories that Close removes. If the test process dies first,
// Patroni, etcd and HAProxy die with it (parent-death signal) and a watchdog
// stops the postmasters and removes the directory. When the tests run as
// root, Patroni and PostgreSQL run as the "postgres" system user.
//
// Credentials are pgtest's: the application role "dislock" (password
// "dislock-secret") owns the database "dislock", and the superuser is
// "postgres"; all TCP logins use scram-sha-256.
package hapg

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/pgtest"
)

// Options tune a Cluster; the zero value starts three nodes in synchronous
// mode.
type Options struct {
	// Name appears in log lines and the temp directory's name.
	Name string
	// Logf receives progress lines (t.Logf); nil = silent.
	Logf func(format string, args ...any)
	// Nodes is 2 or 3 (0 means 3): pg-a, pg-b and pg-c, in data centres a,
	// b and c.
	Nodes int
	// Async turns Patroni's synchronous_mode off. By default a commit waits
	// for one replica (the sync standby), and only that replica may be
	// promoted, so a failover loses no acknowledged commit.
	Async bool
}

// Cluster is a running Patroni cluster with HAProxy and a PgBouncer per data
// centre. Its methods are safe for concurrent use.
type Cluster struct {
	opts Options
	base

	etcdPort, haproxyPort, statsPort int
	// nodes and bouncers are fixed once Start returns; bouncers follow the
	// order of nodes (one per data centre).
	nodes    []*node
	bouncers []*pgtest.UpstreamBouncer

	mu       sync.Mutex
	closed   bool
	closeErr error
	etcd     *proc
	haproxy  *proc
}

// node is one Patroni member and its PostgreSQL.
type node struct {
	name, dc         string
	dir              string
	pgPort, restPort int
	// patroni is nil before the first start; not running after Kill.
	patroni *proc
}

func (n *node) path(name string) string { return filepath.Join(n.dir, name) }
func (n *node) dataDir() string         { return n.path("data") }

// Start starts etcd, the Patroni nodes, HAProxy and the PgBouncers, creates
// the "dislock" role and database, and returns once the cluster has a
// primary, every replica streams from it (one of them as sync standby unless
// opts.Async), and a query through HAProxy and through every PgBouncer
// succeeds. A missing program yields an error wrapping ErrMissingBinary.
func Start(opts Options) (*Cluster, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Nodes != 2 && opts.Nodes != 3 {
		return nil, fmt.Errorf("hapg: Options.Nodes is %d; want 2 or 3", opts.Nodes)
	}
	b, err := newBase(opts.Name)
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, base: b}
	return harness.SetUp(c, c.setUp, (*Cluster).logTails)
}

// base is what a Cluster and a Pair start from: the programs, the account
// they run as, and a fresh temp directory with its watchdog.
type base struct {
	bin  binaries
	acct account
	dir  string
	wd   *harness.Watchdog
}

func newBase(name string) (base, error) {
	bin, err := findBinaries()
	if err != nil {
		return base{}, err
	}
	acct, err := serverAccount()
	if err != nil {
		return base{}, err
	}
	dir, err := acct.prepareDir(label(name))
	if err != nil {
		return base{}, err
	}
	wd, err := harness.StartWatchdog("hapg", watchdogScript, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return base{}, err
	}
	return base{bin: bin, acct: acct, dir: dir, wd: wd}, nil
}

func (c *Cluster) setUp() error {
	begun := time.Now()
	ports, err := harness.FreePorts(2 + 2*c.opts.Nodes + 2)
	if err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	if err := c.startEtcd(ports[0], ports[1]); err != nil {
		return err
	}
	c.haproxyPort, c.statsPort = ports[2], ports[len(ports)-1]
	for i := range c.opts.Nodes {
		dc := string(rune('a' + i))
		n := &node{name: "pg-" + dc, dc: dc, dir: filepath.Join(c.dir, "pg-"+dc),
			pgPort: ports[3+2*i], restPort: ports[4+2*i]}
		if err := c.acct.Mkdir(n.dir); err != nil {
			return fmt.Errorf("hapg: %w", err)
		}
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		conf, err := c.patroniConfig(n)
		if err != nil {
			return err
		}
		if err := c.acct.WriteFile(n.path("patroni.yml"), conf, 0o600); err != nil {
			return fmt.Errorf("hapg: %w", err)
		}
		if _, err := c.startPatroni(n); err != nil {
			return err
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	leader, err := c.waitLeader(ctx, "")
	if err != nil {
		return err
	}
	c.logf("%s is primary after %v", leader, time.Since(begun).Round(time.Millisecond))
	if err := execSQL(ctx, c.nodeSuperuserDSN(leader), pgtest.CreateRoleSQL, pgtest.CreateDatabaseSQL); err != nil {
		return fmt.Errorf("hapg: creating role and database %q: %w", pgtest.Database, err)
	}
	if err := c.waitSync(ctx); err != nil {
		return err
	}
	c.logf("replicas streaming after %v", time.Since(begun).Round(time.Millisecond))

	if err := c.startHAProxy(ctx); err != nil {
		return err
	}
	for _, n := range c.nodes {
		b, err := pgtest.StartBouncer(pgtest.BouncerOptions{
			Name: "hapg-" + n.dc, Logf: c.opts.Logf, Host: "127.0.0.1", Port: c.haproxyPort,
		})
		if err != nil {
			return err
		}
		c.bouncers = append(c.bouncers, b)
	}
	mode := "synchronous"
	if c.opts.Async {
		mode = "asynchronous"
	}
	c.logf("%d nodes (%s replication), haproxy on %s, etcd on %s, files in %s; ready in %v",
		len(c.nodes), mode, addr(c.haproxyPort), addr(c.etcdPort), c.dir, time.Since(begun).Round(time.Millisecond))
	return nil
}

func (c *Cluster) startEtcd(clientPort, peerPort int) error {
	client, peer := "http://"+addr(clientPort), "http://"+addr(peerPort)
	p, err := startProc(c.dir, "etcd", nil, c.bin.etcd,
		"--name=hapg",
		"--data-dir="+filepath.Join(c.dir, "etcd-data"),
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=hapg="+peer,
		// The data dies with the test.
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.etcd, c.etcdPort = p, clientPort
	c.mu.Unlock()
	err = waitFor(readyTimeout, func() error {
		if !p.Running() {
			return errExited
		}
		_, err := httpGet(context.Background(), client+"/health")
		return err
	})
	if err != nil {
		return fmt.Errorf("hapg: starting etcd on %s: %w", client, err)
	}
	return nil
}

// startHAProxy starts HAProxy and returns once it routes to the leader
// only: until its first checks HAProxy deems every server up, so that the
// first connections could reach a replica.
func (c *Cluster) startHAProxy(ctx context.Context) error {
	cfg := filepath.Join(c.dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(c.haproxyConfig(c.haproxyPort, c.statsPort)), 0o644); err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	// -db: foreground, no daemon; logs go to stdout (haproxy.log).
	p, err := startProc(c.dir, "haproxy", nil, c.bin.haproxy, "-db", "-f", cfg)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.haproxy = p
	c.mu.Unlock()
	err = poll(ctx, func() error {
		if !p.Running() {
			return errExited
		}
		leader, err := c.Leader(ctx)
		if err != nil {
			return err
		}
		states, err := c.haproxyStates(ctx)
		if err != nil {
			return err
		}
		for _, n := range c.nodes {
			if up := strings.HasPrefix(states[n.name], "UP"); up != (n.name == leader) {
				return fmt.Errorf("haproxy server states %v, want only %s up", states, leader)
			}
		}
		return isPrimary(ctx, c.SuperuserDSN())
	})
	if err != nil {
		return fmt.Errorf("hapg: querying the primary through haproxy on %s: %w", addr(c.haproxyPort), err)
	}
	return nil
}

// haproxyStates maps each node to its state in HAProxy: "UP", "DOWN", or
// with a transition under way "UP 1/2", "DOWN 1/2".
func (c *Cluster) haproxyStates(ctx context.Context) (map[string]string, error) {
	body, err := httpGet(ctx, "http://"+addr(c.statsPort)+"/stats;csv")
	if err != nil {
		return nil, err
	}
	rows, err := csv.NewReader(strings.NewReader(strings.TrimPrefix(string(body), "# "))).ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, fmt.Errorf("haproxy stats: %q: %v", body, err)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	px, sv, st := col["pxname"], col["svname"], col["status"]
	states := map[string]string{}
	for _, r := range rows[1:] {
		if len(r) > max(px, sv, st) && r[px] == "postgres" {
			states[r[sv]] = r[st]
		}
	}
	return states, nil
}

var errExited = errors.New("process exited")

// startPatroni starts n's Patroni, which starts (and if need be creates) its
// PostgreSQL.
func (c *Cluster) startPatroni(n *node) (*proc, error) {
	p, err := startProc(n.dir, "patroni", c.acct.Cred, c.bin.patroni, n.path("patroni.yml"))
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	n.patroni = p
	c.mu.Unlock()
	return p, nil
}

// Nodes returns the node names, "pg-a", "pg-b"[, "pg-c"].
func (c *Cluster) Nodes() []string {
	var names []string
	for _, n := range c.nodes {
		names = append(names, n.name)
	}
	return names
}

// DCs returns the data centres, "a", "b"[, "c"]; node "pg-<dc>" and
// Bouncer(dc) belong to dc.
func (c *Cluster) DCs() []string {
	var dcs []string
	for _, n := range c.nodes {
		dcs = append(dcs, n.dc)
	}
	return dcs
}

// node returns the node called name; an unknown name is a mistake in the
// test.
func (c *Cluster) node(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	panic(fmt.Sprintf("hapg: no node %q (have %s)", name, strings.Join(c.Nodes(), ", ")))
}

// NodeDSN connects straight to one node as the application role, whatever
// its role in the cluster.
func (c *Cluster) NodeDSN(name string) string {
	return appDSN(c.node(name).pgPort)
}

func (c *Cluster) nodeSuperuserDSN(name string) string { return adminDSN(c.node(name).pgPort) }

// HAProxyDSN connects through HAProxy, i.e. to the current primary, as the
// application role.
func (c *Cluster) HAProxyDSN() string { return appDSN(c.haproxyPort) }

// SuperuserDSN connects through HAProxy as the superuser "postgres", for
// setup and inspection.
func (c *Cluster) SuperuserDSN() string { return superuserDSN(c.haproxyPort) }

// MultiHostDSN names every node, in order, with target_session_attrs=
// read-write: libpq and pgx try each and keep the first that accepts
// writes. The application role.
func (c *Cluster) MultiHostDSN() string {
	var ports []int
	for _, n := range c.nodes {
		ports = append(ports, n.pgPort)
	}
	return multiHostDSN(pgtest.AppUser, pgtest.AppPassword, ports)
}

// Bouncer returns data centre dc's PgBouncer (transaction pooling, in front
// of HAProxy), for faults of its own: Stop, Pause, ...
func (c *Cluster) Bouncer(dc string) *pgtest.UpstreamBouncer {
	for i, n := range c.nodes {
		if n.dc == dc && i < len(c.bouncers) {
			return c.bouncers[i]
		}
	}
	panic(fmt.Sprintf("hapg: no bouncer for data centre %q (have %s)", dc, strings.Join(c.DCs(), ", ")))
}

// BouncerDSN connects through data centre dc's PgBouncer as the application
// role.
func (c *Cluster) BouncerDSN(dc string) string { return c.Bouncer(dc).DSN() }

// Close stops everything (PostgreSQL with an immediate shutdown: the data
// is thrown away) and removes the temp directories. Later calls return the
// first call's result.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.closeErr
	}
	c.closed = true
	var errs []error
	for _, b := range c.bouncers {
		errs = append(errs, b.Close())
	}
	errs = append(errs, c.haproxy.Stop(syscall.SIGTERM, 5*time.Second))
	for _, n := range c.nodes {
		n.patroni.SignalGroup(syscall.SIGKILL)
	}
	for _, n := range c.nodes {
		if _, err := killPostmaster(n.dataDir(), syscall.SIGQUIT); err != nil {
			errs = append(errs, fmt.Errorf("hapg: stopping %s: %w", n.name, err))
		}
		errs = append(errs, n.patroni.Stop(syscall.SIGKILL, 5*time.Second))
	}
	errs = append(errs, c.etcd.Stop(syscall.SIGTERM, 5*time.Second))
	c.closeErr = c.wd.StopAndRemove(errs...)
	c.logf("stopped; removed %s", c.dir)
	return c.closeErr
}

// logTails returns the end of every log: Patroni's and PostgreSQL's per
// node, HAProxy's, etcd's and the bouncers'.
func (c *Cluster) logTails() string {
	var b strings.Builder
	for _, n := range c.nodes {
		b.WriteString(patroniLogTail(n.path("patroni.log")) + "\n")
		b.WriteString(logTail(filepath.Join(n.path("log"), "postgresql.log")) + "\n")
	}
	for _, name := range []string{"haproxy.log", "etcd.log"} {
		b.WriteString(logTail(filepath.Join(c.dir, name)) + "\n")
	}
	for _, bn := range c.bouncers {
		b.WriteString(bn.LogTail() + "\n")
	}
	return b.String()
}

func (c *Cluster) logf(format string, args ...any) {
	harness.Logf(c.opts.Logf, "hapg", label(c.opts.Name), format, args...)
}

// label turns a name into a short, path-safe label: unix socket paths must
// stay under 107 bytes.
func label(name string) string { return harness.Label(name, "pg") }

// liveNodes are the nodes whose Patroni runs (not killed), in order.
func (c *Cluster) liveNodes() []*node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(c.nodes), func(n *node) bool { return !n.patroni.Running() })
}
