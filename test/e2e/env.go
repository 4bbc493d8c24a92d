// Package e2e runs dislock end to end the way users run it: several
// Kubernetes clusters ("data centres"), each with its own etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and one real node
// (kubelet + containerd), its own PgBouncer in transaction mode in front of
// the one PostgreSQL they share, and dislock installed with `helm install`
// (release.go). CronJobs applied to every cluster
// run real pods with the injected dislock-agent sidecar; a ledger table
// records which cluster ran which window.
//
// With Options.HA the database is a Patroni cluster instead (test/hapg): a
// PostgreSQL node per data centre, synchronous replication, HAProxy in front
// of the primary and a PgBouncer per data centre in front of HAProxy, so
// that a test can lose a data centre together with the primary.
//
// Everything listens on the loopback interface (127.0.0.1, and each node's
// own address there), and pods use the host network to reach their data
// centre's PgBouncer on 127.0.0.1. Close (and, if the test process dies,
// the watchdogs of every part) removes every process, mount, cgroup and
// directory the environment created.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dislock/dislock/test/hapg"
	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/images"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/node"
	"github.com/dislock/dislock/test/pgtest"
)

// ErrMissing is returned (wrapped, together with the error of the part that
// is missing, which says how to get it) when a binary or a Debian package
// the environment needs is not on this machine.
var ErrMissing = errors.New("e2e: missing prerequisite")

const (
	// Namespace is the opted-in namespace the tests' CronJobs live in, in
	// every data centre.
	Namespace = "e2e"
	// OtherTeam is a second opted-in namespace, another team's: it gets a
	// database role of its own, and a CronJob of the same name there is
	// another key.
	OtherTeam = "e2e-team-b"
	// DBSecretName holds the namespace's own database role's URL through the
	// data centre's PgBouncer (key "url"; the webhook provisions it) in
	// Namespace, where the injected sidecars read it.
	DBSecretName = "dislock-db"
)

// Teams are the opted-in namespaces, each a team of its own.
var Teams = []string{Namespace, OtherTeam}

// Options configure an Env.
type Options struct {
	// DCs names the data centres; default dc-a and dc-b.
	DCs []string
	// Logf receives progress lines; nil = silent.
	Logf func(format string, args ...any)
	// HA runs the database on a Patroni cluster (test/hapg) rather than on
	// one PostgreSQL: one node per data centre, in order (the first data
	// centre's is pg-a, and so on: 2 or 3 data centres), synchronous
	// replication. Each data centre's pods reach the primary through that
	// data centre's PgBouncer of the cluster, which is in front of HAProxy;
	// the migration, the ledger and the CLI go through HAProxy.
	HA bool
}

// Env is the running multi-DC setup.
type Env struct {
	opts   Options
	dir    string
	root   string
	wd     *harness.Watchdog
	Images images.Set
	// PG is the PostgreSQL every data centre shares (its own PgBouncer is
	// not used: each DC has one); nil with Options.HA.
	PG *pgtest.Server
	// HA is the Patroni cluster with Options.HA, nil otherwise.
	HA  *hapg.Cluster
	DCs []*DC

	closeOnce sync.Once
	closeErr  error
}

// DC is one data centre.
type DC struct {
	Name    string
	Cluster *kube.Cluster
	Node    *node.Node
	Client  kubernetes.Interface
	bouncer pgBouncer
	// ha and haDC are, with Options.HA, the Patroni cluster and the data
	// centre of it ("a", "b", "c") that is this one.
	ha   *hapg.Cluster
	haDC string
}

// BouncerDSN is the database URL through this data centre's PgBouncer.
func (dc *DC) BouncerDSN() string { return dc.bouncer.DSN() }

// StopBouncer makes this data centre lose the database.
func (dc *DC) StopBouncer() error { return dc.bouncer.Stop() }

// StartBouncer gives it back.
func (dc *DC) StartBouncer() error { return dc.bouncer.Start() }

// PostgresNode is, with Options.HA, the name of this data centre's Patroni
// node ("pg-a", ...); "" otherwise.
func (dc *DC) PostgresNode() string {
	if dc.ha == nil {
		return ""
	}
	return "pg-" + dc.haDC
}

// KillPostgres, with Options.HA, makes this data centre lose its PostgreSQL
// node: its Patroni and every PostgreSQL process are SIGKILLed (hapg's
// Kill). If it was the primary, a replica is promoted once the leader key
// expires.
func (dc *DC) KillPostgres() error {
	if dc.ha == nil {
		return errors.New("e2e: KillPostgres needs Options.HA")
	}
	return dc.ha.Kill(dc.PostgresNode())
}

