package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/test/pgtest"
)

const ttl = 30 * time.Second

func TestFirstClaimerOwnsTheWindowAndOthersAreToldWho(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 4)
		key := storetest.UniqueKey(t)
		a, b := storetest.Owner("dc-a", "report-1", "pod-a"), storetest.Owner("dc-b", "report-1", "pod-b")

		won := storetest.MustClaim(t, s, key, storetest.WindowAt(0), a, false, ttl, store.Claimed)
		if won.Window.State != store.StateRunning || won.Window.Cluster != "dc-a" || won.Window.Pod != "pod-a" {
			t.Fatalf("claimed row = %+v", won.Window)
		}
		if got := won.Window.AliveUntil.Sub(won.Window.ClaimedAt); got != ttl {
			t.Fatalf("alive_until - claimed_at = %s, want the ttl %s", got, ttl)
		}
		lost := storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), b, false, a.WindowOwner())
		if lost.Window.Token != won.Window.Token || lost.Window.Cluster != "dc-a" {
			t.Fatalf("refusal shows %+v, want the owner's row %+v", lost.Window, won.Window)
		}

		// The same pod again (a restarted sidecar): re-entry, same token.
		again := storetest.MustClaim(t, s, key, storetest.WindowAt(0), a, false, ttl, store.Reentered)
		if again.Window.Token != won.Window.Token || !again.Window.ClaimedAt.Equal(won.Window.ClaimedAt) {
			t.Fatalf("re-entry changed token or claim time: %+v then %+v", won.Window, again.Window)
		}
		// Another pod of the same Job while the owner is alive is refused
		// (it waits); it never shares the token.
		retry := a
		retry.Pod = "pod-a-retry"
		storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), retry, false, a.WindowOwner())

		// Once the owner succeeded, everyone skips, even after the run ended.
		if _, err := s.Finish(context.Background(), key, storetest.WindowAt(0), store.NotIndexed, won.Window.Token, store.StateSucceeded, storetest.Ptr(0)); err != nil {
			t.Fatal(err)
		}
		done := storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), b, true, a.WindowOwner())
		if done.Window.State != store.StateSucceeded || done.Window.FinishedAt == nil || *done.Window.ExitCode != 0 {
			t.Fatalf("finished row = %+v", done.Window)
		}
		// Not even the owner's own Job runs a succeeded window again.
		storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), a, false, a.WindowOwner())

		// The next window is a new claim with a larger token.
		next := storetest.MustClaim(t, s, key, storetest.WindowAt(1), b, false, ttl, store.Claimed)
		if next.Window.Token <= won.Window.Token {
			t.Fatalf("token %d after %d: tokens must increase", next.Window.Token, won.Window.Token)
		}
	})
}

func TestTokensStrictlyIncreaseWithEveryClaim(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 1)
		key := storetest.UniqueKey(t)
		var last int64
		for i := range 50 {
			c := storetest.MustClaim(t, s, key, storetest.WindowAt(i), storetest.Owner("dc-a", fmt.Sprint("job-", i), "p"), false, ttl, store.Claimed)
			if c.Window.Token <= last {
				t.Fatalf("window %d: token %d after %d", i, c.Window.Token, last)
			}
			last = c.Window.Token
		}
	})
}

// Three clusters, eight claimers each, race for 200 windows of one key.
func TestContendedWindowsHaveExactlyOneOwnerEach(t *testing.T) {
	const clusters, claimers, windows = 3, 8, 200
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		key := storetest.UniqueKey(t)
		stores := make([]*store.Store, clusters)
		for i := range stores {
			stores[i] = storetest.Open(t, dsn, claimers)
		}
		type result struct {
			window int
			owner  store.Owner
			token  int64
			won    bool
			seen   string // the owner a refusal named
		}
		results := make(chan result, clusters*claimers*windows)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for c := range clusters {
			for j := range claimers {
				wg.Go(func() {
					// One Job per (cluster, claimer); each visits the windows in its own order.
					o := storetest.Owner(fmt.Sprintf("dc-%d", c), fmt.Sprintf("job-%d", j), "pod")
					order := rand.Perm(windows)
					<-start
					for _, w := range order {
						got, err := stores[c].ClaimWindow(context.Background(), store.ClaimRequest{Key: key, Window: storetest.WindowAt(w), Index: store.NotIndexed, Owner: o, TTL: ttl})
						switch {
						case err == nil:
							results <- result{window: w, owner: o, token: got.Window.Token, won: true}
						case errors.Is(err, store.ErrWindowTaken):
							results <- result{window: w, owner: o, seen: got.Window.Owner}
						default:
							t.Errorf("claim: %v", err)
							return
						}
					}
				})
			}
		}
		close(start)
		wg.Wait()
		close(results)

		owners := map[int]store.Owner{}
		tokens := map[int64]int{}
		var refusals []result
		for r := range results {
			if !r.won {
				refusals = append(refusals, r)
				continue
			}
			if prev, dup := owners[r.window]; dup {
				t.Fatalf("window %d owned twice: %s and %s", r.window, prev.WindowOwner(), r.owner.WindowOwner())
			}
			owners[r.window] = r.owner
			if w, dup := tokens[r.token]; dup {
				t.Fatalf("token %d handed out for windows %d and %d", r.token, w, r.window)
			}
			tokens[r.token] = r.window
		}
		if len(owners) != windows {
			t.Fatalf("%d windows have an owner, want %d", len(owners), windows)
		}
		if want := clusters*claimers*windows - windows; len(refusals) != want {
			t.Fatalf("%d refusals, want %d", len(refusals), want)
		}
		for _, r := range refusals {
			if r.seen != owners[r.window].WindowOwner() {
				t.Fatalf("refusal for window %d named %q, the owner is %q", r.window, r.seen, owners[r.window].WindowOwner())
			}
		}
		// The database agrees, and each owner's restarted sidecar re-enters.
		rows, _, err := stores[0].ListWindows(context.Background(), key, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != windows {
			t.Fatalf("database has %d windows, want %d", len(rows), windows)
		}
		for _, row := range rows {
			w := int(row.Start.Sub(storetest.WindowAt(0)) / time.Minute)
			if row.Owner != owners[w].WindowOwner() {
				t.Fatalf("database owner of window %d is %s, the claimer that won was %s", w, row.Owner, owners[w].WindowOwner())
			}
		}
		for w, o := range owners {
			storetest.MustClaim(t, stores[1], key, storetest.WindowAt(w), o, false, ttl, store.Reentered)
		}
	})
}

