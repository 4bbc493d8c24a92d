package chart

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/test/tlstest"
	"github.com/dislock/dislock/webhook/inject"
)

var (
	buildOnce sync.Once
	// builtDir holds the dislock binary built for the install tests; TestMain
	// removes it.
	builtDir string
	built    string
	buildErr error
)

// dislockBinary builds `dislock` once per test binary.
func dislockBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if builtDir, buildErr = os.MkdirTemp("", "dislock-chart-"); buildErr != nil {
			return
		}
		built = filepath.Join(builtDir, "dislock")
		if out, err := exec.Command("go", "build", "-o", built, "github.com/dislock/dislock").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// release is the chart installed in the test API server, with `dislock
// webhook` running as its Deployment says, as its ServiceAccount.
type release struct {
	c         *kube.Cluster
	admin     kubernetes.Interface
	ns        string
	m         manifest
	dep       *appsv1.Deployment
	container corev1.Container
	flags     flagSet
	port      int
	probePort int
	certDir   string
	// exited is closed when the webhook process has exited.
	exited <-chan struct{}
}

// installChart renders the chart, points both webhook configurations at
// https://localhost:PORT (the API server runs on loopback, the webhook is not
// behind a Service) and applies every object for real.
func installChart(t *testing.T, c *kube.Cluster, name string, vals map[string]any) *release {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(c.RESTConfig())
	r := &release{c: c, admin: admin, ns: name, port: tlstest.FreePort(t), probePort: tlstest.FreePort(t), certDir: t.TempDir()}
	createNamespace(t, c, r.ns)
	r.m = helmTemplate(t, name, r.ns, vals)
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		cfg := r.m.one(t, kind)
		hooks, _, _ := unstructured.NestedSlice(cfg.Object, "webhooks")
		for _, h := range hooks {
			cc := h.(map[string]any)["clientConfig"].(map[string]any)
			path := cc["service"].(map[string]any)["path"].(string)
			h.(map[string]any)["clientConfig"] = map[string]any{"url": fmt.Sprintf("https://localhost:%d%s", r.port, path)}
		}
		if err := unstructured.SetNestedSlice(cfg.Object, hooks, "webhooks"); err != nil {
			t.Fatal(err)
		}
	}
	ensureOptionalCRDs(t, c)
	kubectl(t, c, r.m.yaml(t), "apply", "--server-side", "-f", "-")
	t.Cleanup(func() { kubectl(t, c, r.m.yaml(t), "delete", "--ignore-not-found", "--wait=false", "-f", "-") })
	r.dep = typed[appsv1.Deployment](t, r.m.one(t, "Deployment"))
	r.container = r.dep.Spec.Template.Spec.Containers[0]
	r.flags = parseFlags(t, r.container.Args)
	return r
}

// start runs the webhook as the Deployment's pod would, with its command
// line and env. Only what a pod gets from its node differs: the ports and
// --cert-dir (local), --kubeconfig holding a token of the chart's
// ServiceAccount (the in-cluster config), and the extra flags. With
// cert-manager the caller plays the kubelet (projectSecret) and
// cert-manager; a self-signed certificate is served from its Secret.
func (r *release) start(t *testing.T, extra ...string) {
	t.Helper()
	args := slices.Clone(r.container.Args)
	for flag, v := range map[string]string{
		"port": strconv.Itoa(r.port), "cert-dir": r.certDir,
		"health-probe-bind-address": fmt.Sprintf("127.0.0.1:%d", r.probePort),
		"metrics-bind-address":      fmt.Sprintf("127.0.0.1:%d", tlstest.FreePort(t)),
	} {
		i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "--"+flag+"=") })
		if i < 0 {
			t.Fatalf("the Deployment has no --%s: %v", flag, args)
		}
		args[i] = "--" + flag + "=" + v
	}
	args = append(args, "--kubeconfig="+r.serviceAccountKubeconfig(t, r.dep.Spec.Template.Spec.ServiceAccountName))
	args = append(args, extra...)

	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	for _, e := range r.container.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env = append(env, e.Name+"="+r.ns)
		case e.ValueFrom.SecretKeyRef != nil:
			s, err := r.admin.CoreV1().Secrets(r.ns).Get(context.Background(), e.ValueFrom.SecretKeyRef.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("env %s: %v", e.Name, err)
			}
			env = append(env, e.Name+"="+string(s.Data[e.ValueFrom.SecretKeyRef.Key]))
		default:
			t.Fatalf("env %s: the test does not know how to resolve %+v", e.Name, e.ValueFrom)
		}
	}
	r.exited = startProcess(t, dislockBinary(t), args, env)
}

