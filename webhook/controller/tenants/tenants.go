// Package tenants gives every opted-in namespace a database role of its own
// and keeps only that role's credential in the namespace's database Secret
// (--tenant-roles, with the owner's --database-url), renewing it every
// --tenant-rotation and dropping superseded roles after --tenant-grace. It
// runs on the elected leader only.
package tenants

import (
	"bytes"
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/webhook/controller"
	"github.com/dislock/dislock/webhook/inject"
)

// Defaults of the tenant credentials' life cycle.
const (
	DefaultTenantRotation = 30 * 24 * time.Hour
	DefaultTenantGrace    = 7 * 24 * time.Hour
	// MinTenantGrace keeps a superseded role alive for at least a day: a pod
	// that read the old Secret keeps using its role until it ends.
	MinTenantGrace = 24 * time.Hour
	// DefaultTenantProvisionInterval is the least time between two new role
	// generations of one namespace. A new generation is otherwise minted as
	// soon as its tenant deletes or spoils the Secret, so a tenant doing that
	// in a loop would spin the database (CREATE ROLE, DROP ROLE) as fast as
	// the controller runs; rotation (hours at least) never waits for it.
	DefaultTenantProvisionInterval = time.Minute
)

// MaxLiveTenantGenerations bounds the live (not yet retired) role generations
// of one namespace in one cluster, the one in use included. Superseded
// generations normally live out the grace, so that pods started with them
// finish; but every generation is a role in the catalog with a connection
// limit of its own, and a tenant deleting its Secret again and again would
// mint one a minute for the whole grace. Minting one more first drops the
// oldest superseded ones beyond the bound, inside their grace: only the
// tenant's own pods still using them are cut off. Normal rotation keeps two
// live (the one in use and the one it replaced), so four leaves room for a
// few replaced Secrets before anything is cut short.
const MaxLiveTenantGenerations = 4

// ReasonTenantRoleRetiredEarly is the reason of the Warning Event put on a
// namespace's database Secret when generations of its role were dropped
// inside their grace (MaxLiveTenantGenerations).
const ReasonTenantRoleRetiredEarly = "DislockTenantRoleRetiredEarly"

// tenantReconcileTimeout bounds one namespace's reconcile.
const tenantReconcileTimeout = 30 * time.Second

var tenantRolesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "dislock_tenant_roles_total",
	Help: "Database roles of opted-in namespaces provisioned or retired, by action (provision, retire, retire_early: inside the grace, beyond the live generations a namespace may hold).",
}, []string{"action"})

// tenantActionRetireEarly is the dislock_tenant_roles_total action of a
// generation dropped inside its grace (MaxLiveTenantGenerations).
const tenantActionRetireEarly = "retire_early"

func init() { metrics.Registry.MustRegister(tenantRolesTotal) }

// Options configure the tenant roles (set from the webhook's flags).
type Options struct {
	// DatabaseURL is the owner's credential (--database-url), with which
	// the roles are created and dropped; a namespace's URL is this one with
	// its role's credential.
	DatabaseURL string
	// Cluster names this cluster (--cluster-name): each cluster provisions
	// roles of its own for a namespace.
	Cluster string
	// Namespace is the webhook's, never provisioned.
	Namespace string
	// SecretName and SecretKey locate the URL in each namespace
	// (--db-secret-name, --db-secret-key).
	SecretName, SecretKey string
	// CA is the database's CA (--database-ca-file), nil without one: each
	// Secret carries it as ca.crt, which the sidecar mounts, and its URL
	// names the sidecar's copy as sslrootcert.
	CA []byte
	// Rotation is how often a namespace gets a new role generation
	// (--tenant-rotation); Grace how long a superseded one stays valid for
	// pods that still use it (--tenant-grace).
	Rotation, Grace time.Duration
	// ProvisionInterval is the least time between two new role
	// generations of one namespace (0: DefaultTenantProvisionInterval), so
	// that a tenant deleting its Secret in a loop cannot spin the database.
	ProvisionInterval time.Duration
	// GatewayURL, when set (--tenant-gateway-url, https://host:port), is
	// this cluster's lock gateway: namespaces get a gateway credential
	// instead of a database role, and their Secret the gateway's URL,
	// which trusts the CA in GatewayCAFile (--tenant-gateway-ca-file; the
	// system's roots when empty). No role is created: the owner needs no
	// CREATEROLE. The file is read at every reconcile: with self-signed
	// certificates the webhook writes it only once it runs, and a new CA
	// gives every namespace a new generation whose URL trusts it.
	GatewayURL    string
	GatewayCAFile string
}

