package webhook

import (
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/webhook/controller/tenants"
)

// The flags are valid only if every component's options made from them
// are: a bad value of any component stops the webhook at start, saying
// which flag to fix.
func TestConfigValidateChecksEveryComponentsOptions(t *testing.T) {
	t.Parallel()
	valid := func() Config {
		return Config{Inject: testOptions(), Namespace: "dislock-system", DatabaseURL: "postgres://owner@db/dislock", Retention: store.DefaultRetention,
			TenantRoles: true, TenantRotation: tenants.DefaultTenantRotation, TenantGrace: tenants.DefaultTenantGrace}
	}
	if err := valid().Validate(); err != nil {
		t.Fatalf("valid flags: %v", err)
	}
	for _, tc := range []struct {
		component string
		edit      func(*Config)
		want      string
	}{
		{"injection", func(c *Config) { c.Inject.ClusterName = "" }, "--cluster-name"},
		{"registry lookups", func(c *Config) { c.Resolver.Timeout = time.Minute }, "--registry-timeout"},
		{"database loops", func(c *Config) { c.LedgerInterval = time.Second }, "--ledger-interval"},
		{"tenant roles", func(c *Config) { c.TenantRotation = time.Minute }, "--tenant-rotation"},
		{"tenant gateway", func(c *Config) { c.TenantGatewayURL = "http://gateway:9445" }, "--tenant-gateway-url"},
		{"tenant gateway without the owner", func(c *Config) {
			c.TenantGatewayURL, c.TenantRoles, c.DatabaseURL = "https://gateway:9445", false, ""
		}, "--tenant-gateway-url"},
	} {
		c := valid()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("a bad option of the %s: %v, want an error naming %s", tc.component, err, tc.want)
		}
	}
}
