package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
)

// ServerOptions completes o, the webhook server's options, for c's
// certificates: CertDir, and with self-signed certificates a TLS option that
// serves them from their Secret (SetupWithManager names the Secret and the
// cache that reads it). The kubelet copies a Secret into a pod's volume only
// at its next sync of the pod, a minute or more after the rotator wrote it:
// served from the files, a first install would wait that long for nothing.
// cert-manager's certificates are still read from CertDir.
func (c *Config) ServerOptions(o crwebhook.Options) crwebhook.Options {
	o.CertDir = c.Certs.CertDir
	if c.Certs.SelfSigned {
		c.Certs.serving = &secretCertificate{}
		o.TLSOpts = append(o.TLSOpts, func(t *tls.Config) { t.GetCertificate = c.Certs.serving.GetCertificate })
	}
	return o
}

// secretCertificate is the serving certificate as its Secret holds it now,
// parsed again only when the Secret changed. Once one was served, a Secret
// that cannot be read or holds no usable pair (deleted, or edited by hand)
// leaves the last good certificate served and is logged: failing every
// handshake would refuse every opted-in Job in the cluster at once, where the
// kubelet's copy of a broken Secret kept the old files.
type secretCertificate struct {
	// reader (the manager's cache) and key are set by SetupWithManager,
	// before the server starts.
	reader client.Reader
	key    types.NamespacedName

	mu   sync.Mutex
	rv   string
	cert *tls.Certificate
	// broken is the last problem logged, logged again only when it changes.
	broken string
}

// errNoCertificate is returned while the rotator has not written the
// Secret yet; the pod is not ready then, so no call should arrive.
var errNoCertificate = errors.New("no serving certificate in the Secret yet")

// data reads the Secret's keys.
func (s *secretCertificate) data(ctx context.Context) (map[string][]byte, string, error) {
	if s.reader == nil {
		return nil, "", errNoCertificate
	}
	var secret corev1.Secret
	if err := s.reader.Get(ctx, s.key, &secret); err != nil {
		return nil, "", fmt.Errorf("reading the serving certificate's Secret %s: %w", s.key, err)
	}
	if len(secret.Data["tls.crt"]) == 0 || len(secret.Data["tls.key"]) == 0 {
		return nil, "", fmt.Errorf("Secret %s: %w", s.key, errNoCertificate)
	}
	return secret.Data, secret.ResourceVersion, nil
}

// GetCertificate is the server's tls.Config.GetCertificate.
func (s *secretCertificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	data, rv, err := s.data(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.cert != nil && rv == s.rv {
		return s.cert, nil
	}
	if err == nil {
		var cert tls.Certificate
		if cert, err = tls.X509KeyPair(data["tls.crt"], data["tls.key"]); err == nil {
			s.cert, s.rv, s.broken = &cert, rv, ""
			return s.cert, nil
		}
		err = fmt.Errorf("the serving certificate in Secret %s: %w", s.key, err)
	}
	if s.cert == nil {
		return nil, err
	}
	if err.Error() != s.broken {
		s.broken = err.Error()
		log.Log.WithName("certs").Error(err, "serving the last good certificate meanwhile; the certificate rotator writes a good one when it next looks (at the latest at the webhook's restart)")
	}
	return s.cert, nil
}

// verifyPair says why data, a serving certificate Secret's keys, cannot
// serve name: a key that is not the certificate's, or a certificate that
// does not chain to the Secret's CA (the one the webhook configurations are
// given) or does not name the Service.
func verifyPair(data map[string][]byte, name string) error {
	pair, err := tls.X509KeyPair(data["tls.crt"], data["tls.key"])
	if err != nil {
		return err
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(data["ca.crt"]) {
		return errors.New("ca.crt holds no PEM certificate")
	}
	_, err = leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name})
	return err
}
