package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/client-go/kubernetes"

	"github.com/dislock/dislock/internal/gatewaycmd"
	"github.com/dislock/dislock/lockagent/gateway/client"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/test/tlstest"
	"github.com/dislock/dislock/webhook"
)

// A managed PostgreSQL: the owner is no superuser and may not create roles
// (its admin user only created the NOLOGIN group role once). Installed with
// the lock gateway it serves every namespace, and PgBouncer sees no login
// but the owner's, which its auth_file lists (no tenant role exists for an
// auth_query to find): dislock check names that path, the
// owner migrates, the webhook gives each opted-in namespace a gateway
// credential (no role), a pod claims with its Secret's URL through the
// gateway and PgBouncer, and superseded credentials retire without
// CREATEROLE.
func TestAManagedDatabaseWithoutCreateRoleServesNamespacesThroughTheLockGateway(t *testing.T) {
	srv, err := pgtest.Start(pgtest.Options{Name: "managed", Logf: t.Logf})
	if err != nil {
		pgtest.Missing(t, err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx := context.Background()
	su, err := pgx.Connect(ctx, srv.SuperuserDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(ctx)
	for _, stmt := range []string{
		"ALTER ROLE " + pgtest.AppUser + " NOCREATEROLE NOSUPERUSER",
		// The provider's admin user, once (docs/install.md).
		`DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '` + tenant.GroupRole + `') THEN CREATE ROLE ` + tenant.GroupRole + ` NOLOGIN; END IF; END $$`,
	} {
		if _, err := su.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	owner := srv.BouncerDSN()
	rep := check.URL(ctx, owner, check.Options{AllowAsync: true})
	var privileges check.Finding
	for _, f := range rep.Findings {
		if f.Check == "privileges" {
			privileges = f
		}
	}
	if privileges.Status != check.StatusWarn || !strings.Contains(privileges.Detail, "lock gateway yes, tenant roles no") {
		t.Fatalf("dislock check's privileges: %+v, want the lock gateway named as the path", privileges)
	}
	admin, err := store.Open(ctx, owner, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := migrate.Up(ctx, admin); err != nil {
		t.Fatalf("migrating as an owner without CREATEROLE: %v", err)
	}

	// The gateway of dc-a.
	certDir := t.TempDir()
	// The serving certificate is its own CA, which the webhook reads as
	// the chart has it read the one its certificate Secret holds.
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, tlstest.ServingCert(t, certDir), 0o644); err != nil {
		t.Fatal(err)
	}
	ports, err := harness.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	logs := &harness.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- gatewaycmd.Main(runCtx, []string{"--cluster-name", "dc-a", "--database-url", owner, "--cert-dir", certDir,
			"--bind-address", fmt.Sprintf("127.0.0.1:%d", ports[0]), "--health-probe-bind-address", "", "--metrics-bind-address", ""}, logs)
	}()
	t.Cleanup(func() {
		stop()
		<-done
		if t.Failed() {
			t.Logf("gateway logs:\n%s", logs)
		}
	})

	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	namespace(t, cs, webhookNamespace, false)
	startWebhook(t, c, cs, withTenantRoles(owner), func(cfg *webhook.Config) {
		cfg.TenantGatewayURL, cfg.TenantGatewayCAFile = fmt.Sprintf("https://127.0.0.1:%d", ports[0]), caFile
	})
	namespace(t, cs, "managed-a", true)
	url, name := tenantSecret(t, cs, "managed-a")
	if !strings.HasPrefix(url, "https://managed-a:") || !tenant.IsGatewayCredential(name) {
		_, host, _ := strings.Cut(url, "@")
		t.Fatalf("managed-a's Secret holds a URL of %q for %q, want the gateway's URL and a gateway credential", host, name)
	}

	pod, err := client.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	req := store.ClaimRequest{Key: "managed-a/report", Window: time.Now().UTC().Truncate(time.Minute), Index: store.NotIndexed, TTL: time.Minute,
		Owner: store.Owner{Cluster: "dc-a", Namespace: "managed-a", Job: "report-1", JobUID: "uid-1", Pod: "report-1-x"}}
	var claim store.Claim
	await(t, "a claim with managed-a's Secret through the gateway", func() (bool, error) {
		claim, err = pod.ClaimWindow(ctx, req)
		if errors.Is(err, store.ErrUnavailable) {
			return false, nil
		}
		return err == nil, err
	})
	if claim.Outcome != store.Claimed {
		t.Fatalf("claim %+v", claim)
	}
	other := req
	other.Key = "someone-else/report"
	if _, err := pod.ClaimWindow(ctx, other); !errors.Is(err, store.ErrForbidden) {
		t.Fatalf("managed-a claiming another namespace's key: %v, want ErrForbidden", err)
	}
	var roles int
	if err := su.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname LIKE 'dislock_t\_%'`).Scan(&roles); err != nil || roles != 0 {
		t.Fatalf("%d tenant roles exist (%v), want none", roles, err)
	}
	// Rotation's end: a superseded credential retires without CREATEROLE.
	if _, err := tenant.ProvisionGateway(ctx, admin, "dc-a", "managed-a"); err != nil {
		t.Fatal(err)
	}
	if retired, err := tenant.Retire(ctx, admin, "dc-a", "managed-a", 0); err != nil || len(retired) != 1 {
		t.Fatalf("retiring the superseded credential: %v, %v", retired, err)
	}
}