// serviceAccountKubeconfig writes a kubeconfig holding a fresh token of the
// ServiceAccount, as the pod's projected token would be.
func (r *release) serviceAccountKubeconfig(t *testing.T, sa string) string {
	t.Helper()
	tr, err := r.admin.CoreV1().ServiceAccounts(r.ns).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: r.c.URL(), CertificateAuthority: r.c.CAFile()}
	cfg.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: sa, Namespace: r.ns}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// startProcess runs the webhook until the test ends, then requires a clean
// exit on SIGTERM; its output is logged if the test failed. The channel is
// closed when it exits.
func startProcess(t *testing.T, bin string, args, env []string) <-chan struct{} {
	t.Helper()
	logs, err := os.Create(filepath.Join(t.TempDir(), "webhook.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			if waitErr != nil {
				t.Errorf("dislock webhook did not exit cleanly on SIGTERM: %v", waitErr)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("dislock webhook still running 30 s after SIGTERM")
		}
		_ = logs.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logs.Name())
			t.Logf("dislock webhook %s\n%s", strings.Join(args, " "), out)
		}
	})
	return exited
}

// projectSecret plays the kubelet: it copies the Secret's keys into the
// cert dir now (a pod starts only once its secret volumes are mounted) and
// again whenever they change, the way a secret volume is updated, until the
// test ends.
func (r *release) projectSecret(t *testing.T, name string) {
	t.Helper()
	var last map[string][]byte
	project := func() error {
		s, err := r.admin.CoreV1().Secrets(r.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || len(s.Data) == 0 || sameData(s.Data, last) {
			return err
		}
		if err := tlstest.WriteFiles(r.certDir, s.Data); err != nil {
			return err
		}
		last = s.Data
		return nil
	}
	if err := project(); err != nil {
		t.Fatalf("mounting Secret %s: %v", name, err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
				_ = project()
			}
		}
	}()
}

