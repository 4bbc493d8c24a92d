package ledger_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/ledger"
	"github.com/dislock/dislock/test/pgtest"
)

// A tenant that draws a token inside a transaction it leaves open holds
// nothing anyone else needs: not after a failover (when the epoch moves),
// not ever. Other namespaces' grants and the owner's confirmation of the
// epoch go on.
func TestATenantLeavingATokenDrawOpenStallsNoOneElse(t *testing.T) {
	t.Parallel() // its own server: the epoch is moved
	srv := pgtest.New(t, pgtest.Options{Name: "tokens-open"})
	ctx := context.Background()
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			own := storetest.Open(t, tg.DSN, 2)
			su := storetest.Superuser(t, srv)
			// The state of the epochs right after a promotion: the
			// timeline gives an epoch above the last one used.
			if _, err := su.Exec(ctx, `UPDATE dislock.token_epoch SET base_timeline = base_timeline - 1`); err != nil {
				t.Fatal(err)
			}
			nsA, nsB := storetest.Namespace(t, "idle"), storetest.Namespace(t, "busy")
			idle := storetest.RawConn(t, storetest.TenantDSN(t, tg.DSN, storetest.Provision(t, own, nsA)))
			busy := storetest.TenantStore(t, tg.DSN, storetest.Provision(t, own, nsB))
			if _, err := idle.Exec(ctx, `BEGIN`); err != nil {
				t.Fatal(err)
			}
			var drawn int64
			if err := idle.QueryRow(ctx, `SELECT dislock.next_token()`).Scan(&drawn); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { idle.Exec(context.Background(), `ROLLBACK`) }) //nolint:errcheck // the test is over
			bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			o := store.Owner{Cluster: "dc-a", Namespace: nsB, Job: "job", JobUID: "uid", Pod: "pod"}
			g, err := busy.AcquireLease(bounded, nsB+"/job", o, time.Minute)
			if err != nil {
				t.Fatalf("another namespace's grant while a tenant holds a token draw open: %v", err)
			}
			if g.Lease.Token <= drawn {
				t.Fatalf("token %d, not above %d drawn before it", g.Lease.Token, drawn)
			}
			if _, err := ledger.KeepTokens(bounded, own, 0, false); err != nil {
				t.Fatalf("the owner's confirmation while a tenant holds a token draw open: %v", err)
			}
		})
	}
}

