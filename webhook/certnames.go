package webhook

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// dropCertLackingNames empties the serving certificate in the self-signed
// Secret when it lacks one of names, so that the rotator issues a new one
// from the same CA: the rotator keeps a certificate that is valid for its
// main name whatever else it lacks, and a name added since (the lock
// gateway's Service, when the chart's gateway is turned on) would otherwise
// wait for the certificate's renewal, months away, while every pod failed
// to verify the gateway. The CA stays, so nothing that trusts it changes.
// It reports whether it emptied the certificate.
func dropCertLackingNames(ctx context.Context, r client.Reader, w client.Writer, key types.NamespacedName, names []string) (bool, error) {
	s := &corev1.Secret{}
	if err := r.Get(ctx, key, s); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil // the rotator makes it, with every name
		}
		return false, fmt.Errorf("reading the serving certificate's Secret %s: %w", key, err)
	}
	crt := s.Data[corev1.TLSCertKey]
	if len(crt) == 0 {
		return false, nil
	}
	var lacks []string
	block, _ := pem.Decode(crt)
	cert, err := func() (*x509.Certificate, error) {
		if block == nil {
			return nil, fmt.Errorf("no PEM block")
		}
		return x509.ParseCertificate(block.Bytes)
	}()
	for _, n := range names {
		if err != nil || cert.VerifyHostname(n) != nil {
			lacks = append(lacks, n)
		}
	}
	if len(lacks) == 0 {
		return false, nil
	}
	delete(s.Data, corev1.TLSCertKey)
	delete(s.Data, corev1.TLSPrivateKeyKey)
	if err := w.Update(ctx, s); err != nil {
		return false, fmt.Errorf("emptying the serving certificate of %s, which lacks %v: %w", key, lacks, err)
	}
	return true, nil
}
