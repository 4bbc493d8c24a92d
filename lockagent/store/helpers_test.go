package store_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, pgtest.Options{Name: "store"})) }

// eachTarget runs fn once directly against PostgreSQL and once through
// PgBouncer in transaction pooling mode.
func eachTarget(t *testing.T, fn func(t *testing.T, dsn string)) {
	t.Helper()
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) { fn(t, tg.DSN) })
	}
}

// openStore opens a migrated Store closed with the test.
func openStore(t testing.TB, dsn string, maxConns int32) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), dsn, store.Options{MaxConns: maxConns})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s
}

var keySeq atomic.Int64

// uniqueKey gives each test its own lock keys so tests share one database.
func uniqueKey(t testing.TB) string {
	name := strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	return fmt.Sprintf("test-%d/%s", keySeq.Add(1), name)
}

func owner(cluster, job, pod string) store.Owner {
	return store.Owner{Cluster: cluster, Namespace: "ns", Job: job, JobUID: "uid-" + job, Pod: pod}
}

// window0 is a fixed schedule tick; windows are minutes after it.
var window0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func windowAt(i int) time.Time { return window0.Add(time.Duration(i) * time.Minute) }

// awaitDBPast waits until the database clock is past ts: expiry is a matter of
// database time, so the test waits for that condition, not for a local timer.
func awaitDBPast(t testing.TB, s *store.Store, ts time.Time) {
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