// Validate lists every problem.
func (o Options) Validate() error {
	var errs []error
	if o.Grace < MinTenantGrace {
		errs = append(errs, fmt.Errorf("tenant grace %s is shorter than %s (set --tenant-grace to at least %s): a running pod would lose its database role", o.Grace, MinTenantGrace, MinTenantGrace))
	}
	if o.ProvisionInterval < 0 {
		errs = append(errs, fmt.Errorf("tenant provision interval %s is negative (leave it 0 for %s)", o.ProvisionInterval, DefaultTenantProvisionInterval))
	}
	if o.Rotation < time.Hour {
		errs = append(errs, fmt.Errorf("tenant rotation %s is shorter than an hour (set --tenant-rotation to e.g. %s)", o.Rotation, DefaultTenantRotation))
	}
	if o.GatewayURL != "" {
		if _, err := tenant.GatewayURL(o.GatewayURL, nil, tenant.GatewayCredential{Namespace: "n", Secret: "s"}); err != nil {
			errs = append(errs, fmt.Errorf("--tenant-gateway-url: %w", err))
		}
	}
	return errors.Join(errs...)
}

// tenantProvisioner gives every opted-in namespace its own database role
// and keeps that role's credential, and nothing else, in the namespace's
// database Secret: a tenant who reads it can lock only its own namespace's
// keys (row-level security in the database does the rest). It creates a new
// role generation when the Secret is missing, holds another credential (a
// copy of the owner's from before tenant roles, or a retired role), or is due
// for rotation, at most one per provision interval (a minute by default).
// Superseded generations are dropped after the grace, so pods still running
// with them are not cut off, unless the namespace would hold more than
// MaxLiveTenantGenerations (its Secret replaced again and again): then the
// oldest go early. It only writes Secrets carrying its managed-by label: a
// Secret of the same name that a user created is left alone.
type tenantProvisioner struct {
	client.Client
	// api reads the Secret uncached: the cache only holds Secrets carrying
	// the managed-by label, so a user's own Secret of that name is not in it.
	api      client.Reader
	ownerDSN string
	cluster  string
	secret   string // the Secret's name in each namespace
	key      string // the URL's key in it
	ownNS    string // the webhook's namespace: never provisioned
	ca       []byte // Options.CA
	rotation time.Duration
	grace    time.Duration
	// gatewayURL is Options.GatewayURL: with it, namespaces get gateway
	// credentials instead of roles, whose URLs trust gatewayCA().
	gatewayURL string
	gatewayCA  func() ([]byte, error)
	now        func() time.Time
	// pace spaces a namespace's new generations; events tells the
	// namespace when generations were retired early.
	pace   *provisionPacer
	events events.EventRecorder

	// The store is opened on first use: the database may come up after
	// the webhook, which must serve admissions meanwhile.
	mu    sync.Mutex
	store *store.Store
}

// SetupWithManager adds the controller that provisions and retires the
// roles.
func SetupWithManager(mgr ctrl.Manager, o Options) error {
	r := &tenantProvisioner{Client: mgr.GetClient(), api: mgr.GetAPIReader(), ownerDSN: o.DatabaseURL,
		cluster: o.Cluster, secret: o.SecretName, key: o.SecretKey, ownNS: o.Namespace, ca: o.CA,
		rotation: o.Rotation, grace: o.Grace, gatewayURL: o.GatewayURL, gatewayCA: caFile(o.GatewayCAFile), now: time.Now,
		pace:   &provisionPacer{interval: cmp.Or(o.ProvisionInterval, DefaultTenantProvisionInterval)},
		events: mgr.GetEventRecorder("dislock-webhook")}
	// A deleted or edited Secret is provisioned again at once, or once the
	// provision interval since the namespace's last generation has passed.
	return controller.ForNamespaces(mgr, "tenant-roles", func(_ context.Context, obj client.Object) []reconcile.Request {
		return controller.ManagedSecretNamespace(r.secret, obj)
	}, r)
}

func (r *tenantProvisioner) open(ctx context.Context) (*store.Store, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.store == nil {
		s, err := store.Open(ctx, r.ownerDSN, store.Options{MaxConns: 2})
		if err != nil {
			return nil, err
		}
		r.store = s
	}
	return r.store, nil
}

