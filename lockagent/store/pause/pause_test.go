package pause_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/pause"
	"github.com/dislock/dislock/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, pgtest.Options{Name: "pause"})) }

const ttl = time.Minute

// tenantOwner is a pod of job in namespace ns, cluster cluster.
func tenantOwner(cluster, ns, job, pod string) store.Owner {
	return store.Owner{Cluster: cluster, Namespace: ns, Job: job, JobUID: "uid-" + job, Pod: pod}
}

func claimAs(t *testing.T, s *store.Store, key string, w time.Time, o store.Owner, index int) (store.Claim, error) {
	t.Helper()
	return s.ClaimWindow(context.Background(), store.ClaimRequest{Key: key, Window: w, Index: index, Owner: o, TTL: ttl})
}

// mustBePaused checks that err is the pause, spelt with who, until when and
// why.
func mustBePaused(t *testing.T, what string, err error, want string) {
	t.Helper()
	if !errors.Is(err, store.ErrKeyPaused) || !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: %v, want ErrKeyPaused saying %q", what, err, want)
	}
}

func TestAPausedKeyStartsNoRunInAnyClusterButWhatRunsGoesOn(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		owner := storetest.Open(t, dsn, 4)
		ns := storetest.Namespace(t, "pause")
		// The agents' own roles: what they may do is what a pause must stop.
		a := storetest.TenantStore(t, dsn, storetest.Provision(t, owner, ns))
		key, other := ns+"/report", ns+"/other"
		podA, podB := tenantOwner("dc-a", ns, "report-1", "report-1-a"), tenantOwner("dc-b", ns, "report-1", "report-1-b")
		standbyB := tenantOwner("dc-b", ns, "report-2", "report-2-b")

		running, err := claimAs(t, a, key, storetest.WindowAt(0), podA, store.NotIndexed)
		if err != nil {
			t.Fatal(err)
		}
		lease, err := a.AcquireLease(ctx, key, podA, ttl)
		if err != nil {
			t.Fatal(err)
		}
		p, err := pause.Set(ctx, owner, pause.Request{Key: key, By: "alice", Reason: "bad release", For: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if p.Until == nil || p.Until.Sub(p.PausedAt) != time.Hour || p.PausedBy != "alice" {
			t.Fatalf("pause = %+v, want alice's for an hour", p)
		}
		said := `paused by alice until ` + p.Until.Format(time.RFC3339) + ` ("bad release")`

		t.Run("a new window, in every completion index, is refused and nothing is written", func(t *testing.T) {
			for _, index := range []int{store.NotIndexed, 0, 3} {
				_, err := claimAs(t, a, key, storetest.WindowAt(1), podB, index)
				mustBePaused(t, "claim", err, said)
				if _, _, err := owner.WindowAt(ctx, key, storetest.WindowAt(1), index); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("index %d: the refused claim left a row (%v)", index, err)
				}
			}
		})
		t.Run("a new lease is refused; a live one is held, paused or not", func(t *testing.T) {
			_, err := a.AcquireLease(ctx, key+"#2", podB, ttl)
			mustBePaused(t, "lease "+key+"#2", err, said)
			if _, err := a.AcquireLease(ctx, key, podB, ttl); !errors.Is(err, store.ErrLeaseHeld) {
				t.Fatalf("lease %s, held: %v, want ErrLeaseHeld", key, err)
			}
		})
		t.Run("the running claim and the live lease are re-entered by their own pod only", func(t *testing.T) {
			c, err := claimAs(t, a, key, storetest.WindowAt(0), podA, store.NotIndexed)
			if err != nil || c.Outcome != store.Reentered || c.Window.Token != running.Window.Token {
				t.Fatalf("re-entering the running claim: %+v, %v", c, err)
			}
			g, err := a.AcquireLease(ctx, key, podA, ttl)
			if err != nil || !g.Reentered || g.Lease.Token != lease.Lease.Token {
				t.Fatalf("re-entering the live lease: %+v, %v", g, err)
			}
			// Another pod of the run's Job, or a standby, is told the run
			// goes on, paused or not: it waits for the run's end, where a
			// skip would complete the Job and have its running pod deleted.
			if _, err := a.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed,
				Owner: standbyB, TTL: ttl, Standby: true}); !errors.Is(err, store.ErrWindowTaken) {
				t.Fatalf("a standby's claim of the running window: %v, want ErrWindowTaken", err)
			}
			sameJob := tenantOwner("dc-a", ns, "report-1", "report-1-replacement")
			if _, err := a.AcquireLease(ctx, key, sameJob, ttl); !errors.Is(err, store.ErrLeaseHeld) {
				t.Fatalf("a replacement pod's lease while the run holds it: %v, want ErrLeaseHeld", err)
			}
			// Renewals go on: the pause does not stop a running run.
			if _, err := a.Renew(ctx, store.Renewal{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed,
				WindowToken: running.Window.Token, LeaseKey: key, LeaseToken: lease.Lease.Token, TTL: ttl}); err != nil {
				t.Fatalf("renewing while paused: %v", err)
			}
		})
		t.Run("a failed run is not taken over while paused", func(t *testing.T) {
			if _, err := a.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, running.Window.Token, store.StateFailed, storetest.Ptr(1)); err != nil {
				t.Fatal(err)
			}
			_, err := a.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: storetest.WindowAt(0), Index: store.NotIndexed,
				Owner: standbyB, TTL: ttl, Standby: true})
			mustBePaused(t, "a standby's takeover", err, said)
			if _, err := a.ReleaseLease(ctx, key, lease.Lease.Token); err != nil {
				t.Fatal(err)
			}
			// Released, the lease is no longer live: its own pod may not
			// take it anew either.
			_, err = a.AcquireLease(ctx, key, podA, ttl)
			mustBePaused(t, "re-acquiring a released lease", err, said)
		})
		t.Run("another key of the namespace is not paused", func(t *testing.T) {
			if _, err := claimAs(t, a, other, storetest.WindowAt(1), podB, store.NotIndexed); err != nil {
				t.Fatal(err)
			}
			if _, err := a.AcquireLease(ctx, other, podB, ttl); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("pausing again changes who, why and until, and keeps when it began", func(t *testing.T) {
			again, err := pause.Set(ctx, owner, pause.Request{Key: key, By: "bob", Reason: "still bad"})
			if err != nil {
				t.Fatal(err)
			}
			if !again.PausedAt.Equal(p.PausedAt) || again.Until != nil || again.PausedBy != "bob" {
				t.Fatalf("paused again = %+v, first %+v", again, p)
			}
			_, err = claimAs(t, a, key, storetest.WindowAt(2), podB, store.NotIndexed)
			mustBePaused(t, "claim", err, `paused by bob until resumed ("still bad")`)
			active, _, err := pause.Active(ctx, owner, ns+"/")
			if err != nil || len(active) != 1 || active[0].Key != key {
				t.Fatalf("active pauses of %s: %+v, %v", ns, active, err)
			}
		})
		t.Run("resumed, the next window runs; resuming again says there was nothing to resume", func(t *testing.T) {
			r, ok, err := pause.Resume(ctx, owner, key, "carol")
			if err != nil || !ok || r.ResumedAt == nil || r.ResumedBy != "carol" {
				t.Fatalf("resume: %+v, %t, %v", r, ok, err)
			}
			if c, err := claimAs(t, a, key, storetest.WindowAt(3), podB, store.NotIndexed); err != nil || c.Outcome != store.Claimed {
				t.Fatalf("claim after the resume: %+v, %v", c, err)
			}
			if _, ok, err := pause.Resume(ctx, owner, key, "carol"); ok || err != nil {
				t.Fatalf("resuming twice: %t, %v", ok, err)
			}
			// The history keeps the pause, and when it held.
			hist, err := pause.Overlapping(ctx, owner.Handle().Pool, []string{key}, p.PausedAt, r.ResumedAt.Add(time.Second))
			if err != nil || len(hist) != 1 || !hist[0].Covers(p.PausedAt) || hist[0].Covers(*r.ResumedAt) {
				t.Fatalf("history: %+v, %v", hist, err)
			}
		})
	})
}

