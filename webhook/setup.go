package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/webhook/controller"
	"github.com/dislock/dislock/webhook/controller/outcome"
	"github.com/dislock/dislock/webhook/controller/secretcopy"
	"github.com/dislock/dislock/webhook/controller/tenants"
	"github.com/dislock/dislock/webhook/inject"
	"github.com/dislock/dislock/webhook/maintenance"
	"github.com/dislock/dislock/webhook/pluginapi"
	"github.com/dislock/dislock/webhook/registry"
)

// Defaults of the server configuration.
const (
	DefaultCertSecretName       = "dislock-webhook-cert"
	DefaultServiceName          = "dislock-webhook"
	DefaultMutatingConfigName   = "dislock"
	DefaultValidatingConfigName = "dislock"
)

// Config is everything the `dislock webhook` server wires up, as its flags
// set it. The admission handlers take Inject and Resolver; SetupWithManager
// gives every other component its own options, made from the rest.
type Config struct {
	Inject   inject.Options
	Resolver registry.Options
	// Namespace the webhook runs in: where the database secret is copied
	// from, and never intercepted.
	Namespace string
	// CopyDBSecret runs the controller that copies the database secret into
	// every opted-in namespace (without tenant roles only: the copy is the
	// credential the administrator put there, for every namespace alike).
	CopyDBSecret bool
	// DatabaseURL, when set, runs the database loops (maintenance.Options,
	// with Retention, LedgerInterval, AlertingCandidate and
	// TokenRecordInterval). It is the owner's credential and never leaves
	// the webhook's namespace.
	DatabaseURL         string
	Retention           time.Duration
	LedgerInterval      time.Duration
	AlertingCandidate   bool
	TokenRecordInterval time.Duration
	// TenantRoles gives every opted-in namespace its own database role and
	// puts only that role's URL in the namespace's Secret (needs
	// DatabaseURL; tenants.Options, with TenantRotation, TenantGrace and
	// TenantProvisionInterval).
	TenantRoles             bool
	TenantRotation          time.Duration
	TenantGrace             time.Duration
	TenantProvisionInterval time.Duration
	// TenantGatewayURL, when set, gives namespaces lock gateway
	// credentials instead of roles (tenants.Options.GatewayURL), whose
	// URLs trust the CA in TenantGatewayCAFile.
	TenantGatewayURL    string
	TenantGatewayCAFile string
	Certs               CertConfig
	// PluginAPI, when set, is the server `kubectl dislock` reaches through
	// the API server's service proxy (webhook/pluginapi); it needs
	// DatabaseURL.
	PluginAPI webhook.Server
}

// CertConfig chooses where the serving certificate comes from.
type CertConfig struct {
	// SelfSigned generates a CA and serving certificate in process, stores
	// them in SecretName, rotates them and keeps the webhook configurations'
	// caBundle current. Otherwise the certificate is read from the manager's
	// CertDir (cert-manager's mounted secret), reloaded when it changes.
	SelfSigned  bool
	CertDir     string
	SecretName  string
	ServiceName string
	// ExtraDNSNames are added to the generated certificate (e.g. the
	// Service's fully qualified name, or localhost for a webhook the API
	// server reaches on loopback).
	ExtraDNSNames        []string
	MutatingConfigName   string
	ValidatingConfigName string

	// serving is where the server's TLS option reads self-signed
	// certificates from (Config.ServerOptions).
	serving *secretCertificate
}

