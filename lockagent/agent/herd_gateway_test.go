package agent

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/gateway"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/tlstest"
)

// The herd through lock gateways: each cluster's pods send their lock
// calls over HTTPS to their cluster's gateway, which alone logs in to the
// database, as the owner, through the cluster's PgBouncer.
var (
	herdGateway              = flag.Bool("herd.gateway", false, "BenchmarkHerd: the pods reach the database through their cluster's lock gateway (a process of its own) instead of their PgBouncer")
	herdCompare              = flag.Bool("herd.compare", false, "BenchmarkHerd: each size first straight to PgBouncer and then through the lock gateways, on the same database in one run")
	herdGatewayDecisionConns = flag.Int("herd.gateway-decision-conns", 8, "BenchmarkHerd: each lock gateway's connections for decisions")
	herdGatewayRenewalConns  = flag.Int("herd.gateway-renewal-conns", 2, "BenchmarkHerd: each lock gateway's connections for renewals")
)

// herdPath is how a herd's pods reach the database.
type herdPath string

const (
	// viaBouncer: each pod logs in to its cluster's PgBouncer as its
	// namespace's tenant role, as without a gateway.
	viaBouncer herdPath = "PgBouncer"
	// viaGateway: each pod calls its cluster's lock gateway with its
	// namespace's credential.
	viaGateway herdPath = "gateway"
)

// herdPaths are the paths BenchmarkHerd measures, in the order it runs
// them: the flags decide.
func herdPaths() []herdPath {
	switch {
	case *herdCompare:
		return []herdPath{viaBouncer, viaGateway}
	case *herdGateway:
		return []herdPath{viaGateway}
	}
	return []herdPath{viaBouncer}
}

// gatewayDatabase is the database name under which each cluster's
// PgBouncer serves the gateway's owner login. PgBouncer 1.18 sizes pools
// only per database ([users] takes no pool_size), and the tenant roles'
// pools must keep -herd.pool for the runs without a gateway: the alias
// gives the owner's pool a size of its own, decision and renewal
// connections together.
const gatewayDatabase = "dislock_gateway"

// gatewayBouncerConf is the [databases] section that adds the alias; it
// must come last in pgbouncer.ini, after the settings of [pgbouncer].
func gatewayBouncerConf(directDSN string, poolSize int) (string, error) {
	u, err := url.Parse(directDSN)
	if err != nil {
		return "", fmt.Errorf("the database's URL: %w", err)
	}
	return fmt.Sprintf("\n[databases]\n%s = host=%s port=%s dbname=%s pool_size=%d\n",
		gatewayDatabase, u.Hostname(), u.Port(), strings.TrimPrefix(u.Path, "/"), poolSize), nil
}

// gatewayOwnerDSN is bouncerDSN (the owner's, through a cluster's
// PgBouncer) on the gateway's alias.
func gatewayOwnerDSN(bouncerDSN string) (string, error) {
	u, err := url.Parse(bouncerDSN)
	if err != nil {
		return "", err
	}
	u.Path = "/" + gatewayDatabase
	return u.String(), nil
}

// herdGatewaySpec is what a cluster's gateway process serves.
type herdGatewaySpec struct {
	Cluster string
	// DSN is the owner's login through the cluster's PgBouncer.
	DSN                                    string
	DecisionConns, RenewalConns, MaxQueued int
	// Credentials are the namespaces' secrets, made by the benchmark as
	// the webhook makes them.
	Credentials map[string]string
}

// herdGatewayEvent is a line a gateway process writes.
type herdGatewayEvent struct {
	Event string `json:"event"` // ready, warmed, stats, failed
	Error string `json:"error,omitempty"`
	// Addr and CA (PEM) are where the pods reach it and what they trust
	// (ready).
	Addr  string             `json:"addr,omitempty"`
	CA    []byte             `json:"ca,omitempty"`
	Stats herdGatewayCounted `json:"stats"`
}

