package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
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
		// One for every server (the admission server, kubectl dislock's).
		if c.Certs.serving == nil {
			c.Certs.serving = &secretCertificate{}
		}
		o.TLSOpts = append(o.TLSOpts, func(t *tls.Config) { t.GetCertificate = c.Certs.serving.GetCertificate })
	}
	return o
}

// secretCertificate is the serving certificate as its Secret holds it now,
// served only when it can serve the Service: its key is its own, it names
// the Service and chains to the Secret's CA (the one the webhook
// configurations are given). Once one was served, a Secret that cannot be
// read or holds no such certificate (deleted, or edited by hand) leaves the
// last good certificate served and is logged once: failing every handshake
// would refuse every opted-in Job in the cluster at once, where the
// kubelet's copy of a broken Secret kept the old files.
type secretCertificate struct {
	// reader (the manager's cache), key, name (the Service's DNS name) and
	// log are set by SetupWithManager, before the server starts.
	reader client.Reader
	key    types.NamespacedName
	name   string
	log    logr.Logger

	mu   sync.Mutex
	rv   string // the resourceVersion cert came from
	cert *tls.Certificate
	// badRV is a resourceVersion found unservable for badErr: not parsed
	// again on every handshake.
	badRV  string
	badErr error
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
func (s *secretCertificate) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	ctx := context.Background()
	if hello != nil && hello.Context() != nil {
		ctx = hello.Context()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	data, rv, err := s.data(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil:
	case s.cert != nil && rv == s.rv:
		return s.cert, nil
	case rv == s.badRV:
		err = s.badErr
	default:
		var cert *tls.Certificate
		if cert, err = s.servable(data); err == nil {
			s.cert, s.rv, s.broken = cert, rv, ""
			return cert, nil
		}
		s.badRV, s.badErr = rv, err
	}
	if s.cert == nil {
		return nil, err
	}
	if err.Error() != s.broken {
		s.broken = err.Error()
		s.log.Error(err, "serving the last good certificate meanwhile: the certificate rotator replaces a bad one when it next looks; a deleted Secret must be created again (helm upgrade creates it empty), which the rotator then fills")
	}
	return s.cert, nil
}

// servable is servable for the Secret's keys, data, saying which Secret
// and name it failed for.
func (s *secretCertificate) servable(data map[string][]byte) (*tls.Certificate, error) {
	cert, err := servable(data, s.name)
	if err != nil {
		return nil, fmt.Errorf("the serving certificate in Secret %s cannot serve %s: %w", s.key, s.name, err)
	}
	return cert, nil
}

// servable is data's pair, a serving certificate Secret's keys, if it can
// serve name: its key is the certificate's, and the certificate names name
// and chains to ca.crt.
func servable(data map[string][]byte, name string) (*tls.Certificate, error) {
	pair, err := tls.X509KeyPair(data["tls.crt"], data["tls.key"])
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(data["ca.crt"]) {
		return nil, errors.New("ca.crt holds no PEM certificate")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
		return nil, err
	}
	return &pair, nil
}
