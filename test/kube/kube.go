// Package kube starts a private Kubernetes control plane (etcd,
// kube-apiserver and optionally kube-controller-manager) from the real
// binaries in <repo>/bin, for integration and end-to-end tests.
//
// A Cluster owns one temporary directory (etcd data, certificates, keys,
// kubeconfig, logs) and the processes it starts. Everything listens on
// 127.0.0.1 only, on ports picked at start, so several clusters can run side by
// side. Close stops the processes and removes the directory. If the test
// process dies first (panic, timeout, ^C, SIGKILL) the kernel kills the
// processes (they are started with a parent-death signal) and a small
// watchdog removes the directory, so no etcd or apiserver outlives a test run.
//
// Authentication: one static bearer token for the user "admin" in
// system:masters; RESTConfig and Kubeconfig use it and verify the apiserver's
// self-signed serving certificate. The binaries come from `make tools`
// (test/tools/build.sh); without them Start returns ErrMissingBinary.
package kube

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dislock/dislock/test/harness"
	"k8s.io/client-go/rest"
)

// ErrMissingBinary is returned (wrapped) by Start when a control-plane binary
// is not in the bin directory. The wrapping error names the binaries and says
// to run `make tools`.
var ErrMissingBinary = errors.New("kube: binary not built")

// Options tune a Cluster; the zero value starts etcd and kube-apiserver.
type Options struct {
	// Name appears in log lines and the temp directory's name.
	Name string
	// Logf receives progress lines (t.Logf); nil = silent.
	Logf func(format string, args ...any)
	// ControllerManager also starts kube-controller-manager with every
	// controller (CronJob, Job, garbage collector, service accounts, ...).
	// There is no scheduler and no node: pods stay Pending.
	ControllerManager bool
	// BinDir holds etcd, kube-apiserver and kube-controller-manager. Default:
	// <repo root>/bin, the repo root being the nearest directory above the
	// working directory whose go.mod is module github.com/dislock/dislock.
	BinDir string
}

// Names of the binaries, which are also the names of their log files.
const (
	etcdBin      = "etcd"
	apiserverBin = "kube-apiserver"
	kcmBin       = "kube-controller-manager"
)

const (
	// mainModule is how the repo root is recognised.
	mainModule = "github.com/dislock/dislock"
	// serviceCIDR is --service-cluster-ip-range; the apiserver takes the first
	// address (10.96.0.1) for the "kubernetes" service and puts it in its
	// certificate. Nothing is routed there: tests reach the API on loopback.
	serviceCIDR = "10.96.0.0/16"
	// adminUser is the token user; system:masters bypasses RBAC.
	adminUser = "admin"
	// serviceAccountIssuer is --service-account-issuer (the "iss" of tokens).
	serviceAccountIssuer = "https://kubernetes.default.svc.cluster.local"
	// Clients built from RESTConfig are not throttled the way client-go's
	// default (5 QPS) would throttle a test that creates many objects.
	clientQPS   = 100
	clientBurst = 200
)

// Cluster is a running control plane. Its methods are safe for concurrent use.
type Cluster struct {
	opts  Options
	bins  map[string]string
	dir   string
	token string
	// caPEM is the apiserver's serving certificate chain (self-signed CA
	// included), which clients trust.
	caPEM []byte
	// apiPort is the apiserver's secure port on 127.0.0.1.
	apiPort int
	wd      *harness.Watchdog

	mu       sync.Mutex
	closed   bool
	closeErr error
	// procs are the running components in start order; Close stops them in
	// reverse.
	procs []*proc
}

