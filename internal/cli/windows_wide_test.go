package cli_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dislock/dislock/internal/cli"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/pgtest"

	_ "time/tzdata" // --tz Europe/Berlin wherever the tests run
)

// An on-call engineer asks why a window ran where it did: -o wide shows
// every cluster's decision of each window with its reason, newest window
// first, a window every cluster skipped included; --since, --from and --to
// pick the windows by start, and --tz prints the times in the zone asked.
func TestWideWindowsShowWhatEveryClusterDecided(t *testing.T) {
	srv := pgtest.Need(t)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	tokyoZone, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			s := migratedStore(t, tg.DSN)
			key := namespace("wide") + "/report"
			base := dbNow(t, s).Truncate(time.Minute)
			// old ran in dc-a three hours ago; decided was claimed by dc-a
			// and skipped by dc-b and dc-c; skipped was skipped everywhere
			// and has no owner's row.
			old, decided, skipped := base.Add(-3*time.Hour), base.Add(-30*time.Minute), base.Add(-20*time.Minute)
			runWindow(t, s, key, old, "dc-a", store.StateSucceeded, time.Minute)
			record(t, s, store.Decision{Key: key, Window: old, Index: store.NotIndexed, Cluster: "dc-a", Action: store.ActionRun, Reason: "window claimed three hours ago"})
			c := runWindow(t, s, key, decided, "dc-a", store.StateSucceeded, time.Minute)
			tok := c.Window.Token
			for _, d := range []store.Decision{
				{Cluster: "dc-a", Action: store.ActionRun, Reason: "window claimed", Token: tok},
				{Cluster: "dc-b", Action: store.ActionSkip, Reason: "window already claimed by cluster dc-a"},
				{Cluster: "dc-c", Action: store.ActionSkip, Reason: "window already claimed by cluster dc-a, no standby"},
			} {
				d.Key, d.Window, d.Index = key, decided, store.NotIndexed
				record(t, s, d)
			}
			for _, cl := range []string{"dc-a", "dc-b"} {
				record(t, s, store.Decision{Key: key, Window: skipped, Index: store.NotIndexed, Cluster: cl, Action: store.ActionSkip, Reason: "stale: window started 3m ago"})
			}
			utc := func(at time.Time) string { return at.UTC().Format(time.RFC3339) }

			code, out, errOut := run(t, "windows", "--database-url", tg.DSN, "--key", key, "-o", "wide")
			if code != 0 {
				t.Fatalf("windows -o wide: exit %d: %s", code, errOut)
			}
			if header := strings.Fields(strings.SplitN(out, "\n", 2)[0]); strings.Join(header, " ") != "KEY WINDOW INDEX CLUSTER ACTION TOKEN AT POD REASON" {
				t.Fatalf("wide header %q:\n%s", header, out)
			}
			rows := tableRows(out, key)
			want := [][]string{
				{utc(skipped), "dc-a", "skip", "stale: window started 3m ago"},
				{utc(skipped), "dc-b", "skip", "stale: window started 3m ago"},
				{utc(decided), "dc-a", "run", " " + strconv.FormatInt(tok, 10) + " ", "window claimed"},
				{utc(decided), "dc-b", "skip", "window already claimed by cluster dc-a"},
				{utc(decided), "dc-c", "skip", "window already claimed by cluster dc-a, no standby"},
				{utc(old), "dc-a", "run", "window claimed three hours ago"},
			}
			if len(rows) != len(want) {
				t.Fatalf("wide listing has %d rows of %s, want %d (one per decision, newest window first):\n%s", len(rows), key, len(want), out)
			}
			for i, cells := range want {
				for _, c := range cells {
					if !strings.Contains(rows[i], c) {
						t.Errorf("row %d %q lacks %q", i, rows[i], c)
					}
				}
			}

			// --limit counts windows in the wide listing: the newest is the
			// one every cluster skipped.
			_, out, _ = run(t, "windows", "--database-url", tg.DSN, "--key", key, "-o", "wide", "--limit", "1")
			if rows := tableRows(out, key); len(rows) != 2 || !strings.Contains(rows[0], utc(skipped)) || !strings.Contains(rows[1], utc(skipped)) {
				t.Errorf("-o wide --limit 1: want the 2 decisions of %s:\n%s", utc(skipped), out)
			}

			// --since counts back from the database's time.
			_, out, _ = run(t, "windows", "--database-url", tg.DSN, "--key", key, "-o", "wide", "--since", "2h")
			if rows := tableRows(out, key); len(rows) != 5 || strings.Contains(out, utc(old)) {
				t.Errorf("-o wide --since 2h: want the 5 decisions of the two recent windows, not %s:\n%s", utc(old), out)
			}
			_, out, _ = run(t, "windows", "--database-url", tg.DSN, "--key", key, "--since", "2h")
			if rows := tableRows(out, key); len(rows) != 1 || !strings.Contains(rows[0], utc(decided)) {
				t.Errorf("--since 2h: want the owner's row of %s only:\n%s", utc(decided), out)
			}
			// --from is inclusive, --to exclusive.
			_, out, _ = run(t, "windows", "--database-url", tg.DSN, "--key", key, "-o", "wide", "--from", utc(decided), "--to", utc(skipped))
			if rows := tableRows(out, key); len(rows) != 3 || strings.Contains(out, utc(skipped)) || strings.Contains(out, utc(old)) {
				t.Errorf("--from %s --to %s: want the 3 decisions of %s only:\n%s", utc(decided), utc(skipped), utc(decided), out)
			}
			// A date-time without a zone is read in --tz (one without
			// daylight saving time: no local time is ambiguous), and every
			// time is printed in it.
			tokyo := decided.In(tokyoZone)
			_, out, _ = run(t, "windows", "--database-url", tg.DSN, "--key", key, "-o", "wide", "--tz", "Asia/Tokyo",
				"--from", tokyo.Format("2006-01-02 15:04"), "--to", tokyo.Add(time.Minute).Format("2006-01-02T15:04"))
			rows = tableRows(out, key)
			if len(rows) != 3 || !strings.Contains(rows[0], tokyo.Format(time.RFC3339)) || strings.Contains(out, utc(decided)) {
				t.Errorf("--tz Asia/Tokyo with local --from/--to: want the 3 decisions of %s, shown as %s:\n%s", utc(decided), tokyo.Format(time.RFC3339), out)
			}
			local := decided.In(berlin)
			_, out, _ = run(t, "windows", "--database-url", tg.DSN, "--key", key, "--tz", "Europe/Berlin")
			if rows := tableRows(out, key); len(rows) != 2 || !strings.Contains(rows[0], local.Format(time.RFC3339)) || strings.Contains(rows[0], "Z ") {
				t.Errorf("--tz Europe/Berlin: want the windows at %s and no UTC time:\n%s", local.Format(time.RFC3339), out)
			}

			// -o yaml and -o json parse back into the owners' rows.
			for _, format := range []string{"yaml", "json"} {
				code, out, errOut = run(t, "windows", "--database-url", tg.DSN, "--key", key, "-o", format)
				var got []store.Window
				var err error
				if format == "yaml" {
					err = yaml.Unmarshal([]byte(out), &got)
				} else {
					err = json.Unmarshal([]byte(out), &got)
				}
				if code != 0 || err != nil {
					t.Fatalf("-o %s: exit %d, %v, stderr %q:\n%s", format, code, err, errOut, out)
				}
				if len(got) != 2 || !got[0].Start.Equal(decided) || got[0].Cluster != "dc-a" || got[0].Token != tok ||
					got[0].State != store.StateSucceeded || !got[1].Start.Equal(old) {
					t.Fatalf("-o %s: %+v, want %s (dc-a, token %d, succeeded) then %s", format, got, utc(decided), tok, utc(old))
				}
			}
		})
	}
}