func TestAPauseEndsByItselfAtItsUntilByDatabaseTime(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := storetest.Open(t, dsn, 4)
		key := storetest.UniqueKey(t)
		o := storetest.Owner("dc-a", "job-a", "pod-a")
		p, err := pause.Set(ctx, s, pause.Request{Key: key, By: "alice", For: pause.MinFor})
		if err != nil {
			t.Fatal(err)
		}
		_, err = claimAs(t, s, key, storetest.WindowAt(0), o, store.NotIndexed)
		mustBePaused(t, "claim", err, "paused by alice until "+p.Until.Format(time.RFC3339))
		storetest.AwaitDBPast(t, s, *p.Until)
		if c, err := claimAs(t, s, key, storetest.WindowAt(0), o, store.NotIndexed); err != nil || c.Outcome != store.Claimed {
			t.Fatalf("claim after the until: %+v, %v", c, err)
		}
		if _, ok, err := pause.Resume(ctx, s, key, "bob"); ok || err != nil {
			t.Fatalf("resuming an ended pause: %t, %v", ok, err)
		}
		// Closed at its until, not at the resume: the history says when it
		// really ended.
		hist, err := pause.Overlapping(ctx, s.Handle().Pool, []string{key}, p.PausedAt, p.Until.Add(time.Hour))
		if err != nil || len(hist) != 1 || hist[0].ResumedAt == nil || !hist[0].ResumedAt.Equal(*p.Until) || hist[0].ResumedBy != "" {
			t.Fatalf("history: %+v, %v", hist, err)
		}
		// An end already past, by the database's clock, pauses nothing.
		if _, err := pause.Set(ctx, s, pause.Request{Key: key, By: "erin", Until: p.Until}); err == nil || !strings.Contains(err.Error(), "is not after the database's now") {
			t.Fatalf("pausing until a past time: %v", err)
		}
		// A new pause of the key is a new row.
		if _, err := pause.Set(ctx, s, pause.Request{Key: key, By: "dave"}); err != nil {
			t.Fatal(err)
		}
		active, _, err := pause.Active(ctx, s, key)
		if err != nil || len(active) != 1 || active[0].PausedBy != "dave" || active[0].PausedAt.Equal(p.PausedAt) {
			t.Fatalf("active: %+v, %v", active, err)
		}
	})
}