// Start creates a temp directory, starts etcd on free 127.0.0.1 ports,
// kube-apiserver on another and, if asked, kube-controller-manager, and
// returns once the apiserver's /readyz answers ok (and kcm's /healthz). A
// missing binary yields an error wrapping ErrMissingBinary that says to run
// `make tools`.
func Start(opts Options) (*Cluster, error) {
	binDir := opts.BinDir
	if binDir == "" {
		root, err := repoRoot()
		if err != nil {
			return nil, err
		}
		binDir = filepath.Join(root, "bin")
	}
	names := []string{etcdBin, apiserverBin}
	if opts.ControllerManager {
		names = append(names, kcmBin)
	}
	bins, err := findBinaries(binDir, names)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kube-"+dirLabel(opts.Name)+"-")
	if err != nil {
		return nil, fmt.Errorf("kube: creating temp dir: %w", err)
	}
	// Not spawned with a parent-death signal: it must outlive us.
	wd, err := harness.StartWatchdog("kube", watchdogScript, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	c := &Cluster{opts: opts, bins: bins, dir: dir, wd: wd}
	return harness.SetUp(c, c.setUp, (*Cluster).logTails)
}

func (c *Cluster) setUp() error {
	begun := time.Now()
	token, err := randomToken()
	if err != nil {
		return err
	}
	c.token = token
	if err := writeCredentials(c.dir, c.token); err != nil {
		return err
	}
	for _, d := range []string{c.certDir(), c.path("kcm-certs")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("kube: %w", err)
		}
	}

	etcdPort, err := c.startEtcd()
	if err != nil {
		return err
	}
	c.logf("etcd ready on %s in %v", addr(etcdPort), time.Since(begun).Round(time.Millisecond))

	apiBegun := time.Now()
	if err := c.startAPIServer(etcdPort); err != nil {
		return err
	}
	c.logf("kube-apiserver ready on %s in %v", c.URL(), time.Since(apiBegun).Round(time.Millisecond))
	if err := writeKubeconfig(c.Kubeconfig(), c.URL(), c.caFile(), c.token); err != nil {
		return err
	}

	if c.opts.ControllerManager {
		kcmBegun := time.Now()
		port, err := c.startControllerManager()
		if err != nil {
			return err
		}
		c.logf("kube-controller-manager healthy on %s in %v", addr(port), time.Since(kcmBegun).Round(time.Millisecond))
	}
	c.logf("control plane up in %v (dir %s)", time.Since(begun).Round(time.Millisecond), c.dir)
	return nil
}

// portAttempts bounds how often a component is started on new ports because
// it exited before becoming ready, most likely because another process took
// a port between freePort and the bind.
const portAttempts = 3

func (c *Cluster) startEtcd() (int, error) {
	var lastErr error
	for attempt := 1; attempt <= portAttempts; attempt++ {
		ports, err := freePorts(2)
		if err != nil {
			return 0, err
		}
		client, peer := "http://"+addr(ports[0]), "http://"+addr(ports[1])
		// A fresh data directory each attempt: a failed start may have
		// recorded the previous peer URL in it.
		data := c.path("etcd-data")
		if err := os.RemoveAll(data); err != nil {
			return 0, fmt.Errorf("kube: %w", err)
		}
		p, err := c.startProc(etcdBin,
			"--name=kube-test",
			"--data-dir="+data,
			"--listen-client-urls="+client,
			"--advertise-client-urls="+client,
			"--listen-peer-urls="+peer,
			"--initial-advertise-peer-urls="+peer,
			"--initial-cluster=kube-test="+peer,
			// The data dies with the test; skipping fsync makes the
			// apiserver's bootstrap (a few hundred writes) quicker on slow
			// disks.
			"--unsafe-no-fsync",
			"--log-level=warn",
		)
		if err != nil {
			return 0, err
		}
		err = waitReady(p, func() error { return httpOK(nil, client+"/health", "") })
		if err == nil {
			return ports[0], nil
		}
		lastErr = fmt.Errorf("kube: starting etcd on %s (attempt %d): %w", client, attempt, err)
		if !errors.Is(err, errExited) {
			return 0, lastErr
		}
	}
	return 0, lastErr
}