func sameData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func (r *release) awaitReady(t *testing.T) {
	t.Helper()
	await(t, 90*time.Second, "the webhook's /readyz", func(context.Context) (bool, error) {
		select {
		case <-r.exited:
			return false, errors.New("the webhook exited")
		default:
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", r.probePort))
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// The chart as installed by default (own certificates, the database Secret
// copied, leader election) works with nothing but its own RBAC: the webhook
// publishes a certificate for the Service's name, takes the lease, migrates
// the schema through PgBouncer, keeps copies of the database Secret, and
// injects Jobs of opted-in CronJobs, reading a pull secret to ask the
// registry for an image's entrypoint; its own namespace and kube-system are
// never intercepted. It is ready, and serves, though the kubelet never
// projects its certificate into the pod (a kubelet does at its next sync of
// the pod, up to a minute after the Secret was written): it serves the
// certificate from the Secret it wrote.
func TestTheDefaultInstallWorksWithOnlyTheChartsPermissions(t *testing.T) {
	c := kube.Need(t)
	pg := pgtest.New(t, pgtest.Options{Name: "chart"})
	reg := startRegistry(t)
	begun := time.Now()
	r := installChart(t, c, "dislock-defaults", values("clusterName", "dc-a", "database.url", pg.BouncerDSN()))
	ctx := context.Background()
	r.start(t,
		// The API server dials localhost: the generated certificate must name it too.
		"--cert-extra-dns-name=localhost",
		// The test's registry speaks plain HTTP.
		"--insecure-registry")
	r.awaitReady(t)
	t.Logf("ready %s after the install", time.Since(begun).Round(time.Millisecond))
	if _, err := os.Stat(filepath.Join(r.certDir, "tls.crt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a certificate is in the cert dir (%v): the test would not show that the Secret is served", err)
	}

	t.Run("the certificate is published and names the Service", func(t *testing.T) {
		var ca []byte
		await(t, 30*time.Second, "the caBundle of both configurations", func(ctx context.Context) (bool, error) {
			m, err := r.admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, r.flags.value("mutating-webhook-configuration"), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			v, err := r.admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, r.flags.value("validating-webhook-configuration"), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			ca = m.Webhooks[0].ClientConfig.CABundle
			return len(ca) > 0 && bytes.Equal(ca, v.Webhooks[0].ClientConfig.CABundle), nil
		})
		svc := r.m.one(t, "Service")
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", r.port), &tls.Config{RootCAs: pool, ServerName: svc.GetName() + "." + svc.GetNamespace() + ".svc"})
		if err != nil {
			t.Fatalf("the served certificate does not verify for the Service's DNS name: %v", err)
		}
		conn.Close()
	})

	t.Run("one replica leads", func(t *testing.T) {
		await(t, 30*time.Second, "the leader election Lease and its event", func(ctx context.Context) (bool, error) {
			l, err := r.admin.CoordinationV1().Leases(r.ns).Get(ctx, "dislock-webhook", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
				return false, err
			}
			return hasEvent(ctx, r.admin, r.ns, "LeaderElection", "")
		})
	})

	t.Run("the leader migrates the schema through PgBouncer", func(t *testing.T) {
		await(t, 60*time.Second, "schema version "+strconv.Itoa(migrate.SchemaVersion()), func(ctx context.Context) (bool, error) {
			conn, err := pgx.Connect(ctx, pg.DirectDSN())
			if err != nil {
				return false, err
			}
			defer conn.Close(ctx)
			var v int
			// Until the webhook migrated, the table does not exist.
			if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM dislock.schema_migrations").Scan(&v); err != nil {
				return false, nil
			}
			return v == migrate.SchemaVersion(), nil
		})
	})

	team := r.optIn(t, "team-defaults")

	t.Run("every opted-in namespace gets a database role of its own", func(t *testing.T) {
		db := r.flags.value("db-secret-name")
		var url string
		await(t, 30*time.Second, "the namespace's Secret", func(ctx context.Context) (bool, error) {
			s, err := r.admin.CoreV1().Secrets(team).Get(ctx, db, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			url = string(s.Data["url"])
			return err == nil && s.Annotations[contract.AnnotationTenantRole] != "", err
		})
		if url == "" || url == pg.BouncerDSN() {
			t.Fatalf("the namespace's Secret holds %q, not a role of its own", url)
		}
		tenantDB, err := store.Open(ctx, url, store.Options{})
		if err != nil {
			t.Fatalf("opening the database with the namespace's Secret: %v", err)
		}
		defer tenantDB.Close()
		claim := func(key string) error {
			_, err := tenantDB.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC), Index: store.NotIndexed, TTL: time.Minute,
				Owner: store.Owner{Cluster: "dc-a", Namespace: team, Job: "report-1", JobUID: "uid-1", Pod: "report-1-x"}})
			return err
		}
		if err := claim(team + "/report"); err != nil {
			t.Fatalf("claiming the namespace's own window: %v", err)
		}
		if err := claim("someone-else/report"); !errors.Is(err, store.ErrForbidden) {
			t.Fatalf("claiming another namespace's window: %v, want refused", err)
		}
	})

	t.Run("a Job of an opted-in CronJob is injected", func(t *testing.T) {
		r.injects(t, team)
	})

	t.Run("an entrypoint comes from the registry through the Job's pull secret", func(t *testing.T) {
		image := reg.push(t, "team/app:v1", []string{"/app/run"}, []string{"--once"})
		pull := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "registry"}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`,
				reg.host, base64.StdEncoding.EncodeToString([]byte(registryUser+":"+registryPassword))))}}
		if _, err := r.admin.CoreV1().Secrets(team).Create(ctx, pull, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cj := cronJobIn(team, "imaged", contract.AnnotationMode, "schedule")
		app := &cj.Spec.JobTemplate.Spec.Template.Spec
		app.Containers[0].Image, app.Containers[0].Command = image, nil
		app.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
		created, err := r.admin.BatchV1().CronJobs(team).Create(ctx, cj, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		job, err := r.admin.BatchV1().Jobs(team).Create(ctx, jobOf(created, time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := append(slices.Clone(inject.WrapperPrefix), "/app/run", "--once")
		if got := job.Spec.Template.Spec.Containers[0].Command; !slices.Equal(got, want) {
			t.Errorf("command %v, want %v", got, want)
		}
	})

	t.Run("its own namespace and kube-system are never intercepted", func(t *testing.T) {
		r.leavesAlone(t, r.ns, "kube-system")
	})

	t.Run("the copy goes when the namespace opts out", func(t *testing.T) {
		label(t, r.admin, team, false)
		await(t, 30*time.Second, "the copy to be deleted", func(ctx context.Context) (bool, error) {
			_, err := r.admin.CoreV1().Secrets(team).Get(ctx, r.flags.value("db-secret-name"), metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, err
		})
	})
}

// With cert-manager the webhook only reads the certificate the chart's
// Certificate asks for (the test plays cert-manager and its CA injector), and
// runs with the smallest RBAC the chart has: no rotator, no Secret copies.
// The CA injector copies the chart's own CA, not the serving certificate, so
// a renewed serving certificate (a new key, as rotationPolicy Always makes
// it) leaves the caBundle as it is and no admission fails across it.
func TestWithCertManagerTheWebhookServesTheIssuedCertificate(t *testing.T) {
	c := kube.Need(t)
	const name = "dislock-certmanager"
	// The Secret the user manages (database.existingSecret): a replica is
	// ready only once it reached the database and found the schema usable.
	pg := pgtest.New(t, pgtest.Options{Name: "certmanager"})
	createNamespace(t, c, name)
	kubectl(t, c, nil, "--namespace", name, "create", "secret", "generic", "dislock-db",
		"--from-literal=url="+pg.BouncerDSN())
	r := installChart(t, c, name, base("certManager.enabled", true, "database.copyToNamespaces", false))
	ctx := context.Background()

	cert := r.m.get(t, "Certificate", "dislock-certmanager-webhook")
	caCert := r.m.get(t, "Certificate", "dislock-certmanager-webhook-ca")
	secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	ca := tlstest.NewCA(t)
	leaf := ca.Issue(t)
	issued := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: secretName}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM, "ca.crt": ca.CertPEM}}
	if _, err := r.admin.CoreV1().Secrets(r.ns).Create(ctx, issued, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		cfg := r.m.one(t, kind)
		if got := cfg.GetAnnotations()["cert-manager.io/inject-ca-from"]; got != r.ns+"/"+caCert.GetName() {
			t.Fatalf("%s asks the CA injector for %q, not the chart's CA %s", kind, got, caCert.GetName())
		}
		patch, _ := json.Marshal([]map[string]any{{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": ca.CertPEM}})
		kubectl(t, c, nil, "patch", strings.ToLower(kind), cfg.GetName(), "--type=json", "--patch", string(patch))
	}
	r.projectSecret(t, secretName)
	r.start(t)
	r.awaitReady(t)

	team := r.optIn(t, "team-certmanager")
	t.Run("a Job of an opted-in CronJob is injected", func(t *testing.T) { r.injects(t, team) })
	t.Run("its own namespace and kube-system are never intercepted", func(t *testing.T) {
		r.leavesAlone(t, r.ns, "kube-system")
	})
	t.Run("a renewed serving certificate needs no caBundle change and fails no admission", func(t *testing.T) {
		bundles := func() [][]byte {
			mwc, err := r.admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, r.m.one(t, "MutatingWebhookConfiguration").GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			vwc, err := r.admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, r.m.one(t, "ValidatingWebhookConfiguration").GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return [][]byte{mwc.Webhooks[0].ClientConfig.CABundle, vwc.Webhooks[0].ClientConfig.CABundle}
		}
		before := bundles()
		// Admissions go on all through the renewal: a dry-run CronJob the
		// validating webhook refuses naming its bad mode. Anything else is
		// an admission that failed (a TLS error, a webhook not answering).
		probe := cronJobIn(team, "renewal-probe", contract.AnnotationMode, "sometimes")
		var answered, failed atomic.Int64
		var firstFailure atomic.Value
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := r.admin.BatchV1().CronJobs(team).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				if err != nil && strings.Contains(err.Error(), "sometimes") {
					answered.Add(1)
					continue
				}
				failed.Add(1)
				firstFailure.CompareAndSwap(nil, fmt.Sprint(err))
			}
		}()
		renewed := ca.Issue(t)
		issued.Data = map[string][]byte{"tls.crt": renewed.CertPEM, "tls.key": renewed.KeyPEM, "ca.crt": ca.CertPEM}
		if _, err := r.admin.CoreV1().Secrets(r.ns).Update(ctx, issued, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		await(t, 30*time.Second, "the webhook to serve the renewed certificate", func(context.Context) (bool, error) {
			serial, err := tlstest.ServedSerial(r.port, ca.CertPEM)
			return err == nil && serial.Cmp(renewed.Serial) == 0, nil
		})
		// And some admissions after it, through the renewed certificate.
		after := answered.Load()
		await(t, 30*time.Second, "admissions through the renewed certificate", func(context.Context) (bool, error) {
			return answered.Load() >= after+5, nil
		})
		close(stop)
		<-done
		if n := failed.Load(); n > 0 {
			t.Errorf("%d of %d admissions failed across the renewal; the first: %v", n, n+answered.Load(), firstFailure.Load())
		}
		if got := bundles(); !slices.EqualFunc(got, before, bytes.Equal) {
			t.Errorf("the caBundles changed across the renewal")
		}
		t.Logf("%d admissions answered across the renewal, none failed; caBundles unchanged", answered.Load())
	})
}
