package check

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/db"
	"github.com/dislock/dislock/lockagent/store/internal/dsn"
	"github.com/dislock/dislock/lockagent/store/tenant"
)

// The kinds of role a RoleReport can be about.
const (
	// RoleOwner is the owner/admin role: migrations, retention,
	// provisioning, the operator CLI (the webhook's --database-url).
	RoleOwner = "owner"
	// RoleTenant is a namespace's login role (its Secret dislock-db/url).
	RoleTenant = "tenant"
)

// RoleReport is what URL found for one database URL.
type RoleReport struct {
	// Role is the login role the URL names; never its password.
	Role string `json:"role"`
	// Kind is RoleOwner or RoleTenant, empty when the check never logged in.
	Kind string `json:"kind,omitempty"`
	// Namespace is a tenant role's namespace.
	Namespace string    `json:"namespace,omitempty"`
	Addr      string    `json:"addr"`
	Database  string    `json:"database"`
	Findings  []Finding `json:"findings"`
}

// Heading names the role the findings are about, e.g. "role dislock
// (owner) at db:6432, database dislock".
func (r RoleReport) Heading() string {
	who := "role " + r.Role
	switch r.Kind {
	case RoleOwner:
		who += " (owner)"
	case RoleTenant:
		if r.Namespace == "" {
			who += " (tenant)"
		} else {
			who += " (tenant of namespace " + r.Namespace + ")"
		}
	}
	return fmt.Sprintf("%s at %s, database %s", who, r.Addr, r.Database)
}

// checkConnectTimeout bounds each connection the check opens when the URL
// sets no connect_timeout: a host behind a firewall that drops packets
// would otherwise keep the check waiting for the operating system's TCP
// timeout, minutes, before it can say so.
const checkConnectTimeout = 10 * time.Second

// URL runs every check for the role databaseURL logs in as, the
// preflight a new install runs before the first tick: that it can connect
// (a failure is a finding naming the cause and the fix, not an error), how
// it reaches PostgreSQL (pooling mode, TLS), how far the database's clock
// is from this host's, what the role may do (the owner migrates and
// provisions tenants; a tenant claims), and then Database's findings.
// No text in the report contains the URL's password.
func URL(ctx context.Context, databaseURL string, opts Options) RoleReport {
	var rep RoleReport
	defer func() {
		for i := range rep.Findings {
			f := &rep.Findings[i]
			f.Detail, f.Fix = dsn.Scrub(databaseURL, f.Detail), dsn.Scrub(databaseURL, f.Fix)
		}
	}()
	cfg, err := store.ParseDatabaseURL(databaseURL)
	if err != nil {
		rep.Findings = []Finding{{Check: "url", Status: StatusFail, Detail: err.Error(),
			Fix: "write the URL as postgres://<role>:<password>@<host>:<port>/<database>?sslmode=verify-full (or key=value pairs)"}}
		return rep
	}
	cc := cfg.ConnConfig
	rep.Role, rep.Addr, rep.Database = cc.User, db.Addrs(cc), cc.Database
	if strings.HasPrefix(rep.Role, tenant.RolePrefix) {
		// Known by its name even when it cannot log in.
		rep.Kind = RoleTenant
	}
	s, err := store.Open(ctx, databaseURL, store.Options{MaxConns: 2})
	if err != nil {
		rep.Findings = []Finding{{Check: "url", Status: StatusFail, Detail: err.Error()}}
		return rep
	}
	defer s.Close()
	rep.Findings = checker{st: s, h: s.Handle()}.preflight(ctx, &rep, opts)
	return rep
}

// preflight fills rep's kind and namespace and returns its findings.
func (s checker) preflight(ctx context.Context, rep *RoleReport, opts Options) []Finding {
	conn, err := s.connect(ctx)
	if err != nil {
		return []Finding{s.connectionFinding(ctx, rep, err)}
	}
	defer conn.Close(context.Background())
	var namespace string
	switch err := conn.QueryRow(ctx, qTenantNamespace).Scan(&namespace); {
	case err == nil && namespace != "":
		rep.Kind, rep.Namespace = RoleTenant, namespace
	case strings.HasPrefix(rep.Role, tenant.RolePrefix):
		// A tenant role that lost its grants cannot even ask which
		// namespace it serves; its name still says what it is.
		rep.Kind = RoleTenant
	default:
		// Any other role, or a database whose schema is not there yet
		// (only the owner can create it): the schema finding says which.
		rep.Kind = RoleOwner
	}
	out := []Finding{{Check: "connection", Status: StatusOK,
		Detail: fmt.Sprintf("logged in as role %s at %s, database %s", rep.Role, rep.Addr, rep.Database)}}
	out = append(out, tlsFinding(conn))
	out = append(out, clockFinding(ctx, conn))
	var privileges Finding
	if rep.Kind == RoleTenant {
		privileges = s.tenantPrivileges(ctx, conn, namespace)
	} else {
		privileges = ownerPrivileges(ctx, conn)
	}
	// The pooling probe opens connections of its own: under session
	// pooling this one would hold a server connection the probe may need.
	conn.Close(context.Background())
	out = append(out, s.poolingFinding(ctx), privileges)
	found, err := s.database(ctx, opts)
	if err != nil {
		return append(out, Finding{Check: "database", Status: StatusFail, Detail: err.Error(),
			Fix: "see the error; run dislock check again once the database answers"})
	}
	return append(out, found...)
}