func TestPauseRequestsNameWhatIsWrong(t *testing.T) {
	for _, tc := range []struct {
		r    pause.Request
		want string
	}{
		{pause.Request{Key: "report", By: "a"}, `key "report" is not <namespace>/<name>`},
		{pause.Request{Key: "ns/report#1", By: "a"}, `is not <namespace>/<name>`},
		{pause.Request{Key: "ns/report"}, "who pauses must be named"},
		{pause.Request{Key: "ns/report", By: "a", Reason: strings.Repeat("x", pause.MaxReasonBytes+1)}, "the reason has 1025 bytes"},
		{pause.Request{Key: "ns/report", By: "a", For: -time.Second}, "shorter than 1s"},
		{pause.Request{Key: "ns/report", By: "a", For: 999 * time.Nanosecond}, "shorter than 1s"},
		{pause.Request{Key: "ns/report", By: "a", For: time.Second, Until: &time.Time{}}, "not both"},
	} {
		if err := tc.r.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.r, err, tc.want)
		}
	}
	if err := (pause.Request{Key: "ns/report", By: "a"}).Validate(); err != nil {
		t.Errorf("a good request: %v", err)
	}
}

// A tenant may not read another namespace's pause, and may not write
// pauses at all.
func TestATenantNeitherReadsAnotherNamespacesPauseNorWritesOne(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		owner := storetest.Open(t, dsn, 4)
		nsA, nsB := storetest.Namespace(t, "pa"), storetest.Namespace(t, "pb")
		a := storetest.TenantStore(t, dsn, storetest.Provision(t, owner, nsA))
		storetest.Provision(t, owner, nsB)
		if _, err := pause.Set(ctx, owner, pause.Request{Key: nsB + "/report", By: "alice", Reason: "secret"}); err != nil {
			t.Fatal(err)
		}
		conn := a.Handle().Pool
		// Paused or not, another namespace's key is not the tenant's to ask
		// about.
		for _, key := range []string{nsB + "/report", nsB + "/not-paused"} {
			var n int
			err := conn.QueryRow(ctx, `SELECT count(*) FROM dislock.pause_of($1)`, key).Scan(&n)
			if !errors.Is(a.Handle().Classify("pause_of", err), store.ErrForbidden) {
				t.Fatalf("reading the pause of %s: %d rows, %v", key, n, err)
			}
		}
		for _, q := range []string{
			`INSERT INTO dislock.pauses (lock_key, paused_at, paused_by) VALUES ('` + nsA + `/report', now(), 'me')`,
			`UPDATE dislock.pauses SET resumed_at = now()`,
			`SELECT * FROM dislock.pauses`,
		} {
			if _, err := conn.Exec(ctx, q); !errors.Is(a.Handle().Classify("pauses", err), store.ErrForbidden) {
				t.Fatalf("%s: %v, want refused", q, err)
			}
		}
		// Its own key's pause it is told of, in the call itself.
		if _, err := pause.Set(ctx, owner, pause.Request{Key: nsA + "/report", By: "alice"}); err != nil {
			t.Fatal(err)
		}
		_, err := claimAs(t, a, nsA+"/report", storetest.WindowAt(0), tenantOwner("dc-a", nsA, "report-1", "p"), store.NotIndexed)
		mustBePaused(t, "its own key's claim", err, "paused by alice until resumed")
	})
}