// Neither the epoch nor the counter's offset in it wraps: at their bounds
// next_token() refuses, naming what to do, and the owner's new epoch starts
// the offset again with every token above the ones before. Half an epoch
// spent starts a new one on the owner's next confirmation, so that a caller
// drawing in a loop never gets there.
func TestTokensAtTheirBoundsFailClosedAndANewEpochRenewsThem(t *testing.T) {
	t.Parallel() // its own server: the counter jumps
	srv := pgtest.New(t, pgtest.Options{Name: "tokens-bound"})
	ctx := context.Background()
	s := storetest.Open(t, srv.DirectDSN(), 2)
	su := storetest.Superuser(t, srv)
	key := storetest.UniqueKey(t)
	o := storetest.Owner("dc-a", "job", "pod")
	grant := func() (int64, error) {
		g, err := s.AcquireLease(ctx, key, o, time.Minute)
		return g.Lease.Token, err
	}
	setOffset := func(offset int64) {
		t.Helper()
		if _, err := su.Exec(ctx, `SELECT setval('dislock.token_counter', counter_base + $1::bigint) FROM dislock.token_epoch`, offset); err != nil {
			t.Fatal(err)
		}
	}
	// A new owner for each grant: the same owner would keep its token.
	next := func() (int64, error) {
		o.Pod += "x"
		if _, err := s.ReleaseLease(ctx, key, 0); err != nil && !errors.Is(err, store.ErrLeaseLost) && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		if _, err := su.Exec(ctx, `DELETE FROM dislock.leases WHERE lock_key = $1`, key); err != nil {
			t.Fatal(err)
		}
		return grant()
	}

	setOffset(store.MaxTokenOffset - 1)
	last, err := next()
	if err != nil {
		t.Fatalf("the last offset of the epoch: %v", err)
	}
	if _, off := store.TokenEpoch(last); off != store.MaxTokenOffset {
		t.Fatalf("token %d has offset %d, want %d", last, off, int64(store.MaxTokenOffset))
	}
	if _, err := next(); !errors.Is(err, store.ErrTokensExhausted) || !strings.Contains(err.Error(), "dislock tokens --new-epoch") {
		t.Fatalf("a grant past the counter's bound: %v, want %v naming dislock tokens --new-epoch", err, store.ErrTokensExhausted)
	}
	fs, err := check.Database(ctx, s, check.Options{AllowAsync: true})
	if err != nil || storetest.ByCheck(fs)["token counter"].Status != check.StatusFail || !strings.Contains(storetest.ByCheck(fs)["token counter"].Fix, "dislock tokens --new-epoch") {
		t.Fatalf("check with the counter at its bound: %+v %v", fs, err)
	}
	st, err := ledger.KeepTokens(ctx, s, 0, true)
	if err != nil || st.Moved == "" {
		t.Fatalf("a new epoch: %+v %v", st, err)
	}
	renewed, err := next()
	if err != nil || renewed <= last {
		t.Fatalf("the first token of the new epoch %d (%v), not above %d", renewed, err, last)
	}
	if e, off := store.TokenEpoch(renewed); e != st.Epoch || off > 10 {
		t.Fatalf("token %d: epoch %d offset %d, want epoch %d and the offset started again", renewed, e, off, st.Epoch)
	}

	// Half spent: the owner's next confirmation moves on by itself.
	setOffset(store.MaxTokenOffset/2 + 10)
	before, err := next()
	if err != nil {
		t.Fatal(err)
	}
	st2, err := ledger.KeepTokens(ctx, s, 0, false)
	if err != nil || !strings.Contains(st2.Moved, "half") || st2.Epoch != st.Epoch+1 {
		t.Fatalf("the confirmation after half the epoch was spent: %+v %v", st2, err)
	}
	if after, err := next(); err != nil || after <= before {
		t.Fatalf("token %d (%v) after the renewal, not above %d", after, err, before)
	}

	// The last epoch: no token beyond it, and no new epoch either.
	if _, err := su.Exec(ctx, `UPDATE dislock.token_epoch SET base_epoch = $1::bigint - (dislock.wal_timeline() - base_timeline), last_epoch = $1::bigint`, int64(store.MaxTokenEpoch)+1); err != nil {
		t.Fatal(err)
	}
	if tok, err := next(); !errors.Is(err, store.ErrTokensExhausted) {
		t.Fatalf("a grant past the last epoch: token %d, %v; want %v", tok, err, store.ErrTokensExhausted)
	}
	if st, err := ledger.KeepTokens(ctx, s, 0, true); !errors.Is(err, store.ErrTokensExhausted) {
		t.Fatalf("a new epoch past the last: %+v %v; want %v", st, err, store.ErrTokensExhausted)
	}
}

// Draws keep coming while tokens are held (agents retry, a tenant may loop):
// one racing the owner's move either is refused or gets a token of the
// moved epoch, never one computed from the held row. Each round holds the
// tokens as a dump of a cluster whose epochs reached follow+1 would, with
// its row giving follow on this timeline.
func TestADrawRacingTheOwnersMoveNeverUsesTheHeldRow(t *testing.T) {
	t.Parallel() // its own server: the epoch is moved every round
	srv := pgtest.New(t, pgtest.Options{Name: "tokens-race"})
	own := storetest.Open(t, srv.DirectDSN(), 2)
	su := storetest.Superuser(t, srv)
	ctx := context.Background()
	ns := storetest.Namespace(t, "racer")
	tenantDSN := storetest.TenantDSN(t, srv.DirectDSN(), storetest.Provision(t, own, ns))
	conns := make([]*pgx.Conn, 3)
	for i := range conns {
		conns[i] = storetest.RawConn(t, tenantDSN)
	}
	for round := range 100 {
		var follow int64
		if err := su.QueryRow(ctx, `SELECT dislock.token_epoch_now()`).Scan(&follow); err != nil {
			t.Fatal(err)
		}
		if _, err := su.Exec(ctx, `UPDATE dislock.token_epoch SET system_id = 42, last_epoch = $1::bigint + 1`, follow); err != nil {
			t.Fatal(err)
		}
		var (
			mu    sync.Mutex
			bad   []int64
			wg    sync.WaitGroup
			stop  atomic.Bool
			draws atomic.Int64
		)
		for _, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					var tok int64
					err := c.QueryRow(ctx, `SELECT dislock.next_token()`).Scan(&tok)
					draws.Add(1)
					if e, _ := store.TokenEpoch(tok); err == nil && e <= follow+1 {
						mu.Lock()
						bad = append(bad, tok)
						mu.Unlock()
					}
				}
			}()
		}
		storetest.AwaitCond(t, "draws before the move", func() bool { return draws.Load() >= 6 })
		st, err := ledger.KeepTokens(ctx, own, 0, false)
		after := draws.Load()
		storetest.AwaitCond(t, "draws after the move", func() bool { return draws.Load() >= after+6 })
		stop.Store(true)
		wg.Wait()
		if err != nil || st.Moved == "" || st.Epoch <= follow+1 {
			t.Fatalf("round %d: the move: %+v %v", round, st, err)
		}
		if len(bad) > 0 {
			e, _ := store.TokenEpoch(bad[0])
			t.Fatalf("round %d: the owner moved to epoch %d (epochs up to %d used before), yet a draw racing the move got token %d of epoch %d (%d such tokens)",
				round, st.Epoch, follow+1, bad[0], e, len(bad))
		}
	}
}