// connect opens one connection of its own, outside the Store's pool, with
// the Store's settings.
func (s checker) connect(ctx context.Context) (*pgx.Conn, error) {
	cc := s.h.Pool.Config().ConnConfig
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = checkConnectTimeout
	}
	return pgx.ConnectConfig(ctx, cc)
}

// The fixes of the connection findings name where an install keeps the
// URL: the chart's Secret (or the one database.existingSecret names) for
// the owner, the namespace's Secret for a tenant.
const (
	fixReach = "check the URL's host and port; that PostgreSQL (or PgBouncer) listens there (listen_addresses, listen_addr) " +
		"and that a NetworkPolicy or firewall lets this host (the webhook's and the job pods' nodes) reach it"
	fixSecret = "correct the URL in the Secret that holds it (the namespace's dislock-db, key url, for a tenant; for the owner the chart's database Secret " +
		"or the one database.existingSecret names), or set the role's password as a superuser: ALTER ROLE %s PASSWORD '…' " +
		"(through PgBouncer, its auth_file or auth_query must know the role too)"
	fixTLS = "make the URL's TLS settings match the server: sslmode=verify-full with sslrootcert=<the CA that signed the server's certificate> " +
		"(the chart's database.tls.caSecret, the webhook's --database-ca-file), a certificate whose names include the URL's host, " +
		"or, only if the server cannot do TLS at all, sslmode=disable on a network you trust"
)

// connectionFinding says why the Store cannot log in, and what to do.
func (s checker) connectionFinding(ctx context.Context, rep *RoleReport, err error) Finding {
	f := Finding{Check: "connection", Status: StatusFail}
	var pgErr *pgconn.PgError
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000" || bouncerRefusedLogin(pgErr)):
		f.Check = "login"
		f.Detail = fmt.Sprintf("%s refused role %s: %s (SQLSTATE %s): a wrong password, or no such role", rep.Addr, rep.Role, pgErr.Message, pgErr.Code)
		if pgErr.Message == bouncerConfigError {
			f.Detail += "; PgBouncer answers so when its auth_query finds no such role, or when its own login to PostgreSQL for the role failed (its log says which)"
		}
		f.Fix = fmt.Sprintf(fixSecret, rep.Role)
	case errors.As(err, &pgErr) && (pgErr.Code == "3D000" || bouncerNoDatabase(pgErr)):
		f.Check = "database name"
		f.Detail = fmt.Sprintf("%s has no database %q: %s (SQLSTATE %s)", rep.Addr, rep.Database, pgErr.Message, pgErr.Code)
		f.Fix = "name an existing database in the URL's path (postgres://…@host:port/<database>), " +
			"create it (CREATE DATABASE … OWNER <owner role>), or add it to PgBouncer's [databases]"
	case errors.As(err, &pgErr):
		f.Detail = fmt.Sprintf("%s refused the connection: %s (SQLSTATE %s)", rep.Addr, pgErr.Message, pgErr.Code)
		f.Fix = "see the server's message; run dislock check again once the database accepts connections"
	case tlsVerifyFailed(err):
		f.Check = "tls"
		f.Detail = fmt.Sprintf("the certificate of %s did not verify: %v", rep.Addr, errors.Unwrap(err))
		f.Fix = fixTLS
	case errors.As(err, &dnsErr):
		f.Detail = fmt.Sprintf("cannot resolve host %s: %v", dnsErr.Name, dnsErr)
		f.Fix = fixReach
	case errors.As(err, &opErr) && opErr.Op == "dial", pgconn.Timeout(err), errors.Is(err, context.DeadlineExceeded):
		f.Detail = fmt.Sprintf("cannot reach %s: %v", rep.Addr, errors.Unwrap(err))
		f.Fix = fixReach
	case s.refusesTLS(ctx):
		f.Check = "tls"
		f.Detail = fmt.Sprintf("%s does not support TLS (it answered no to the TLS request), and the URL's sslmode requires it", rep.Addr)
		f.Fix = "enable TLS on the server (ssl = on; PgBouncer client_tls_sslmode), then " + fixTLS
	default:
		f.Detail = fmt.Sprintf("cannot connect to %s: %v", rep.Addr, err)
		f.Fix = fixReach
	}
	return f
}

