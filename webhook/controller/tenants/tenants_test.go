package tenants

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/tlstest"
	"github.com/dislock/dislock/webhook/inject"
)

// A namespace gets a new role generation at once the first time, then waits
// out the rest of the interval after each; other namespaces are not held
// back, and namespaces whose interval has passed are forgotten.
func TestEachNamespaceWaitsOutTheIntervalBetweenTwoNewGenerations(t *testing.T) {
	t.Parallel()
	p := &provisionPacer{interval: time.Minute}
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	steps := []struct {
		name      string
		at        time.Duration // after t0
		namespace string
		want      time.Duration
		provision bool
	}{
		{"the first generation is minted at once", 0, "team-a", 0, true},
		{"a Secret deleted 10s later waits the remaining 50s", 10 * time.Second, "team-a", 50 * time.Second, false},
		{"another namespace is not held back", 10 * time.Second, "team-b", 0, true},
		{"a minute after the last one team-a may have the next", time.Minute, "team-a", 0, true},
		{"and then waits again", time.Minute + time.Second, "team-a", 59 * time.Second, false},
	}
	for _, s := range steps {
		if got := p.wait(s.namespace, t0.Add(s.at)); got != s.want {
			t.Fatalf("%s: wait %s, want %s", s.name, got, s.want)
		}
		if s.provision {
			p.provisioned(s.namespace, t0.Add(s.at))
		}
	}
	// team-b's interval has passed, team-a's not yet.
	p.provisioned("team-c", t0.Add(90*time.Second))
	if _, ok := p.last["team-b"]; ok || len(p.last) != 2 {
		t.Errorf("the pacer remembers %v, want only team-a and team-c", p.last)
	}
}

// The Event a namespace gets when generations of its role go inside the
// grace says why, which generations, and what it means for its pods, within
// an Event note's 1 kB however many went.
func TestTheEarlyRetirementNoteSaysWhyWhichAndWhatFollows(t *testing.T) {
	t.Parallel()
	gens := func(g ...int) []tenant.Role {
		var out []tenant.Role
		for _, n := range g {
			out = append(out, tenant.Role{Role: "r", Generation: n})
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		early []tenant.Role
		want  []string
	}{
		{"one generation", gens(2), []string{"generation 2 retired early", "pods started with it can"}},
		{"a few", gens(2, 3, 4), []string{"generations 2, 3, 4 retired early", "pods started with them can"}},
		{"many from before the bound", gens(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), []string{"12 generations (1 to 12) retired early"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			note := earlyRetirementNote(tc.early, DefaultTenantGrace)
			for _, w := range append(tc.want, "replaced 4 or more times within the grace (168h0m0s)", "at most 4 live generations",
				"can no longer reach the database", "the Secret's new role") {
				if !strings.Contains(note, w) {
					t.Errorf("note %q lacks %q", note, w)
				}
			}
			if len(note) > 1024 {
				t.Errorf("note is %d bytes, more than an Event holds", len(note))
			}
		})
	}
}

// The interval may be left 0 (the default) but not be negative.
func TestANegativeTenantProvisionIntervalIsRefusedNamingTheDefault(t *testing.T) {
	t.Parallel()
	o := Options{DatabaseURL: "postgres://owner@db/dislock", Cluster: "dc-a", Namespace: "dislock-system",
		SecretName: inject.DefaultDBSecretName, SecretKey: inject.DefaultDBSecretKey, Rotation: DefaultTenantRotation, Grace: DefaultTenantGrace}
	if err := o.Validate(); err != nil {
		t.Fatalf("the interval left 0: %v", err)
	}
	o.ProvisionInterval = -time.Second
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "-1s") || !strings.Contains(err.Error(), "1m0s") {
		t.Errorf("interval -1s: %v, want an error naming it and the default", err)
	}
}

// With a database CA, the Secret the webhook writes for a namespace
// carries it as ca.crt, and the URL in it verifies the server with the
// sidecar's copy, not with the owner's path in the webhook's pod; the
// owner's password is in neither.
func TestATenantURLVerifiesWithTheSidecarsCopyOfTheCA(t *testing.T) {
	t.Parallel()
	ownerCA := filepath.Join(t.TempDir(), "ca.crt")
	pem := tlstest.NewCA(t).CertPEM
	if err := os.WriteFile(ownerCA, pem, 0o644); err != nil {
		t.Fatal(err)
	}
	owner, err := store.WithRootCA("postgres://dislock:owner-s3cret@pgbouncer.db:6432/dislock", ownerCA)
	if err != nil {
		t.Fatal(err)
	}
	r := &tenantProvisioner{ownerDSN: owner, key: inject.DefaultDBSecretKey, ca: pem, now: time.Now}
	cred := tenant.Credential{Role: "dislock_t_team_1", Password: "tenant-pw", Namespace: "team", Cluster: "dc-a", Generation: 1}
	dsn, err := r.tenantDSN(cred)
	if err != nil {
		t.Fatal(err)
	}
	want := "postgres://dislock_t_team_1:tenant-pw@pgbouncer.db:6432/dislock?sslmode=verify-full&sslrootcert=%2Fvar%2Frun%2Fdislock%2Fdatabase-ca%2Fca.crt"
	if dsn != want {
		t.Fatalf("tenant URL %s\nwant       %s", dsn, want)
	}
	if strings.Contains(dsn, "owner-s3cret") || strings.Contains(dsn, ownerCA) {
		t.Fatalf("tenant URL %s carries the owner's password or CA path", dsn)
	}
	without := &tenantProvisioner{ownerDSN: "postgres://dislock:owner-s3cret@db/dislock", key: inject.DefaultDBSecretKey}
	if dsn, err := without.tenantDSN(cred); err != nil || strings.Contains(dsn, "ssl") {
		t.Fatalf("without a CA: %s, %v; want the URL without TLS settings", dsn, err)
	}
}

