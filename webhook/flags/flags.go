// Package flags is the command line of `dislock webhook`: every flag, its
// default and its check, in one place. The chart's values schema is held to
// what Check refuses (test/chart), so a value that renders also starts.
package flags

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/dislock/dislock/internal/flagusage"
	"github.com/dislock/dislock/internal/tokenrecord"
	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/webhook"
	"github.com/dislock/dislock/webhook/controller/tenants"
	"github.com/dislock/dislock/webhook/inject"
	"github.com/dislock/dislock/webhook/maintenance"
	"github.com/dislock/dislock/webhook/registry"
)

// Settings is what the flags set: the webhook's Config and the manager's
// own settings. Check completes Config from the flags it reads as text.
type Settings struct {
	Config webhook.Config
	Port   int
	// PluginAPIPort serves kubectl dislock (0: not served).
	PluginAPIPort int
	Host          string
	MetricsAddr   string
	ProbeAddr     string
	Kubeconfig    string
	LeaderElect   bool
	Zap           zap.Options

	agentCPU, agentCPULimit   string
	agentMem, agentMemRequest string
	agentMaxCPU, agentMaxMem  string
	databaseCAFile            string
	gatewayCAFile             string
}

// Parse reads args and reports what it refuses to out: a malformed flag
// with the usage, as -h (flag.ErrHelp) asks. Check then refuses values that
// parse but cannot run.
func Parse(args []string, out io.Writer) (*Settings, error) {
	fs := flag.NewFlagSet("dislock webhook", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: dislock webhook [flags]\n\nThe admission webhook server (docs/install.md installs it with the chart).\n\nFlags:\n")
		flagusage.Print(out, fs)
	}
	s := &Settings{}
	cfg := &s.Config
	fs.StringVar(&cfg.Inject.ClusterName, "cluster-name", "", "name of this cluster (data centre) in every lock owner (required)")
	fs.StringVar(&cfg.Inject.AgentImage, "agent-image", "", "image of the injected dislock-agent sidecar (required)")
	fs.StringVar(&cfg.Inject.DBSecretName, "db-secret-name", inject.DefaultDBSecretName, "Secret holding the database URL, in each opted-in namespace")
	fs.StringVar(&cfg.Inject.DBSecretKey, "db-secret-key", inject.DefaultDBSecretKey, "key of the database URL in that Secret")
	fs.StringVar(&s.agentCPU, "agent-cpu-request", "", "sidecar CPU request (default "+inject.DefaultAgentCPURequest+")")
	fs.StringVar(&s.agentCPULimit, "agent-cpu-limit", "", "sidecar CPU limit (default "+inject.DefaultAgentCPULimit+")")
	fs.StringVar(&s.agentMemRequest, "agent-memory-request", "", "sidecar memory request (default "+inject.DefaultAgentMemoryRequest+", or the limit if lower)")
	fs.StringVar(&s.agentMem, "agent-memory-limit", "", "sidecar memory limit (default "+inject.DefaultAgentMemoryLimit+")")
	fs.StringVar(&s.agentMaxCPU, "agent-max-cpu", "", "most CPU (request or limit) a CronJob may give its sidecar by annotation (default "+inject.DefaultAgentMaxCPU+")")
	fs.StringVar(&s.agentMaxMem, "agent-max-memory", "", "most memory (request or limit) a CronJob may give its sidecar by annotation (default "+inject.DefaultAgentMaxMemory+")")
	fs.StringVar(&cfg.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace the webhook runs in (default $POD_NAMESPACE)")
	fs.BoolVar(&cfg.CopyDBSecret, "copy-db-secret", false, "copy the database Secret into every opted-in namespace")
	fs.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv(contract.EnvDatabaseURL), "PostgreSQL URL for migrations and retention (optional; default $"+contract.EnvDatabaseURL+")")
	fs.StringVar(&s.databaseCAFile, "database-ca-file", "", "PEM file of the CA that signed the database's (or PgBouncer's) certificate: --database-url verifies with it (sslmode=verify-full unless the URL sets a mode), and the sidecars get it from their namespace's Secret")
	fs.Func("pod-labels", "labels added to injected Jobs' pods, key=value,... (repeatable; a key the pod template sets keeps its value)", inject.PodMetadataFlag("--pod-labels", &cfg.Inject.PodLabels))
	fs.Func("pod-annotations", "annotations added to injected Jobs' pods, key=value,... (repeatable; a key the pod template sets keeps its value)", inject.PodMetadataFlag("--pod-annotations", &cfg.Inject.PodAnnotations))
	fs.DurationVar(&cfg.Retention, "retention", store.DefaultRetention, "delete windows older than this")
	fs.BoolVar(&cfg.TenantRoles, "tenant-roles", true, "give every opted-in namespace its own database role and put only its URL in the namespace's Secret (with --database-url)")
	fs.DurationVar(&cfg.TenantRotation, "tenant-rotation", tenants.DefaultTenantRotation, "give each namespace a new database role this often")
	fs.StringVar(&cfg.TenantGatewayURL, "tenant-gateway-url", "", "this cluster's lock gateway, https://host:port: namespaces get a gateway credential instead of a database role, and their Secret the gateway's URL (the owner then needs no CREATEROLE)")
	fs.StringVar(&s.gatewayCAFile, "tenant-gateway-ca-file", "", "PEM file of the CA that signed the lock gateway's certificate, read at every reconcile: the namespaces' gateway URLs trust it (default: the system's roots)")
	fs.DurationVar(&cfg.TenantGrace, "tenant-grace", tenants.DefaultTenantGrace, "keep a superseded namespace role valid this long for pods still using it (at least 24h)")
	fs.DurationVar(&cfg.TokenRecordInterval, "token-record-interval", maintenance.DefaultTokenRecordInterval, "confirm the fencing token epoch and record its high water in ConfigMap "+tokenrecord.Name+" this often on the elected leader (with --database-url)")
	fs.BoolVar(&cfg.AlertingCandidate, "alerting-candidate", false, "let this cluster raise the alerts on the database's metrics for every cluster (the alerting cluster, docs/operations.md): set it where Prometheus evaluates dislock's rules (with --database-url)")
	fs.DurationVar(&cfg.LedgerInterval, "ledger-interval", maintenance.DefaultLedgerInterval, "compute the ledger's metrics (missed windows, decisions, run durations) this often on the elected leader (with --database-url)")
	fs.IntVar(&s.Port, "port", 9443, "webhook HTTPS port")
	fs.IntVar(&s.PluginAPIPort, "plugin-api-port", 0, "HTTPS port serving kubectl dislock through the API server's service proxy, with the callers' own RBAC (with --database-url; 0: not served)")
	fs.StringVar(&s.Host, "host", "", "address the webhook's HTTPS server listens on (default: every address; on the host's network the chart gives the pod's IP)")
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
	fs.StringVar(&s.MetricsAddr, "metrics-bind-address", ":8080", "Prometheus metrics address (0 disables)")
	fs.StringVar(&s.ProbeAddr, "health-probe-bind-address", ":8081", "health and readiness probe address")
	fs.BoolVar(&s.LeaderElect, "leader-elect", false, "elect a leader for the secret copier, tenant roles, retention, the ledger metrics and the pods' outcome labels and Events")
	fs.StringVar(&s.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, or $KUBECONFIG)")
	s.Zap.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("dislock webhook takes no arguments, got %q: every setting is a flag (dislock webhook -h)", fs.Args())
		fmt.Fprintln(out, err)
		return nil, err
	}
	return s, nil
}