// A refused claim, the common case at the top of the minute (another
// cluster's pod), locks nothing, draws no token and writes no WAL: it
// leaves the owner's row as it was (xmax unchanged: no row lock) and the
// token sequence where it was. A claim the owner's row allows (the same
// Job's retry once the owner failed) still goes through the locked path.
func TestARefusedClaimWritesNothing(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := storetest.Open(t, dsn, 4)
		su := storetest.RawConn(t, pgtest.Need(t).SuperuserDSN())
		key := storetest.UniqueKey(t)
		a, b := storetest.Owner("dc-a", "report-1", "pod-a"), storetest.Owner("dc-b", "report-1", "pod-b")
		won := storetest.MustClaim(t, s, key, storetest.WindowAt(0), a, false, ttl, store.Claimed)
		rowAndToken := func() (xmax string, token int64) {
			t.Helper()
			err := su.QueryRow(ctx, `SELECT xmax::text, (SELECT last_value FROM dislock.token_counter)
				FROM dislock.windows WHERE lock_key = $1 AND window_start = $2`, key, storetest.WindowAt(0)).Scan(&xmax, &token)
			if err != nil {
				t.Fatal(err)
			}
			return xmax, token
		}
		xmax0, token0 := rowAndToken()
		for range 3 {
			storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), b, false, a.WindowOwner())
			storetest.MustBeTaken(t, s, key, storetest.WindowAt(0), b, true, a.WindowOwner()) // a standby, the owner alive
		}
		if xmax, token := rowAndToken(); xmax != xmax0 || token != token0 {
			t.Fatalf("refusals changed the owner's row or drew tokens: xmax %s → %s, last token %d → %d", xmax0, xmax, token0, token)
		}
		if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, won.Window.Token, store.StateFailed, storetest.Ptr(1)); err != nil {
			t.Fatal(err)
		}
		retry := a
		retry.Pod = "pod-a-retry"
		took := storetest.MustClaim(t, s, key, storetest.WindowAt(0), retry, false, ttl, store.TookOver)
		if took.Window.Token <= won.Window.Token {
			t.Fatalf("takeover token %d after %d: tokens must increase", took.Window.Token, won.Window.Token)
		}
	})
}

// A claim's MaxLate (the pod's catchup) refuses a window that started too
// long ago by the database's clock, writing nothing, except to the pod that
// already holds it: its retry of a claim whose reply it lost re-enters with
// the same token, however late, as the first try would have. Otherwise the
// window claimed in time would be left to lapse, unrun.
func TestALateClaimIsStaleButTheSamePodReentersItsOwn(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := storetest.Open(t, dsn, 4)
		key := storetest.UniqueKey(t)
		a, b := storetest.Owner("dc-a", "report-1", "pod-a"), storetest.Owner("dc-b", "report-1", "pod-b")
		late := func(o store.Owner, standby bool) store.ClaimRequest {
			return store.ClaimRequest{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed, Owner: o, TTL: ttl,
				Standby: standby, MaxLate: time.Minute}
		}

		c, err := s.ClaimWindow(ctx, late(a, false))
		if !errors.Is(err, store.ErrWindowStale) || c.DBTime.Sub(storetest.WindowAt(0)) <= time.Minute {
			t.Fatalf("a claim of a window days old with MaxLate 1m: %+v, %v; want ErrWindowStale with the database's time", c, err)
		}
		if _, err := s.GetWindow(ctx, key, storetest.WindowAt(0), store.NotIndexed); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a stale claim left a row (or the read failed): %v", err)
		}

		first := storetest.MustClaim(t, s, key, storetest.WindowAt(0), a, false, ttl, store.Claimed)
		again, err := s.ClaimWindow(ctx, late(a, false))
		if err != nil || again.Outcome != store.Reentered || again.Window.Token != first.Window.Token {
			t.Fatalf("the owner's late retry: %+v, %v; want re-entered with token %d", again, err, first.Window.Token)
		}
		if _, err := s.ClaimWindow(ctx, late(b, true)); !errors.Is(err, store.ErrWindowStale) {
			t.Fatalf("another cluster's late standby claim: %v; want ErrWindowStale", err)
		}
	})
}
