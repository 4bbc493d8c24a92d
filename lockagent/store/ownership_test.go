package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/test/pgtest"
)

// windowTakeable is what ClaimWindow's re-read says of window 0 of key for
// the claim of who.
func windowTakeable(t *testing.T, s *store.Store, key string, who store.Owner, standby bool) bool {
	t.Helper()
	rows, err := s.Handle().Pool.Query(context.Background(), store.GetWindowTakeableSQL,
		key, storetest.WindowAt(0), store.NotIndexed, who.String(), who.JobPrefix(), standby)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	if !rows.Next() {
		t.Fatalf("the re-read found no row of %s: %v", key, rows.Err())
	}
	vals, err := rows.Values()
	if err != nil {
		t.Fatal(err)
	}
	takeable, ok := vals[len(vals)-1].(bool)
	if !ok {
		t.Fatalf("the re-read's last column is %T, want a bool", vals[len(vals)-1])
	}
	return takeable
}

// The "Ownership and re-entry" table of the design, row by row: who asks for
// a window whose owner is in which state, and what the database answers.
func TestOwnershipTable(t *testing.T) {
	type answer int
	const (
		sameToken answer = iota // re-entered with the owner's token
		newToken                // took it over with a larger token
		refused                 // ErrWindowTaken: the caller waits or skips
	)
	owner0 := storetest.Owner("dc-a", "report-1", "pod-a")
	samePod := owner0
	sameJob := owner0
	sameJob.Pod = "pod-a-replacement"
	otherJob := storetest.Owner("dc-b", "report-1", "pod-b")
	type asker struct {
		name    string
		who     store.Owner
		standby bool
	}
	askers := []asker{
		{"the same pod", samePod, false},
		{"another pod of the same Job", sameJob, false},
		{"another Job with standby", otherJob, true},
		{"another Job", otherJob, false},
	}
	states := []string{"alive", "lapsed", "failed", "succeeded", "skipped"}
	want := map[string][]answer{
		"the same pod":                {sameToken, sameToken, refused, refused, refused},
		"another pod of the same Job": {refused, newToken, newToken, refused, refused},
		"another Job with standby":    {refused, newToken, newToken, refused, refused},
		"another Job":                 {refused, refused, refused, refused, refused},
	}
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		for _, a := range askers {
			for i, state := range states {
				t.Run(a.name+" asks for a window whose owner is "+state, func(t *testing.T) {
					key := storetest.UniqueKey(t)
					first := storetest.MustClaim(t, s, key, storetest.WindowAt(0), owner0, false, ttl, store.Claimed)
					tok := first.Window.Token
					switch state {
					case "lapsed":
						short := storetest.MustClaim(t, s, key, storetest.WindowAt(0), owner0, false, time.Millisecond, store.Reentered)
						storetest.AwaitDBPast(t, s, short.Window.AliveUntil)
					case "failed", "succeeded", "skipped":
						if _, err := s.Finish(ctx, key, storetest.WindowAt(0), store.NotIndexed, tok, store.State(state), nil); err != nil {
							t.Fatal(err)
						}
					}
					// The re-read a claim falls back on when its locked path
					// refused asks the claim's own rule.
					if takeable := windowTakeable(t, s, key, a.who, a.standby); takeable != (want[a.name][i] != refused) {
						t.Errorf("the re-read says takeable %v; the claim is %v", takeable, []string{"re-entered", "taken over", "refused"}[want[a.name][i]])
					}
					got, err := storetest.Claim(t, s, key, storetest.WindowAt(0), a.who, a.standby, ttl)
					switch want[a.name][i] {
					case sameToken:
						if err != nil || got.Outcome != store.Reentered || got.Window.Token != tok {
							t.Fatalf("got %+v, %v; want re-entry with token %d", got, err, tok)
						}
					case newToken:
						if err != nil || got.Outcome != store.TookOver || got.Window.Token <= tok || got.Window.Owner != a.who.String() {
							t.Fatalf("got %+v, %v; want a takeover with a token above %d", got, err, tok)
						}
						// The old owner's heartbeat now fails: it must stop.
						if _, _, err := s.Heartbeat(ctx, key, storetest.WindowAt(0), store.NotIndexed, tok, ttl); !errors.Is(err, store.ErrWindowLost) {
							t.Fatalf("old owner's heartbeat after the takeover: %v, want ErrWindowLost", err)
						}
					case refused:
						if !errors.Is(err, store.ErrWindowTaken) || got.Window.Owner != owner0.String() {
							t.Fatalf("got %+v, %v; want ErrWindowTaken naming %s", got, err, owner0)
						}
					}
				})
			}
		}
	})
}