func (r *tenantProvisioner) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx).WithValues("namespace", req.Name)
	if req.Name == r.ownNS {
		return reconcile.Result{}, nil
	}
	// A database call that hangs (a lock held somewhere) must not stall
	// every other namespace behind this one: the controller retries.
	ctx, cancel := context.WithTimeout(ctx, tenantReconcileTimeout)
	defer cancel()
	db, err := r.open(ctx)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("opening the database for tenant roles: %w", err)
	}
	ns := &corev1.Namespace{}
	err = r.Get(ctx, req.NamespacedName, ns)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	want := err == nil && ns.DeletionTimestamp == nil && ns.Labels[contract.LabelInjection] == contract.LabelInjectionEnabled
	cur := &corev1.Secret{}
	err = r.api.Get(ctx, types.NamespacedName{Namespace: req.Name, Name: r.secret}, cur)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	mine := exists && cur.Labels[controller.ManagedByLabel] == controller.ManagedByValue
	if !want {
		// The roles go whoever holds the Secret now: taking the label
		// off it must not keep a role alive.
		return r.optedOut(ctx, db, logger, req.Name, cur, mine)
	}
	if exists && !mine {
		logger.Info("leaving a Secret dislock did not create alone; its credential is used as it is", "secret", r.secret)
		return reconcile.Result{}, nil
	}
	roles, err := tenant.Roles(ctx, db, r.cluster, req.Name)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("listing the tenant roles of namespace %s: %w", req.Name, err)
	}
	why := r.stale(cur, exists, roles)
	// Generations dropped inside their grace are told to the namespace on
	// the way out, errors included: they are gone either way.
	var early []tenant.Role
	var regarding runtime.Object = ns
	if exists {
		regarding = cur
	}
	defer func() { r.reportEarly(regarding, early) }()
	if why != "" {
		if wait := r.pace.wait(req.Name, r.now()); wait > 0 {
			logger.Info("the namespace got a new database role moments ago; waiting before the next", "why", why,
				"in", wait.Round(time.Millisecond).String(), "interval", r.pace.interval.String())
			return reconcile.Result{RequeueAfter: wait}, nil
		}
		// Make room first, so that with the new generation the namespace
		// holds at most MaxLiveTenantGenerations.
		dropped, err := r.retireBeyond(ctx, db, logger, req.Name, MaxLiveTenantGenerations-1)
		early = append(early, dropped...)
		if err != nil {
			return reconcile.Result{}, err
		}
		m, err := r.mint(ctx, db, req.Name)
		if err != nil {
			return reconcile.Result{}, err
		}
		written, err := r.write(ctx, req.Name, cur, exists, m)
		if err != nil {
			return reconcile.Result{}, err
		}
		regarding = written
		tenantRolesTotal.WithLabelValues("provision").Inc()
		logger.Info("gave the namespace a new "+m.what, "name", m.name, "generation", m.generation, "why", why, "secret", r.secret)
	}
	retired, err := tenant.Retire(ctx, db, r.cluster, req.Name, r.grace)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("retiring superseded roles of namespace %s: %w", req.Name, err)
	}
	if len(retired) > 0 {
		tenantRolesTotal.WithLabelValues("retire").Add(float64(len(retired)))
		logger.Info("dropped superseded database roles after their grace", "roles", retired, "grace", r.grace.String())
	}
	// Holds the bound even when something else minted (another replica
	// while the leadership moved) or a namespace has more from before it.
	dropped, err := r.retireBeyond(ctx, db, logger, req.Name, MaxLiveTenantGenerations)
	early = append(early, dropped...)
	if err != nil {
		return reconcile.Result{}, err
	}
	// Come back for the next rotation, or to retire what was superseded.
	return reconcile.Result{RequeueAfter: min(r.rotation, r.grace) / 4}, nil
}

// caFile reads the lock gateway's CA from file at every call; no file, no
// CA (the system's roots).
func caFile(file string) func() ([]byte, error) {
	return func() ([]byte, error) {
		if file == "" {
			return nil, nil
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("reading the lock gateway's CA (--tenant-gateway-ca-file): %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--tenant-gateway-ca-file %s holds no PEM certificate (want the CA that signed the lock gateway's certificate)", file)
		}
		return b, nil
	}
}

// minted is a namespace's new generation: its row's name, and the URL its
// pods reach the database with.
type minted struct {
	what, name, url string
	generation      int
}

// mint makes the namespace's next generation: a gateway credential with a
// gateway, a database role without.
func (r *tenantProvisioner) mint(ctx context.Context, db *store.Store, namespace string) (minted, error) {
	if r.gatewayURL != "" {
		ca, err := r.gatewayCA()
		if err != nil {
			return minted{}, err
		}
		c, err := tenant.ProvisionGateway(ctx, db, r.cluster, namespace)
		if err != nil {
			return minted{}, fmt.Errorf("provisioning a lock gateway credential for namespace %s: %w", namespace, err)
		}
		// Counted from when the generation exists, so that a failing
		// write is retried at the interval, not minted again at once.
		r.pace.provisioned(namespace, r.now())
		url, err := tenant.GatewayURL(r.gatewayURL, ca, c)
		return minted{what: "lock gateway credential", name: c.Name, url: url, generation: c.Generation}, err
	}
	cred, err := tenant.Provision(ctx, db, r.cluster, namespace)
	if err != nil {
		return minted{}, fmt.Errorf("provisioning a database role for namespace %s: %w", namespace, err)
	}
	r.pace.provisioned(namespace, r.now())
	dsn, err := r.tenantDSN(cred)
	return minted{what: "database role", name: cred.Role, url: dsn, generation: cred.Generation}, err
}

