package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
// parsed again only when the Secret changed.
type secretCertificate struct {
	// reader (the manager's cache) and key are set by SetupWithManager,
	// before the server starts.
	reader client.Reader
	key    types.NamespacedName

	mu   sync.Mutex
	rv   string
	cert *tls.Certificate
}

// errNoCertificate is returned while the rotator has not written the
// Secret yet; the pod is not ready then, so no call should arrive.
var errNoCertificate = errors.New("no serving certificate in the Secret yet")

// data reads the Secret's keys.
func (s *secretCertificate) data(ctx context.Context) (map[string][]byte, string, error) {
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
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert != nil && rv == s.rv {
		return s.cert, nil
	}
	cert, err := tls.X509KeyPair(data["tls.crt"], data["tls.key"])
	if err != nil {
		return nil, fmt.Errorf("the serving certificate in Secret %s: %w", s.key, err)
	}
	s.cert, s.rv = &cert, rv
	return s.cert, nil
}