// A window that started while its key was paused never runs, not even
// once the pause is over; a window that started before it runs once
// resumed.
func TestAWindowThatStartedWhilePausedNeverRunsEvenAfterTheResume(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := storetest.Open(t, dsn, 4)
		key := storetest.UniqueKey(t)
		o := storetest.Owner("dc-a", "job-a", "pod-a")
		before, err := s.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p, err := pause.Set(ctx, s, pause.Request{Key: key, By: "alice", Reason: "bad release"})
		if err != nil {
			t.Fatal(err)
		}
		storetest.AwaitDBPast(t, s, p.PausedAt)
		during, err := s.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok, err := pause.Resume(ctx, s, key, "bob"); err != nil || !ok {
			t.Fatalf("resume: %t, %v", ok, err)
		}
		_, err = claimAs(t, s, key, during, o, store.NotIndexed)
		mustBePaused(t, "a claim of a window that started while paused, after the resume", err, `paused by alice until resumed ("bad release")`)
		if c, err := claimAs(t, s, key, before, o, store.NotIndexed); err != nil || c.Outcome != store.Claimed {
			t.Fatalf("a window that started before the pause, after the resume: %+v, %v", c, err)
		}
	})
}

// A claim that waited for its window's row, or a lease grant that waited
// for the lease's (another pod's claim or grant of it, in flight), while
// the key was paused is undone: it looked for a pause before the pause
// committed, and runs nothing after it. An Indexed Job's lease ("key#i")
// heeds its CronJob's pause.
func TestWhatWaitedForItsRowWhileTheKeyWasPausedIsUndone(t *testing.T) {
	w := storetest.WindowAt(7)
	for _, c := range []struct {
		name string
		// hold writes the row a call then waits for, in tx; call asks for
		// it as tenant a; left reads what the call left of it.
		hold func(ctx context.Context, tx pgx.Tx, ns, key string) error
		call func(ctx context.Context, a *store.Store, ns, key string) error
		left func(ctx context.Context, owner *store.Store, key string) error
	}{
		{"claim",
			func(ctx context.Context, tx pgx.Tx, ns, key string) error {
				_, err := tx.Exec(ctx, `INSERT INTO dislock.windows (lock_key, window_start, job_index, owner, cluster, pod, token, state, claimed_at, alive_until)
					VALUES ($1, $2, -1, 'dc-x/`+ns+`/j/u/p', 'dc-x', 'p', 1, 'running', now(), now())`, key, w)
				return err
			},
			func(ctx context.Context, a *store.Store, ns, key string) error {
				_, err := claimAs(t, a, key, w, tenantOwner("dc-b", ns, "report-1", "report-1-b"), store.NotIndexed)
				return err
			},
			func(ctx context.Context, owner *store.Store, key string) error {
				_, _, err := owner.WindowAt(ctx, key, w, store.NotIndexed)
				return err
			}},
		{"lease",
			func(ctx context.Context, tx pgx.Tx, ns, key string) error {
				_, err := tx.Exec(ctx, `INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at)
					VALUES ($1, 'dc-x/`+ns+`/j/u/p', 1, now(), now())`, key+"#2")
				return err
			},
			func(ctx context.Context, a *store.Store, ns, key string) error {
				_, err := a.AcquireLease(ctx, key+"#2", tenantOwner("dc-b", ns, "report-1", "report-1-b"), ttl)
				return err
			},
			func(ctx context.Context, owner *store.Store, key string) error {
				_, _, err := owner.GetLease(ctx, key+"#2")
				return err
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			storetest.EachTarget(t, func(t *testing.T, dsn string) {
				ctx := context.Background()
				owner := storetest.Open(t, dsn, 4)
				ns := storetest.Namespace(t, "race"+c.name)
				a := storetest.TenantStore(t, dsn, storetest.Provision(t, owner, ns))
				key := ns + "/report"
				holder := storetest.RawConn(t, dsn)
				tx, err := holder.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx) //nolint:errcheck // rolled back below
				if err := c.hold(ctx, tx, ns, key); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- c.call(ctx, a, ns, key) }()
				watcher := storetest.RawConn(t, dsn)
				storetest.AwaitCond(t, "the "+c.name+" to wait for its row", func() bool {
					var n int
					err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted`).Scan(&n)
					return err == nil && n > 0
				})
				if _, err := pause.Set(ctx, owner, pause.Request{Key: key, By: "alice", Reason: "stop now"}); err != nil {
					t.Fatal(err)
				}
				if err := tx.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				mustBePaused(t, "the "+c.name+" that waited", <-done, `paused by alice until resumed ("stop now")`)
				if err := c.left(ctx, owner, key); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("the undone %s left a row (%v)", c.name, err)
				}
			})
		})
	}
}

// What the database holds of a pause is what every reader can read.
func TestAPauseOfInfiniteTimeIsRefused(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		conn := storetest.RawConn(t, dsn)
		storetest.Open(t, dsn, 1)
		_, err := conn.Exec(context.Background(), `INSERT INTO dislock.pauses (lock_key, paused_at, paused_by, until) VALUES ('ns/x', now(), 'me', 'infinity')`)
		if err == nil || !strings.Contains(err.Error(), "pauses_finite") {
			t.Fatalf("an infinite until: %v", err)
		}
	})
}

// A session at a stricter isolation level than read committed reads one
// snapshot for the whole call, and could not undo a claim or grant that
// waited while a pause committed: what would start a run is refused with
// the setting named, and undone. A run going (its pod re-entering its
// claim and lease) and the refusals are answered as ever.
func TestAClaimOrLeaseStartsNoRunAboveReadCommittedButARunGoingReenters(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		s := storetest.Open(t, dsn, 1)
		conn := storetest.RawConn(t, dsn)
		o := storetest.Owner("dc-a", "job-a", "pod-a")
		other := storetest.Owner("dc-b", "job-b", "pod-b")
		calls := map[string]func(tx pgx.Tx, key string, o store.Owner) (string, error){
			"claim": func(tx pgx.Tx, key string, o store.Owner) (string, error) {
				return column(tx.Query(ctx, store.ClaimWindowSQL, key, storetest.WindowAt(0), store.NotIndexed, o.WindowOwner(), o.Cluster, o.Pod,
					int64(60e6), o.JobPrefix(), false, nil, int64(60e6), int64(60e6), nil))(12)
			},
			"lease": func(tx pgx.Tx, key string, o store.Owner) (string, error) {
				return column(tx.Query(ctx, store.AcquireLeaseSQL, key, o.LeaseOwner(), int64(60e6)))(5)
			},
		}
		at := func(level pgx.TxIsoLevel, call func(tx pgx.Tx, key string, o store.Owner) (string, error), key string, o store.Owner) (string, error) {
			tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: level})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // only tried
			return call(tx, key, o)
		}
		for name, call := range calls {
			key := storetest.UniqueKey(t) + "-" + name
			for _, level := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
				outcome, err := at(level, call, key, o)
				if err == nil || !strings.Contains(err.Error(), "isolation level "+string(level)) || !strings.Contains(err.Error(), "read committed") {
					t.Fatalf("a fresh %s at %s: %q, %v; want a refusal naming the isolation level", name, level, outcome, err)
				}
			}
			// Held at read committed (by the Store), then asked for again.
			if name == "claim" {
				storetest.MustClaim(t, s, key, storetest.WindowAt(0), o, false, time.Minute, store.Claimed)
			} else if _, err := s.AcquireLease(ctx, key, o, time.Minute); err != nil {
				t.Fatal(err)
			}
			for _, level := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.ReadUncommitted, pgx.ReadCommitted} {
				if outcome, err := at(level, call, key, o); err != nil || outcome != "reentered" {
					t.Fatalf("the holder's %s again at %s: %q, %v; want reentered", name, level, outcome, err)
				}
				if outcome, err := at(level, call, key, other); err != nil || (outcome != "refused" && outcome != "held") {
					t.Fatalf("another's %s at %s: %q, %v; want a refusal", name, level, outcome, err)
				}
			}
		}
	})
}

// A pod whose role defaults above read committed learns why it cannot
// start a run, and the fix, from its Store.
func TestAStoreAboveReadCommittedSaysHowToFixIt(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		owner := storetest.Open(t, dsn, 1)
		ns := storetest.Namespace(t, "isofix")
		c := storetest.ProvisionDefaulting(t, owner, ns, "serializable")
		a := storetest.TenantStore(t, dsn, c)
		_, err := claimAs(t, a, ns+"/report", storetest.WindowAt(0), tenantOwner("dc-a", ns, "report-1", "report-1-a"), store.NotIndexed)
		if err == nil || !strings.Contains(err.Error(), "isolation level serializable") || !strings.Contains(err.Error(), "RESET default_transaction_isolation") {
			t.Fatalf("a claim as a role defaulting to serializable: %v, want the level and the fix", err)
		}
		_, err = a.AcquireLease(ctx, ns+"/report", tenantOwner("dc-a", ns, "report-1", "report-1-a"), ttl)
		if err == nil || !strings.Contains(err.Error(), "RESET default_transaction_isolation") {
			t.Fatalf("a lease as a role defaulting to serializable: %v, want the fix", err)
		}
	})
}

// column reads column i (the outcome) of a statement's one row as text.
func column(rows pgx.Rows, err error) func(i int) (string, error) {
	return func(i int) (string, error) {
		if err != nil {
			return "", err
		}
		defer rows.Close()
		if !rows.Next() {
			return "", fmt.Errorf("no row (%v)", rows.Err())
		}
		vals, err := rows.Values()
		if err != nil {
			return "", err
		}
		outcome, _ := vals[i].(string)
		return outcome, nil
	}
}
