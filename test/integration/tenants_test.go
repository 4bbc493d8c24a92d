package integration

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/webhook"
	"github.com/dislock/dislock/webhook/controller"
	"github.com/dislock/dislock/webhook/controller/tenants"
	"github.com/dislock/dislock/webhook/inject"
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
	legacy := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-c", Name: inject.DefaultDBSecretName,
		Labels:      map[string]string{controller.ManagedByLabel: controller.ManagedByValue},
		Annotations: map[string]string{contract.AnnotationCopiedFrom: webhookNamespace + "/" + inject.DefaultDBSecretName}},
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
	a, err := store.Open(ctx, urlA, store.Options{})
	if err != nil {
		t.Fatalf("opening the database with tenant-a's Secret: %v", err)
	}
	defer a.Close()
	claim := func(key string) error {
		_, err := a.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC), Index: store.NotIndexed, TTL: time.Minute,
			Owner: store.Owner{Cluster: "dc-a", Namespace: "tenant-a", Job: "report-1", JobUID: "uid-1", Pod: "report-1-x"}})
		return err
	}
	if err := claim("tenant-a/report"); err != nil {
		t.Fatalf("tenant-a claiming its own window: %v", err)
	}
	if err := claim("tenant-b/report"); !errors.Is(err, store.ErrForbidden) {
		t.Fatalf("tenant-a claiming tenant-b's window: %v, want refused", err)
	}

	// A deleted Secret comes back with a new generation of the role.
	if err := cs.CoreV1().Secrets("tenant-a").Delete(ctx, inject.DefaultDBSecretName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, "tenant-a's Secret to come back with a new role", func() (bool, error) {
		got, err := cs.CoreV1().Secrets("tenant-a").Get(ctx, inject.DefaultDBSecretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && got.Annotations[contract.AnnotationTenantRole] != "" && got.Annotations[contract.AnnotationTenantRole] != roleA, err
	})
	// The superseded role keeps working for pods that still use it.
	if err := claim("tenant-a/other"); err != nil {
		t.Fatalf("the superseded role of tenant-a before its grace: %v", err)
	}

	// tenant-b opts out: its Secret goes.
	setOptIn(t, cs, "tenant-b", false)
	await(t, "tenant-b's Secret to go when it opts out", func() (bool, error) {
		_, err := cs.CoreV1().Secrets("tenant-b").Get(ctx, inject.DefaultDBSecretName, metav1.GetOptions{})
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
		ns.Labels[contract.LabelInjection] = contract.LabelInjectionEnabled
	} else {
		delete(ns.Labels, contract.LabelInjection)
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
	admin, err := store.Open(context.Background(), srv.BouncerDSN(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := migrate.Up(context.Background(), admin); err != nil {
		t.Fatal(err)
	}
	return srv.BouncerDSN()
}

func withTenantRoles(owner string) func(*webhook.Config) {
	return func(cfg *webhook.Config) {
		cfg.DatabaseURL, cfg.Retention = owner, store.DefaultRetention
		cfg.TenantRoles, cfg.TenantRotation, cfg.TenantGrace = true, tenants.DefaultTenantRotation, tenants.DefaultTenantGrace
		// A Secret the test deletes comes back at once, not after the
		// minute a real tenant waits.
		cfg.TenantProvisionInterval = 100 * time.Millisecond
	}
}

// tenantSecret waits for the webhook to put a role of ns's own in ns's
// database Secret and returns its URL and role.
func tenantSecret(t *testing.T, cs kubernetes.Interface, ns string) (url, role string) {
	t.Helper()
	var s *corev1.Secret
	await(t, "the database Secret of "+ns, func() (bool, error) {
		got, err := cs.CoreV1().Secrets(ns).Get(context.Background(), inject.DefaultDBSecretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		s = got
		return err == nil && got.Annotations[contract.AnnotationTenantRole] != "" && got.Annotations[contract.AnnotationCopiedFrom] == "", err
	})
	return string(s.Data["url"]), s.Annotations[contract.AnnotationTenantRole]
}

// A tenant who takes the managed-by label off its namespace's Secret (edit
// allows it) before the namespace opts out still loses its roles: they are
// superseded, to be dropped after the grace, whoever holds the Secret then,
// rather than living on, never rotated or retired.
func TestOptingOutRetiresTheRolesEvenOfAnUnlabelledSecret(t *testing.T) {
	owner, c, cs := tenantCluster(t)
	ctx := context.Background()
	startWebhook(t, c, cs, withTenantRoles(owner))
	namespace(t, cs, "unlabel-a", true)
	tenantSecret(t, cs, "unlabel-a")
	s, err := cs.CoreV1().Secrets("unlabel-a").Get(ctx, inject.DefaultDBSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(s.Labels, controller.ManagedByLabel)
	if _, err := cs.CoreV1().Secrets("unlabel-a").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	setOptIn(t, cs, "unlabel-a", false)
	admin, err := store.Open(ctx, owner, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	await(t, "the namespace's roles to be superseded", func() (bool, error) {
		roles, err := tenant.Roles(ctx, admin, "dc-a", "unlabel-a")
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
	if _, err := cs.CoreV1().Secrets("unlabel-a").Get(ctx, inject.DefaultDBSecretName, metav1.GetOptions{}); err != nil {
		t.Errorf("the unlabelled Secret: %v, want left alone", err)
	}
}

// A tenant that deletes its namespace's Secret again and again gets a new
// role generation each time, but no faster than one per interval, and its
// namespace never holds more than tenants.MaxLiveTenantGenerations live
// roles: minting one more drops the oldest superseded generation inside its
// grace (it can no longer log in) and tells the namespace with a Warning
// Event on its Secret. The generations kept still work for the pods that use
// them, the Secret always ends with a working role, and another namespace's
// role is untouched.
func TestATenantDeletingItsSecretInALoopHoldsAtMostAFewRoles(t *testing.T) {
	const (
		maxLive   = tenants.MaxLiveTenantGenerations
		deletions = maxLive + 2
		interval  = time.Second
	)
	owner, c, cs := tenantCluster(t)
	ctx := context.Background()
	earlyBefore := tenantRoleActions(t, "retire_early")
	startWebhook(t, c, cs, withTenantRoles(owner), func(cfg *webhook.Config) { cfg.TenantProvisionInterval = interval })
	namespace(t, cs, "loop-a", true)
	namespace(t, cs, "loop-b", true)
	_, roleB := tenantSecret(t, cs, "loop-b")
	url, role := tenantSecret(t, cs, "loop-a")
	urls := map[int]string{1: url} // generation → its URL

	admin := openAs(t, owner)
	liveGenerations := func() ([]int, error) {
		roles, err := tenant.Roles(ctx, admin, "dc-a", "loop-a")
		var gens []int
		for _, r := range roles {
			gens = append(gens, r.Generation)
		}
		return gens, err
	}
	// Watch the live count the whole time, not only between deletions.
	var (
		mu      sync.Mutex
		mostAt  []int
		pollErr error
	)
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			gens, err := liveGenerations()
			mu.Lock()
			if err != nil && pollErr == nil {
				pollErr = err
			}
			if len(gens) > len(mostAt) {
				mostAt = gens
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	for i := range deletions {
		if err := cs.CoreV1().Secrets("loop-a").Delete(ctx, inject.DefaultDBSecretName, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var back *corev1.Secret
		await(t, fmt.Sprintf("loop-a's Secret to come back after deletion %d", i+1), func() (bool, error) {
			got, err := cs.CoreV1().Secrets("loop-a").Get(ctx, inject.DefaultDBSecretName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			back = got
			r := got.Annotations[contract.AnnotationTenantRole]
			return err == nil && r != "" && r != role, err
		})
		gen, err := strconv.Atoi(back.Annotations[contract.AnnotationTenantRoleGeneration])
		if err != nil || gen != i+2 {
			t.Fatalf("deletion %d brought generation %q, want %d", i+1, back.Annotations[contract.AnnotationTenantRoleGeneration], i+2)
		}
		role, urls[gen] = back.Annotations[contract.AnnotationTenantRole], string(back.Data["url"])
		if gens, err := liveGenerations(); err != nil || len(gens) > maxLive {
			t.Fatalf("after deletion %d the namespace holds generations %v (%v), more than %d", i+1, gens, err, maxLive)
		}
	}
	close(stop)
	<-stopped
	if pollErr != nil {
		t.Fatal(pollErr)
	}
	if len(mostAt) > maxLive {
		t.Fatalf("the namespace held generations %v at once, more than %d", mostAt, maxLive)
	}

	// The newest maxLive generations are live; the older ones went early.
	last := deletions + 1
	gens, err := liveGenerations()
	if want := fmt.Sprint(generationsDown(last, last-maxLive+1)); err != nil || fmt.Sprint(gens) != want {
		t.Fatalf("live generations %v (%v), want %s", gens, err, want)
	}
	claimWith := func(gen int, window int) error {
		s, err := store.Open(ctx, urls[gen], store.Options{})
		if err != nil {
			return err
		}
		defer s.Close()
		_, err = s.ClaimWindow(ctx, store.ClaimRequest{Key: "loop-a/report", Window: time.Date(2026, 12, 3, window, 0, 0, 0, time.UTC),
			Index: store.NotIndexed, TTL: time.Minute, Owner: store.Owner{Cluster: "dc-a", Namespace: "loop-a", Job: "report-1", JobUID: "uid-1", Pod: "report-1-x"}})
		return err
	}
	for gen := 1; gen <= last; gen++ {
		err := claimWith(gen, gen)
		switch live := gen > last-maxLive; {
		case live && err != nil:
			t.Errorf("generation %d, kept inside its grace: %v", gen, err)
		case !live && err == nil:
			t.Errorf("generation %d, retired early, still claims a window", gen)
		}
	}

	// Never faster than one generation per interval (database times).
	created := tenantCreationTimes(t, owner, "loop-a")
	if len(created) != last {
		t.Fatalf("%d generations were minted, want %d", len(created), last)
	}
	var gaps []string
	for g := 1; g < len(created); g++ {
		gap := created[g].Sub(created[g-1])
		gaps = append(gaps, gap.Round(time.Millisecond).String())
		if gap < interval*9/10 {
			t.Errorf("generation %d was minted %s after generation %d, want at least %s", g+1, gap, g, interval)
		}
	}
	t.Logf("%d generations minted %v apart; at most %d live at once (%v)", len(created), gaps, len(mostAt), mostAt)

	// The namespace is told, on its Secret, which generations went and why.
	await(t, "a Warning Event for each generation retired early", func() (bool, error) {
		evs, err := cs.EventsV1().Events("loop-a").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		told := map[int]bool{}
		for _, e := range evs.Items {
			if e.Reason != tenants.ReasonTenantRoleRetiredEarly || e.Regarding.Kind != "Secret" || e.Regarding.Name != inject.DefaultDBSecretName ||
				e.Type != corev1.EventTypeWarning || !strings.Contains(e.Note, "replaced 4 or more times within the grace") {
				continue
			}
			for gen := 1; gen <= last-maxLive; gen++ {
				if strings.Contains(e.Note, fmt.Sprintf("generation %d retired early", gen)) {
					told[gen] = true
				}
			}
		}
		return len(told) == last-maxLive, nil
	})
	if got := tenantRoleActions(t, "retire_early") - earlyBefore; got != float64(last-maxLive) {
		t.Errorf("dislock_tenant_roles_total{action=retire_early} grew by %v, want %d", got, last-maxLive)
	}

	// loop-b kept its one role.
	if roles, err := tenant.Roles(ctx, admin, "dc-a", "loop-b"); err != nil || len(roles) != 1 || roles[0].Role != roleB {
		t.Errorf("loop-b's roles: %+v, %v; want only %s", roles, err, roleB)
	}
}

// generationsDown is from, from-1, ..., to.
func generationsDown(from, to int) []int {
	var out []int
	for g := from; g >= to; g-- {
		out = append(out, g)
	}
	return out
}

// tenantCreationTimes is when each generation of ns's role was created
// (database time), retired ones too, oldest first.
func tenantCreationTimes(t *testing.T, owner, ns string) []time.Time {
	t.Helper()
	rows, err := connect(t, owner).Query(context.Background(),
		`SELECT created_at FROM dislock.tenants WHERE cluster = 'dc-a' AND namespace = $1 ORDER BY generation`, ns)
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for rows.Next() {
		var ts time.Time
		if err := rows.Scan(&ts); err != nil {
			t.Fatal(err)
		}
		out = append(out, ts)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// tenantRoleActions reads dislock_tenant_roles_total{action} from the
// in-process webhook's metrics registry.
func tenantRoleActions(t *testing.T, action string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "dislock_tenant_roles_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "action" && l.GetValue() == action {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
