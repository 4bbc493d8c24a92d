package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	batchv1 "k8s.io/api/batch/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/webhook/inject"
)

// A tenant with the rights a team normally has in its own namespace (the
// built-in edit role: read Secrets, create Jobs) uses everything it can
// read or create against another team sharing the lock database: the API
// server keeps the other team's Secret and the webhook's from it, the webhook
// refuses a forged injection carrying the other team's key, and the database
// refuses every statement on the other team's rows with the tenant's own
// credential — the other team's window and lease rows stay byte for byte
// as they were, while the tenant's own claims and leases keep working.
func TestAHostileTenantTouchesNothingOfAnotherTeam(t *testing.T) {
	owner, c, cs := tenantCluster(t)
	ctx := context.Background()
	startWebhook(t, c, cs, withTenantRoles(owner))
	namespace(t, cs, "hostile-a", true)
	namespace(t, cs, "hostile-b", true)
	awaitOptedIn(t, cs, "hostile-a")
	urlB, _ := tenantSecret(t, cs, "hostile-b")

	// team-b holds a running window and a lease.
	window := time.Date(2026, 12, 3, 2, 0, 0, 0, time.UTC)
	b := openAs(t, urlB)
	ownerB := store.Owner{Cluster: "dc-a", Namespace: "hostile-b", Job: "report-1", JobUID: "uid-b", Pod: "report-1-b"}
	claimB, err := b.ClaimWindow(ctx, store.ClaimRequest{Key: "hostile-b/report", Window: window, Index: store.NotIndexed, TTL: time.Hour, Owner: ownerB})
	if err != nil {
		t.Fatalf("hostile-b claiming its window: %v", err)
	}
	leaseB, err := b.AcquireLease(ctx, "hostile-b/report", ownerB, time.Hour)
	if err != nil {
		t.Fatalf("hostile-b taking its lease: %v", err)
	}
	before := rowsOf(t, owner, "hostile-b/")

	// The tenant: a user bound to edit in team-a only.
	if _, err := cs.RbacV1().RoleBindings("hostile-a").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: "hostile-a", Name: "alice-edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "alice"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	asAlice := rest.CopyConfig(c.RESTConfig())
	asAlice.Impersonate = rest.ImpersonationConfig{UserName: "alice"}
	alice := kubernetes.NewForConfigOrDie(asAlice)
	var urlA string
	await(t, "alice to read team-a's database Secret", func() (bool, error) {
		s, err := alice.CoreV1().Secrets("hostile-a").Get(ctx, inject.DefaultDBSecretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) { // the binding or the Secret not there yet
			return false, nil
		}
		if err == nil && s.Annotations[contract.AnnotationTenantRole] != "" {
			urlA = string(s.Data["url"])
		}
		return urlA != "", err
	})

	t.Run("the API server keeps the other team's and the webhook's Secrets from the tenant", func(t *testing.T) {
		for _, ns := range []string{"hostile-b", webhookNamespace} {
			if _, err := alice.CoreV1().Secrets(ns).Get(ctx, inject.DefaultDBSecretName, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
				t.Errorf("alice reading the database Secret of %s: %v, want forbidden", ns, err)
			}
		}
		if urlA == owner || urlA == urlB {
			t.Fatalf("hostile-a's Secret holds someone else's URL")
		}
	})

	t.Run("the webhook refuses a forged injection with the other team's key", func(t *testing.T) {
		cj := withAnnotations(cronJob("hostile-a", "nightly", "0 3 * * *"), map[string]string{contract.AnnotationMode: "schedule"})
		cj.Spec.Suspend = ptr.To(true)
		cj, err := alice.BatchV1().CronJobs("hostile-a").Create(ctx, cj, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		job := jobFor(cj, window)
		job.Name = "nightly-forged"
		stored, err := alice.BatchV1().Jobs("hostile-a").Create(ctx, job, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("alice creating her own Job: %v", err)
		}
		forged := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "hostile-a", Name: "nightly-forged-2", Annotations: stored.Annotations,
			OwnerReferences: stored.OwnerReferences}, Spec: *stored.Spec.DeepCopy()}
		forged.Spec.Selector = nil
		for _, l := range []string{"controller-uid", "job-name", inject.UIDLabel, contract.LabelJobName} {
			delete(forged.Spec.Template.Labels, l)
		}
		sc := &forged.Spec.Template.Spec.InitContainers[0]
		for i := range sc.Env {
			if sc.Env[i].Name == contract.EnvKey {
				sc.Env[i].Value = "hostile-b/report"
			}
		}
		if _, err := alice.BatchV1().Jobs("hostile-a").Create(ctx, forged, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "denied") {
			t.Fatalf("alice creating a Job with team-b's key: %v, want denied by the webhook", err)
		}
	})

	a := openAs(t, urlA)
	ownerA := store.Owner{Cluster: "dc-a", Namespace: "hostile-a", Job: "evil-1", JobUID: "uid-a", Pod: "evil-1-a"}
	t.Run("the lock API refuses every move on the other team's locks", func(t *testing.T) {
		for what, err := range map[string]error{
			"claim":      two(a.ClaimWindow(ctx, store.ClaimRequest{Key: "hostile-b/report", Window: window, Index: store.NotIndexed, TTL: time.Hour, Owner: ownerA, Standby: true})),
			"claim next": two(a.ClaimWindow(ctx, store.ClaimRequest{Key: "hostile-b/report", Window: window.Add(time.Hour), Index: store.NotIndexed, TTL: time.Hour, Owner: ownerA})),
			"heartbeat":  three(a.Heartbeat(ctx, "hostile-b/report", window, store.NotIndexed, claimB.Window.Token, time.Hour)),
			"finish":     two(a.Finish(ctx, "hostile-b/report", window, store.NotIndexed, claimB.Window.Token, store.StateSucceeded, ptr.To(0))),
			"lease":      two(a.AcquireLease(ctx, "hostile-b/report", ownerA, time.Hour)),
			"renew":      three(a.RenewLease(ctx, "hostile-b/report", leaseB.Lease.Token, time.Hour)),
			"release":    releaseErr(a.ReleaseLease(ctx, "hostile-b/report", leaseB.Lease.Token)),
		} {
			if err == nil {
				t.Errorf("%s on team-b's lock with team-a's credential succeeded", what)
			}
		}
	})

	t.Run("the database refuses the tenant's SQL on anything not its own", func(t *testing.T) {
		conn := connect(t, urlA)
		for _, q := range []string{
			`SELECT setval('dislock.token_counter', 1)`,
			`SELECT nextval('dislock.token_counter')`,
			`UPDATE dislock.token_epoch SET base_epoch = 0`,
			`DELETE FROM dislock.windows`,
			`TRUNCATE dislock.leases`,
			`ALTER TABLE dislock.windows DISABLE ROW LEVEL SECURITY`,
			`DROP SCHEMA dislock CASCADE`,
			`CREATE TABLE dislock.mine (x int)`,
			`INSERT INTO dislock.tenants (role_name, namespace, cluster, generation) VALUES (current_user, 'hostile-b', 'dc-a', 99)`,
		} {
			if _, err := conn.Exec(ctx, q); err == nil {
				t.Errorf("hostile-a's role ran %q", q)
			}
		}
		for _, q := range []string{
			`UPDATE dislock.windows SET state = 'succeeded' WHERE lock_key LIKE 'hostile-b/%'`,
			`UPDATE dislock.leases SET expire_at = now() WHERE lock_key LIKE 'hostile-b/%'`,
		} {
			if tag, err := conn.Exec(ctx, q); err == nil && tag.RowsAffected() != 0 {
				t.Errorf("hostile-a's role changed %d of team-b's rows with %q", tag.RowsAffected(), q)
			}
		}
		var seen int
		if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM dislock.windows WHERE lock_key NOT LIKE 'hostile-a/%')
			+ (SELECT count(*) FROM dislock.leases WHERE lock_key NOT LIKE 'hostile-a/%')
			+ (SELECT count(*) FROM dislock.views WHERE lock_key NOT LIKE 'hostile-a/%')`).Scan(&seen); err != nil || seen != 0 {
			t.Errorf("hostile-a's role sees %d rows of other namespaces (%v)", seen, err)
		}
	})

	t.Run("the tenant's own locks keep working", func(t *testing.T) {
		if _, err := a.ClaimWindow(ctx, store.ClaimRequest{Key: "hostile-a/report", Window: window, Index: store.NotIndexed, TTL: time.Hour, Owner: ownerA}); err != nil {
			t.Errorf("hostile-a claiming its own window: %v", err)
		}
		if _, err := a.AcquireLease(ctx, "hostile-a/report", ownerA, time.Hour); err != nil {
			t.Errorf("hostile-a taking its own lease: %v", err)
		}
	})

	if after := rowsOf(t, owner, "hostile-b/"); after != before {
		t.Fatalf("hostile-b's rows changed:\nbefore %s\nafter  %s", before, after)
	}
}

// connect is one plain connection, through PgBouncer in transaction mode
// (so no prepared statements).
func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func openAs(t *testing.T, url string) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), url, store.Options{})
	if err != nil {
		t.Fatalf("opening the database: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// rowsOf is every window, lease and view row under prefix, as the owner reads
// them: text to compare byte for byte.
func rowsOf(t *testing.T, owner, prefix string) string {
	t.Helper()
	conn := connect(t, owner)
	var out string
	err := conn.QueryRow(context.Background(), `SELECT concat_ws(E'\n',
		(SELECT string_agg(row_to_json(w)::text, E'\n' ORDER BY w.window_start) FROM dislock.windows w WHERE starts_with(w.lock_key, $1)),
		(SELECT string_agg(row_to_json(l)::text, E'\n' ORDER BY l.lock_key) FROM dislock.leases l WHERE starts_with(l.lock_key, $1)),
		(SELECT string_agg(row_to_json(v)::text, E'\n' ORDER BY v.cluster) FROM dislock.views v WHERE starts_with(v.lock_key, $1)))`, prefix).Scan(&out)
	if err != nil {
		t.Fatal(err)
	}
	if out == "" {
		t.Fatalf("no rows under %s to compare", prefix)
	}
	return out
}

func two[T any](_ T, err error) error           { return err }
func three[T, U any](_ T, _ U, err error) error { return err }

// releaseErr: a release that released nothing was refused.
func releaseErr(released bool, err error) error {
	if err == nil && !released {
		return errors.New("nothing released")
	}
	return err
}