func (c *Cluster) startAPIServer(etcdPort int) error {
	var lastErr error
	for attempt := 1; attempt <= portAttempts; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		c.apiPort = port
		p, err := c.startProc(apiserverBin,
			"--etcd-servers=http://"+addr(etcdPort),
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			"--secure-port="+strconv.Itoa(port),
			// No --tls-cert-file: the apiserver makes a CA and a serving
			// certificate for 127.0.0.1 here, and clients trust that chain.
			"--cert-dir="+c.certDir(),
			"--token-auth-file="+c.path(tokenFile),
			"--authorization-mode=Node,RBAC",
			// The default reconciler would publish 127.0.0.1 as the
			// "kubernetes" endpoint, which the apiserver refuses.
			"--endpoint-reconciler-type=none",
			"--service-account-issuer="+serviceAccountIssuer,
			"--service-account-key-file="+c.path(saPublicKeyFile),
			"--service-account-signing-key-file="+c.path(saPrivateKeyFile),
			"--service-cluster-ip-range="+serviceCIDR,
			"--allow-privileged=true",
			// No kube-proxy here, so a Service's ClusterIP leads nowhere:
			// the apiserver dials a webhook Service's endpoints instead
			// (it resolves admission webhooks' Services as aggregated
			// APIs').
			"--enable-aggregator-routing=true",
		)
		if err != nil {
			return err
		}
		err = waitReady(p, func() error {
			if c.caPEM == nil {
				pem, err := os.ReadFile(c.caFile())
				if err != nil {
					return err
				}
				if _, err := certPool(pem); err != nil {
					// Read while being written: try again.
					return err
				}
				c.caPEM = pem
			}
			pool, _ := certPool(c.caPEM)
			return httpOK(pool, c.URL()+"/readyz", c.token)
		})
		if err == nil {
			return nil
		}
		lastErr = fmt.Errorf("kube: starting kube-apiserver on %s (attempt %d): %w", addr(port), attempt, err)
		if !errors.Is(err, errExited) {
			return lastErr
		}
		c.caPEM = nil
	}
	return lastErr
}

func (c *Cluster) startControllerManager() (int, error) {
	var lastErr error
	certDir := c.path("kcm-certs")
	for attempt := 1; attempt <= portAttempts; attempt++ {
		port, err := freePort()
		if err != nil {
			return 0, err
		}
		p, err := c.startProc(kcmBin,
			"--kubeconfig="+c.Kubeconfig(),
			// Delegated authn/authz of kcm's own endpoints; without these it
			// logs warnings and treats every request as anonymous.
			"--authentication-kubeconfig="+c.Kubeconfig(),
			"--authorization-kubeconfig="+c.Kubeconfig(),
			"--controllers=*",
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			"--secure-port="+strconv.Itoa(port),
			"--cert-dir="+certDir,
			"--service-account-private-key-file="+c.path(saPrivateKeyFile),
			"--root-ca-file="+c.caFile(),
			"--use-service-account-credentials=false",
		)
		if err != nil {
			return 0, err
		}
		// /healthz is on kcm's always-allowed paths. Its certificate is
		// self-signed into certDir; read it to verify rather than skip
		// verification.
		err = waitReady(p, func() error {
			pem, err := os.ReadFile(filepath.Join(certDir, kcmBin+".crt"))
			if err != nil {
				return err
			}
			pool, err := certPool(pem)
			if err != nil {
				return err
			}
			return httpOK(pool, "https://"+addr(port)+"/healthz", "")
		})
		if err == nil {
			return port, nil
		}
		lastErr = fmt.Errorf("kube: starting kube-controller-manager on %s (attempt %d): %w", addr(port), attempt, err)
		if !errors.Is(err, errExited) {
			return 0, lastErr
		}
	}
	return 0, lastErr
}

// RESTConfig returns a new client config for the admin user (system:masters)
// that verifies the apiserver's certificate.
func (c *Cluster) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            c.URL(),
		BearerToken:     c.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), c.caPEM...)},
		QPS:             clientQPS,
		Burst:           clientBurst,
		UserAgent:       "dislock-test/kube",
	}
}

// Kubeconfig returns the path of a kubeconfig file for the admin user, for
// kubectl or a process under test (KUBECONFIG=...). It lives in the cluster's
// temp directory and is removed by Close.
func (c *Cluster) Kubeconfig() string { return c.path("kubeconfig") }

