// Package gatewaycmd is `dislock gateway`: the lock gateway
// (lockagent/gateway) as a server of its own, one Deployment per cluster,
// with the owner's database credential, the namespaces' credentials read
// from the database as the webhook mints them (--tenant-gateway-url), a
// serving certificate reloaded on change, probes and metrics.
package gatewaycmd

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"github.com/dislock/dislock/internal/flagusage"
	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/gateway"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/tenant"
)

// Settings are the command's flags.
type Settings struct {
	Cluster, DatabaseURL, DatabaseCAFile  string
	Addr, CertDir, ProbeAddr, MetricsAddr string
	DecisionConns, RenewalConns           int
	MaxQueued, MaxQueuedPerNamespace      int
}

// Defaults of the flags.
const (
	DefaultPort          = 9445
	DefaultDecisionConns = 8
	DefaultRenewalConns  = 2
)

// Parse reads args; a malformed flag is reported to out with the usage.
func Parse(args []string, out io.Writer) (*Settings, error) {
	fs := flag.NewFlagSet("dislock gateway", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: dislock gateway [flags]\n\nThe lock gateway: runs the pods' lock calls on its own database connections (docs/design.md, \"The lock gateway\").\n\nFlags:\n")
		flagusage.Print(out, fs)
	}
	s := &Settings{}
	fs.StringVar(&s.Cluster, "cluster-name", "", "name of this cluster (data centre): every owner, view and decision a pod sends must name it (required; the webhook's --cluster-name)")
	fs.StringVar(&s.DatabaseURL, "database-url", os.Getenv(contract.EnvDatabaseURL), "the owner's PostgreSQL URL (default $"+contract.EnvDatabaseURL+")")
	fs.StringVar(&s.DatabaseCAFile, "database-ca-file", "", "PEM file of the CA that signed the database's (or PgBouncer's) certificate")
	fs.StringVar(&s.Addr, "bind-address", fmt.Sprintf(":%d", DefaultPort), "address the pods' calls are served on (HTTPS)")
	fs.StringVar(&s.CertDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory with tls.crt and tls.key (reloaded on change)")
	fs.StringVar(&s.ProbeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (HTTP; empty: none)")
	fs.StringVar(&s.MetricsAddr, "metrics-bind-address", ":8080", "address of /metrics (HTTP; empty: none)")
	fs.IntVar(&s.DecisionConns, "decision-conns", DefaultDecisionConns, "database connections of the decisions lane (the top of the hour's claims)")
	fs.IntVar(&s.RenewalConns, "renewal-conns", DefaultRenewalConns, "database connections of the renewals lane (heartbeats, outcomes, releases)")
	fs.IntVar(&s.MaxQueued, "max-queued", gateway.DefaultMaxQueued, "calls each lane keeps waiting at most; past it a call is refused as unavailable and the pod retries")
	fs.IntVar(&s.MaxQueuedPerNamespace, "max-queued-per-namespace", 0, "calls of one namespace each lane keeps waiting at most (default a quarter of --max-queued)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("dislock gateway takes no arguments, only flags: %q", fs.Args())
		fmt.Fprintln(out, err)
		return nil, err
	}
	return s, nil
}

// Check lists every flag that cannot run, naming it.
func (s *Settings) Check() error {
	var errs []error
	switch {
	case s.Cluster == "":
		errs = append(errs, errors.New("--cluster-name is required (the same name as the webhook's)"))
	case strings.ContainsAny(s.Cluster, "/\x00"):
		errs = append(errs, fmt.Errorf("--cluster-name %q contains '/' or NUL", s.Cluster))
	}
	if s.DatabaseURL == "" {
		errs = append(errs, fmt.Errorf("--database-url (or $%s) is required: the owner's URL", contract.EnvDatabaseURL))
	} else if _, err := store.ParseDatabaseURL(s.DatabaseURL); err != nil {
		errs = append(errs, fmt.Errorf("--database-url: %w", err))
	}
	if s.DecisionConns < 1 || s.DecisionConns > 1000 {
		errs = append(errs, fmt.Errorf("--decision-conns %d: want 1 to 1000", s.DecisionConns))
	}
	if s.RenewalConns < 1 || s.RenewalConns > 1000 {
		errs = append(errs, fmt.Errorf("--renewal-conns %d: want 1 to 1000", s.RenewalConns))
	}
	if s.MaxQueued < 1 {
		errs = append(errs, fmt.Errorf("--max-queued %d: want at least 1", s.MaxQueued))
	}
	if s.MaxQueuedPerNamespace < 0 {
		errs = append(errs, fmt.Errorf("--max-queued-per-namespace %d: want 0 (a quarter of --max-queued) or more", s.MaxQueuedPerNamespace))
	}
	if _, port, err := net.SplitHostPort(s.Addr); err != nil {
		errs = append(errs, fmt.Errorf("--bind-address %q: %v", s.Addr, err))
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		errs = append(errs, fmt.Errorf("--bind-address %q: the port must be 1 to 65535", s.Addr))
	}
	return errors.Join(errs...)
}

// Main runs `dislock gateway` until ctx ends: 0 after a clean stop, 2 for
// bad flags, 1 when it cannot serve.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	s, err := Parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	if err := s.Check(); err != nil {
		log.Error("bad flags", "err", err)
		return 2
	}
	if err := s.run(ctx, log); err != nil {
		log.Error("the lock gateway stopped", "err", err)
		return 1
	}
	return 0
}