// PgBouncer (up to at least 1.18) reports every refusal of its own with
// SQLSTATE 08P01: only its message tells a wrong password or an unknown
// role from the rest. These are PgBouncer's fixed texts, not a translated
// server message. bouncerConfigError is what it answers, before the client
// logged in, when the role's login to PostgreSQL fails, which includes an
// auth_query that finds no such role.
func bouncerRefusedLogin(e *pgconn.PgError) bool {
	return e.Code == "08P01" && (e.Message == "password authentication failed" || e.Message == "no such user" ||
		e.Message == bouncerConfigError || strings.HasPrefix(e.Message, "SASL authentication failed"))
}

const bouncerConfigError = "bouncer config error"

func bouncerNoDatabase(e *pgconn.PgError) bool {
	return e.Code == "08P01" && strings.HasPrefix(e.Message, "no such database")
}

// tlsVerifyFailed reports a server certificate the URL's TLS settings do
// not accept.
func tlsVerifyFailed(err error) bool {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	return errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) || errors.As(err, &verify)
}

// refusesTLS asks the URL's first host, as libpq does before it starts
// TLS, whether it supports TLS, when the URL insists on it. The driver's
// own refusal has no type to tell it by.
func (s checker) refusesTLS(ctx context.Context) bool {
	cc := s.h.Pool.Config().ConnConfig
	if cc.TLSConfig == nil || strings.HasPrefix(cc.Host, "/") {
		return false
	}
	for _, fb := range cc.Fallbacks {
		if fb.TLSConfig == nil { // sslmode allow or prefer: plain text would do
			return false
		}
	}
	d := net.Dialer{Timeout: checkConnectTimeout}
	c, err := d.DialContext(ctx, "tcp", db.HostPort(cc.Host, cc.Port))
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(checkConnectTimeout))
	// SSLRequest: length 8, code 1234 5679.
	if _, err := c.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil {
		return false
	}
	answer := make([]byte, 1)
	_, err = c.Read(answer)
	return err == nil && answer[0] == 'N'
}

// tlsFinding says whether the connection is encrypted and whether the
// client verified whom it talks to. It reads the connection itself and the
// parsed URL, not pg_stat_ssl: through PgBouncer that shows the bouncer's
// own connection to PostgreSQL, not this one.
func tlsFinding(conn *pgx.Conn) Finding {
	cc := conn.Config()
	_, encrypted := conn.PgConn().Conn().(*tls.Conn)
	const fix = "use sslmode=verify-full and sslrootcert=<the CA that signed the server's certificate> in the URL " +
		"(the chart's database.tls.caSecret, the webhook's --database-ca-file)"
	switch {
	case encrypted && !cc.TLSConfig.InsecureSkipVerify:
		return Finding{Check: "tls", Status: StatusOK, Detail: "encrypted, and the server's certificate and host name verified (sslmode=verify-full)"}
	case encrypted && cc.TLSConfig.VerifyPeerCertificate != nil:
		return Finding{Check: "tls", Status: StatusWarn, Fix: fix,
			Detail: "encrypted, but server identity not verified: the certificate chains to the CA, its host name is not checked (sslmode=verify-ca), so any server with a certificate from that CA can stand in"}
	case encrypted:
		return Finding{Check: "tls", Status: StatusWarn, Fix: fix,
			Detail: "encrypted, but server identity not verified (sslmode=require or prefer): whoever answers at the address gets the password"}
	case loopback(conn):
		return Finding{Check: "tls", Status: StatusOK, Detail: "plain text over this host's loopback or a Unix socket"}
	}
	return Finding{Check: "tls", Status: StatusWarn, Fix: fix,
		Detail: fmt.Sprintf("plain text to %s: the password and every claim cross the network unencrypted and unauthenticated", cc.Host)}
}

// loopback reports a connection that never leaves this host.
func loopback(conn *pgx.Conn) bool {
	host := conn.Config().Host
	if strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return true
	}
	if tcp, ok := db.TCPAddr(conn.PgConn().Conn().RemoteAddr()); ok {
		return tcp.IP.IsLoopback()
	}
	return false
}
