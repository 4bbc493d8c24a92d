package integration

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/webhook"
	"github.com/dislock/dislock/webhook/inject"
)

// A database that requires TLS from a private CA (--database-ca-file): the
// webhook provisions the namespace's role over a verified connection, and
// the Secret it writes carries the CA as ca.crt and a URL that verifies the
// server with the sidecar's copy of it. With that file where the sidecar
// mounts it, the namespace's URL claims its windows through PgBouncer.
func TestATenantSecretCarriesTheDatabaseCA(t *testing.T) {
	srv, err := pgtest.Start(pgtest.Options{Name: "tenants-tls", TLS: true, Logf: t.Logf})
	if err != nil {
		pgtest.Missing(t, err)
	}
	t.Cleanup(func() { srv.Close() })
	ca, err := inject.ReadDatabaseCA(srv.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	// The operator's URL, as main.go makes it verify with the CA file.
	plain, _, _ := strings.Cut(srv.BouncerDSN(), "?")
	owner, err := store.WithRootCA(plain, srv.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	admin, err := store.Open(context.Background(), owner, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := migrate.Up(context.Background(), admin); err != nil {
		t.Fatal(err)
	}

	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	namespace(t, cs, webhookNamespace, false)
	startWebhook(t, c, cs, withTenantRoles(owner), func(cfg *webhook.Config) { cfg.Inject.DatabaseCA = ca })
	namespace(t, cs, "tls-a", true)

	url, _ := tenantSecret(t, cs, "tls-a")
	s, err := cs.CoreV1().Secrets("tls-a").Get(context.Background(), inject.DefaultDBSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s.Data[inject.DatabaseCAKey], ca) {
		t.Fatalf("the Secret's %s is %q, want the webhook's CA", inject.DatabaseCAKey, s.Data[inject.DatabaseCAKey])
	}
	cfgURL := strings.NewReplacer("%2F", "/").Replace(url)
	if !strings.Contains(cfgURL, "sslrootcert="+inject.DatabaseCAPath) || !strings.Contains(url, "sslmode=verify-full") ||
		strings.Contains(cfgURL, srv.CAFile()) || strings.Contains(url, pgtest.AppPassword) {
		t.Fatalf("tenant URL %s: want sslmode=verify-full and sslrootcert=%s, without the owner's password or CA path", url, inject.DatabaseCAPath)
	}

	// The sidecar's view: ca.crt mounted, the URL naming it.
	mounted := filepath.Join(t.TempDir(), inject.DatabaseCAKey)
	if err := os.WriteFile(mounted, s.Data[inject.DatabaseCAKey], 0o444); err != nil {
		t.Fatal(err)
	}
	sidecarURL, err := store.ReplaceRootCA(url, mounted)
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := store.Open(context.Background(), sidecarURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tenant.Close()
	if _, err := tenant.ClaimWindow(context.Background(), store.ClaimRequest{Key: "tls-a/report", Window: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC),
		Index: store.NotIndexed, TTL: time.Minute,
		Owner: store.Owner{Cluster: "dc-a", Namespace: "tls-a", Job: "report-1", JobUID: "uid-1", Pod: "report-1-x"}}); err != nil {
		t.Fatalf("claiming with the namespace's URL over TLS through PgBouncer: %v", err)
	}
}
