package pgtest

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
)

// Credentials of the throwaway cluster. They are constants because the
// cluster only listens on 127.0.0.1 and lives for one test process. hapg's
// clusters use the same, so that anything written against pgtest can point
// at them, and so that a PgBouncer of pgtest's (whose auth_file holds these
// passwords) logs in to them.
const (
	Database          = "dislock"
	AppUser           = "dislock"
	AppPassword       = "dislock-secret"
	Superuser         = "postgres"
	SuperuserPassword = "pgtest-superuser-secret"
)

// PgBouncer's auth_user: the role PgBouncer logs in as to look up, with
// AuthQuery, the SCRAM secret of a client role its auth_file does not list.
// The dislock roles the webhook creates for namespaces log in through
// PgBouncer that way without a reload.
const (
	AuthUser         = "pgbouncer_auth"
	AuthUserPassword = "pgtest-pgbouncer-auth-secret"
	AuthQuery        = "SELECT username, password FROM pgbouncer.get_auth($1)"
)

// Bootstrap SQL, run as the superuser (by pgtest over the private unix
// socket). The application role owns the database and may create roles:
// the dislock schema's owner creates the namespaces' tenant roles.
const (
	CreateRoleSQL     = "CREATE ROLE " + AppUser + " LOGIN CREATEROLE PASSWORD '" + AppPassword + "'"
	CreateDatabaseSQL = "CREATE DATABASE " + Database + " OWNER " + AppUser
	CreateAuthUserSQL = "CREATE ROLE " + AuthUser + " LOGIN PASSWORD '" + AuthUserPassword + "'"
)

// CreateAuthQuerySQL, run as the superuser in the database PgBouncer serves
// (PgBouncer 1.18 runs auth_query in the client's database), is PgBouncer's
// usual auth_query recipe: a SECURITY DEFINER function over pg_authid, in a
// schema the superuser owns so that the auth user cannot replace it,
// executable by the auth user alone. It answers for login roles only and
// never for a superuser, whose secret has no business in a pooler.
const CreateAuthQuerySQL = `
CREATE SCHEMA pgbouncer AUTHORIZATION ` + Superuser + `;
REVOKE ALL ON SCHEMA pgbouncer FROM PUBLIC;
GRANT USAGE ON SCHEMA pgbouncer TO ` + AuthUser + `;
CREATE FUNCTION pgbouncer.get_auth(p_username text, OUT username text, OUT password text)
RETURNS record LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT rolname::text, rolpassword FROM pg_catalog.pg_authid
    WHERE rolname = p_username AND rolcanlogin AND NOT rolsuper
      AND (rolvaliduntil IS NULL OR rolvaliduntil > now())
$$;
REVOKE ALL ON FUNCTION pgbouncer.get_auth(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO ` + AuthUser + `;
`

// DSN is a URL for user at 127.0.0.1:port, database "dislock", without TLS:
// postgres://user:password@127.0.0.1:port/dislock?sslmode=disable.
func DSN(user, password string, port int) string {
	return dsn(user, password, port, "sslmode=disable")
}

// VerifyFullDSN is DSN over TLS, verifying the server's certificate and its
// name (127.0.0.1) against the CA in the file caFile:
// postgres://user:password@127.0.0.1:port/dislock?sslmode=verify-full&sslrootcert=caFile.
func VerifyFullDSN(user, password string, port int, caFile string) string {
	return dsn(user, password, port, url.Values{"sslmode": {"verify-full"}, "sslrootcert": {caFile}}.Encode())
}

func dsn(user, password string, port int, query string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(user, password),
		Host:     addr(port),
		Path:     "/" + Database,
		RawQuery: query,
	}
	return u.String()
}

// Files of a TLS Server (Options.TLS), in its temp directory: one CA signs
// PostgreSQL's and PgBouncer's certificates, both for 127.0.0.1 and
// localhost, so a client verifying either with the CA file verifies the name
// too (sslmode=verify-full).
const (
	caFile          = "ca.crt"
	serverCertFile  = "server.crt"
	serverKeyFile   = "server.key"
	bouncerCertFile = "pgbouncer.crt"
	bouncerKeyFile  = "pgbouncer.key"
)

// postgresTLSConf turns TLS on in postgresql.conf. The key file must belong
// to the server's account and be private, or postgres refuses to start.
func postgresTLSConf(dir string) string {
	return fmt.Sprintf(`ssl = on
ssl_cert_file = %s
ssl_key_file = %s
`, pgQuote(filepath.Join(dir, serverCertFile)), pgQuote(filepath.Join(dir, serverKeyFile)))
}

// pgHBATLS is pgHBA for a TLS Server: over TCP only hostssl lines, so a
// client that does not encrypt finds no pg_hba.conf entry and is refused,
// as a production server that requires TLS refuses it.
const pgHBATLS = `# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 trust
hostssl all       all   127.0.0.1/32  scram-sha-256
`

