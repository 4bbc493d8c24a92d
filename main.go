// Command dislock is the admission webhook server (`dislock webhook`) and the
// operator CLI (migrate, windows, leases, release, version).
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/dislock/dislock/internal/cli"
	"github.com/dislock/dislock/internal/kubeconfig"
	"github.com/dislock/dislock/internal/tokenrecord"
	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/webhook"
	"github.com/dislock/dislock/webhook/controller/tenants"
	"github.com/dislock/dislock/webhook/inject"
	"github.com/dislock/dislock/webhook/maintenance"
	"github.com/dislock/dislock/webhook/registry"

	_ "time/tzdata" // CronJob time zones in a minimal image
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "webhook" {
		os.Exit(runWebhook(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// runWebhook parses flags, builds the manager and hands it to the webhook
// package; every failure is one logged line and a non-zero exit.
func runWebhook(args []string) int {
	fs := flag.NewFlagSet("dislock webhook", flag.ContinueOnError)
	var (
		cfg                          webhook.Config
		port                         int
		metricsAddr, probeAddr, kube string
		leaderElect                  bool
		agentCPU, agentCPULimit      string
		agentMem, agentMemRequest    string
		agentMaxCPU, agentMaxMem     string
		databaseCAFile               string
	)
	fs.StringVar(&cfg.Inject.ClusterName, "cluster-name", "", "name of this cluster (data centre) in every lock owner (required)")
	fs.StringVar(&cfg.Inject.AgentImage, "agent-image", "", "image of the injected dislock-agent sidecar (required)")
	fs.StringVar(&cfg.Inject.DBSecretName, "db-secret-name", inject.DefaultDBSecretName, "Secret holding the database URL, in each opted-in namespace")
	fs.StringVar(&cfg.Inject.DBSecretKey, "db-secret-key", inject.DefaultDBSecretKey, "key of the database URL in that Secret")
	fs.StringVar(&agentCPU, "agent-cpu-request", "", "sidecar CPU request (default "+inject.DefaultAgentCPURequest+")")
	fs.StringVar(&agentCPULimit, "agent-cpu-limit", "", "sidecar CPU limit (default "+inject.DefaultAgentCPULimit+")")
	fs.StringVar(&agentMemRequest, "agent-memory-request", "", "sidecar memory request (default "+inject.DefaultAgentMemoryRequest+", or the limit if lower)")
	fs.StringVar(&agentMem, "agent-memory-limit", "", "sidecar memory limit (default "+inject.DefaultAgentMemoryLimit+")")
	fs.StringVar(&agentMaxCPU, "agent-max-cpu", "", "most CPU (request or limit) a CronJob may give its sidecar by annotation (default "+inject.DefaultAgentMaxCPU+")")
	fs.StringVar(&agentMaxMem, "agent-max-memory", "", "most memory (request or limit) a CronJob may give its sidecar by annotation (default "+inject.DefaultAgentMaxMemory+")")
	fs.StringVar(&cfg.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace the webhook runs in (default $POD_NAMESPACE)")
	fs.BoolVar(&cfg.CopyDBSecret, "copy-db-secret", false, "copy the database Secret into every opted-in namespace")
	fs.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv(contract.EnvDatabaseURL), "PostgreSQL URL for migrations and retention (optional; default $"+contract.EnvDatabaseURL+")")
	fs.StringVar(&databaseCAFile, "database-ca-file", "", "PEM file of the CA that signed the database's (or PgBouncer's) certificate: --database-url verifies with it (sslmode=verify-full unless the URL sets a mode), and the sidecars get it from their namespace's Secret")
	fs.Func("pod-labels", "labels added to injected Jobs' pods, key=value,... (repeatable; a key the pod template sets keeps its value)", inject.PodMetadataFlag("--pod-labels", &cfg.Inject.PodLabels))
	fs.Func("pod-annotations", "annotations added to injected Jobs' pods, key=value,... (repeatable; a key the pod template sets keeps its value)", inject.PodMetadataFlag("--pod-annotations", &cfg.Inject.PodAnnotations))
	fs.DurationVar(&cfg.Retention, "retention", store.DefaultRetention, "delete windows older than this")
	fs.BoolVar(&cfg.TenantRoles, "tenant-roles", true, "give every opted-in namespace its own database role and put only its URL in the namespace's Secret (with --database-url)")
	fs.DurationVar(&cfg.TenantRotation, "tenant-rotation", tenants.DefaultTenantRotation, "give each namespace a new database role this often")
	fs.DurationVar(&cfg.TenantGrace, "tenant-grace", tenants.DefaultTenantGrace, "keep a superseded namespace role valid this long for pods still using it (at least 24h)")
	fs.DurationVar(&cfg.TokenRecordInterval, "token-record-interval", maintenance.DefaultTokenRecordInterval, "confirm the fencing token epoch and record its high water in ConfigMap "+tokenrecord.Name+" this often on the elected leader (with --database-url)")
	fs.DurationVar(&cfg.LedgerInterval, "ledger-interval", maintenance.DefaultLedgerInterval, "compute the ledger's metrics (missed windows, decisions, run durations) this often on the elected leader (with --database-url)")
	fs.IntVar(&port, "port", 9443, "webhook HTTPS port")
	fs.StringVar(&cfg.Certs.CertDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory with tls.crt and tls.key (reloaded on change)")
	fs.BoolVar(&cfg.Certs.SelfSigned, "self-signed-certs", false, "generate and rotate the serving certificate in process and keep the webhook configurations' caBundle current")
	fs.StringVar(&cfg.Certs.SecretName, "cert-secret-name", webhook.DefaultCertSecretName, "Secret storing the self-signed certificate")
	fs.Func("cert-extra-dns-name", "another DNS name for the self-signed certificate (repeatable; e.g. localhost when the API server calls the webhook on loopback)", func(v string) error {
		if v = strings.TrimSpace(v); v == "" {
			return errors.New("empty name")
		}
		cfg.Certs.ExtraDNSNames = append(cfg.Certs.ExtraDNSNames, v)
		return nil
	})
	fs.StringVar(&cfg.Certs.ServiceName, "service-name", webhook.DefaultServiceName, "Service in front of the webhook (the certificate's DNS name)")
	fs.StringVar(&cfg.Certs.MutatingConfigName, "mutating-webhook-configuration", webhook.DefaultMutatingConfigName, "MutatingWebhookConfiguration whose caBundle to keep current")
	fs.StringVar(&cfg.Certs.ValidatingConfigName, "validating-webhook-configuration", webhook.DefaultValidatingConfigName, "ValidatingWebhookConfiguration whose caBundle to keep current")
	fs.DurationVar(&cfg.Resolver.Timeout, "registry-timeout", registry.DefaultResolveTimeout, "deadline for one image registry lookup (must fit in the webhook timeout)")
	fs.DurationVar(&cfg.Resolver.ReviewBudget, "registry-review-budget", registry.DefaultReviewBudget, "deadline for all registry lookups of one admission, run in parallel (below the 5s webhook timeout)")
	fs.Int64Var(&cfg.Resolver.MaxManifestBytes, "registry-max-manifest-bytes", registry.DefaultMaxManifestBytes, "largest image manifest or index read from a registry")
	fs.Int64Var(&cfg.Resolver.MaxConfigBytes, "registry-max-config-bytes", registry.DefaultMaxConfigBytes, "largest image config read from a registry")
	fs.IntVar(&cfg.Resolver.MaxConcurrentLookups, "registry-max-concurrent-lookups", registry.DefaultMaxConcurrentLookups, "registry lookups in flight at once, across all admissions")
	// Registry host patterns, comma-separated or repeated; Validate checks them.
	hostList := func(dst *[]string) func(string) error {
		return func(v string) error {
			for _, h := range strings.Split(v, ",") {
				if h = strings.TrimSpace(h); h != "" {
					*dst = append(*dst, h)
				}
			}
			return nil
		}
	}
	fs.Func("registry-allow", "only query these registries (host or host:port, * within a DNS label; repeatable or comma-separated; default: all)", hostList(&cfg.Resolver.AllowedRegistries))
	fs.Func("registry-deny", "never contact these registries, not even through a redirect (repeatable or comma-separated)", hostList(&cfg.Resolver.DeniedRegistries))
	fs.Func("registry-insecure", "registries that may be spoken to over plain HTTP (repeatable or comma-separated)", hostList(&cfg.Resolver.InsecureRegistries))
	fs.Func("registry-private", "registries that may resolve to loopback or private addresses, e.g. an in-cluster registry (repeatable or comma-separated; link-local is never contacted)", hostList(&cfg.Resolver.PrivateRegistries))
	fs.BoolVar(&cfg.Resolver.Insecure, "insecure-registry", false, "let every registry be plain HTTP and on a private address (tests only)")
	fs.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "Prometheus metrics address (0 disables)")
	fs.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "health and readiness probe address")
	fs.BoolVar(&leaderElect, "leader-elect", false, "elect a leader for the secret copier, tenant roles, retention, the ledger metrics and the pods' outcome labels and Events")
	fs.StringVar(&kube, "kubeconfig", "", "kubeconfig file (default: in-cluster, or $KUBECONFIG)")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

	var err error
	if cfg.Inject.AgentResources, err = inject.AgentResources(agentCPU, agentCPULimit, agentMemRequest, agentMem); err != nil {
		log.Error(err, "bad sidecar resources")
		return 2
	}
	if cfg.Inject.AgentMaxResources, err = inject.AgentMaxResources(agentMaxCPU, agentMaxMem); err != nil {
		log.Error(err, "bad sidecar resource ceiling")
		return 2
	}
	if databaseCAFile != "" {
		if cfg.Inject.DatabaseCA, err = inject.ReadDatabaseCA(databaseCAFile); err != nil {
			log.Error(err, "bad database CA")
			return 2
		}
		// Before anything connects: the owner's connection verifies too.
		if cfg.DatabaseURL != "" {
			if cfg.DatabaseURL, err = store.WithRootCA(cfg.DatabaseURL, databaseCAFile); err != nil {
				log.Error(err, "bad --database-url")
				return 2
			}
		}
	}
	// Tenant roles are provisioned with the owner's credential: without it
	// each namespace's Secret is the administrator's to create.
	cfg.TenantRoles = cfg.TenantRoles && cfg.DatabaseURL != ""
	if err := cfg.Validate(); err != nil {
		log.Error(err, "bad flags")
		return 2
	}
	restCfg, err := kubeconfig.Load(kube)
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
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Cache:                   webhook.CacheOptions(cfg),
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr, TLSOpts: []func(*tls.Config){secure}},
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "dislock-webhook",
		LeaderElectionNamespace: cfg.Namespace,
		WebhookServer: crwebhook.NewServer(crwebhook.Options{
			Port: port, CertDir: cfg.Certs.CertDir, TLSOpts: []func(*tls.Config){secure},
		}),
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
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "running the manager")
		return 1
	}
	return 0
}

func ptr[T any](v T) *T { return &v }
