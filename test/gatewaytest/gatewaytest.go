// Package gatewaytest runs lock gateways (lockagent/gateway) for tests: on
// loopback, on a free port, with a throwaway CA, over a database URL.
package gatewaytest

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"net"
	"net/url"
	"testing"

	"github.com/dislock/dislock/lockagent/gateway"
	"github.com/dislock/dislock/lockagent/gateway/client"
	"github.com/dislock/dislock/test/tlstest"
)

// Secret is the credential the gateways of this package accept for
// namespace.
func Secret(namespace string) string { return "test-credential-of-" + namespace }

// Credentials accept Secret(namespace) for every namespace.
type Credentials struct{}

// Check implements gateway.Credentials.
func (Credentials) Check(_ context.Context, namespace, secret string) error {
	if secret != Secret(namespace) {
		return fmt.Errorf("the credential of namespace %q is not the current one", namespace)
	}
	return nil
}

// Gateway is one running lock gateway.
type Gateway struct {
	Server *gateway.Server
	addr   string
	ca     string // the ca parameter of its URLs
}

// Start runs a gateway over the database at dsn as cfg says; Start fills
// in what cfg leaves zero: the lanes' connections (4 and 2), the
// credentials (Secret), and Cluster ("dc-a"). It stops at the test's end.
func Start(t testing.TB, dsn string, cfg gateway.Config) *Gateway {
	t.Helper()
	if cfg.Cluster == "" {
		cfg.Cluster = "dc-a"
	}
	if cfg.DecisionConns == 0 {
		cfg.DecisionConns = 4
	}
	if cfg.RenewalConns == 0 {
		cfg.RenewalConns = 2
	}
	if cfg.Credentials == nil {
		cfg.Credentials = Credentials{}
	}
	srv, err := gateway.Open(context.Background(), dsn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ca := tlstest.NewCA(t)
	leaf := ca.Issue(t)
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := gateway.NewHTTPServer("", srv, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = hs.Close() })
	return &Gateway{Server: srv, addr: ln.Addr().String(), ca: base64.RawURLEncoding.EncodeToString(ca.CertPEM)}
}

// URL is the gateway's URL for pods of namespace, with its credential.
func (g *Gateway) URL(namespace string) string {
	return g.URLWith(namespace, Secret(namespace))
}

// URLWith is URL with another credential.
func (g *Gateway) URLWith(namespace, secret string) string {
	u := url.URL{Scheme: "https", User: url.UserPassword(namespace, secret), Host: g.addr, RawQuery: "ca=" + g.ca}
	return u.String()
}

// Client dials the gateway as namespace.
func (g *Gateway) Client(t testing.TB, namespace string) *client.Client {
	t.Helper()
	c, err := client.Dial(g.URL(namespace))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}