// A Secret whose ca.crt is not the webhook's CA (added, changed or removed
// with --database-ca-file) gets a new generation, whose URL matches.
func TestASecretWithAnotherCAIsStale(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	roles := []tenant.Role{{Role: "dislock_t_team_1", Generation: 1}}
	secret := func(ca []byte) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
			contract.AnnotationTenantRole: "dislock_t_team_1", contract.AnnotationTenantRoleCreated: now.Format(time.RFC3339)}},
			Data: map[string][]byte{inject.DefaultDBSecretKey: []byte("postgres://x")}}
		if ca != nil {
			s.Data[inject.DatabaseCAKey] = ca
		}
		return s
	}
	for _, tc := range []struct {
		name        string
		webhook, in []byte
		stale       bool
	}{
		{"no CA anywhere", nil, nil, false},
		{"the same CA", []byte("ca-1"), []byte("ca-1"), false},
		{"a CA added", []byte("ca-1"), nil, true},
		{"a CA changed", []byte("ca-2"), []byte("ca-1"), true},
		{"a CA removed", nil, []byte("ca-1"), true},
	} {
		r := &tenantProvisioner{key: inject.DefaultDBSecretKey, ca: tc.webhook, rotation: time.Hour, now: func() time.Time { return now }}
		why := r.stale(secret(tc.in), true, roles)
		if (why != "") != tc.stale || (tc.stale && !strings.Contains(why, "--database-ca-file")) {
			t.Errorf("%s: stale %q", tc.name, why)
		}
	}
}

// With a lock gateway, a namespace whose Secret holds a database role, a
// gateway credential for another gateway or CA, gets a new generation; and
// without one, a Secret holding a gateway credential does.
func TestASecretOfTheOtherAccessPathIsStale(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	const gw = "https://dislock-gateway.dislock-system.svc:9445"
	cred := tenant.GatewayCredential{Name: "dislock_lock_gateway_credential_" + strings.Repeat("0", 64) + "_g2", Namespace: "team", Secret: "s"}
	gwURL, err := tenant.GatewayURL(gw, []byte("ca-1"), cred)
	if err != nil {
		t.Fatal(err)
	}
	secret := func(name, url string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
			contract.AnnotationTenantRole: name, contract.AnnotationTenantRoleCreated: now.Format(time.RFC3339)}},
			Data: map[string][]byte{inject.DefaultDBSecretKey: []byte(url)}}
	}
	for _, tc := range []struct {
		name          string
		gateway       string
		ca            []byte
		inSecret, url string
		want          string // in the reason; "" = not stale
	}{
		{"a role, roles wanted", "", nil, "dislock_t_team_1", "postgres://x", ""},
		{"a role, the gateway wanted", gw, []byte("ca-1"), "dislock_t_team_1", "postgres://x", "--tenant-gateway-url"},
		{"a credential, roles wanted", "", nil, cred.Name, gwURL, "no --tenant-gateway-url"},
		{"a credential of this gateway", gw, []byte("ca-1"), cred.Name, gwURL, ""},
		{"a credential of a moved gateway", "https://gw.other.svc:9445", []byte("ca-1"), cred.Name, gwURL, "--tenant-gateway-ca-file"},
		{"a credential trusting another CA", gw, []byte("ca-2"), cred.Name, gwURL, "--tenant-gateway-ca-file"},
	} {
		r := &tenantProvisioner{key: inject.DefaultDBSecretKey, gatewayURL: tc.gateway, gatewayCA: func() ([]byte, error) { return tc.ca, nil }, rotation: time.Hour, now: func() time.Time { return now }}
		why := r.stale(secret(tc.inSecret, tc.url), true, []tenant.Role{{Role: tc.inSecret, Generation: 2}})
		if (why == "") != (tc.want == "") || !strings.Contains(why, tc.want) {
			t.Errorf("%s: stale %q, want a reason naming %q", tc.name, why, tc.want)
		}
	}
}