// herdGatewayCounted is what a gateway process counted since it started.
type herdGatewayCounted struct {
	// Connections are the TLS connections pods opened: their logins.
	Connections int64 `json:"connections"`
	Calls       int64 `json:"calls"`
	// Unavailable calls were answered 503: a full queue, a database
	// error, a caller gone before its call started.
	Unavailable int64 `json:"unavailable"`
	// PeakInFlight is the most calls inside the gateway at once, queued
	// or running, since the last stats.
	PeakInFlight int64 `json:"peakInFlight"`
	// DatabaseLogins are the connections its two pools opened.
	DatabaseLogins int64 `json:"databaseLogins"`
}

// Sub is c minus an earlier count; the peak is c's own.
func (c herdGatewayCounted) Sub(o herdGatewayCounted) herdGatewayCounted {
	return herdGatewayCounted{Connections: c.Connections - o.Connections, Calls: c.Calls - o.Calls, Unavailable: c.Unavailable - o.Unavailable,
		PeakInFlight: c.PeakInFlight, DatabaseLogins: c.DatabaseLogins - o.DatabaseLogins}
}

func (c *herdGatewayCounted) add(o herdGatewayCounted) {
	c.Connections += o.Connections
	c.Calls += o.Calls
	c.Unavailable += o.Unavailable
	c.PeakInFlight += o.PeakInFlight
	c.DatabaseLogins += o.DatabaseLogins
}

// herdGatewayEnv makes the test binary a cluster's lock gateway
// (HerdGatewayChild).
const herdGatewayEnv = "DISLOCK_HERD_GATEWAY"

// HerdGatewayChild runs the test binary as one cluster's lock gateway for
// BenchmarkHerd when the benchmark started it so (TestMain asks first): a
// process of its own, so that its CPU is told apart from the pods', the
// bouncers' and PostgreSQL's. It reads a herdGatewaySpec on stdin, makes
// its own CA and serving certificate, says ready with its address and CA,
// and then answers "warm" and "stats" until stdin closes.
func HerdGatewayChild() (code int, isChild bool) { return runChild(herdGatewayEnv, herdGatewayChild) }

func herdGatewayChild(in *bufio.Reader, out *json.Encoder) error {
	ctx := context.Background()
	var spec herdGatewaySpec
	line, err := in.ReadBytes('\n')
	if err != nil {
		return err
	}
	if err := json.Unmarshal(line, &spec); err != nil {
		return err
	}
	open := func(conns int) (*store.Store, error) {
		return store.Open(ctx, spec.DSN, store.Options{MaxConns: int32(conns)})
	}
	decisions, err := open(spec.DecisionConns)
	if err != nil {
		return err
	}
	defer decisions.Close()
	renewals, err := open(spec.RenewalConns)
	if err != nil {
		return err
	}
	defer renewals.Close()
	srv, err := gateway.NewServer(gateway.Config{
		Cluster: spec.Cluster, Decisions: decisions, Renewals: renewals,
		DecisionConns: spec.DecisionConns, RenewalConns: spec.RenewalConns, MaxQueued: spec.MaxQueued,
		Credentials: gateway.StaticCredentials(spec.Credentials),
		Logger:      slog.New(slog.NewJSONHandler(os.Stderr, nil)),
	})
	if err != nil {
		return err
	}
	ca, err := tlstest.GenerateCA("dislock-herd-gateway-ca")
	if err != nil {
		return err
	}
	leaf, err := ca.IssueLeaf("dislock-herd-gateway")
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	counted := &gatewayCounter{next: srv}
	hs := &http.Server{
		Handler:   counted,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				counted.connections.Add(1)
			}
		},
	}
	served := make(chan error, 1)
	go func() { served <- hs.ServeTLS(ln, "", "") }()
	defer hs.Close()
	lanes := []*store.Store{decisions, renewals}
	if err := warmGateway(ctx, lanes); err != nil {
		return err
	}
	if err := out.Encode(herdGatewayEvent{Event: "ready", Addr: ln.Addr().String(), CA: ca.CertPEM}); err != nil {
		return err
	}
	for {
		line, err := in.ReadString('\n')
		if errors.Is(err, io.EOF) {
			return nil // the benchmark is done with it
		}
		if err != nil {
			return err
		}
		var ev herdGatewayEvent
		switch cmd := strings.TrimSpace(line); cmd {
		case "warm":
			if err := warmGateway(ctx, lanes); err != nil {
				return err
			}
			ev = herdGatewayEvent{Event: "warmed"}
		case "stats":
			ev = herdGatewayEvent{Event: "stats", Stats: counted.take(lanes)}
		default:
			return fmt.Errorf("unknown command %q", cmd)
		}
		select {
		case err := <-served:
			return fmt.Errorf("the gateway stopped serving: %w", err)
		default:
		}
		if err := out.Encode(ev); err != nil {
			return err
		}
	}
}

