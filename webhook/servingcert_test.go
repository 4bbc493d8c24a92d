package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/dislock/dislock/test/tlstest"
)

// With self-signed certificates the server presents what the Secret holds
// now: nothing (an error, no handshake) before the rotator wrote it, then
// its certificate, and a renewed one as soon as the Secret changes.
func TestTheSelfSignedServerPresentsTheCertificateItsSecretHoldsNow(t *testing.T) {
	key := types.NamespacedName{Namespace: "dislock-system", Name: "dislock-webhook-cert"}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	c := fake.NewClientBuilder().WithObjects(secret).Build()
	cfg := Config{Certs: CertConfig{SelfSigned: true, CertDir: t.TempDir()}}
	opts := cfg.ServerOptions(crwebhook.Options{})
	if opts.CertDir != cfg.Certs.CertDir || cfg.Certs.serving == nil {
		t.Fatalf("ServerOptions: cert dir %q, serving %v", opts.CertDir, cfg.Certs.serving)
	}
	cfg.Certs.serving.reader, cfg.Certs.serving.key = c, key
	var served tls.Config
	for _, o := range opts.TLSOpts {
		o(&served)
	}
	presented := func() (*tls.Certificate, error) { return served.GetCertificate(&tls.ClientHelloInfo{}) }

	if _, err := presented(); !errors.Is(err, errNoCertificate) {
		t.Fatalf("before the rotator wrote the Secret: %v, want %v", err, errNoCertificate)
	}
	ctx := context.Background()
	ca := tlstest.NewCA(t)
	for i, leaf := range []tlstest.Leaf{ca.Issue(t), ca.Issue(t)} {
		if err := c.Get(ctx, key, secret); err != nil {
			t.Fatal(err)
		}
		secret.Data = map[string][]byte{"ca.crt": ca.CertPEM, "tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM}
		if err := c.Update(ctx, secret); err != nil {
			t.Fatal(err)
		}
		got, err := presented()
		if err != nil {
			t.Fatalf("certificate %d: %v", i, err)
		}
		x, err := x509.ParseCertificate(got.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		if x.SerialNumber.Cmp(leaf.Serial) != 0 {
			t.Errorf("certificate %d: presented serial %s, want %s (the Secret's now)", i, x.SerialNumber, leaf.Serial)
		}
	}
	last, err := presented()
	if err != nil {
		t.Fatal(err)
	}

	// Broken by hand, then deleted: the last good certificate is still
	// presented, rather than every call refused.
	other := ca.Issue(t)
	secret.Data["tls.key"] = other.KeyPEM
	if err := c.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if got, err := presented(); err != nil || got != last {
		t.Errorf("with a key that is not the certificate's: %v, %v; want the last good certificate", got, err)
	}
	if err := c.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if got, err := presented(); err != nil || got != last {
		t.Errorf("with the Secret deleted: %v, %v; want the last good certificate", got, err)
	}
}

// The webhook is ready only with a certificate that can serve the
// Service's name: its key is its own, it names the Service, and it chains
// to the CA the webhook configurations are given.
func TestACertificateServesOnlyWithItsOwnKeyTheServicesNameAndItsCA(t *testing.T) {
	ca, stranger := tlstest.NewCA(t), tlstest.NewCA(t)
	leaf, other := ca.Issue(t), ca.Issue(t) // for 127.0.0.1 and localhost
	for _, tc := range []struct {
		name           string
		cert, key, caC []byte
		serves         string
		ok             bool
	}{
		{"its own key, its name, its CA", leaf.CertPEM, leaf.KeyPEM, ca.CertPEM, "localhost", true},
		{"another certificate's key", leaf.CertPEM, other.KeyPEM, ca.CertPEM, "localhost", false},
		{"not the Service's name", leaf.CertPEM, leaf.KeyPEM, ca.CertPEM, "dislock-webhook.dislock-system.svc", false},
		{"signed by another CA", leaf.CertPEM, leaf.KeyPEM, stranger.CertPEM, "localhost", false},
		{"no CA", leaf.CertPEM, leaf.KeyPEM, []byte("x"), "localhost", false},
	} {
		err := verifyPair(map[string][]byte{"tls.crt": tc.cert, "tls.key": tc.key, "ca.crt": tc.caC}, tc.serves)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%t", tc.name, err, tc.ok)
		}
	}
}

// A webhook set up with self-signed certificates whose server was not built
// with Config.ServerOptions would serve nothing: it refuses to start.
func TestSelfSignedCertificatesNeedTheServerOptions(t *testing.T) {
	cfg := Config{Certs: CertConfig{SelfSigned: true}}
	if err := setupSelfSigned(nil, cfg, func() {}); err == nil {
		t.Fatal("setupSelfSigned without ServerOptions: no error")
	}
}