// tenantDSN is the URL a namespace's sidecars connect with: the owner's
// with the tenant's credential and, with a CA, the sidecar's copy of it as
// sslrootcert (the owner's names a file in the webhook's pod).
func (r *tenantProvisioner) tenantDSN(cred tenant.Credential) (string, error) {
	dsn, err := tenant.DSN(r.ownerDSN, cred)
	if err != nil || len(r.ca) == 0 {
		return dsn, err
	}
	return store.ReplaceRootCA(dsn, inject.DatabaseCAPath)
}

// stale says why the Secret needs a new role generation, or "".
func (r *tenantProvisioner) stale(cur *corev1.Secret, exists bool, roles []tenant.Role) string {
	switch {
	case !exists:
		return "the namespace has no database Secret yet"
	case cur.Annotations[contract.AnnotationCopiedFrom] != "":
		return "the Secret holds a copy of the webhook's own credential (from before tenant roles)"
	case len(cur.Data[r.key]) == 0:
		return "the Secret has no " + r.key
	case !bytes.Equal(cur.Data[inject.DatabaseCAKey], r.ca):
		// A CA added, changed or removed (--database-ca-file): the URL
		// names the sidecar's copy only when there is one, so the URL
		// changes too, and a URL comes only with a new generation.
		return "the Secret's " + inject.DatabaseCAKey + " is not the webhook's database CA (--database-ca-file)"
	}
	role := cur.Annotations[contract.AnnotationTenantRole]
	if role == "" || len(roles) == 0 || roles[0].Role != role {
		return fmt.Sprintf("the Secret's role %q is not the namespace's newest", role)
	}
	switch gateway := tenant.IsGatewayCredential(role); {
	case r.gatewayURL != "" && !gateway:
		return "the Secret holds a database role, and namespaces now reach the database through the lock gateway (--tenant-gateway-url)"
	case r.gatewayURL == "" && gateway:
		return "the Secret holds a lock gateway credential, and namespaces now get database roles (no --tenant-gateway-url)"
	case gateway:
		// Unreadable, the CA counts as unchanged: mint would fail on it.
		ca, err := r.gatewayCA()
		if err == nil && !tenant.GatewayURLFor(string(cur.Data[r.key]), r.gatewayURL, ca) {
			return "the Secret's URL is not the lock gateway's (--tenant-gateway-url, --tenant-gateway-ca-file)"
		}
	}
	created, err := time.Parse(time.RFC3339, cur.Annotations[contract.AnnotationTenantRoleCreated])
	if err != nil {
		return "the Secret's role creation time is unreadable"
	}
	if age := r.now().Sub(created); age >= r.rotation {
		return fmt.Sprintf("rotation: the role is %s old (rotation every %s)", age.Round(time.Minute), r.rotation)
	}
	return ""
}

// retireBeyond drops the namespace's superseded generations beyond its
// keep newest live ones, inside their grace, and logs and counts them.
func (r *tenantProvisioner) retireBeyond(ctx context.Context, db *store.Store, logger logr.Logger, namespace string, keep int) ([]tenant.Role, error) {
	dropped, err := tenant.RetireBeyond(ctx, db, r.cluster, namespace, keep)
	if len(dropped) > 0 {
		tenantRolesTotal.WithLabelValues(tenantActionRetireEarly).Add(float64(len(dropped)))
		roles := make([]string, 0, len(dropped))
		for _, d := range dropped {
			roles = append(roles, d.Role)
		}
		logger.Info("dropped database roles inside their grace: "+earlyRetirementNote(dropped, r.grace),
			"roles", roles, "maxLive", MaxLiveTenantGenerations)
	}
	if err != nil {
		return dropped, fmt.Errorf("retiring the roles of namespace %s beyond the newest %d: %w", namespace, keep, err)
	}
	return dropped, nil
}