// Validate lists every problem.
func (c Config) Validate() error {
	var errs []error
	errs = append(errs, c.Inject.Validate(), c.Resolver.Validate())
	if c.Namespace == "" {
		errs = append(errs, errors.New("namespace is empty (set --namespace or POD_NAMESPACE)"))
	}
	errs = append(errs, c.maintenanceOptions().Validate())
	if c.TenantRoles {
		switch {
		case c.DatabaseURL == "":
			errs = append(errs, errors.New("tenant roles need the owner's database URL (set --database-url, or --tenant-roles=false and create each namespace's Secret yourself)"))
		case c.CopyDBSecret:
			errs = append(errs, errors.New("--copy-db-secret would put the owner's credential into every opted-in namespace, where tenant roles put each namespace's own: drop --copy-db-secret (or pass --tenant-roles=false to keep copying, which lets every tenant touch every other's locks)"))
		}
		errs = append(errs, c.tenantOptions().Validate())
	}
	if c.PluginAPI != nil && c.DatabaseURL == "" {
		errs = append(errs, errors.New("kubectl dislock's API (--plugin-api-port) answers from the database: set --database-url, or --plugin-api-port=0"))
	}
	if c.TenantGatewayURL != "" && !c.TenantRoles {
		errs = append(errs, errors.New("--tenant-gateway-url gives each namespace a lock gateway credential, which the webhook mints with the owner's credential: set --database-url (and keep --tenant-roles)"))
	}
	if c.Certs.SelfSigned {
		for _, f := range [][2]string{{"cert dir", c.Certs.CertDir}, {"cert secret name", c.Certs.SecretName},
			{"service name", c.Certs.ServiceName}, {"mutating configuration name", c.Certs.MutatingConfigName},
			{"validating configuration name", c.Certs.ValidatingConfigName}} {
			if f[1] == "" {
				errs = append(errs, fmt.Errorf("self-signed certificates need the %s", f[0]))
			}
		}
	}
	return errors.Join(errs...)
}

// secretCopyOptions are the database secret copier's options.
func (c Config) secretCopyOptions() secretcopy.Options {
	return secretcopy.Options{Namespace: c.Namespace, SecretName: c.Inject.DBSecretName, CA: c.Inject.DatabaseCA}
}

// tenantOptions are the tenant roles' options.
func (c Config) tenantOptions() tenants.Options {
	return tenants.Options{DatabaseURL: c.DatabaseURL, Cluster: c.Inject.ClusterName, Namespace: c.Namespace,
		SecretName: c.Inject.DBSecretName, SecretKey: c.Inject.DBSecretKey, CA: c.Inject.DatabaseCA,
		Rotation: c.TenantRotation, Grace: c.TenantGrace, ProvisionInterval: c.TenantProvisionInterval,
		GatewayURL: c.TenantGatewayURL, GatewayCAFile: c.TenantGatewayCAFile}
}

// maintenanceOptions are the database loops' options.
func (c Config) maintenanceOptions() maintenance.Options {
	return maintenance.Options{DatabaseURL: c.DatabaseURL, Retention: c.Retention, Cluster: c.Inject.ClusterName, Namespace: c.Namespace,
		LedgerInterval: c.LedgerInterval, AlertingCandidate: c.AlertingCandidate, TokenRecordInterval: c.TokenRecordInterval}
}

// CacheOptions limits what the manager caches to what the webhook reads:
// CronJobs, opted-in namespaces, Secrets only in its own namespace or
// carrying its managed-by label (never every Secret of the cluster), and
// Pods only of injected Jobs until their outcome is labelled, trimmed to
// their status (never every pod of the cluster, nor their specs).
func CacheOptions(cfg Config) cache.Options {
	managed := labels.SelectorFromSet(labels.Set{controller.ManagedByLabel: controller.ManagedByValue})
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}: outcome.PodCache(),
		&corev1.Secret{}: {Namespaces: map[string]cache.Config{
			cfg.Namespace: {},
			// By name too: a tenant may label any number of Secrets of its
			// own, and the cache must not grow with them.
			cache.AllNamespaces: {LabelSelector: managed, FieldSelector: fields.OneTermEqualSelector("metadata.name", dbSecretName(cfg))},
		}},
	}}
}

// dbSecretName is the namespaces' database Secret's name, defaulted as the
// injection defaults it.
func dbSecretName(cfg Config) string {
	if cfg.Inject.DBSecretName != "" {
		return cfg.Inject.DBSecretName
	}
	return inject.DefaultDBSecretName
}

