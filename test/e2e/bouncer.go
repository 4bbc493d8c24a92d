package e2e

// A data centre's PgBouncer: in transaction pooling mode, as users run it,
// in front of the one PostgreSQL all data centres share. Stopping it is that
// data centre losing the database while the others keep it.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/node"
	"github.com/dislock/dislock/test/pgtest"
)

// bouncerAccount runs pgbouncer when the tests run as root: it refuses to
// run as root.
const bouncerAccount = "postgres"

// pgBouncer is a data centre's PgBouncer: the environment's own (bouncer),
// or with Options.HA the Patroni cluster's, in front of its HAProxy.
type pgBouncer interface {
	DSN() string
	Start() error
	Stop() error
	LogTail() string
	Close() error
}

type bouncer struct {
	name string
	dir  string
	bin  string
	// upstream is the direct DSN of the shared PostgreSQL.
	upstream *url.URL
	port     int
	cred     *syscall.Credential
	p        *node.Process
}

func findPgbouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("%w: pgbouncer not found: install it with hack/install-deps.sh (Debian package pgbouncer)", ErrMissing)
}

// newBouncer writes the configuration of a PgBouncer in dir for the
// database at directDSN and picks its port.
func newBouncer(name, dir, directDSN string) (*bouncer, error) {
	bin, err := findPgbouncer()
	if err != nil {
		return nil, err
	}
	up, err := url.Parse(directDSN)
	if err != nil {
		return nil, fmt.Errorf("e2e: %w", err)
	}
	b := &bouncer{name: name, dir: dir, bin: bin, upstream: up}
	if os.Geteuid() == 0 {
		u, err := user.Lookup(bouncerAccount)
		if err != nil {
			return nil, fmt.Errorf("%w: running as root needs the %q user (apt-get install postgresql): %v", ErrMissing, bouncerAccount, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		b.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	if b.port, err = harness.FreePort(); err != nil {
		return nil, err
	}
	password, _ := up.User.Password()
	files := map[string]string{
		b.path("ini"): fmt.Sprintf(`[databases]
%[1]s = host=%[2]s port=%[3]s dbname=%[1]s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %[4]d
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %[5]s
pool_mode = transaction
max_client_conn = 200
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,options
server_reset_query =
; A restarted PostgreSQL is retried at once rather than after 15 s.
server_login_retry = 1
; The namespaces' tenant roles, created by the webhooks while PgBouncer runs,
; are looked up in the database (docs/install.md, "Database roles").
auth_user = %[6]s
auth_query = %[7]s
`, filepath.Base(up.Path), up.Hostname(), up.Port(), b.port, b.path("users"), pgtest.AuthUser, pgtest.AuthQuery),
		b.path("users"): fmt.Sprintf("%q %q\n%q %q\n", up.User.Username(), password, pgtest.AuthUser, pgtest.AuthUserPassword),
	}
	for p, content := range files {
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			return nil, fmt.Errorf("e2e: %w", err)
		}
		if b.cred != nil {
			if err := os.Chown(p, int(b.cred.Uid), int(b.cred.Gid)); err != nil {
				return nil, fmt.Errorf("e2e: %w", err)
			}
		}
	}
	return b, nil
}

func (b *bouncer) path(ext string) string { return filepath.Join(b.dir, b.name+"."+ext) }

// DSN is the application's URL through this PgBouncer.
func (b *bouncer) DSN() string {
	u := *b.upstream
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
	return u.String()
}

// Start runs pgbouncer and returns once a query through it succeeds.
// Starting a running bouncer is a no-op.
func (b *bouncer) Start() error {
	if b.p != nil && b.p.Running() {
		return nil
	}
	cmd := exec.Command(b.bin, b.path("ini"))
	cmd.Dir = b.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred}
	p, err := node.StartProcess(b.dir, b.name, cmd)
	if err != nil {
		return err
	}
	b.p = p
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := b.ping()
		if err == nil {
			return nil
		}
		if !p.Running() || time.Now().After(deadline) {
			return fmt.Errorf("e2e: %s does not answer: %v\n%s", b.name, err, harness.LogTail(p.LogFile(), 20, 4096))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *bouncer) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, b.DSN())
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.Ping(ctx)
}

// Stop ends pgbouncer and returns once its port refuses connections: the
// data centre has lost the database.
func (b *bouncer) Stop() error {
	if err := b.p.Stop(); err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)), time.Second)
	if err == nil {
		c.Close()
		return errors.New("e2e: " + b.name + " port still accepts connections after stop")
	}
	return nil
}

// LogTail returns the end of pgbouncer's log, for a failing test's output.
func (b *bouncer) LogTail() string {
	if b.p == nil {
		return ""
	}
	return harness.LogTail(b.p.LogFile(), 10, 2048)
}

// Close stops pgbouncer if it was started.
func (b *bouncer) Close() error {
	if b.p == nil {
		return nil
	}
	return b.p.Stop()
}
