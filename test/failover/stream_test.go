package failover_test

import (
	"context"
	"errors"
	"flag"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/hapg"
)

var failovers = flag.Int("failover.count", 10, "how many times TestFailoverLosesNoClaim kills the primary")

// grant is one acknowledged answer a client got: a window won (or
// re-entered), or a lease granted.
type grant struct {
	client     string
	lease      bool
	window     int
	token      int64
	sent, ackd time.Time
	reentered  bool
}

// client is one data centre's stream of claims and leases, each through its
// own path to the database.
type client struct {
	name  string
	store *store.Store
	owner store.Owner

	mu      sync.Mutex
	grants  []grant
	skipped int
	errors  int
}

const (
	streamKey   = "stream/job"
	streamLease = "stream/job-lease"
)

var window0 = time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)

func windowAt(i int) time.Time { return window0.Add(time.Duration(i) * time.Minute) }

// run claims windows 0, 1, 2, ... in turn, as every cluster's pod of that
// window would: until it gets a definite answer (won, or taken by another),
// retrying through any outage. A winner takes the lease and gives it back.
func (c *client) run(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		req := store.ClaimRequest{Key: streamKey, Window: windowAt(i), Index: store.NotIndexed, Owner: c.owner, TTL: time.Hour}
		var claim store.Claim
		var sent time.Time
		err := c.retry(ctx, func(ctx context.Context) (err error) {
			sent = time.Now()
			claim, err = c.store.ClaimWindow(ctx, req)
			return err
		})
		switch {
		case errors.Is(err, store.ErrWindowTaken):
			c.mu.Lock()
			c.skipped++
			c.mu.Unlock()
			continue
		case err != nil:
			return // the test is over
		}
		c.record(grant{client: c.name, window: i, token: claim.Window.Token, sent: sent, ackd: time.Now(), reentered: claim.Outcome == store.Reentered})

		var g store.LeaseGrant
		err = c.retry(ctx, func(ctx context.Context) (err error) {
			sent = time.Now()
			g, err = c.store.AcquireLease(ctx, streamLease, c.owner, time.Minute)
			return err
		})
		if err != nil {
			continue // held by another winner, or the test is over
		}
		c.record(grant{client: c.name, lease: true, window: i, token: g.Lease.Token, sent: sent, ackd: time.Now(), reentered: g.Reentered})
		_ = c.retry(ctx, func(ctx context.Context) error {
			_, err := c.store.ReleaseLease(ctx, streamLease, g.Lease.Token)
			return err
		})
	}
}

// retry repeats op while the database is unavailable (a failover).
func (c *client) retry(ctx context.Context, op func(context.Context) error) error {
	for {
		callCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := op(callCtx)
		cancel()
		if err == nil || !errors.Is(err, store.ErrUnavailable) || ctx.Err() != nil {
			return err
		}
		c.mu.Lock()
		c.errors++
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *client) record(g grant) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grants = append(c.grants, g)
}

func (c *client) snapshot() (grants []grant, skipped, errs int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.grants), c.skipped, c.errors
}

// lastAck is the newest acknowledgement any client got.
func lastAck(clients []*client) time.Time {
	var last time.Time
	for _, c := range clients {
		c.mu.Lock()
		if n := len(c.grants); n > 0 && c.grants[n-1].ackd.After(last) {
			last = c.grants[n-1].ackd
		}
		c.mu.Unlock()
	}
	return last
}