// SetupWithManager registers the webhooks, health checks and controllers.
func SetupWithManager(mgr manager.Manager, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("webhook configuration: %w", err)
	}
	// Start the CronJob informer with the cache rather than on the first
	// admission review, which must answer within the webhook timeout.
	if _, err := mgr.GetCache().GetInformer(context.Background(), &batchv1.CronJob{}); err != nil {
		return fmt.Errorf("watching CronJobs: %w", err)
	}
	// The Job's namespace tells whether a mesh will add a classic sidecar
	// to its pods (docs/mesh.md). The cache holds Namespaces only when a
	// namespace controller below watches them, and only then is the webhook
	// granted them (charts/dislock/templates/rbac.yaml): a read otherwise
	// would start an informer that can never sync.
	var namespaces client.Reader
	if cfg.TenantRoles || cfg.CopyDBSecret {
		// Started with the cache on every replica, not only with the
		// elected leader's controllers, so that no review waits for it.
		if _, err := mgr.GetCache().GetInformer(context.Background(), &corev1.Namespace{}); err != nil {
			return fmt.Errorf("watching Namespaces: %w", err)
		}
		namespaces = mgr.GetClient()
	} else {
		mgr.GetLogger().Info("namespaces are not watched (no tenant roles, no Secret copies): " +
			"classic mesh sidecars are detected from each Job's pod template alone, not from namespace labels (docs/mesh.md)")
	}
	register := func() {
		srv := mgr.GetWebhookServer()
		dec := admission.NewDecoder(mgr.GetScheme())
		srv.Register(MutateJobPath, &webhook.Admission{Handler: &jobMutator{
			cache: mgr.GetClient(), api: mgr.GetAPIReader(), namespaces: namespaces, opts: cfg.Inject.WithDefaults(),
			resolver: registry.NewResolver(cfg.Resolver), events: mgr.GetEventRecorder("dislock-webhook"),
		}})
		srv.Register(ValidateCronJobPath, &webhook.Admission{Handler: &cronJobValidator{decoder: dec, opts: cfg.Inject}})
	}
	if !cfg.Certs.SelfSigned {
		register()
		if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
			return err
		}
	} else if err := setupSelfSigned(mgr, cfg, register); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if cfg.CopyDBSecret {
		if err := secretcopy.SetupWithManager(mgr, cfg.secretCopyOptions()); err != nil {
			return err
		}
	}
	if cfg.TenantRoles {
		if err := tenants.SetupWithManager(mgr, cfg.tenantOptions()); err != nil {
			return err
		}
	}
	if err := outcome.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("adding the outcome controller: %w", err)
	}
	if cfg.DatabaseURL != "" {
		if err := maintenance.SetupWithManager(mgr, cfg.maintenanceOptions()); err != nil {
			return err
		}
	}
	if cfg.PluginAPI != nil {
		// Connections are made when a request comes.
		s, err := store.Open(context.Background(), cfg.DatabaseURL, store.Options{MaxConns: pluginapi.MaxInFlight})
		if err != nil {
			return fmt.Errorf("kubectl dislock's API: %w", err)
		}
		cfg.PluginAPI.Register(pluginapi.PathPrefix, &pluginapi.Handler{Client: mgr.GetClient(), Reader: mgr.GetClient(),
			Store: s, Cluster: cfg.Inject.ClusterName})
		if err := mgr.Add(cfg.PluginAPI); err != nil {
			return fmt.Errorf("kubectl dislock's API: %w", err)
		}
	}
	return nil
}

// certsServable says whether the webhook can serve: the rotator has
// written the serving certificate into its Secret, which the server serves
// from, its key is its own and it names the Service, and both webhook
// configurations trust the CA beside it, which signed it. The
// rotator's own readiness waits for the kubelet to project the Secret into
// the cert directory (up to its sync period, a minute, after the write) and
// looks for the files with an exponential back-off (a minute apart and more
// after the first few seconds): a first install could wait minutes for
// nothing. This looks every second. It lists the two configurations by
// name, which the chart's RBAC grants for the rotator (get it does not).
func certsServable(ctx context.Context, r client.Reader, c CertConfig) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	data, _, err := c.serving.data(ctx)
	if errors.Is(err, errNoCertificate) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	ca := data["ca.crt"]
	if len(bytes.TrimSpace(ca)) == 0 {
		return false, nil
	}
	if _, err := c.serving.servable(data); err != nil {
		return false, err
	}
	var m admissionregistrationv1.MutatingWebhookConfigurationList
	var v admissionregistrationv1.ValidatingWebhookConfigurationList
	for _, l := range []struct {
		list       client.ObjectList
		name, kind string
	}{{&m, c.MutatingConfigName, "mutating"}, {&v, c.ValidatingConfigName, "validating"}} {
		if err := r.List(ctx, l.list, client.MatchingFields{"metadata.name": l.name}); err != nil {
			return false, fmt.Errorf("listing the %s webhook configurations: %w", l.kind, err)
		}
	}
	var bundles [][]byte
	for _, cfg := range m.Items {
		for _, w := range cfg.Webhooks {
			bundles = append(bundles, w.ClientConfig.CABundle)
		}
	}
	for _, cfg := range v.Items {
		for _, w := range cfg.Webhooks {
			bundles = append(bundles, w.ClientConfig.CABundle)
		}
	}
	for _, b := range bundles {
		if !bytes.Equal(bytes.TrimSpace(b), bytes.TrimSpace(ca)) {
			return false, nil
		}
	}
	return len(bundles) > 0, nil
}