// URL is the apiserver's base URL, https://127.0.0.1:PORT.
func (c *Cluster) URL() string { return "https://" + addr(c.apiPort) }

// CAFile returns the path of the PEM bundle that verifies the apiserver's
// serving certificate.
func (c *Cluster) CAFile() string { return c.caFile() }

// Dir is the cluster's temp directory, which holds the components' logs
// (<binary>.log).
func (c *Cluster) Dir() string { return c.dir }

// Close stops kube-controller-manager, kube-apiserver and etcd (SIGTERM, then
// SIGKILL after 10 s each), waits for them to exit and removes the temp
// directory. Later calls return the first call's result.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.closeErr
	}
	c.closed = true
	var errs []error
	for i := len(c.procs) - 1; i >= 0; i-- {
		if err := c.procs[i].Stop(syscall.SIGTERM, stopGrace); err != nil {
			errs = append(errs, err)
		}
	}
	c.closeErr = c.wd.StopAndRemove(errs...)
	c.logf("stopped; removed %s", c.dir)
	return c.closeErr
}

// pids returns the pid of every component still running, by binary name.
func (c *Cluster) pids() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int)
	for _, p := range c.procs {
		if p.Running() {
			out[p.Name()] = p.Pid()
		}
	}
	return out
}

// startProc starts one component and records it for Close.
func (c *Cluster) startProc(name string, args ...string) (*proc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, err := startProc(c.dir, name, c.bins[name], args)
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, p)
	return p, nil
}

// logTails returns the end of every component's log, for a failing test's
// output.
func (c *Cluster) logTails() string {
	var b strings.Builder
	for _, name := range []string{etcdBin, apiserverBin, kcmBin} {
		if _, ok := c.bins[name]; !ok {
			continue
		}
		b.WriteString(logTail(c.path(name + ".log")))
		b.WriteString("\n")
	}
	return b.String()
}

func (c *Cluster) certDir() string { return c.path("apiserver-certs") }

// caFile is written by the apiserver: its serving certificate followed by the
// self-signed CA that issued it.
func (c *Cluster) caFile() string { return filepath.Join(c.certDir(), "apiserver.crt") }

func (c *Cluster) path(name string) string { return filepath.Join(c.dir, name) }

func (c *Cluster) logf(format string, args ...any) {
	harness.Logf(c.opts.Logf, "kube", dirLabel(c.opts.Name), format, args...)
}

// findBinaries returns the path of each named binary in dir; every missing one
// is named in a single error.
func findBinaries(dir string, names []string) (map[string]string, error) {
	bins := make(map[string]string)
	var missing []string
	for _, n := range names {
		p := filepath.Join(dir, n)
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			missing = append(missing, n)
			continue
		}
		bins[n] = p
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s not found in %s; run `make tools` to build them "+
			"(test/tools/build.sh; 15-45 minutes the first time, seconds after that)",
			ErrMissingBinary, strings.Join(missing, ", "), dir)
	}
	return bins, nil
}

// repoRoot walks up from the working directory (a package directory under
// `go test`) to the directory whose go.mod declares the main module; nested
// modules such as test/tools are passed over.
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("kube: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if modulePath(filepath.Join(d, "go.mod")) == mainModule {
			return d, nil
		}
		if d == filepath.Dir(d) {
			return "", fmt.Errorf("kube: no go.mod for module %s in %s or above; set Options.BinDir", mainModule, wd)
		}
	}
}

// modulePath returns the module path declared in a go.mod file, or "".
func modulePath(goMod string) string {
	b, err := os.ReadFile(goMod)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) >= 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`+"`")
		}
	}
	return ""
}

func certPool(pemData []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, errors.New("no PEM certificate yet")
	}
	return pool, nil
}

var addr = harness.Addr

// dirLabel turns Options.Name into a short, path-safe label.
func dirLabel(name string) string { return harness.Label(name, "kube") }
