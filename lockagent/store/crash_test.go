package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/test/pgtest"
)

// A crash of PostgreSQL (pg_ctl stop -m immediate: no checkpoint, no clean
// shutdown) must not forget a single claimed window, or another cluster would
// claim it again after the restart.
func TestClaimedWindowsSurviveADatabaseCrash(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "crash", Logf: t.Logf})
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			s := storetest.Open(t, tg.DSN, 4)
			ctx := context.Background()
			key := storetest.UniqueKey(t)
			a, b := storetest.Owner("dc-a", "job-a", "pod-a"), storetest.Owner("dc-b", "job-b", "pod-b")
			before := map[time.Time]int64{}
			var maxToken int64
			for i := range 50 {
				c := storetest.MustClaim(t, s, key, storetest.WindowAt(i), a, false, ttl, store.Claimed)
				before[c.Window.Start] = c.Window.Token
				maxToken = max(maxToken, c.Window.Token)
			}
			lease, err := s.AcquireLease(ctx, key, a, time.Hour)
			if err != nil {
				t.Fatal(err)
			}

			if err := srv.StopPostgres("immediate"); err != nil {
				t.Fatal(err)
			}
			// PgBouncer queues a query while the server is down (up to its
			// query_wait_timeout), so callers bound every call with a deadline.
			down, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if _, err := s.ClaimWindow(down, store.ClaimRequest{Key: key, Window: storetest.WindowAt(100), Index: store.NotIndexed, Owner: b, TTL: ttl}); !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("claim while the database is down: %v, want ErrUnavailable", err)
			}
			if err := srv.StartPostgres(); err != nil {
				t.Fatal(err)
			}
			awaitReachable(t, s)

			rows, _, err := s.ListWindows(ctx, key, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != len(before) {
				t.Fatalf("%d windows after the crash, %d before", len(rows), len(before))
			}
			for _, r := range rows {
				if before[r.Start] != r.Token || r.Owner != a.WindowOwner() {
					t.Fatalf("window %s after crash: %+v, token before %d", r.Start, r, before[r.Start])
				}
				storetest.MustBeTaken(t, s, key, r.Start, b, false, a.WindowOwner())
			}
			if _, err := s.AcquireLease(ctx, key, b, ttl); !errors.Is(err, store.ErrLeaseHeld) {
				t.Fatalf("lease after crash: %v, want ErrLeaseHeld", err)
			}
			// The fencing token never goes back, even across the crash.
			next := storetest.MustClaim(t, s, key, storetest.WindowAt(200), b, false, ttl, store.Claimed)
			if next.Window.Token <= max(maxToken, lease.Lease.Token) {
				t.Fatalf("token %d after the crash, had reached %d", next.Window.Token, maxToken)
			}
		})
	}
}

// awaitReachable waits for the store to answer again (PgBouncer reconnects to
// a restarted server on its own schedule).
func awaitReachable(t *testing.T, s *store.Store) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.Ping(context.Background())
		if err == nil {
			return
		}
		if !errors.Is(err, store.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("database did not come back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