// servingWait registers the webhook's handlers, which adds its server to
// the manager, once the certificate is servable (certsServable, or the
// rotator's ready), and never after the manager began to stop: it is one of
// the manager's runnables, on every replica.
type servingWait struct {
	mgr      manager.Manager
	certs    CertConfig
	ready    <-chan struct{}
	register func()
	started  chan struct{}
}

func (w *servingWait) NeedLeaderElection() bool { return false }

func (w *servingWait) Start(ctx context.Context) error {
	log := w.mgr.GetLogger().WithName("certs")
	every := time.NewTicker(time.Second)
	defer every.Stop()
	// A changed problem is logged, at most once a minute: some change their
	// text every second (an expired certificate's says the time).
	var said string
	var saidAt time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.ready:
		case <-every.C:
			ok, err := certsServable(ctx, w.mgr.GetAPIReader(), w.certs)
			if err != nil && err.Error() != said && time.Since(saidAt) >= time.Minute && ctx.Err() == nil {
				said, saidAt = err.Error(), time.Now()
				log.Error(err, "the certificate cannot be served yet; still looking every second, and the rotator's own look counts too")
			}
			if !ok {
				continue
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		w.register()
		close(w.started)
		return nil
	}
}

// setupSelfSigned adds the certificate rotator and points the server's
// certificate at its Secret, read through the manager's cache (which holds
// the release namespace's Secrets). The handlers are registered (and the
// server added to the manager) once the certificate is servable; until
// then the pod is not ready.
func setupSelfSigned(mgr manager.Manager, cfg Config, register func()) error {
	if cfg.Certs.serving == nil {
		return errors.New("self-signed certificates are served from their Secret: build the webhook server with Config.ServerOptions")
	}
	key := types.NamespacedName{Namespace: cfg.Namespace, Name: cfg.Certs.SecretName}
	service := fmt.Sprintf("%s.%s.svc", cfg.Certs.ServiceName, cfg.Namespace)
	cfg.Certs.serving.reader, cfg.Certs.serving.key, cfg.Certs.serving.name = mgr.GetClient(), key, service
	cfg.Certs.serving.log = mgr.GetLogger().WithName("certs")
	if len(cfg.Certs.ExtraDNSNames) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		dropped, err := dropCertLackingNames(ctx, mgr.GetAPIReader(), mgr.GetClient(), key, cfg.Certs.ExtraDNSNames)
		cancel()
		log := mgr.GetLogger().WithName("certs")
		switch {
		case err != nil:
			log.Error(err, "the serving certificate may lack a name it must carry; it is renewed with it later")
		case dropped:
			log.Info("the serving certificate lacked a name it must carry; a new one is issued from the same CA", "names", cfg.Certs.ExtraDNSNames)
		}
	}
	ready := make(chan struct{})
	err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:      key,
		CertDir:        cfg.Certs.CertDir,
		CAName:         "dislock-webhook-ca",
		CAOrganization: "dislock",
		DNSName:        service,
		ExtraDNSNames:  cfg.Certs.ExtraDNSNames,
		IsReady:        ready,
		Webhooks: []rotator.WebhookInfo{
			{Name: cfg.Certs.MutatingConfigName, Type: rotator.Mutating},
			{Name: cfg.Certs.ValidatingConfigName, Type: rotator.Validating},
		},
	})
	if err != nil {
		return fmt.Errorf("adding the certificate rotator: %w", err)
	}
	wait := &servingWait{mgr: mgr, certs: cfg.Certs, ready: ready, register: register, started: make(chan struct{})}
	if err := mgr.Add(wait); err != nil {
		return fmt.Errorf("adding the wait for the certificate: %w", err)
	}
	started := wait.started
	return mgr.AddReadyzCheck("webhook", func(req *http.Request) error {
		select {
		case <-started:
			return mgr.GetWebhookServer().StartedChecker()(req)
		default:
			return errors.New("waiting for the self-signed certificate")
		}
	})
}
