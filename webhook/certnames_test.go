package webhook

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dislock/dislock/test/tlstest"
)

// A self-signed serving certificate that lacks a name the webhook must now
// carry (the lock gateway's Service, turned on after the certificate was
// issued) is emptied for the rotator to issue again from the same CA; one
// that carries every name, and a Secret not made yet, are left alone.
func TestACertificateLackingANewNameIsIssuedAgain(t *testing.T) {
	ca := tlstest.NewCA(t)
	leaf := ca.Issue(t) // for 127.0.0.1 and localhost
	key := types.NamespacedName{Namespace: "dislock-system", Name: "dislock-webhook-cert"}
	secret := func() *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Data: map[string][]byte{"ca.crt": ca.CertPEM, "ca.key": []byte("k"), corev1.TLSCertKey: leaf.CertPEM, corev1.TLSPrivateKeyKey: leaf.KeyPEM}}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		names   []string
		dropped bool
	}{
		{"every name carried", []string{"localhost"}, false},
		{"the gateway's name added", []string{"localhost", "dislock-gateway.dislock-system.svc"}, true},
	} {
		c := fake.NewClientBuilder().WithObjects(secret()).Build()
		dropped, err := dropCertLackingNames(ctx, c, c, key, tc.names)
		if err != nil || dropped != tc.dropped {
			t.Fatalf("%s: dropped %t, %v; want %t", tc.name, dropped, err, tc.dropped)
		}
		got := &corev1.Secret{}
		if err := c.Get(ctx, key, got); err != nil {
			t.Fatal(err)
		}
		if _, has := got.Data[corev1.TLSCertKey]; has == tc.dropped || string(got.Data["ca.crt"]) != string(ca.CertPEM) {
			t.Errorf("%s: the Secret holds %d keys, tls.crt %t, the CA kept %t", tc.name, len(got.Data), has, string(got.Data["ca.crt"]) == string(ca.CertPEM))
		}
	}
	none := fake.NewClientBuilder().Build()
	if dropped, err := dropCertLackingNames(ctx, none, none, key, []string{"x.svc"}); dropped || err != nil {
		t.Fatalf("no Secret yet: %t, %v", dropped, err)
	}
}
