package hapg

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/test/pgtest"
)

// Credentials are pgtest's (pgtest.AppUser, pgtest.Superuser, ...), so that
// a test can point anything written against pgtest at this cluster, and so
// that pgtest's PgBouncer (whose auth_file holds pgtest's passwords) logs in
// to it. Only the replication role is hapg's own: it streams WAL to the
// replicas (Patroni's authentication.replication).
const (
	replicationUser     = "replicator"
	replicationPassword = "hapg-replication-secret"
)

// pgHBA: trust on the unix socket, which only the account (and root) may
// use; SCRAM over TCP for everything else, replication included, as in
// production.
var pgHBA = []string{
	"local all all trust",
	"host replication " + replicationUser + " 127.0.0.1/32 scram-sha-256",
	"host all all 127.0.0.1/32 scram-sha-256",
}

// appDSN connects to 127.0.0.1:port, database "dislock", as the application
// role; superuserDSN as the superuser.
func appDSN(port int) string { return pgtest.DSN(pgtest.AppUser, pgtest.AppPassword, port) }

func superuserDSN(port int) string {
	return pgtest.DSN(pgtest.Superuser, pgtest.SuperuserPassword, port)
}

// adminDSN connects as the superuser to the database "postgres", which
// exists before "dislock" does: for setup and the harness's inspections.
func adminDSN(port int) string {
	return strings.Replace(superuserDSN(port), "/"+pgtest.Database+"?", "/postgres?", 1)
}

// multiHostDSN is pgtest.DSN naming every port in order, with
// target_session_attrs=read-write: it connects to the first that accepts
// writes.
func multiHostDSN(user, password string, ports []int) string {
	hosts := make([]string, len(ports))
	for i, p := range ports {
		hosts[i] = addr(p)
	}
	u, err := url.Parse(pgtest.DSN(user, password, ports[0]))
	if err != nil {
		panic(fmt.Sprintf("hapg: pgtest.DSN: %v", err))
	}
	u.Host = strings.Join(hosts, ",")
	u.RawQuery += "&target_session_attrs=read-write"
	return u.String()
}

// withConn runs f on a fresh connection to dsn, within timeout for both.
func withConn(ctx context.Context, dsn string, timeout time.Duration, f func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	// Unnamed statements, as the lock store sends them: a named one stays on
	// the PgBouncer server connection after this client leaves, and the next
	// client that prepares the same text there fails with "already exists".
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return f(ctx, conn)
}

// queryRow runs one query on a fresh connection (at most queryTimeout for
// both) and scans its single row into dest.
func queryRow(ctx context.Context, dsn, query string, dest ...any) error {
	return withConn(ctx, dsn, queryTimeout, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, query).Scan(dest...)
	})
}

// execSQL runs statements in order on one fresh connection.
func execSQL(ctx context.Context, dsn string, statements ...string) error {
	return withConn(ctx, dsn, commandTimeout, func(ctx context.Context, conn *pgx.Conn) error {
		for _, s := range statements {
			if _, err := conn.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	})
}

// isPrimary asks the server at dsn whether it is out of recovery.
func isPrimary(ctx context.Context, dsn string) error {
	var inRecovery bool
	if err := queryRow(ctx, dsn, "SELECT pg_is_in_recovery()", &inRecovery); err != nil {
		return err
	}
	if inRecovery {
		return fmt.Errorf("still in recovery")
	}
	return nil
}

// replica is a row of pg_stat_replication.
type replica struct {
	name, state, syncState string
}

// replicas lists the walsenders of the server at dsn (a superuser's: others
// see no state).
func replicas(ctx context.Context, dsn string) (rs []replica, err error) {
	err = withConn(ctx, dsn, queryTimeout, func(ctx context.Context, conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, "SELECT application_name, coalesce(state, ''), coalesce(sync_state, '') FROM pg_stat_replication")
		if err != nil {
			return err
		}
		rs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (replica, error) {
			var r replica
			err := row.Scan(&r.name, &r.state, &r.syncState)
			return r, err
		})
		return err
	})
	return rs, err
}

// pgConfString renders s as a postgresql.conf string literal.
func pgConfString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// itoa is strconv.Itoa, for config text.
func itoa(n int) string { return strconv.Itoa(n) }