// `dislock windows --watch` prints the listing, then what is new: a
// decision recorded after it started, and an owner's row again once its
// run ended; never a row it printed already.
func TestWatchPrintsWhatHappensAfterItStarted(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			s := migratedStore(t, tg.DSN)
			key := namespace("watch") + "/report"
			base := dbNow(t, s).Truncate(time.Minute)
			w := base.Add(-10 * time.Minute)
			record(t, s, store.Decision{Key: key, Window: w, Index: store.NotIndexed, Cluster: "dc-a", Action: store.ActionRun, Reason: "decided before the watch"})

			out, stop := startWatch(t, "windows", "--database-url", tg.DSN, "--key", key, "-o", "wide", "--watch", "--interval", "1s")
			out.await(t, "the first listing", func(s string) bool { return strings.Contains(s, "decided before the watch") })
			record(t, s, store.Decision{Key: key, Window: w, Index: store.NotIndexed, Cluster: "dc-b", Action: store.ActionSkip, Reason: "decided while watched"})
			out.await(t, "the decision recorded after the watch started", func(s string) bool { return strings.Contains(s, "decided while watched") })
			if got := stop(); got != 0 {
				t.Fatalf("the interrupted watch exited %d, want 0", got)
			}
			got := out.String()
			for text, n := range map[string]int{"KEY": 1, "decided before the watch": 1, "decided while watched": 1} {
				if c := strings.Count(got, text); c != n {
					t.Errorf("%q printed %d times, want %d:\n%s", text, c, n, got)
				}
			}

			// The table prints a window's row again when its run ends, and
			// not while it is unchanged: the second window's row comes from a
			// later query than the first's.
			first, second := base.Add(-5*time.Minute), base.Add(-4*time.Minute)
			out, stop = startWatch(t, "windows", "--database-url", tg.DSN, "--key", key, "--watch", "--interval", "1s")
			out.await(t, "the header", func(s string) bool { return strings.Contains(s, "KEY") })
			c := runWindow(t, s, key, first, "dc-b", store.StateRunning, time.Minute)
			out.await(t, "the first window's row", func(s string) bool { return len(tableRows(s, key)) >= 1 })
			runWindow(t, s, key, second, "dc-a", store.StateRunning, time.Minute)
			out.await(t, "the second window's row", func(s string) bool { return strings.Contains(s, second.Format(time.RFC3339)) })
			exit := 0
			if _, err := s.Finish(context.Background(), key, first, store.NotIndexed, c.Window.Token, store.StateSucceeded, &exit); err != nil {
				t.Fatal(err)
			}
			out.await(t, "the first window's end", func(s string) bool { return strings.Contains(s, "succeeded") })
			if got := stop(); got != 0 {
				t.Fatalf("the interrupted watch exited %d, want 0", got)
			}
			rows := tableRows(out.String(), key)
			want := [][]string{{first.Format(time.RFC3339), "running"}, {second.Format(time.RFC3339), "running"}, {first.Format(time.RFC3339), "succeeded"}}
			if len(rows) != len(want) {
				t.Fatalf("watching the table: want the first window running, the second running, the first succeeded; got:\n%s", out.String())
			}
			for i, cells := range want {
				for _, c := range cells {
					if !strings.Contains(rows[i], c) {
						t.Errorf("row %d %q lacks %q", i, rows[i], c)
					}
				}
			}
		})
	}
}