// reportEarly puts a Warning Event on the namespace's database Secret (or
// on the namespace when there is none) for generations retired early: the
// tenant's pods that used them lose the database, and the namespace's
// events are where its people look.
func (r *tenantProvisioner) reportEarly(regarding runtime.Object, early []tenant.Role) {
	if len(early) == 0 || r.events == nil {
		return
	}
	r.events.Eventf(regarding, nil, corev1.EventTypeWarning, ReasonTenantRoleRetiredEarly, "Retire", "%s", earlyRetirementNote(early, r.grace))
}

// earlyRetirementNote says why generations were retired inside their grace
// and what it means for the namespace's pods. It stays short: an Event's
// note is at most 1 kB.
func earlyRetirementNote(early []tenant.Role, grace time.Duration) string {
	gens := make([]string, 0, len(early))
	for _, e := range early {
		gens = append(gens, strconv.Itoa(e.Generation))
	}
	which, them := "generation "+gens[0], "it"
	switch {
	case len(gens) > 5:
		which, them = fmt.Sprintf("%d generations (%s to %s)", len(gens), gens[0], gens[len(gens)-1]), "them"
	case len(gens) > 1:
		which, them = "generations "+strings.Join(gens, ", "), "them"
	}
	return fmt.Sprintf("the namespace's database Secret was replaced %d or more times within the grace (%s), and a namespace keeps at most %d live generations of its database role: "+
		"%s retired early; pods started with %s can no longer reach the database (a running job is stopped), "+
		"pods started from now on use the Secret's new role", MaxLiveTenantGenerations, grace, MaxLiveTenantGenerations, which, them)
}

func (r *tenantProvisioner) write(ctx context.Context, namespace string, cur *corev1.Secret, exists bool, m minted) (*corev1.Secret, error) {
	s := cur
	if !exists {
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: r.secret}, Type: corev1.SecretTypeOpaque}
	}
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels[controller.ManagedByLabel] = controller.ManagedByValue
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	delete(s.Annotations, contract.AnnotationCopiedFrom)
	s.Annotations[contract.AnnotationTenantRole] = m.name
	s.Annotations[contract.AnnotationTenantRoleCreated] = r.now().UTC().Format(time.RFC3339)
	s.Annotations[contract.AnnotationTenantRoleGeneration] = strconv.Itoa(m.generation)
	s.Data = map[string][]byte{r.key: []byte(m.url)}
	if len(r.ca) > 0 {
		s.Data[inject.DatabaseCAKey] = r.ca
	}
	if exists {
		return s, r.Update(ctx, s)
	}
	return s, r.Create(ctx, s)
}

// provisionPacer spaces each namespace's new role generations by at least
// interval. It measures this process's elapsed time (monotonic), not database
// time: it paces this controller's own work, and a wall clock set wrong must
// neither hold a namespace without its Secret nor lift the pace. It lives in
// memory: a restarted or newly elected webhook may mint once at once, and
// MaxLiveTenantGenerations bounds what that leaves behind.
type provisionPacer struct {
	interval time.Duration
	mu       sync.Mutex
	last     map[string]time.Time // namespace → its last new generation
}

// wait is how long namespace must still wait for its next generation.
func (p *provisionPacer) wait(namespace string, now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	last, ok := p.last[namespace]
	if !ok {
		return 0
	}
	return max(0, p.interval-now.Sub(last))
}

// provisioned records a new generation of namespace at now, and forgets
// namespaces whose interval has passed, so the map holds only those that
// are waiting.
func (p *provisionPacer) provisioned(namespace string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ns, t := range p.last {
		if now.Sub(t) >= p.interval {
			delete(p.last, ns)
		}
	}
	if p.last == nil {
		p.last = map[string]time.Time{}
	}
	p.last[namespace] = now
}

// optedOut removes the namespace's Secret and supersedes its roles, which are
// dropped after the grace: pods of the namespace still running keep theirs.
func (r *tenantProvisioner) optedOut(ctx context.Context, db *store.Store, logger logr.Logger, namespace string, cur *corev1.Secret, exists bool) (reconcile.Result, error) {
	if exists {
		if err := r.Delete(ctx, cur); client.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, err
		}
		logger.Info("deleted the database Secret: the namespace is no longer opted in", "secret", r.secret)
	}
	if err := tenant.Supersede(ctx, db, r.cluster, namespace); err != nil {
		return reconcile.Result{}, err
	}
	retired, err := tenant.Retire(ctx, db, r.cluster, namespace, r.grace)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(retired) > 0 {
		tenantRolesTotal.WithLabelValues("retire").Add(float64(len(retired)))
		logger.Info("dropped the roles of a namespace no longer opted in", "roles", retired)
	}
	left, err := tenant.Roles(ctx, db, r.cluster, namespace)
	if err != nil || len(left) == 0 {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: r.grace / 4}, nil
}
