package gatewaytest

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/tlstest"
)

// Build compiles dislock-test-gateway into dir and returns its path.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "dislock-test-gateway")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/dislock/dislock/test/gatewaytest/cmd/dislock-test-gateway").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building dislock-test-gateway: %v\n%s", err, out)
	}
	return bin, nil
}

// Process is a gateway running as a process of its own (Build's binary),
// on one loopback port for its whole life, restarts included.
type Process struct {
	bin, dsn, cluster, dir string
	port                   int
	ca                     string
	roots                  *x509.CertPool
	cmd                    *exec.Cmd
	exited                 chan struct{}
}

// NewProcess prepares a gateway of cluster over dsn with its files in dir;
// Start runs it.
func NewProcess(bin, dsn, cluster, dir string) (*Process, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ca, err := tlstest.GenerateCA("dislock-test-gateway-ca")
	if err != nil {
		return nil, err
	}
	leaf, err := ca.IssueLeaf("dislock-test-gateway")
	if err != nil {
		return nil, err
	}
	for name, b := range map[string][]byte{"tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return nil, err
		}
	}
	// Restart starts it again on this port.
	port, err := harness.StablePort()
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM)
	return &Process{bin: bin, dsn: dsn, cluster: cluster, dir: dir, port: port, roots: roots,
		ca: base64.RawURLEncoding.EncodeToString(ca.CertPEM)}, nil
}

// URL is the gateway's URL for pods of namespace.
func (p *Process) URL(namespace string) string {
	u := url.URL{Scheme: "https", User: url.UserPassword(namespace, Secret(namespace)),
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)), RawQuery: "ca=" + p.ca}
	return u.String()
}

// Start runs the gateway unless it runs, and returns once it completes a
// TLS handshake.
func (p *Process) Start() error {
	if p.cmd != nil {
		return nil
	}
	logf, err := os.OpenFile(filepath.Join(p.dir, "gateway.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
	cmd := exec.Command(p.bin, "-database-url", p.dsn, "-cluster", p.cluster, "-listen", addr,
		"-cert", filepath.Join(p.dir, "tls.crt"), "-key", filepath.Join(p.dir, "tls.key"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(p.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{RootCAs: p.roots, ServerName: "127.0.0.1"})
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-p.exited:
			p.cmd = nil
			return fmt.Errorf("gateway of %s exited at start: %s", p.cluster, harness.LogTail(filepath.Join(p.dir, "gateway.log"), 10, 2048))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gateway of %s does not serve %s: %v", p.cluster, addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill SIGKILLs the gateway, as a node kills a pod's container: its calls
// in flight end with it, and it returns once the process is gone.
func (p *Process) Kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}

// Restart kills the gateway and starts it again on the same port.
func (p *Process) Restart() error {
	p.Kill()
	return p.Start()
}