// startWatch runs the CLI until the test calls the returned function,
// which interrupts it and returns its exit code.
func startWatch(t *testing.T, args ...string) (*watchedBuffer, func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := newWatchedBuffer(), newWatchedBuffer()
	done := make(chan int, 1)
	go func() { done <- cli.Main(ctx, args, out, errOut) }()
	stopped := false
	stop := func() int {
		t.Helper()
		stopped = true
		cancel()
		select {
		case code := <-done:
			if errOut.String() != "" {
				t.Errorf("the watch wrote to stderr: %s", errOut)
			}
			return code
		case <-time.After(30 * time.Second):
			t.Fatalf("the watch did not end within 30s of its interrupt")
			return -1
		}
	}
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-done
		}
	})
	return out, stop
}

// What a tenant wrote into its own decisions reaches the operator's wide
// listing quoted: a newline in a reason cannot print a forged row of
// another namespace, nor a tab or an escape sequence shift or hide columns.
func TestATenantsDecisionsCannotForgeRowsOfTheWideListing(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			ctx := context.Background()
			owner := migratedStore(t, tg.DSN)
			hostile := namespace("hostile")
			cred, err := tenant.Provision(ctx, owner, "dc-a", hostile)
			if err != nil {
				t.Fatal(err)
			}
			tenantURL, err := tenant.DSN(tg.DSN, cred)
			if err != nil {
				t.Fatal(err)
			}
			tenant, err := store.Open(ctx, tenantURL, store.Options{MaxConns: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer tenant.Close()
			forged := "victim/report  2026-12-02T13:00:00Z  -  dc-b  run  42"
			reason := "ok\n" + forged + "\t\x1b[2K"
			d := store.Decision{Key: hostile + "/x", Window: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC), Index: store.NotIndexed,
				Cluster: "dc-a\n" + forged, Job: "j", Pod: "p\x1b[8m", Action: store.ActionSkip, Reason: reason}
			if err := tenant.RecordDecision(ctx, d); err != nil {
				t.Fatalf("the tenant recording its own decision: %v", err)
			}
			code, out, errOut := run(t, "windows", "--database-url", tg.DSN, "--key", d.Key, "-o", "wide")
			if code != 0 {
				t.Fatalf("windows -o wide: exit %d: %s", code, errOut)
			}
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, forged) || strings.ContainsAny(l, "\t\x1b") {
					t.Errorf("the wide listing printed a tenant's bytes raw: %q", l)
				}
			}
			for _, quoted := range []string{strconv.Quote(reason), strconv.Quote(d.Cluster), strconv.Quote(d.Pod)} {
				if !strings.Contains(out, quoted) {
					t.Errorf("the wide listing does not show %s quoted:\n%s", quoted, out)
				}
			}
		})
	}
}