func (s *Settings) run(ctx context.Context, log *slog.Logger) error {
	dsn, err := store.WithRootCA(s.DatabaseURL, s.DatabaseCAFile)
	if err != nil {
		return fmt.Errorf("--database-url: %w", err)
	}
	owner, err := store.Open(ctx, dsn, store.Options{MaxConns: 2, Logger: log})
	if err != nil {
		return err
	}
	defer owner.Close()
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	srv, err := gateway.Open(ctx, dsn, gateway.Config{
		Cluster: s.Cluster, DecisionConns: s.DecisionConns, RenewalConns: s.RenewalConns,
		MaxQueued: s.MaxQueued, MaxQueuedPerNamespace: s.MaxQueuedPerNamespace,
		Credentials: &gateway.DatabaseCredentials{Lookup: func(ctx context.Context, ns string) ([][sha256.Size]byte, error) {
			return tenant.GatewayDigests(ctx, owner, s.Cluster, ns)
		}},
		Observe: m.observe,
		Logger:  log,
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	m.lanes(reg, srv)
	// The certificate may not be there yet: at a first install with
	// self-signed certificates the webhook writes it once it runs, and the
	// kubelet projects it some time after. Until then handshakes fail and
	// the gateway is not ready; it does not exit.
	var certs atomic.Pointer[certwatcher.CertWatcher]
	go s.watchCert(ctx, log, &certs)
	getCert := func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		if w := certs.Load(); w != nil {
			return w.GetCertificate(hello)
		}
		return nil, errors.New("no serving certificate yet in --cert-dir")
	}
	// TLS 1.2 or newer, and HTTP/1.1 only, as the webhook's server.
	hs := gateway.NewHTTPServer(s.Addr, srv, &tls.Config{GetCertificate: getCert,
		MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}})
	side := []*http.Server{hs}
	if s.ProbeAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
			if certs.Load() == nil {
				http.Error(w, "waiting for the serving certificate in --cert-dir "+s.CertDir, http.StatusServiceUnavailable)
				return
			}
			pctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			defer cancel()
			if err := owner.Ping(pctx); err != nil {
				http.Error(w, "the database does not answer: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		side = append(side, &http.Server{Addr: s.ProbeAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second})
	}
	if s.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		side = append(side, &http.Server{Addr: s.MetricsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second})
	}
	errc := make(chan error, len(side))
	for i, h := range side {
		ln, err := net.Listen("tcp", h.Addr)
		if err != nil {
			return err
		}
		go func() {
			var err error
			if i == 0 {
				err = h.ServeTLS(ln, "", "")
			} else {
				err = h.Serve(ln)
			}
			if !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	log.Info("serving the pods' lock calls", "cluster", s.Cluster, "address", s.Addr,
		"decisionConns", s.DecisionConns, "renewalConns", s.RenewalConns, "maxQueued", s.MaxQueued)
	select {
	case err = <-errc:
	case <-ctx.Done():
		log.Info("stopping: the calls under way finish first")
	}
	// Calls under way run to their end; new connections are refused.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*gateway.DefaultCallTimeout)
	defer cancel()
	for _, h := range side {
		_ = h.Shutdown(sctx)
	}
	return err
}

// watchCert waits for tls.crt and tls.key in the cert dir, then serves them
// through certs, reloaded when they change.
func (s *Settings) watchCert(ctx context.Context, log *slog.Logger, certs *atomic.Pointer[certwatcher.CertWatcher]) {
	crt, key := filepath.Join(s.CertDir, "tls.crt"), filepath.Join(s.CertDir, "tls.key")
	var logged time.Time
	for {
		w, err := certwatcher.New(crt, key)
		if err == nil {
			certs.Store(w)
			log.Info("serving with the certificate in --cert-dir", "dir", s.CertDir)
			_ = w.Start(ctx)
			return
		}
		if time.Since(logged) > 30*time.Second {
			log.Info("waiting for the serving certificate", "dir", s.CertDir, "err", err)
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}