// bouncerTLSConf extends a pgbouncer.ini for a TLS Server: clients must
// encrypt (PgBouncer presents its own certificate from the CA), and
// PgBouncer verifies PostgreSQL's certificate and name against the CA, so
// both hops of the production path are encrypted and verified.
func bouncerTLSConf(dir string) string {
	return fmt.Sprintf(`client_tls_sslmode = require
client_tls_cert_file = %s
client_tls_key_file = %s
server_tls_sslmode = verify-full
server_tls_ca_file = %s
`, filepath.Join(dir, bouncerCertFile), filepath.Join(dir, bouncerKeyFile), filepath.Join(dir, caFile))
}

// postgresConf is appended to the postgresql.conf that initdb wrote, so that a
// plain `pg_ctl start` (StartPostgres) brings the server back with the same
// settings.
func postgresConf(port int, socketDir string) string {
	return fmt.Sprintf(`
# --- added by pgtest ---
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = %s
# Only the cluster's owner (and root) may use the socket, which is what makes
# "trust" on it in pg_hba.conf safe.
unix_socket_permissions = 0700
max_connections = 200
shared_buffers = 32MB
# Benchmarks and crash tests measure durable commits: never trade these away
# for speed.
fsync = on
synchronous_commit = on
full_page_writes = on
# pg_ctl -l captures the server's stderr into postgres.log in the temp dir.
logging_collector = off
password_encryption = 'scram-sha-256'
`, port, pgQuote(socketDir))
}

// pgHBA replaces initdb's pg_hba.conf: trust on the owner-only unix socket (the
// harness bootstraps roles through it), SCRAM for everything over TCP so that
// tests exercise the same authentication path as production.
const pgHBA = `# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 trust
host    all       all   127.0.0.1/32  scram-sha-256
`

// Server connections per bouncer: the Server's own bouncer keeps PgBouncer's
// default; an extra one (AddBouncer) gets a small pool, so that a dozen of
// them stay well inside max_connections even when each has just been
// resumed with a queue of clients. Transaction pooling multiplexes many
// clients onto few server connections, so a small pool only queues them.
const (
	mainPoolSize  = 20
	extraPoolSize = 4
)

// bouncerConf is pgbouncer.ini for a PgBouncer in front of the postgres on
// 127.0.0.1:pgPort, which pgtest gave the auth_query function: roles the
// auth_file does not list log in too.
func bouncerConf(pgPort, port, poolSize int, authFile, pidFile string) string {
	return upstreamBouncerConf("127.0.0.1", pgPort, port, poolSize, authFile, pidFile) + authQueryConf
}

// authQueryConf extends a pgbouncer.ini: PgBouncer asks the database for the
// SCRAM secret of a role its auth_file lacks (logging in as auth_user, whose
// password is in the auth_file), verifies the client against it, and logs
// in to PostgreSQL with the client's own SCRAM proof (SCRAM pass-through),
// so a role created after PgBouncer started needs no reload.
const authQueryConf = `auth_user = ` + AuthUser + `
auth_query = ` + AuthQuery + `
`

// upstreamBouncerConf is pgbouncer.ini for a PgBouncer in front of
// host:pgPort, authenticating the roles of its auth_file only (pgtest did
// not set up the upstream, so it has no auth_query function). Settings that
// differ from PgBouncer's defaults are explained inline.
func upstreamBouncerConf(host string, pgPort, port, poolSize int, authFile, pidFile string) string {
	return fmt.Sprintf(`[databases]
%s = host=%s port=%d dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
; No unix socket: the default (/tmp) would collide between parallel harnesses.
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %s
; The admin console (database "pgbouncer") is reachable as the superuser for
; tests that want SHOW POOLS and friends.
admin_users = %s
pool_mode = transaction
max_client_conn = 200
default_pool_size = %d
; Idle server connections go back to PostgreSQL after a minute rather than
; ten: many bouncers share one max_connections.
server_idle_timeout = 60
; pgx sends these on startup; PgBouncer would otherwise refuse the client.
ignore_startup_parameters = extra_float_digits,options
server_reset_query =
; After a failed server login PgBouncer refuses clients for this long. The
; default (15 s) would make every restart in a crash test cost 15 s.
server_login_retry = 1
; No logfile: in the foreground PgBouncer logs to stderr, which the harness
; sends to pgbouncer.log; a logfile would receive every line a second time.
pidfile = %s
`, Database, host, pgPort, Database, port, authFile, Superuser, poolSize, pidFile)
}

// bouncerAuthFile lists plain-text passwords: from them PgBouncer 1.18 both
// verifies the client's SCRAM exchange and performs its own SCRAM login to
// PostgreSQL, and the harness need not compute SCRAM secrets itself.
func bouncerAuthFile() string {
	return fmt.Sprintf("%s %s\n%s %s\n%s %s\n",
		bouncerQuote(AppUser), bouncerQuote(AppPassword),
		bouncerQuote(Superuser), bouncerQuote(SuperuserPassword),
		bouncerQuote(AuthUser), bouncerQuote(AuthUserPassword))
}

// pgQuote renders s as a postgresql.conf string literal.
func pgQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// bouncerQuote renders s as a field of a PgBouncer auth_file.
func bouncerQuote(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}