// Each completion index of an Indexed Job is a window of its own: index 1 is
// claimed by whichever cluster gets there first, independently of index 0.
func TestIndexesOfAWindowAreClaimedSeparately(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		key := storetest.UniqueKey(t)
		a, b := storetest.Owner("dc-a", "shards-1", "pod-a-0"), storetest.Owner("dc-b", "shards-1", "pod-b-1")
		claimIndex := func(o store.Owner, index int) (store.Claim, error) {
			return s.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: storetest.WindowAt(0), Index: index, Owner: o, TTL: ttl})
		}
		a0, err := claimIndex(a, 0)
		if err != nil || a0.Outcome != store.Claimed {
			t.Fatalf("dc-a index 0: %+v, %v", a0, err)
		}
		b1, err := claimIndex(b, 1)
		if err != nil || b1.Outcome != store.Claimed || b1.Window.Index != 1 {
			t.Fatalf("dc-b index 1: %+v, %v", b1, err)
		}
		if _, err := claimIndex(b, 0); !errors.Is(err, store.ErrWindowTaken) {
			t.Fatalf("dc-b index 0 after dc-a took it: %v, want ErrWindowTaken", err)
		}
		if _, err := s.Finish(ctx, key, storetest.WindowAt(0), 0, a0.Window.Token, store.StateSucceeded, storetest.Ptr(0)); err != nil {
			t.Fatal(err)
		}
		if w, err := s.GetWindow(ctx, key, storetest.WindowAt(0), 1); err != nil || w.State != store.StateRunning || w.Owner != b.String() {
			t.Fatalf("index 1 after index 0 finished: %+v, %v", w, err)
		}
	})
}

// Two clusters whose CronJobs differ in time zone are told so when they claim.
func TestRecordViewReportsOtherClustersThatDisagree(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn, 2)
		ctx := context.Background()
		key := storetest.UniqueKey(t)
		utc := store.View{Schedule: "0 2 * * *", TimeZone: "Etc/UTC", Mode: "schedule", LeaseTTL: "30s"}
		if others, err := s.RecordView(ctx, key, "dc-a", utc, time.Hour); err != nil || len(others) != 0 {
			t.Fatalf("first view: %+v, %v", others, err)
		}
		if others, err := s.RecordView(ctx, key, "dc-b", utc, time.Hour); err != nil || len(others) != 0 {
			t.Fatalf("an agreeing view: %+v, %v", others, err)
		}
		unset := utc
		unset.TimeZone = ""
		others, err := s.RecordView(ctx, key, "dc-c", unset, time.Hour)
		if err != nil || len(others) != 2 || others[0].Cluster != "dc-a" || others[1].Cluster != "dc-b" {
			t.Fatalf("a disagreeing view: %+v, %v; want dc-a and dc-b named", others, err)
		}
		if diff := unset.Diff(others[0].View); len(diff) != 1 {
			t.Fatalf("diff = %q, want only the time zone", diff)
		}
		all, err := s.ListDisagreements(ctx, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, cv := range all {
			if cv.Key == key {
				n++
			}
		}
		if n != 3 {
			t.Fatalf("ListDisagreements has %d views of %s, want 3: %+v", n, key, all)
		}
	})
}