// LeaderDC is, with Options.HA, the data centre whose PostgreSQL node holds
// Patroni's leader key: the primary.
func (e *Env) LeaderDC(ctx context.Context) (*DC, error) {
	if e.HA == nil {
		return nil, errors.New("e2e: LeaderDC needs Options.HA")
	}
	leader, err := e.HA.Leader(ctx)
	if err != nil {
		return nil, err
	}
	for _, dc := range e.DCs {
		if dc.PostgresNode() == leader {
			return dc, nil
		}
	}
	return nil, fmt.Errorf("e2e: the leader %s is in no data centre", leader)
}

// Start builds the images, starts PostgreSQL (or with opts.HA the Patroni
// cluster), migrates it, creates the ledger, and starts every data centre
// (in parallel). A missing prerequisite yields an error wrapping ErrMissing.
func Start(opts Options) (*Env, error) {
	if len(opts.DCs) == 0 {
		opts.DCs = []string{"dc-a", "dc-b"}
	}
	if opts.HA && len(opts.DCs) != 2 && len(opts.DCs) != 3 {
		return nil, fmt.Errorf("e2e: Options.HA needs 2 or 3 data centres (a Patroni node each), not %d", len(opts.DCs))
	}
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "dislock-e2e-")
	if err != nil {
		return nil, fmt.Errorf("e2e: %w", err)
	}
	// pgbouncer runs as the postgres user and reads its config here.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("e2e: %w", err)
	}
	wd, err := harness.StartWatchdog("e2e", watchdogScript, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	e := &Env{opts: opts, dir: dir, root: root, wd: wd}
	err = e.setUp()
	if err == nil {
		return e, nil
	}
	// The state first: Close removes the logs it reads.
	state := e.Dump()
	return nil, errors.Join(fmt.Errorf("%w\n%s", err, state), e.Close())
}

func (e *Env) setUp() error {
	begun := time.Now()
	set, err := images.Build(filepath.Join(e.dir, "images"))
	if err != nil {
		return missing(err)
	}
	e.Images = set
	e.logf("images built in %v", time.Since(begun).Round(time.Millisecond))

	if err := e.startDatabase(); err != nil {
		return missing(err)
	}
	if out, err := exec.Command(e.dislock(), "migrate", "--database-url", e.dsn()).CombinedOutput(); err != nil {
		return fmt.Errorf("e2e: dislock migrate: %w: %s", err, out)
	}
	if err := e.exec(images.LedgerSchema); err != nil {
		return fmt.Errorf("e2e: creating the ledger: %w", err)
	}

	e.DCs = make([]*DC, len(e.opts.DCs))
	errs := make([]error, len(e.opts.DCs))
	var wg sync.WaitGroup
	for i, name := range e.opts.DCs {
		e.DCs[i] = &DC{Name: name}
		if e.HA != nil {
			e.DCs[i].ha, e.DCs[i].haDC = e.HA, e.HA.DCs()[i]
		}
		wg.Go(func() { errs[i] = e.startDC(e.DCs[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	e.logf("%d data centres up in %v (dir %s)", len(e.DCs), time.Since(begun).Round(time.Millisecond), e.dir)
	return nil
}

// startDatabase starts PostgreSQL, or with Options.HA the Patroni cluster.
func (e *Env) startDatabase() error {
	var err error
	if e.opts.HA {
		e.HA, err = hapg.Start(hapg.Options{Name: "e2e", Logf: e.opts.Logf, Nodes: len(e.opts.DCs)})
	} else {
		e.PG, err = pgtest.Start(pgtest.Options{Name: "e2e", Logf: e.opts.Logf})
	}
	return err
}

// dsn connects to the database directly, not through a data centre's
// PgBouncer (which a test may have stopped): to PostgreSQL, or with
// Options.HA to HAProxy, that is to the current primary.
func (e *Env) dsn() string {
	if e.HA != nil {
		return e.HA.HAProxyDSN()
	}
	return e.PG.DirectDSN()
}

func (e *Env) startDC(dc *DC) error {
	begun := time.Now()
	var err error
	dc.Cluster, err = kube.Start(kube.Options{Name: dc.Name, ControllerManager: true, Logf: e.opts.Logf})
	if err != nil {
		return missing(err)
	}
	dc.Client, err = kubernetes.NewForConfig(dc.Cluster.RESTConfig())
	if err != nil {
		return fmt.Errorf("e2e: %w", err)
	}
	if dc.ha != nil {
		dc.bouncer = dc.ha.Bouncer(dc.haDC)
	} else {
		b, err := newBouncer("pgbouncer-"+dc.Name, e.dir, e.PG.DirectDSN())
		if err != nil {
			return err
		}
		dc.bouncer = b
		if err := b.Start(); err != nil {
			return err
		}
	}
	// The node has an address of its own: the chart's webhook pod, on the
	// host's network, is its Service's endpoint there (release.go).
	dc.Node, err = node.Start(node.Options{Name: dc.Name + "-node", Cluster: dc.Cluster, Images: e.Images.Tarball,
		Scheduler: true, OwnAddress: true, Logf: e.opts.Logf})
	if err != nil {
		return missing(err)
	}
	ctx := context.Background()
	namespaces := []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: WebhookNamespace}}}
	for _, team := range Teams {
		namespaces = append(namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: team,
			Labels: map[string]string{"dislock.io/injection": "enabled"}}})
	}
	for _, ns := range namespaces {
		if _, err := dc.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("e2e: %s: %w", dc.Name, err)
		}
	}
	// The HA cluster's PgBouncers authenticate the roles of their auth_file
	// only (test/hapg): each namespace gets the owner's URL, in a Secret of
	// its own that the webhook leaves alone.
	for _, team := range Teams {
		if dc.ha == nil {
			continue
		}
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: DBSecretName, Namespace: team},
			StringData: map[string]string{"url": dc.bouncer.DSN()},
		}
		if _, err := dc.Client.CoreV1().Secrets(team).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("e2e: %s: %w", dc.Name, err)
		}
	}
	installBegun := time.Now()
	if err := installRelease(ctx, dc, e.root, dc.bouncer.DSN(), e.logf); err != nil {
		return err
	}
	e.logf("%s: helm install %s in %v%s", dc.Name, ReleaseName, time.Since(installBegun).Round(time.Millisecond), webhookRestarts(ctx, dc))
	for _, team := range Teams {
		if err := awaitReady(ctx, dc, team); err != nil {
			return err
		}
	}
	e.logf("%s up in %v", dc.Name, time.Since(begun).Round(time.Millisecond))
	return nil
}

