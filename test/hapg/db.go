package hapg

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Credentials: the same role, password and database as pgtest's, so that a
// test can point anything written against pgtest at this cluster, and so
// that pgtest's PgBouncer (whose auth_file holds pgtest's passwords) logs in
// to it. Everything listens on 127.0.0.1 only and lives for one test process.
const (
	database          = "dislock"
	appUser           = "dislock"
	appPassword       = "dislock-secret"
	superuser         = "postgres"
	superuserPassword = "pgtest-superuser-secret"
	// replicationUser streams WAL to the replicas (Patroni's
	// authentication.replication).
	replicationUser     = "replicator"
	replicationPassword = "hapg-replication-secret"
)

// Bootstrap SQL, run as the superuser on the primary.
const (
	createRoleSQL     = "CREATE ROLE " + appUser + " LOGIN PASSWORD '" + appPassword + "'"
	createDatabaseSQL = "CREATE DATABASE " + database + " OWNER " + appUser
)

// pgHBA: trust on the unix socket, which only the account (and root) may
// use; SCRAM over TCP for everything else, replication included, as in
// production.
var pgHBA = []string{
	"local all all trust",
	"host replication " + replicationUser + " 127.0.0.1/32 scram-sha-256",
	"host all all 127.0.0.1/32 scram-sha-256",
}

// dsn is a URL for user at 127.0.0.1:port, database "dislock".
func dsn(user, password string, port int) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(user, password),
		Host:     addr(port),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// adminDSN connects as the superuser to the database "postgres", which
// exists before "dislock" does: for setup and the harness's inspections.
func adminDSN(port int) string {
	return strings.Replace(dsn(superuser, superuserPassword, port), "/"+database+"?", "/postgres?", 1)
}

// multiHostDSN is a libpq/pgx URL naming every port in order, which
// connects to the first that accepts writes.
func multiHostDSN(user, password string, ports []int) string {
	hosts := make([]string, len(ports))
	for i, p := range ports {
		hosts[i] = addr(p)
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(user, password),
		Host:     strings.Join(hosts, ","),
		Path:     "/" + database,
		RawQuery: "sslmode=disable&target_session_attrs=read-write",
	}
	return u.String()
}

// queryRow runs one query on a fresh connection (at most queryTimeout for
// both) and scans its single row into dest.
func queryRow(ctx context.Context, dsn, query string, dest ...any) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, query).Scan(dest...)
}

// execSQL runs statements in order on one fresh connection.
func execSQL(ctx context.Context, dsn string, statements ...string) error {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, s := range statements {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
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
func replicas(ctx context.Context, dsn string) ([]replica, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, "SELECT application_name, coalesce(state, ''), coalesce(sync_state, '') FROM pg_stat_replication")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (replica, error) {
		var r replica
		err := row.Scan(&r.name, &r.state, &r.syncState)
		return r, err
	})
}

// pgConfString renders s as a postgresql.conf string literal.
func pgConfString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// itoa is strconv.Itoa, for config text.
func itoa(n int) string { return strconv.Itoa(n) }