// Should a row no time.Time can hold get in anyway (by hand, or written
// before the constraints on a database where they were dropped), each owner
// listing leaves that row out, logs it naming the key and the column, and
// counts it, instead of failing for every namespace; a read of the row
// itself fails naming the column. Its own server: the constraints are
// dropped there.
func TestOwnersListingsLeaveOutARowTheyCannotRead(t *testing.T) {
	t.Parallel()
	srv := pgtest.New(t, pgtest.Options{Name: "unreadable"})
	ctx := context.Background()
	storetest.Open(t, srv.DirectDSN(), 1) // migrates
	ownerConn := storetest.RawConn(t, srv.DirectDSN())
	for _, c := range []string{"windows_finite_times ON dislock.windows", "leases_finite_times ON dislock.leases", "views_finite_times ON dislock.views"} {
		table, constraint := strings.Split(c, " ON ")[1], strings.Split(c, " ON ")[0]
		if _, err := ownerConn.Exec(ctx, `ALTER TABLE `+table+` DROP CONSTRAINT `+constraint); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ownerConn.Exec(ctx, `
		INSERT INTO dislock.windows (lock_key, window_start, job_index, owner, cluster, pod, token, state, claimed_at, alive_until) VALUES
			('good/report', '2026-12-02T12:00:00Z', -1, 'o', 'c', 'p', 1, 'failed', now(), now()),
			('bad/report', 'infinity', -1, 'o', 'c', 'p', 1, 'failed', now(), now());
		INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at) VALUES
			('good/report', 'o', 1, now(), now()), ('bad/report', 'o', 1, now(), '-infinity');
		INSERT INTO dislock.views (lock_key, cluster, view, seen_at) VALUES
			('good/report', 'dc-a', '{"timeZone":"UTC"}', now()), ('good/report', 'dc-b', '{"timeZone":"Europe/Berlin"}', now()),
			('bad/report', 'dc-a', '{"timeZone":"UTC"}', 'infinity'), ('bad/report', 'dc-b', '{"timeZone":"Asia/Tokyo"}', 'infinity')`); err != nil {
		t.Fatal(err)
	}
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			var logged strings.Builder
			s, err := store.Open(ctx, tg.DSN, store.Options{MaxConns: 1, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			keys := func(n int, key func(int) string) []string {
				var out []string
				for i := range n {
					out = append(out, key(i))
				}
				return out
			}
			ws, _, err := s.ListWindows(ctx, "", 10)
			if got := keys(len(ws), func(i int) string { return ws[i].Key }); err != nil || fmt.Sprint(got) != "[good/report]" {
				t.Errorf("ListWindows: %v, %v; want [good/report]", got, err)
			}
			ls, _, err := s.ListLeases(ctx)
			if got := keys(len(ls), func(i int) string { return ls[i].Key }); err != nil || fmt.Sprint(got) != "[good/report]" {
				t.Errorf("ListLeases: %v, %v; want [good/report]", got, err)
			}
			vs, err := s.ListDisagreements(ctx, time.Hour)
			if got := keys(len(vs), func(i int) string { return vs[i].Key + "@" + vs[i].Cluster }); err != nil ||
				fmt.Sprint(got) != "[good/report@dc-a good/report@dc-b]" {
				t.Errorf("ListDisagreements: %v, %v; want good/report's two views", got, err)
			}
			if n := s.SkippedRows(); n != 4 {
				t.Errorf("SkippedRows: %d, want 4 (a window, a lease, two views)", n)
			}
			for _, want := range []string{`key=bad/report`, "window_start is infinity", "expire_at is -infinity", "seen_at is infinity", "table=dislock.views"} {
				if !strings.Contains(logged.String(), want) {
					t.Errorf("the log does not say %q:\n%s", want, logged.String())
				}
			}
			if _, _, err := s.GetLease(ctx, "bad/report"); err == nil || !strings.Contains(err.Error(), "expire_at is -infinity") {
				t.Errorf("reading the unreadable lease: %v, want an error naming expire_at", err)
			}
		})
	}
}