// awaitReady waits until the namespace's default ServiceAccount exists
// (without it pods are refused) and the API server calls the webhook for
// the namespace (its namespace selector sees the label through a cache): a
// dry-run CronJob with a bad mode is refused naming the value.
func awaitReady(ctx context.Context, dc *DC, namespace string) error {
	probe := ProbeCronJob()
	probe.Namespace = namespace
	deadline := time.Now().Add(time.Minute)
	for {
		_, saErr := dc.Client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		// The namespace's database Secret: the webhook provisions its role.
		_, secretErr := dc.Client.CoreV1().Secrets(namespace).Get(ctx, DBSecretName, metav1.GetOptions{})
		_, err := dc.Client.BatchV1().CronJobs(namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if saErr == nil && secretErr == nil && err != nil && strings.Contains(err.Error(), probeMode) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("e2e: %s: the webhook does not validate CronJobs in %s (service account: %v; database Secret: %v; dry run: %v)",
				dc.Name, namespace, saErr, secretErr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Close stops every data centre (in parallel), then PostgreSQL or the
// Patroni cluster, and removes the directory. Later calls return the first
// call's result.
func (e *Env) Close() error {
	e.closeOnce.Do(func() {
		var mu sync.Mutex
		var errs []error
		add := func(err error) {
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}
		var wg sync.WaitGroup
		for _, dc := range e.DCs {
			if dc == nil {
				continue
			}
			wg.Go(func() {
				if dc.Node != nil {
					add(dc.Node.Close())
				}
				if dc.Cluster != nil {
					add(dc.Cluster.Close())
				}
				if dc.bouncer != nil {
					add(dc.bouncer.Close())
				}
			})
		}
		wg.Wait()
		if e.PG != nil {
			add(e.PG.Close())
		}
		if e.HA != nil {
			add(e.HA.Close())
		}
		e.wd.Stop()
		if err := os.RemoveAll(e.dir); err != nil {
			add(fmt.Errorf("e2e: %w", err))
		}
		e.closeErr = errors.Join(errs...)
		e.logf("stopped; removed %s", e.dir)
	})
	return e.closeErr
}

// exec runs SQL on the shared database directly.
func (e *Env) exec(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, e.dsn())
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, sql)
	return err
}

// dislock is the dislock binary the images were built with.
func (e *Env) dislock() string { return filepath.Join(e.Images.Binaries, "dislock") }

// Dislock runs the dislock CLI against the shared database.
func (e *Env) Dislock(args ...string) (string, error) {
	args = append(args, "--database-url", e.dsn())
	out, err := exec.Command(e.dislock(), args...).CombinedOutput()
	return string(out), err
}

func (e *Env) logf(format string, args ...any) {
	if e.opts.Logf != nil {
		e.opts.Logf("e2e: "+format, args...)
	}
}

// missing marks the error of a part whose prerequisite is missing.
func missing(err error) error {
	for _, m := range []error{kube.ErrMissingBinary, node.ErrMissing, images.ErrMissing, pgtest.ErrMissingBinary, hapg.ErrMissingBinary} {
		if errors.Is(err, m) {
			return fmt.Errorf("%w: %w", ErrMissing, err)
		}
	}
	return err
}

// repoRoot is the main module's directory, which holds charts/.
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("e2e: go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("e2e: not inside the dislock module")
	}
	return filepath.Dir(mod), nil
}