// The timeline goes back when the database is upgraded with pg_upgrade or
// restored into another cluster: tokens must not. No token is drawn until
// the owner confirms the epoch; it then continues above the highest it
// ever used. Each case puts token_epoch in the state it would be in and
// records a token of the old epoch.
func TestTokensKeepGrowingWhenTheTimelineGoesBack(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Name: "rebase"})
	ctx := context.Background()
	s := storetest.Open(t, srv.DirectDSN(), 2)
	su := storetest.Superuser(t, srv)
	for _, tc := range []struct {
		name  string
		state string // how token_epoch looks when the cluster (timeline 1) starts
		old   int64  // the epoch of the highest token handed out before
		want  int64
	}{
		{"pg_upgrade of a cluster that had failed over twice", "system_id = 42, base_epoch = 3, base_timeline = 3, last_epoch = 3", 3, 3 + 16},
		{"a restore into a new cluster on the same timeline", "system_id = 42, base_epoch = 1, base_timeline = 1, last_epoch = 1", 1, 1 + 16},
		{"a dump of a cluster at timeline 3 loaded into this one", "base_epoch = 1, base_timeline = 1, last_epoch = 3", 3, 3 + 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := storetest.UniqueKey(t)
			if _, err := su.Exec(ctx, `UPDATE dislock.token_epoch SET `+tc.state); err != nil {
				t.Fatal(err)
			}
			before := tc.old<<40 + 1_000_000
			if _, err := su.Exec(ctx, `INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at) VALUES ($1, 'old', $2, now(), now())`, key, before); err != nil {
				t.Fatal(err)
			}
			if _, err := storetest.Claim(t, s, key, storetest.WindowAt(0), storetest.Owner("dc-a", "job", "pod"), false, storetest.TTL); !errors.Is(err, store.ErrTokensHeld) {
				t.Fatalf("a claim before the owner confirmed the epoch: %v, want %v", err, store.ErrTokensHeld)
			}
			if fs, err := check.Database(ctx, s, check.Options{AllowAsync: true}); err != nil || storetest.ByCheck(fs)["tokens"].Status != check.StatusFail {
				t.Fatalf("check while tokens are held: %+v %v", fs, err)
			}
			if st, err := ledger.KeepTokens(ctx, s, 0, false); err != nil || st.Moved == "" || st.Epoch != tc.want {
				t.Fatalf("confirming the epoch: %+v %v, want epoch %d", st, err, tc.want)
			}
			for i := range 3 {
				c := storetest.MustClaim(t, s, key, storetest.WindowAt(i), storetest.Owner("dc-a", "job", "pod"), false, storetest.TTL, store.Claimed)
				if epoch, _ := store.TokenEpoch(c.Window.Token); c.Window.Token <= before || epoch != tc.want {
					t.Fatalf("token %d (epoch %d): want epoch %d, above %d", c.Window.Token, epoch, tc.want, before)
				}
			}
			if fs, err := check.Database(ctx, s, check.Options{AllowAsync: true}); err != nil || storetest.ByCheck(fs)["tokens"].Status != check.StatusOK {
				t.Fatalf("check after the rebase: %+v %v", fs, err)
			}
			// Reset for the next case: this cluster, epoch = timeline.
			if _, err := su.Exec(ctx, `UPDATE dislock.token_epoch SET system_id = (SELECT system_identifier FROM pg_control_system()),
				counter_oid = 'dislock.token_counter'::regclass::oid, base_epoch = 1, base_timeline = 1, last_epoch = 1; DELETE FROM dislock.leases; DELETE FROM dislock.windows`); err != nil {
				t.Fatal(err)
			}
		})
	}
}