// Three data centres claim the same windows and pass one lease around, each
// through another path (its PgBouncer in front of HAProxy, a multi-host URL,
// HAProxy directly), while the primary is killed again and again (Patroni,
// synchronous_mode). After all of it, read from the last primary: every
// acknowledged claim is there with its owner and token, no window was won
// by two clusters, and a grant acknowledged before another was asked for has
// the smaller token. The time from each kill to the next acknowledged grant
// is logged (p50, max).
func TestFailoverLosesNoClaim(t *testing.T) {
	c := hapg.New(t, hapg.Options{Name: "stream", Logf: t.Logf})
	ctx := context.Background()
	migrateSchema(t, c.HAProxyDSN())

	paths := []struct{ name, dsn string }{
		{"dc-a", c.BouncerDSN("a")},
		{"dc-b", c.MultiHostDSN()},
		{"dc-c", c.HAProxyDSN()},
	}
	var clients []*client
	for _, p := range paths {
		s, err := store.Open(ctx, p.dsn, store.Options{MaxConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		clients = append(clients, &client{name: p.name, store: s,
			owner: store.Owner{Cluster: p.name, Namespace: "stream", Job: "job-" + p.name, JobUID: "uid-" + p.name, Pod: p.name + "-pod"}})
	}
	streamCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, cl := range clients {
		wg.Add(1)
		go func() { defer wg.Done(); cl.run(streamCtx) }()
	}
	stopped := false
	stopStream := func() {
		if !stopped {
			stopped = true
			stop()
			wg.Wait()
		}
	}
	defer stopStream()

	var recovery []time.Duration
	for f := range *failovers {
		// Claims are flowing before each kill.
		before := totalGrants(clients)
		awaitCond(t, "grants before the kill", time.Minute, func() bool { return totalGrants(clients) >= before+20 })
		leader, err := c.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Kill(leader); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		awaitCond(t, "a grant after the kill", 2*time.Minute, func() bool { return lastAck(clients).After(killed) })
		took := lastAck(clients).Sub(killed)
		recovery = append(recovery, took)
		newLeader, err := c.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("failover %d: killed %s; %s leads; first grant %s after the kill", f+1, leader, newLeader, took.Round(time.Millisecond))
		if err := c.Restart(leader); err != nil {
			t.Fatal(err)
		}
		waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err = c.WaitSync(waitCtx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	stopStream()

	var all []grant
	for _, cl := range clients {
		g, skipped, errs := cl.snapshot()
		t.Logf("%s: %d grants, %d windows taken by others, %d unavailable answers retried", cl.name, len(g), skipped, errs)
		all = append(all, g...)
	}
	checkGrants(t, c, all)
	if len(recovery) > 0 {
		sorted := slices.Clone(recovery)
		slices.Sort(sorted)
		t.Logf("kill of the primary → first acknowledged grant, over %d failovers: p50 %s, max %s (all: %v)",
			len(sorted), sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond), recovery)
	}
}

func totalGrants(clients []*client) int {
	n := 0
	for _, c := range clients {
		c.mu.Lock()
		n += len(c.grants)
		c.mu.Unlock()
	}
	return n
}

// checkGrants holds the acknowledged grants against the last primary's rows.
func checkGrants(t *testing.T, c *hapg.Cluster, all []grant) {
	t.Helper()
	s, err := store.Open(context.Background(), c.HAProxyDSN(), store.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, _, err := s.ListWindows(context.Background(), streamKey, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[time.Time]store.Window{}
	for _, w := range rows {
		stored[w.Start] = w
	}
	winners := map[int]string{}
	lost := 0
	for _, g := range all {
		if g.lease {
			continue
		}
		if w, ok := winners[g.window]; ok && w != g.client {
			t.Errorf("window %d was won by %s and by %s", g.window, w, g.client)
		}
		winners[g.window] = g.client
		w, ok := stored[windowAt(g.window)]
		if !ok || w.Cluster != g.client || w.Token != g.token {
			lost++
			if lost <= 10 {
				t.Errorf("acknowledged claim lost: %s won window %d with token %d; the database has %+v (present: %v)", g.client, g.window, g.token, w, ok)
			}
		}
	}
	if lost > 10 {
		t.Errorf("... %d acknowledged claims lost in all", lost)
	}

	// A grant acknowledged before another was asked for has the smaller
	// token. Re-entries repeat an earlier token by design.
	var fresh []grant
	epochs := map[int64]int{}
	for _, g := range all {
		if !g.reentered {
			fresh = append(fresh, g)
			e, _ := store.TokenEpoch(g.token)
			epochs[e]++
		}
	}
	byAck := slices.Clone(fresh)
	sort.Slice(byAck, func(i, j int) bool { return byAck[i].ackd.Before(byAck[j].ackd) })
	prefixMax := make([]grant, len(byAck))
	for i, g := range byAck {
		prefixMax[i] = g
		if i > 0 && prefixMax[i-1].token > g.token {
			prefixMax[i] = prefixMax[i-1]
		}
	}
	back := 0
	for _, b := range fresh {
		n := sort.Search(len(byAck), func(i int) bool { return !byAck[i].ackd.Before(b.sent) })
		if n == 0 {
			continue
		}
		if a := prefixMax[n-1]; a.token >= b.token {
			back++
			if back <= 10 {
				t.Errorf("token went back: %s got %d (window %d, lease %v) after %s had been acknowledged %d (window %d, lease %v)",
					b.client, b.token, b.window, b.lease, a.client, a.token, a.window, a.lease)
			}
		}
	}
	t.Logf("checked %d acknowledged grants (%d windows won); tokens by epoch (timeline): %v", len(all), len(winners), epochs)
	if len(epochs) < 2 && *failovers > 0 {
		t.Errorf("tokens never changed epoch across %d failovers: %v", *failovers, epochs)
	}
}

// migrateSchema creates the schema through dsn, waiting for the cluster to accept
// writes.
func migrateSchema(t testing.TB, dsn string) {
	t.Helper()
	s, err := store.Open(context.Background(), dsn, store.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	awaitCond(t, "the schema", time.Minute, func() bool {
		_, err := migrate.Up(context.Background(), s)
		return err == nil
	})
}

func awaitCond(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
