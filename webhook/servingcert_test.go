package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/dislock/dislock/test/tlstest"
)

// With self-signed certificates the server presents what the Secret holds
// now: nothing (an error, no handshake) before the rotator wrote it, then
// its certificate, and a renewed one as soon as the Secret changes. A
// Secret broken by hand (a key that is not the certificate's, a pair from
// another CA) or deleted leaves the last good certificate presented, logged
// once per problem; a good certificate written afterwards is presented.
func TestTheSelfSignedServerPresentsTheGoodCertificateItsSecretHoldsNow(t *testing.T) {
	key := types.NamespacedName{Namespace: "dislock-system", Name: "dislock-webhook-cert"}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	c := fake.NewClientBuilder().WithObjects(secret).Build()
	cfg := Config{Certs: CertConfig{SelfSigned: true, CertDir: t.TempDir()}}
	opts := cfg.ServerOptions(crwebhook.Options{})
	if opts.CertDir != cfg.Certs.CertDir || cfg.Certs.serving == nil {
		t.Fatalf("ServerOptions: cert dir %q, serving %v", opts.CertDir, cfg.Certs.serving)
	}
	var logged []string
	s := cfg.Certs.serving
	// tlstest's certificates are for localhost.
	s.reader, s.key, s.name = c, key, "localhost"
	s.log = funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})
	var served tls.Config
	for _, o := range opts.TLSOpts {
		o(&served)
	}
	presented := func() (*tls.Certificate, error) { return served.GetCertificate(&tls.ClientHelloInfo{}) }
	serial := func(c *tls.Certificate) string {
		if c == nil {
			return "none"
		}
		x, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return x.SerialNumber.String()
	}
	ctx := context.Background()
	write := func(data map[string][]byte) {
		t.Helper()
		if err := c.Get(ctx, key, secret); err != nil {
			t.Fatal(err)
		}
		secret.Data = data
		if err := c.Update(ctx, secret); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := presented(); !errors.Is(err, errNoCertificate) {
		t.Fatalf("before the rotator wrote the Secret: %v, want %v", err, errNoCertificate)
	}
	ca, stranger := tlstest.NewCA(t), tlstest.NewCA(t)
	var last *tls.Certificate
	for i, leaf := range []tlstest.Leaf{ca.Issue(t), ca.Issue(t)} {
		write(map[string][]byte{"ca.crt": ca.CertPEM, "tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM})
		got, err := presented()
		if err != nil {
			t.Fatalf("certificate %d: %v", i, err)
		}
		if serial(got) != leaf.Serial.String() {
			t.Errorf("certificate %d: presented serial %s, want %s (the Secret's now)", i, serial(got), leaf.Serial)
		}
		last = got
	}
	if len(logged) != 0 {
		t.Errorf("logged while the Secret was good: %q", logged)
	}

	other, foreign := ca.Issue(t), stranger.Issue(t)
	for _, broken := range []struct {
		name string
		data map[string][]byte
	}{
		{"a key that is not the certificate's", map[string][]byte{"ca.crt": ca.CertPEM, "tls.crt": last.Leaf.Raw, "tls.key": other.KeyPEM}},
		{"a pair from another CA", map[string][]byte{"ca.crt": ca.CertPEM, "tls.crt": foreign.CertPEM, "tls.key": foreign.KeyPEM}},
	} {
		logged = nil
		write(broken.data)
		for range 3 {
			if got, err := presented(); err != nil || got != last {
				t.Errorf("%s: presented %s, %v; want the last good certificate %s", broken.name, serial(got), err, serial(last))
			}
		}
		if len(logged) != 1 {
			t.Errorf("%s: logged %d times over 3 handshakes, want once: %q", broken.name, len(logged), logged)
		}
	}

	fixed := ca.Issue(t)
	write(map[string][]byte{"ca.crt": ca.CertPEM, "tls.crt": fixed.CertPEM, "tls.key": fixed.KeyPEM})
	if got, err := presented(); err != nil || serial(got) != fixed.Serial.String() {
		t.Fatalf("after the Secret was mended: %v; want the mended certificate %s", err, fixed.Serial)
	}
	last = nil
	if last, _ = presented(); last == nil {
		t.Fatal("no certificate")
	}
	logged = nil
	if err := c.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if got, err := presented(); err != nil || got != last {
		t.Errorf("with the Secret deleted: presented %s, %v; want the last good certificate %s", serial(got), err, serial(last))
	}
	if len(logged) != 1 {
		t.Errorf("with the Secret deleted logged %d times, want once: %q", len(logged), logged)
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

// The webhook is ready with the certificate the rotator makes for the
// Service once both webhook configurations trust its CA, and not with a
// pair whose key is another's, a certificate for another name, or while a
// configuration trusts another CA.
func TestTheRotatorsCertificateIsServableOnceBothConfigurationsTrustItsCA(t *testing.T) {
	const service = "dislock-webhook.dislock-system.svc"
	key := types.NamespacedName{Namespace: "dislock-system", Name: "dislock-webhook-cert"}
	now := time.Now()
	made := func(dnsName string) (*rotator.KeyPairArtifacts, []byte, []byte) {
		t.Helper()
		// What AddRotator defaults ExtKeyUsages to.
		cr := &rotator.CertRotator{DNSName: dnsName, CAName: "dislock-webhook-ca", CAOrganization: "dislock",
			ExtKeyUsages: &[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		ca, err := cr.CreateCACert(now.Add(-time.Hour), now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		cert, k, err := cr.CreateCertPEM(ca, now.Add(-time.Hour), now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return ca, cert, k
	}
	ca, cert, k := made(service)
	otherCA, otherCert, otherKey := made("elsewhere.dislock-system.svc")
	for _, tc := range []struct {
		name                 string
		caPEM, certPEM, kPEM []byte
		validatingTrusts     []byte
		ok                   bool
	}{
		{"the rotator's pair, both configurations trust its CA", ca.CertPEM, cert, k, ca.CertPEM, true},
		{"one configuration still trusts another CA", ca.CertPEM, cert, k, otherCA.CertPEM, false},
		{"a key that is not the certificate's", ca.CertPEM, cert, otherKey, ca.CertPEM, false},
		{"a certificate for another name", otherCA.CertPEM, otherCert, otherKey, otherCA.CertPEM, false},
	} {
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Data: map[string][]byte{"ca.crt": tc.caPEM, "tls.crt": tc.certPEM, "tls.key": tc.kPEM}}
		mutating := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "dislock"},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "jobs.dislock.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: tc.caPEM}}}}
		validating := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "dislock"},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "cronjobs.dislock.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: tc.validatingTrusts}}}}
		byName := func(o client.Object) []string { return []string{o.GetName()} }
		c := fake.NewClientBuilder().WithObjects(secret, mutating, validating).
			WithIndex(&admissionregistrationv1.MutatingWebhookConfiguration{}, "metadata.name", byName).
			WithIndex(&admissionregistrationv1.ValidatingWebhookConfiguration{}, "metadata.name", byName).Build()
		certs := CertConfig{SelfSigned: true, MutatingConfigName: "dislock", ValidatingConfigName: "dislock",
			serving: &secretCertificate{reader: c, key: key, name: service}}
		ok, err := certsServable(context.Background(), c, certs)
		if ok != tc.ok {
			t.Errorf("%s: servable %t (%v), want %t", tc.name, ok, err, tc.ok)
		}
	}
}