// The wide listing picks the newest windows of the ledger and of the
// owners' rows. A tenant writes decisions of its own keys for windows in the
// future (any finite time): `dislock windows -o wide --since 2h`, the
// operator's "what happened in the last two hours", must still show another
// namespace's window of a minute ago: --since ends at now.
func TestATenantsFutureWindowsDoNotFillTheWideListingOfTheLastHours(t *testing.T) {
	srv := pgtest.Need(t)
	dsn := srv.DirectDSN()
	ctx := context.Background()
	owner := migratedStore(t, dsn)
	hostile := namespace("hostile")
	cred, err := tenant.Provision(ctx, owner, "dc-a", hostile)
	if err != nil {
		t.Fatal(err)
	}
	tenantURL, err := tenant.DSN(dsn, cred)
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := store.Open(ctx, tenantURL, store.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tenant.Close()
	far := time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < 60; i++ {
		record(t, tenant, store.Decision{Key: hostile + "/x", Window: far.Add(time.Duration(i) * time.Minute), Index: store.NotIndexed,
			Cluster: "dc-a", Action: store.ActionSkip, Reason: "noise"})
	}
	victim := namespace("victim") + "/report"
	w := dbNow(t, owner).Truncate(time.Minute).Add(-time.Minute)
	record(t, owner, store.Decision{Key: victim, Window: w, Index: store.NotIndexed, Cluster: "dc-b", Action: store.ActionError, Reason: "database unreachable"})
	code, out, errOut := run(t, "windows", "--database-url", dsn, "-o", "wide", "--since", "2h")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, victim) {
		t.Errorf("`dislock windows -o wide --since 2h` does not show %s's window of a minute ago; it shows namespace %s's windows of the year 2200 (%d lines)",
			victim, hostile, strings.Count(out, hostile+"/x"))
	}
}

// Bad values of the listing flags are usage errors that name the flag and
// what it accepts, found before the database is asked anything.
func TestBadListingFlagsNameTheFlagAndWhatItWants(t *testing.T) {
	t.Parallel()
	db := []string{"--database-url", "postgres://u:p@127.0.0.1:1/d?connect_timeout=1"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"since is not a duration", []string{"windows", "--since", "2x"}, []string{`invalid value "2x" for flag -since`, "want a duration such as 2h"}},
		{"since is negative", []string{"missed", "--since", "-1h"}, []string{`invalid value "-1h" for flag -since`}},
		{"from is not a time", []string{"windows", "--from", "noon"}, []string{`--from "noon" is not a time`, "RFC 3339", "2026-12-02 12:00:00"}},
		{"to is not a time", []string{"missed", "--to", "2026-12-02T25:00"}, []string{`--to "2026-12-02T25:00" is not a time`, "RFC 3339"}},
		{"from is after to", []string{"windows", "--from", "2026-12-02T12:00:00Z", "--to", "2026-12-02T11:00:00Z"},
			[]string{"--from 2026-12-02T12:00:00Z is not before --to 2026-12-02T11:00:00Z"}},
		{"unknown time zone", []string{"windows", "--tz", "Mars/Olympus"}, []string{`--tz "Mars/Olympus" is not a time zone`, "Europe/Berlin"}},
		{"unknown time zone of missed", []string{"missed", "--tz", "Nowhere"}, []string{`--tz "Nowhere" is not a time zone`}},
		{"watch too often", []string{"windows", "--watch", "--interval", "10ms"}, []string{"--interval 10ms is too short", "at least 1s"}},
		{"missed limit", []string{"missed", "--limit", "0"}, []string{"--limit 0 must be positive"}},
		{"missed key", []string{"missed", "--key", "report"}, []string{`--key "report" is not <namespace>/<name>`}},
		{"dry run of a bad window", []string{"release", "--key", "a/b", "--window", "noon", "--dry-run"}, []string{"--window", "not an RFC 3339 time"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, errOut := run(t, append(tc.args, db...)...)
			if code != 2 {
				t.Fatalf("exit %d, stderr %q; want 2 (usage)", code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr %q lacks %q", errOut, w)
				}
			}
		})
	}
}