// warmGateway opens every connection of the gateway's pools and has each
// PgBouncer pool open as many server connections, as herd.warm does for
// the tenants' pools: the previous minute's pods left them open.
func warmGateway(ctx context.Context, lanes []*store.Store) error {
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for _, s := range lanes {
		pool := s.Handle().Pool
		for range pool.Config().MaxConns {
			wg.Go(func() {
				// Held across a sleep so that all are in use at once:
				// the pool and PgBouncer open one each.
				if _, err := pool.Exec(ctx, "SELECT pg_sleep(0.2)"); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return fmt.Errorf("warming the gateway's connections: %w", err)
	}
	return nil
}

// gatewayCounter counts the gateway's calls on their way in and out.
type gatewayCounter struct {
	next                            http.Handler
	connections, calls, unavailable atomic.Int64
	inFlight, peak                  atomic.Int64
}

func (g *gatewayCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := g.inFlight.Add(1)
	for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
	}
	defer g.inFlight.Add(-1)
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	g.next.ServeHTTP(sw, r)
	g.calls.Add(1)
	if sw.status == http.StatusServiceUnavailable {
		g.unavailable.Add(1)
	}
}

// take reads the counts and starts a new peak.
func (g *gatewayCounter) take(lanes []*store.Store) herdGatewayCounted {
	c := herdGatewayCounted{Connections: g.connections.Load(), Calls: g.calls.Load(), Unavailable: g.unavailable.Load(), PeakInFlight: g.peak.Swap(g.inFlight.Load())}
	for _, s := range lanes {
		c.DatabaseLogins += s.Handle().Pool.Stat().NewConnsCount()
	}
	return c
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

// herdGatewayProc is a running gateway process, seen from the benchmark.
type herdGatewayProc struct {
	*child[herdGatewayEvent]
	addr string
	ca   string // the ca parameter of its URLs
}

func startHerdGateway(spec herdGatewaySpec) (*herdGatewayProc, error) {
	c, err := startChild[herdGatewayEvent](herdGatewayEnv, "dislock-herd-gateway-"+spec.Cluster, spec)
	if err != nil {
		return nil, err
	}
	g := &herdGatewayProc{child: c}
	e, err := g.await("ready")
	if err != nil {
		g.stop()
		return nil, err
	}
	g.addr, g.ca = e.Addr, base64.RawURLEncoding.EncodeToString(e.CA)
	return g, nil
}

// await waits for the process's next event, which must be want. A gateway
// answers within seconds even beside a herd: it never waits for more than
// its pools' warming.
func (g *herdGatewayProc) await(want string) (herdGatewayEvent, error) {
	select {
	case e, ok := <-g.events:
		switch {
		case !ok:
			return e, fmt.Errorf("the gateway process exited before %q: %v\n%s", want, g.cmd.Wait(), harness.LogTail(g.stderr, 40, 4096))
		case e.Event != want:
			return e, fmt.Errorf("the gateway process said %q (%s), not %q", e.Event, e.Error, want)
		}
		return e, nil
	case <-time.After(time.Minute):
		return herdGatewayEvent{}, fmt.Errorf("the gateway process said no %q within a minute\n%s", want, harness.LogTail(g.stderr, 40, 4096))
	}
}

// ask sends cmd and awaits its answer, want.
func (g *herdGatewayProc) ask(cmd, want string) (herdGatewayEvent, error) {
	fmt.Fprintln(g.in, cmd)
	return g.await(want)
}

// URL is what a pod of namespace ns has as its database URL.
func (g *herdGatewayProc) URL(ns, secret string) string {
	u := url.URL{Scheme: "https", User: url.UserPassword(ns, secret), Host: g.addr, Path: "/", RawQuery: "ca=" + g.ca}
	return u.String()
}

func (g *herdGatewayProc) stop() {
	_ = g.in.Close()
	done := make(chan struct{})
	go func() {
		_ = g.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = g.cmd.Process.Kill()
		<-done
	}
	os.Remove(g.stderr)
}

// startGateways starts a lock gateway per cluster, each logged in as the
// owner through its cluster's PgBouncer (the alias of gatewayBouncerConf),
// and gives every namespace of each cluster a secret of its own and its
// gateway URL. maxKeys is the most pods a cluster will run: each has at
// most two calls in flight (its ledger's write beside a claim), so a queue
// of twice that refuses none of them, and the herd measures the gateway's
// throughput rather than its refusals.
func (h *herd) startGateways(b testing.TB, maxKeys int) {
	for c, bn := range h.bouncers {
		dsn, err := gatewayOwnerDSN(bn.DSN())
		if err != nil {
			b.Fatal(err)
		}
		spec := herdGatewaySpec{Cluster: fmt.Sprintf("dc-%d", c), DSN: dsn,
			DecisionConns: *herdGatewayDecisionConns, RenewalConns: *herdGatewayRenewalConns, MaxQueued: 2 * maxKeys,
			Credentials: map[string]string{}}
		for n := range h.dsn[c] {
			secret := make([]byte, 32)
			if _, err := rand.Read(secret); err != nil {
				b.Fatal(err)
			}
			spec.Credentials[fmt.Sprintf("ns-%d", n)] = hex.EncodeToString(secret)
		}
		g, err := startHerdGateway(spec)
		if err != nil {
			b.Fatalf("%s's lock gateway: %v", spec.Cluster, err)
		}
		b.Cleanup(g.stop)
		h.gateways = append(h.gateways, g)
		h.watch.Gateways = append(h.watch.Gateways, g.cmd.Process.Pid)
		var urls []string
		for n := range h.dsn[c] {
			ns := fmt.Sprintf("ns-%d", n)
			urls = append(urls, g.URL(ns, spec.Credentials[ns]))
		}
		h.gatewayURL = append(h.gatewayURL, urls)
	}
}

// warmGateways has every gateway open all its connections, and their
// PgBouncer pools all their server connections.
func (h *herd) warmGateways(b testing.TB) {
	for _, g := range h.gateways {
		if _, err := g.ask("warm", "warmed"); err != nil {
			b.Fatal(err)
		}
	}
}

// warmGatewayBackends runs an unmeasured herd through the gateways. Their
// server connections are new, and a backend's first calls of the lock
// functions pay for its catalog caches and PL/pgSQL plans (~50 ms of CPU
// each here): the tenants' backends paid that in the limit's pgbench, and in
// production the previous hour's pods paid it. A herd, not a statement per
// connection: PgBouncer hands a client whichever server connection it
// likes, and only a herd keeps all of them busy at once.
func (h *herd) warmGatewayBackends(b testing.TB, mode contract.Mode) {
	const keys = 100
	if r := h.run(b, keys, mode, 0, viaGateway, false); r.late || r.errors+r.undecided > 0 {
		b.Fatalf("warming the gateways' backends: %d error decisions, %d undecided (late: %t); a warning: %s", r.errors, r.undecided, r.late, r.firstIssue)
	}
}

// gatewayStats sums what the gateways counted so far.
func (h *herd) gatewayStats(b testing.TB) herdGatewayCounted {
	var all herdGatewayCounted
	for _, g := range h.gateways {
		e, err := g.ask("stats", "stats")
		if err != nil {
			b.Fatal(err)
		}
		all.add(e.Stats)
	}
	return all
}
