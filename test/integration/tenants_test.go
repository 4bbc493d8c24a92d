package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/lockagent/spec"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/webhook"
)

// With the owner's database URL the webhook gives every opted-in namespace a
// database role of its own and puts only that role's URL in the namespace's
// Secret: a tenant who reads its Secret locks its own keys and no other
// namespace's. A Secret the copier left from before tenant roles (the owner's
// credential) is replaced, a deleted Secret comes back with a new role
// generation, and a namespace that opts out loses its Secret.
func TestEveryOptedInNamespaceGetsItsOwnDatabaseRole(t *testing.T) {
	owner, c, cs := tenantCluster(t)
	ctx := context.Background()
	// tenant-c opts in after an upgrade: the copier left the owner's URL.
	namespace(t, cs, "tenant-c", false)
	legacy := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-c", Name: webhook.DefaultDBSecretName,
		Labels:      map[string]string{webhook.ManagedByLabel: webhook.ManagedByValue},
		Annotations: map[string]string{webhook.CopiedFromAnnotation: webhookNamespace + "/" + webhook.DefaultDBSecretName}},
		StringData: map[string]string{"url": owner}}
	if _, err := cs.CoreV1().Secrets("tenant-c").Create(ctx, legacy, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	startWebhook(t, c, cs, withTenantRoles(owner))
	namespace(t, cs, "tenant-a", true)
	namespace(t, cs, "tenant-b", true)
	setOptIn(t, cs, "tenant-c", true)

	tenantURL := func(ns string) (string, string) { return tenantSecret(t, cs, ns) }
	urlA, roleA := tenantURL("tenant-a")
	urlB, roleB := tenantURL("tenant-b")
	urlC, _ := tenantURL("tenant-c")
	for ns, u := range map[string]string{"tenant-a": urlA, "tenant-b": urlB, "tenant-c": urlC} {
		if u == owner || u == "" {
			t.Fatalf("the Secret of %s holds %q, not a role of its own", ns, u)
		}
	}
	if roleA == roleB {
		t.Fatalf("tenant-a and tenant-b share role %s", roleA)
	}

	// tenant-a's credential locks tenant-a's keys and not tenant-b's.
	a, err := lock.Open(ctx, urlA, lock.Options{})
	if err != nil {
		t.Fatalf("opening the database with tenant-a's Secret: %v", err)
	}
	defer a.Close()
	claim := func(key string) error {
		_, err := a.ClaimWindow(ctx, lock.ClaimRequest{Key: key, Window: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC), Index: lock.NotIndexed, TTL: time.Minute,
			Owner: lock.Owner{Cluster: "dc-a", Namespace: "tenant-a", Job: "report-1", JobUID: "uid-1", Pod: "report-1-x"}})
		return err
	}
	if err := claim("tenant-a/report"); err != nil {
		t.Fatalf("tenant-a claiming its own window: %v", err)
	}
	if err := claim("tenant-b/report"); !errors.Is(err, lock.ErrForbidden) {
		t.Fatalf("tenant-a claiming tenant-b's window: %v, want refused", err)
	}

	// A deleted Secret comes back with a new generation of the role.
	if err := cs.CoreV1().Secrets("tenant-a").Delete(ctx, webhook.DefaultDBSecretName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, "tenant-a's Secret to come back with a new role", func() (bool, error) {
		got, err := cs.CoreV1().Secrets("tenant-a").Get(ctx, webhook.DefaultDBSecretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && got.Annotations[webhook.TenantRoleAnnotation] != "" && got.Annotations[webhook.TenantRoleAnnotation] != roleA, err
	})
	// The superseded role keeps working for pods that still use it.
	if err := claim("tenant-a/other"); err != nil {
		t.Fatalf("the superseded role of tenant-a before its grace: %v", err)
	}

	// tenant-b opts out: its Secret goes.
	setOptIn(t, cs, "tenant-b", false)
	await(t, "tenant-b's Secret to go when it opts out", func() (bool, error) {
		_, err := cs.CoreV1().Secrets("tenant-b").Get(ctx, webhook.DefaultDBSecretName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), client404(err)
	})
}

