// Package tlstest writes throwaway certificates for tests that run the
// webhook server, PostgreSQL or PgBouncer with real TLS on loopback.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/test/harness"
)

// ServingCert writes tls.crt and tls.key for 127.0.0.1 and localhost into
// dir (the layout controller-runtime's webhook server reads) and returns the
// certificate in PEM: it is its own CA, so it is also the caBundle.
func ServingCert(t testing.TB, dir string) []byte {
	t.Helper()
	ca, err := WriteServingCert(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// WriteServingCert is ServingCert for code that has no testing.TB (the e2e
// environment, the demo).
func WriteServingCert(dir string) ([]byte, error) {
	_, key, certPEM, err := sign("dislock-webhook-test-ca", true, nil, nil)
	if err != nil {
		return nil, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	if err := WriteFiles(dir, map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM}); err != nil {
		return nil, fmt.Errorf("tlstest: %w", err)
	}
	return certPEM, nil
}

// CA signs serving certificates, as cert-manager's issuer does: renewing a
// leaf keeps the caBundle the API server trusts.
type CA struct {
	CertPEM []byte
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
}

// serial makes every certificate of a test run distinct.
var serial atomic.Int64

// NewCA returns a self-signed CA that can also serve 127.0.0.1 and localhost.
func NewCA(t testing.TB) *CA {
	t.Helper()
	ca, err := GenerateCA("dislock-webhook-test-ca")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// GenerateCA is NewCA with a common name, for code that has no testing.TB
// (pgtest's servers, which make their own CA when asked for TLS).
func GenerateCA(name string) (*CA, error) {
	ca := &CA{}
	var err error
	if ca.cert, ca.key, ca.CertPEM, err = sign(name, true, nil, nil); err != nil {
		return nil, err
	}
	return ca, nil
}

// Leaf is one serving certificate and its key, in PEM.
type Leaf struct {
	CertPEM, KeyPEM []byte
	// Serial identifies the certificate a server presents.
	Serial *big.Int
}

// Issue signs a new serving certificate for 127.0.0.1 and localhost.
func (ca *CA) Issue(t testing.TB) Leaf {
	t.Helper()
	leaf, err := ca.IssueLeaf("dislock-webhook-test")
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// IssueLeaf is Issue with a common name, for code that has no testing.TB.
func (ca *CA) IssueLeaf(name string) (Leaf, error) {
	cert, key, certPEM, err := sign(name, false, ca.cert, ca.key)
	if err != nil {
		return Leaf{}, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return Leaf{}, err
	}
	return Leaf{CertPEM: certPEM, KeyPEM: keyPEM, Serial: cert.SerialNumber}, nil
}

// Files is the leaf as the Secret keys controller-runtime's server reads.
func (l Leaf) Files() map[string][]byte {
	return map[string][]byte{"tls.crt": l.CertPEM, "tls.key": l.KeyPEM}
}

// sign creates a certificate for 127.0.0.1 and localhost signed by parent
// (self-signed when nil).
func sign(name string, isCA bool, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("tlstest: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano() + serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: isCA, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	if isCA {
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("tlstest: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("tlstest: %w", err)
	}
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("tlstest: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// WriteFiles replaces the files in dir the way the kubelet updates a secret
// volume: the new set goes into a fresh timestamped directory, the ..data
// symlink is swapped to it in one rename, and each file name is a symlink
// through ..data. A reader never sees a new tls.crt beside an old tls.key.
func WriteFiles(dir string, files map[string][]byte) error {
	gen, err := os.MkdirTemp(dir, "..gen_")
	if err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(gen, name), data, 0o600); err != nil {
			return err
		}
	}
	data := filepath.Join(dir, "..data")
	old, _ := os.Readlink(data)
	tmp := filepath.Join(dir, "..data_tmp")
	os.Remove(tmp)
	if err := os.Symlink(filepath.Base(gen), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, data); err != nil {
		return err
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return err
		}
	}
	if old != "" {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// ServedSerial is the serial number of the certificate the server on
// 127.0.0.1:port presents, verified against ca.
func ServedSerial(port int, ca []byte) (*big.Int, error) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber, nil
}
