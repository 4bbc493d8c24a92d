package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/test/pgtest"
)

// The database's clock is the only clock: run the same story against a
// database whose clock is hours ahead of, and hours behind, this process's
// and get the same decisions. Had any decision compared time.Now() with a
// database timestamp, the skewed runs would see leases and liveness expired
// at once (database ahead) or never (database behind).
func TestDecisionsDependOnlyOnTheDatabaseClock(t *testing.T) {
	var reference []string
	for _, skew := range []time.Duration{0, 3 * time.Hour, -3 * time.Hour} {
		env, err := pgtest.FakeClockEnv(skew)
		if err != nil {
			pgtest.Missing(t, err)
		}
		srv := pgtest.New(t, pgtest.Options{Name: fmt.Sprintf("clock%+d", int(skew.Hours())), PostgresEnv: env})
		for _, tg := range srv.Targets() {
			t.Run(fmt.Sprintf("database clock %+v/%s", skew, tg.Name), func(t *testing.T) {
				s := storetest.Open(t, tg.DSN, 2)
				dbNow, err := s.Now(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if got := dbNow.Sub(time.Now()); (got - skew).Abs() > time.Minute {
					t.Fatalf("database clock is %s off ours, the test wanted %s", got.Round(time.Second), skew)
				}
				story := skewStory(t, s)
				if reference == nil {
					reference = story
					t.Logf("decisions: %v", story)
					return
				}
				if !slices.Equal(story, reference) {
					t.Fatalf("decisions with the database clock %s off:\n%v\nwithout skew:\n%v", skew, story, reference)
				}
			})
		}
	}
}

// skewStory runs claims, takeovers and lease expiry, and returns what was
// decided at each step.
func skewStory(t *testing.T, s *store.Store) []string {
	ctx := context.Background()
	key := storetest.UniqueKey(t)
	a, b := storetest.Owner("dc-a", "job-a", "pod-a"), storetest.Owner("dc-b", "job-b", "pod-b")
	short := 500 * time.Millisecond
	var story []string
	note := func(step string, err error, extra string) {
		switch {
		case err == nil:
			story = append(story, step+": ok "+extra)
		case errors.Is(err, store.ErrWindowTaken), errors.Is(err, store.ErrLeaseHeld), errors.Is(err, store.ErrLeaseLost), errors.Is(err, store.ErrWindowLost):
			story = append(story, step+": refused")
		default:
			t.Fatalf("%s: %v", step, err)
		}
	}

	// The window is a schedule tick near the database's "now".
	now, err := s.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := now.Truncate(time.Minute)
	first, err := storetest.Claim(t, s, key, w, a, true, short)
	note("a claims", err, string(first.Outcome))
	_, err = storetest.Claim(t, s, key, w, b, true, short)
	note("b claims while a is alive", err, "")
	storetest.AwaitDBPast(t, s, first.Window.AliveUntil)
	took, err := storetest.Claim(t, s, key, w, b, true, ttl)
	note("b claims after a went silent", err, string(took.Outcome))
	_, _, err = s.Heartbeat(ctx, key, w, store.NotIndexed, first.Window.Token, short)
	note("a heartbeats", err, "")

	g, err := s.AcquireLease(ctx, key, a, short)
	note("a leases", err, "")
	_, err = s.AcquireLease(ctx, key, b, ttl)
	note("b leases while a holds", err, "")
	_, _, err = s.RenewLease(ctx, key, g.Lease.Token, short)
	note("a renews in time", err, "")
	l, _, err := s.GetLease(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	storetest.AwaitDBPast(t, s, l.ExpireAt)
	_, err = s.AcquireLease(ctx, key, b, ttl)
	note("b leases after expiry", err, "")
	_, _, err = s.RenewLease(ctx, key, g.Lease.Token, short)
	note("a renews after expiry", err, "")
	return story
}
