// Command dislock is the admission webhook server (`dislock webhook`), the
// lock gateway (`dislock gateway`) and the operator CLI (migrate, windows,
// leases, release, pause, version, …); named kubectl-dislock it is
// `kubectl dislock`, which asks a cluster's webhook instead of the database.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/dislock/dislock/internal/cli"
	"github.com/dislock/dislock/internal/gatewaycmd"
	"github.com/dislock/dislock/internal/kubeconfig"
	"github.com/dislock/dislock/internal/kubectldislock"
	"github.com/dislock/dislock/internal/listenwait"
	"github.com/dislock/dislock/webhook"
	"github.com/dislock/dislock/webhook/flags"

	_ "time/tzdata" // CronJob time zones in a minimal image
)

func main() {
	if filepath.Base(os.Args[0]) == kubectldislock.BinaryName {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := kubectldislock.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	if len(os.Args) > 1 && os.Args[1] == "webhook" {
		os.Exit(runWebhook(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if len(os.Args) > 1 && os.Args[1] == "wait-for-ports" {
		code := waitForPorts(ctx, os.Args[2:])
		stop()
		os.Exit(code)
	}
	if len(os.Args) > 1 && os.Args[1] == "gateway" {
		code := gatewaycmd.Main(ctx, os.Args[2:], os.Stderr)
		stop()
		os.Exit(code)
	}
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// runWebhook parses flags, builds the manager and hands it to the webhook
// package; every failure is one logged line and a non-zero exit.
func runWebhook(args []string) int {
	s, err := flags.Parse(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2 // Parse said why
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&s.Zap)))
	log := ctrl.Log.WithName("setup")
	if err := s.Check(); err != nil {
		log.Error(err, "bad flags")
		return 2
	}
	cfg, port := s.Config, s.Port
	restCfg, err := kubeconfig.Load(s.Kubeconfig)
	if err != nil {
		log.Error(err, "loading the kubeconfig")
		return 1
	}
	// TLS 1.2 or newer, and HTTP/1.1 only: HTTP/2's rapid-reset and stream
	// exhaustion attacks are not worth it for one request per admission.
	secure := func(c *tls.Config) {
		c.MinVersion = tls.VersionTLS12
		c.NextProtos = []string{"http/1.1"}
	}
	// A host-network replica can start on the node its predecessor is still
	// leaving (graceful shutdown, then the pod's grace period): wait for its
	// ports rather than crash-loop.
	ctx := ctrl.SetupSignalHandler()
	addrs := []string{net.JoinHostPort(s.Host, strconv.Itoa(port)), s.MetricsAddr, s.ProbeAddr}
	if s.PluginAPIPort != 0 {
		addrs = append(addrs, net.JoinHostPort(s.Host, strconv.Itoa(s.PluginAPIPort)))
		cfg.PluginAPI = crwebhook.NewServer(cfg.ServerOptions(crwebhook.Options{
			Host: s.Host, Port: s.PluginAPIPort, TLSOpts: []func(*tls.Config){secure},
		}))
	}
	if err := listenwait.Free(ctx, addrs, portWait, func(addr string, err error) {
		log.Info("waiting for a port another process still holds (on the host's network, the replica this one replaces)", "addr", addr, "err", err.Error(), "upTo", portWait.String())
	}); err != nil {
		log.Error(err, "the ports did not come free; binding them anyway")
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Cache:                   webhook.CacheOptions(cfg),
		Metrics:                 metricsserver.Options{BindAddress: s.MetricsAddr, TLSOpts: []func(*tls.Config){secure}},
		HealthProbeBindAddress:  s.ProbeAddr,
		LeaderElection:          s.LeaderElect,
		LeaderElectionID:        "dislock-webhook",
		LeaderElectionNamespace: cfg.Namespace,
		// A replica that stops hands the Lease over at once rather than
		// leaving it to expire: the manager stops the leader's work before
		// it releases, and the process ends when Start returns.
		LeaderElectionReleaseOnCancel: true,
		WebhookServer: crwebhook.NewServer(cfg.ServerOptions(crwebhook.Options{
			Host: s.Host, Port: port, TLSOpts: []func(*tls.Config){secure},
		})),
		GracefulShutdownTimeout: ptr(20 * time.Second),
	})
	if err != nil {
		log.Error(err, "creating the manager")
		return 1
	}
	if err := webhook.SetupWithManager(mgr, cfg); err != nil {
		log.Error(err, "setting up the webhook")
		return 1
	}
	log.Info("starting", "cluster", cfg.Inject.ClusterName, "port", port, "selfSignedCerts", cfg.Certs.SelfSigned)
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "running the manager")
		return 1
	}
	return 0
}

// waitForPorts is `dislock wait-for-ports [--timeout D] ADDR...`, the
// chart's init container on the host's network: it returns once every
// address can be bound. Waiting there rather than in the webhook keeps the
// kubelet from probing the pod meanwhile, when the predecessor still
// holding the address would answer for it.
func waitForPorts(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("wait-for-ports", flag.ContinueOnError)
	timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait before giving up (exit 1)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "dislock wait-for-ports: name the addresses to wait for, e.g. [10.0.0.7]:9443")
		return 2
	}
	err := listenwait.Free(ctx, fs.Args(), *timeout, func(addr string, err error) {
		fmt.Fprintf(os.Stderr, "dislock wait-for-ports: %s is in use (on the host's network, the replica this one replaces): waiting up to %v: %v\n", addr, *timeout, err)
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "dislock wait-for-ports: %v\n", err)
		return 1
	}
	return 0
}

// portWait bounds the wait for the ports: the predecessor's graceful
// shutdown (20 s) within its pod's termination grace period (the chart's
// 30 s, after a 5 s preStop sleep).
const portWait = time.Minute

func ptr[T any](v T) *T { return &v }
