package failover_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/cli"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/hapg"
)

// The reproduction this work started from, as a test: a primary with an
// asynchronous standby. dislock check refuses the setup, naming the
// setting. Then dc-a claims a window and its lease on the primary, the
// primary dies before the standby received them, and the standby is
// promoted: the claims are gone (that is what asynchronous replication
// means, and why check refuses it), dc-b claims the same window again —
// but every token it gets is larger than every token dc-a got.
func TestAsyncFailoverLosesClaimsButTokensNeverGoBack(t *testing.T) {
	p := hapg.NewAsyncPair(t, hapg.PairOptions{Name: "async", Logf: t.Logf})
	ctx := context.Background()
	migrateSchema(t, p.PrimaryDSN())

	var out, errOut bytes.Buffer
	code := cli.Main(ctx, []string{"check", "--database-url", p.PrimaryDSN()}, &out, &errOut)
	if code != 3 || !strings.Contains(out.String(), "synchronous_standby_names is empty but 1 standby(s) stream asynchronously") {
		t.Fatalf("dislock check on an asynchronous pair: exit %d\n%s%s", code, out.String(), errOut.String())
	}

	primary := open(t, p.PrimaryDSN())
	a := store.Owner{Cluster: "dc-a", Namespace: "async", Job: "job-a", JobUID: "uid-a", Pod: "pod-a"}
	b := store.Owner{Cluster: "dc-b", Namespace: "async", Job: "job-b", JobUID: "uid-b", Pod: "pod-b"}
	const key = "async/job"
	var replicated, lostTokens []int64
	for i := range 3 {
		c, err := primary.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: windowAt(i), Index: store.NotIndexed, Owner: a, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		replicated = append(replicated, c.Window.Token)
	}
	if err := p.PauseReplication(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := primary.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: windowAt(3), Index: store.NotIndexed, Owner: a, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	g, err := primary.AcquireLease(ctx, key, a, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	lostTokens = append(lostTokens, c.Window.Token, g.Lease.Token)
	// Many more grants than the sequence logs ahead (32), for other keys too.
	for i := range 40 {
		c, err := primary.ClaimWindow(ctx, store.ClaimRequest{Key: "async/other", Window: windowAt(i), Index: store.NotIndexed, Owner: a, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		lostTokens = append(lostTokens, c.Window.Token)
	}
	if err := p.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	if err := p.ResumeAndPromote(ctx); err != nil {
		t.Fatal(err)
	}

	promoted := open(t, p.StandbyDSN())
	if _, err := promoted.GetWindow(ctx, key, windowAt(3), store.NotIndexed); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the claim made after replication paused survived the failover (%v): the test did not lose commits", err)
	}
	cb, err := promoted.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: windowAt(3), Index: store.NotIndexed, Owner: b, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	gb, err := promoted.AcquireLease(ctx, key, b, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	before := slices.Max(append(replicated, lostTokens...))
	for _, tok := range []int64{cb.Window.Token, gb.Lease.Token} {
		if tok <= before {
			t.Fatalf("token %d after the failover is not above %d, handed out before it (lost grants: %v)", tok, before, lostTokens)
		}
	}
	eb, _ := store.TokenEpoch(before)
	ea, _ := store.TokenEpoch(cb.Window.Token)
	t.Logf("before the failover: tokens up to %d (epoch %d); after: %d and %d (epoch %d)", before, eb, cb.Window.Token, gb.Lease.Token, ea)
}

func open(t *testing.T, dsn string) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), dsn, store.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