// Check refuses settings the webhook cannot run with, naming the flag, and
// completes Config: the sidecar's resources, the database CA (read from its
// file), tenant roles only with a database URL.
func (s *Settings) Check() error {
	cfg := &s.Config
	var err error
	if cfg.Inject.AgentResources, err = inject.AgentResources(s.agentCPU, s.agentCPULimit, s.agentMemRequest, s.agentMem); err != nil {
		return fmt.Errorf("bad sidecar resources: %w", err)
	}
	if cfg.Inject.AgentMaxResources, err = inject.AgentMaxResources(s.agentMaxCPU, s.agentMaxMem); err != nil {
		return fmt.Errorf("bad sidecar resource ceiling: %w", err)
	}
	if s.databaseCAFile != "" {
		if cfg.Inject.DatabaseCA, err = inject.ReadDatabaseCA(s.databaseCAFile); err != nil {
			return fmt.Errorf("bad database CA: %w", err)
		}
		// Before anything connects: the owner's connection verifies too.
		if cfg.DatabaseURL != "" {
			if cfg.DatabaseURL, err = store.WithRootCA(cfg.DatabaseURL, s.databaseCAFile); err != nil {
				return fmt.Errorf("bad --database-url: %w", err)
			}
		}
	}
	if s.gatewayCAFile != "" && cfg.TenantGatewayURL == "" {
		return errors.New("--tenant-gateway-ca-file needs --tenant-gateway-url")
	}
	cfg.TenantGatewayCAFile = s.gatewayCAFile
	// Tenant roles are provisioned with the owner's credential: without it
	// each namespace's Secret is the administrator's to create.
	cfg.TenantRoles = cfg.TenantRoles && cfg.DatabaseURL != ""
	return cfg.Validate()
}
