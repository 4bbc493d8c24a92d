package tenant_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"
)

// A namespace moves from a database role to a lock gateway credential by
// its next generation: the credential supersedes the role, which is dropped
// after the grace as any superseded role; only the credential's digest is
// kept; and its row can never name a login.
func TestAGatewayCredentialIsTheNamespacesNextGeneration(t *testing.T) {
	owner := storetest.Open(t, pgtest.Need(t).DirectDSN(), 2)
	ctx := context.Background()
	ns := storetest.Namespace(t, "gw")
	role, err := tenant.Provision(ctx, owner, "dc-a", ns)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tenant.ProvisionGateway(ctx, owner, "dc-a", ns)
	if err != nil {
		t.Fatal(err)
	}
	if c.Generation != role.Generation+1 || !tenant.IsGatewayCredential(c.Name) || len(c.Name) <= 63 || len(c.Secret) < 40 {
		t.Fatalf("gateway credential %+v after role generation %d: want the next generation, a row name no role can have, a 256-bit secret", c, role.Generation)
	}
	live, err := tenant.Roles(ctx, owner, "dc-a", ns)
	if err != nil || len(live) != 2 || live[0].Role != c.Name || live[1].SupersededAt == nil {
		t.Fatalf("live generations %+v, %v: want the credential first and the role superseded", live, err)
	}
	digests, err := tenant.GatewayDigests(ctx, owner, "dc-a", ns)
	if err != nil || len(digests) != 1 || digests[0] != tenant.Digest(c.Secret) {
		t.Fatalf("digests %x, %v: want the credential's alone", digests, err)
	}
	var stored int
	if err := owner.Handle().Pool.QueryRow(ctx, `SELECT count(*) FROM dislock.tenants WHERE role_name = $1 AND position(convert_to($2, 'UTF8') in gateway_digest) = 0`, c.Name, c.Secret).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("the credential's row: %d, %v", stored, err)
	}
	retired, err := tenant.Retire(ctx, owner, "dc-a", ns, 0)
	if err != nil || len(retired) != 1 || retired[0] != role.Role {
		t.Fatalf("retired %v, %v: want the superseded role alone", retired, err)
	}
	var roles int
	if err := owner.Handle().Pool.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname = $1`, role.Role).Scan(&roles); err != nil || roles != 0 {
		t.Fatalf("the superseded role still exists: %d, %v", roles, err)
	}
	// Back to roles: the credential is superseded in turn and, once
	// retired, accepted no more.
	if _, err := tenant.Provision(ctx, owner, "dc-a", ns); err != nil {
		t.Fatal(err)
	}
	if _, err := tenant.Retire(ctx, owner, "dc-a", ns, 0); err != nil {
		t.Fatal(err)
	}
	if digests, err := tenant.GatewayDigests(ctx, owner, "dc-a", ns); err != nil || len(digests) != 0 {
		t.Fatalf("digests after the credential retired: %x, %v", digests, err)
	}
}

// The URL a namespace's Secret gets names the gateway, the namespace and
// its credential, and the CA; a moved gateway or a new CA is told apart.
func TestAGatewayURLCarriesTheCredentialAndTheCA(t *testing.T) {
	c := tenant.GatewayCredential{Namespace: "team-a", Secret: "s3cret_-x"}
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	got, err := tenant.GatewayURL("https://dislock-gateway.dislock-system.svc:9445", ca, c)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(got)
	if err != nil || u.User.Username() != "team-a" || u.Host != "dislock-gateway.dislock-system.svc:9445" || u.Query().Get("ca") == "" {
		t.Fatalf("%s (%v)", got, err)
	}
	if p, _ := u.User.Password(); p != c.Secret {
		t.Fatalf("%s: the password is not the credential", got)
	}
	if !tenant.GatewayURLFor(got, "https://dislock-gateway.dislock-system.svc:9445", ca) {
		t.Error("the URL is not recognised as the gateway's")
	}
	for name, ok := range map[string]bool{
		"moved":      tenant.GatewayURLFor(got, "https://other.dislock-system.svc:9445", ca),
		"another CA": tenant.GatewayURLFor(got, "https://dislock-gateway.dislock-system.svc:9445", []byte("x")),
		"no CA":      tenant.GatewayURLFor(got, "https://dislock-gateway.dislock-system.svc:9445", nil),
	} {
		if ok {
			t.Errorf("%s: the URL still counts as the gateway's", name)
		}
	}
	for _, bad := range []string{"http://gw:9445", "https://gw", "https://u:p@gw:9445", "https://gw:9445/v1", "https://gw:9445?ca=x"} {
		if _, err := tenant.GatewayURL(bad, nil, c); err == nil || !strings.Contains(err.Error(), "https://host:port") {
			t.Errorf("%s: %v, want a refusal naming https://host:port", bad, err)
		}
	}
}