// setOptIn labels the namespace name opted in, or takes the label off.
func setOptIn(t *testing.T, cs kubernetes.Interface, name string, on bool) {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	if on {
		ns.Labels[spec.LabelInjection] = spec.LabelInjectionEnabled
	} else {
		delete(ns.Labels, spec.LabelInjection)
	}
	if _, err := cs.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// tenantCluster is what every tenant-role test starts from: a database of
// its own, migrated (tenantDatabase), the API server, and the webhook's
// namespace.
func tenantCluster(t *testing.T) (owner string, c *kube.Cluster, cs kubernetes.Interface) {
	t.Helper()
	owner = tenantDatabase(t)
	c = kube.Need(t)
	cs = kubernetes.NewForConfigOrDie(c.RESTConfig())
	namespace(t, cs, webhookNamespace, false)
	return owner, c, cs
}

// tenantDatabase starts a PostgreSQL and PgBouncer of the test's own, migrated
// by the owner, and returns the owner's URL through PgBouncer.
func tenantDatabase(t *testing.T) string {
	t.Helper()
	srv, err := pgtest.Start(pgtest.Options{Name: "tenants", Logf: t.Logf})
	if err != nil {
		pgtest.Missing(t, err)
	}
	t.Cleanup(func() { srv.Close() })
	admin, err := lock.Open(context.Background(), srv.BouncerDSN(), lock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return srv.BouncerDSN()
}

func withTenantRoles(owner string) func(*webhook.Config) {
	return func(cfg *webhook.Config) {
		cfg.DatabaseURL, cfg.Retention = owner, lock.DefaultRetention
		cfg.TenantRoles, cfg.TenantRotation, cfg.TenantGrace = true, webhook.DefaultTenantRotation, webhook.DefaultTenantGrace
	}
}

// tenantSecret waits for the webhook to put a role of ns's own in ns's
// database Secret and returns its URL and role.
func tenantSecret(t *testing.T, cs kubernetes.Interface, ns string) (url, role string) {
	t.Helper()
	var s *corev1.Secret
	await(t, "the database Secret of "+ns, func() (bool, error) {
		got, err := cs.CoreV1().Secrets(ns).Get(context.Background(), webhook.DefaultDBSecretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		s = got
		return err == nil && got.Annotations[webhook.TenantRoleAnnotation] != "" && got.Annotations[webhook.CopiedFromAnnotation] == "", err
	})
	return string(s.Data["url"]), s.Annotations[webhook.TenantRoleAnnotation]
}

// A tenant who takes the managed-by label off its namespace's Secret (edit
// allows it) before the namespace opts out still loses its roles: they are
// superseded, to be dropped after the grace, whoever holds the Secret then.
// (Found by a hostile review: the role lived on, never rotated or retired.)
func TestOptingOutRetiresTheRolesEvenOfAnUnlabelledSecret(t *testing.T) {
	owner, c, cs := tenantCluster(t)
	ctx := context.Background()
	startWebhook(t, c, cs, withTenantRoles(owner))
	namespace(t, cs, "unlabel-a", true)
	tenantSecret(t, cs, "unlabel-a")
	s, err := cs.CoreV1().Secrets("unlabel-a").Get(ctx, webhook.DefaultDBSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(s.Labels, webhook.ManagedByLabel)
	if _, err := cs.CoreV1().Secrets("unlabel-a").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	setOptIn(t, cs, "unlabel-a", false)
	admin, err := lock.Open(ctx, owner, lock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	await(t, "the namespace's roles to be superseded", func() (bool, error) {
		roles, err := admin.TenantRoles(ctx, "dc-a", "unlabel-a")
		if err != nil || len(roles) == 0 {
			return false, err
		}
		for _, r := range roles {
			if r.SupersededAt == nil {
				return false, nil
			}
		}
		return true, nil
	})
	// The Secret it unlabelled is the tenant's now, and stays.
	if _, err := cs.CoreV1().Secrets("unlabel-a").Get(ctx, webhook.DefaultDBSecretName, metav1.GetOptions{}); err != nil {
		t.Errorf("the unlabelled Secret: %v, want left alone", err)
	}
}
