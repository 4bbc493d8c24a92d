// Package storetest holds the helpers the database tests of lockagent/store
// and its owner-only packages share: the targets (PostgreSQL directly and
// through PgBouncer), migrated stores, keys and namespaces of a test's own,
// tenant roles, and claims.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"
)

// EachTarget runs fn once directly against PostgreSQL and once through
// PgBouncer in transaction pooling mode.
func EachTarget(t *testing.T, fn func(t *testing.T, dsn string)) {
	t.Helper()
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) { fn(t, tg.DSN) })
	}
}

// Open opens a migrated Store closed with the test.
func Open(t testing.TB, dsn string, maxConns int32) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), dsn, store.Options{MaxConns: maxConns})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(s.Close)
	if _, err := migrate.Up(context.Background(), s); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s
}

var seq atomic.Int64

// Seq is a number no other call in the test binary returns, for names
// that must not collide in the database the tests share.
func Seq() int64 { return seq.Add(1) }

// UniqueKey gives each test its own lock keys so tests share one database.
func UniqueKey(t testing.TB) string {
	name := strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	return fmt.Sprintf("test-%d/%s", Seq(), name)
}

// Namespace gives a test a namespace of its own (a DNS label), so that
// tests share one database.
func Namespace(t testing.TB, team string) string {
	t.Helper()
	return fmt.Sprintf("%s-%d", team, Seq())
}

// Owner is the pod of a Job in namespace ns.
func Owner(cluster, job, pod string) store.Owner {
	return store.Owner{Cluster: cluster, Namespace: "ns", Job: job, JobUID: "uid-" + job, Pod: pod}
}

// window0 is a fixed schedule tick; windows are minutes after it.
var window0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// WindowAt is the schedule tick i minutes after a fixed one.
func WindowAt(i int) time.Time { return window0.Add(time.Duration(i) * time.Minute) }

// AwaitDBPast waits until the database clock is past ts: expiry is a matter of
// database time, so the test waits for that condition, not for a local timer.
func AwaitDBPast(t testing.TB, s *store.Store, ts time.Time) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		now, err := s.Now(context.Background())
		if err != nil {
			t.Fatalf("reading database time: %v", err)
		}
		if now.After(ts) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("database time %s never passed %s", now, ts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AwaitCond waits up to 10 s for cond.
func AwaitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Provision creates a tenant role of namespace ns in cluster dc-a with the
// owner's Store.
func Provision(t testing.TB, owner *store.Store, ns string) tenant.Credential {
	t.Helper()
	c, err := tenant.Provision(context.Background(), owner, "dc-a", ns)
	if err != nil {
		t.Fatalf("provisioning namespace %s: %v", ns, err)
	}
	return c
}

// TenantDSN is the tenant's URL, reaching the database the way ownerDSN
// does.
func TenantDSN(t testing.TB, ownerDSN string, c tenant.Credential) string {
	t.Helper()
	dsn, err := tenant.DSN(ownerDSN, c)
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// TenantStore opens a Store as the tenant, reaching the database the way
// ownerDSN does (directly or through PgBouncer).
func TenantStore(t testing.TB, ownerDSN string, c tenant.Credential) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), TenantDSN(t, ownerDSN, c), store.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// ProvisionDefaulting provisions namespace ns's tenant role, as Provision
// does, with its sessions defaulting to isolation level (a
// default_transaction_isolation), as an operator's ALTER ROLE would.
func ProvisionDefaulting(t testing.TB, owner *store.Store, ns, level string) tenant.Credential {
	t.Helper()
	c := Provision(t, owner, ns)
	if _, err := owner.Handle().Pool.Exec(context.Background(),
		"ALTER ROLE "+pgx.Identifier{c.Role}.Sanitize()+" SET default_transaction_isolation = '"+strings.ReplaceAll(level, "'", "''")+"'"); err != nil {
		t.Fatal(err)
	}
	return c
}

// Exec runs q on conn, one or more statements as a migration file holds
// them, failing the test on an error.
func Exec(t testing.TB, conn *pgx.Conn, q string) {
	t.Helper()
	if err := conn.PgConn().Exec(context.Background(), q).Close(); err != nil {
		t.Fatal(err)
	}
}

// RawConn is a plain connection for statements the Store never sends,
// usable through PgBouncer's transaction pooling.
func RawConn(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	cfg, err := store.ParseDatabaseURL(dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(context.Background(), cfg.ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Superuser is a connection of srv's superuser, closed with the test.
func Superuser(t *testing.T, srv *pgtest.Server) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), srv.SuperuserDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// TTL is the liveness of the tests' claims.
const TTL = 30 * time.Second

// Claim claims window w of key for o.
func Claim(t *testing.T, s *store.Store, key string, w time.Time, o store.Owner, standby bool, ttl time.Duration) (store.Claim, error) {
	t.Helper()
	return s.ClaimWindow(context.Background(), store.ClaimRequest{Key: key, Window: w, Index: store.NotIndexed, Owner: o, TTL: ttl, Standby: standby})
}

// MustClaim claims window w of key for o, failing the test unless the
// claim's outcome is want.
func MustClaim(t *testing.T, s *store.Store, key string, w time.Time, o store.Owner, standby bool, ttl time.Duration, want store.ClaimOutcome) store.Claim {
	t.Helper()
	c, err := Claim(t, s, key, w, o, standby, ttl)
	if err != nil {
		t.Fatalf("claim by %s: %v", o.WindowOwner(), err)
	}
	if c.Outcome != want {
		t.Fatalf("claim by %s: outcome %q, want %q", o.WindowOwner(), c.Outcome, want)
	}
	return c
}

// MustBeTaken claims window w of key for o, failing the test unless it is
// refused naming wantOwner.
func MustBeTaken(t *testing.T, s *store.Store, key string, w time.Time, o store.Owner, standby bool, wantOwner string) store.Claim {
	t.Helper()
	c, err := Claim(t, s, key, w, o, standby, TTL)
	if !errors.Is(err, store.ErrWindowTaken) {
		t.Fatalf("claim by %s: err %v, want ErrWindowTaken", o.WindowOwner(), err)
	}
	if c.Window.Owner != wantOwner {
		t.Fatalf("refusal names owner %q, want %q", c.Window.Owner, wantOwner)
	}
	return c
}

// Ptr points at a copy of v.
func Ptr[T any](v T) *T { return &v }

// ByCheck indexes findings by their check.
func ByCheck(fs []check.Finding) map[string]check.Finding {
	m := map[string]check.Finding{}
	for _, f := range fs {
		m[f.Check] = f
	}
	return m
}

// ClosedPort is a port of 127.0.0.1 that refuses connections for the rest
// of the test: a socket bound to it that never listens. A port freed after
// a listen would do only until a server that another test package starts
// meanwhile picks it.
func ClosedPort(t testing.TB) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}
