package cli_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/ledger"
	"github.com/dislock/dislock/test/pgtest"
)

// missedOutput is what `dislock missed -o json|yaml` prints.
type missedOutput struct {
	Missed []ledger.MissedWindow `json:"missed"`
	Silent []struct {
		Key    string `json:"key"`
		Period string `json:"period"`
	} `json:"silent"`
	NewlyDetected int `json:"newlyDetected"`
}

// `dislock missed` finds the windows of the last ten minutes that ran
// nowhere (every cluster skipped one, another's only run failed) and the
// key nobody decided for, and lists exactly those; it exits 0 as a report,
// and 3 with --fail-on-missed when it lists anything.
func TestMissedListsTheWindowsThatRanNowhereAndTheSilentKeys(t *testing.T) {
	srv := pgtest.Need(t)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			ctx := context.Background()
			s := migratedStore(t, tg.DSN)
			raw := rawConn(t, tg.DSN)
			ns := namespace("missed")
			now := dbNow(t, s)
			m0 := now.Truncate(time.Minute).Add(-10 * time.Minute)
			minute := func(i int) time.Time { return m0.Add(time.Duration(i) * time.Minute) }
			view := store.View{Schedule: "* * * * *", Mode: "schedule", LeaseTTL: "30s"}
			// seen makes the key's statistics say it was first decided at
			// firstSeen and last at lastDecided: the detection judges only
			// windows after the first, and a key silent since the last.
			seen := func(key string, firstSeen, lastDecided time.Time) {
				t.Helper()
				if _, err := s.RecordView(ctx, key, "dc-a", view, store.DefaultViewRecency); err != nil {
					t.Fatal(err)
				}
				record(t, s, store.Decision{Key: key, Cluster: "dc-a", Action: store.ActionRun, Reason: "lease only"})
				if _, err := raw.Exec(ctx, `UPDATE dislock.key_stats SET first_seen = $2, last_decided = $3 WHERE lock_key = $1`, key, firstSeen, lastDecided); err != nil {
					t.Fatal(err)
				}
				if _, err := raw.Exec(ctx, `UPDATE dislock.views SET changed_at = $2 WHERE lock_key = $1`, key, firstSeen); err != nil {
					t.Fatal(err)
				}
			}
			nowhere, failed, allRan, silent := ns+"/nowhere", ns+"/failed", ns+"/all", ns+"/silent"
			for _, k := range []string{nowhere, failed, allRan} {
				seen(k, m0.Add(30*time.Second), now)
			}
			seen(silent, m0.Add(30*time.Second), now.Add(-10*time.Minute))
			// The detection judges m0 (the window of the first decision)
			// ... m0+9; m0+10 ran everywhere, in case the clock passes a
			// minute meanwhile.
			for i := 0; i <= 10; i++ {
				if i == 4 {
					record(t, s, store.Decision{Key: nowhere, Window: minute(i), Index: store.NotIndexed, Cluster: "dc-a", Action: store.ActionSkip, Reason: "stale: window started 3m ago"})
					record(t, s, store.Decision{Key: nowhere, Window: minute(i), Index: store.NotIndexed, Cluster: "dc-b", Action: store.ActionSkip, Reason: "stale\nforged line"})
				} else {
					runWindow(t, s, nowhere, minute(i), "dc-a", store.StateSucceeded, time.Minute)
				}
				runWindow(t, s, allRan, minute(i), "dc-b", store.StateSucceeded, time.Minute)
				state := store.StateSucceeded
				if i == 5 {
					state = store.StateFailed
				}
				runWindow(t, s, failed, minute(i), "dc-a", state, time.Minute)
			}
			missed := func(args ...string) (int, missedOutput, string) {
				t.Helper()
				code, out, errOut := run(t, append([]string{"missed", "--database-url", tg.DSN, "-o", "json"}, args...)...)
				var got missedOutput
				if err := json.Unmarshal([]byte(out), &got); err != nil {
					t.Fatalf("missed -o json %q: exit %d, %v, stderr %q:\n%s", args, code, err, errOut, out)
				}
				return code, got, errOut
			}

			code, got, errOut := missed("--key", nowhere)
			if code != 0 || len(got.Missed) != 1 || got.NewlyDetected != 1 {
				t.Fatalf("missed --key %s: exit %d %s, %+v: want its window %s, newly detected", nowhere, code, errOut, got, minute(4))
			}
			code, got, _ = missed()
			if code != 0 {
				t.Fatalf("missed: exit %d, want 0 (a report)", code)
			}
			var found, silentKeys []string
			for _, m := range got.Missed {
				if strings.HasPrefix(m.Key, ns+"/") {
					found = append(found, m.Key+"@"+m.Window.Format("15:04")+" "+m.Kind)
				}
			}
			for _, k := range got.Silent {
				if strings.HasPrefix(k.Key, ns+"/") {
					silentKeys = append(silentKeys, k.Key+" "+k.Period)
				}
			}
			// Newest first.
			want := []string{failed + "@" + minute(5).Format("15:04") + " failed", nowhere + "@" + minute(4).Format("15:04") + " no-run"}
			if !slices.Equal(found, want) {
				t.Errorf("missed lists %q of this test's keys, want exactly %q", found, want)
			}
			if want := []string{silent + " 1m0s"}; !slices.Equal(silentKeys, want) {
				t.Errorf("silent keys %q, want %q", silentKeys, want)
			}
			if _, again, _ := missed("--key", nowhere); again.NewlyDetected != 0 || len(again.Missed) != 1 {
				t.Errorf("a second run: %+v, want the same window, not newly detected", again)
			}

			// The window range: --since counts back from the database's time,
			// --from is inclusive, --to exclusive.
			if _, got, _ := missed("--key", nowhere, "--since", "2m"); len(got.Missed) != 0 {
				t.Errorf("--since 2m lists %+v, want nothing (the window started 6m ago or earlier)", got.Missed)
			}
			if _, got, _ := missed("--key", failed, "--from", minute(5).Format(time.RFC3339), "--to", minute(6).Format(time.RFC3339)); len(got.Missed) != 1 {
				t.Errorf("--from %s --to %s lists %+v, want the window %s", minute(5), minute(6), got.Missed, minute(5))
			}
			if _, got, _ := missed("--key", failed, "--to", minute(5).Format(time.RFC3339)); len(got.Missed) != 0 {
				t.Errorf("--to %s lists %+v, want nothing", minute(5), got.Missed)
			}

			// The table: one row per missed window, the reason saying what each
			// cluster decided, quoted where a tenant wrote a newline; then a
			// summary; times in --tz.
			code, out, errOut := run(t, "missed", "--database-url", tg.DSN, "--key", nowhere, "--tz", "Europe/Berlin")
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if code != 0 || len(lines) < 3 || strings.Join(strings.Fields(lines[0]), " ") != "KEY WINDOW KIND DETECTED REASON" {
				t.Fatalf("missed table: exit %d %s:\n%s", code, errOut, out)
			}
			rows := tableRows(out, nowhere)
			if len(rows) != 1 || !strings.Contains(rows[0], minute(4).In(berlin).Format(time.RFC3339)) || !strings.Contains(rows[0], " no-run ") ||
				!strings.Contains(rows[0], "dc-a skip (stale: window started 3m ago)") || !strings.Contains(rows[0], `dc-b skip (stale\nforged line)`) {
				t.Errorf("missed table rows %q: want the window in Berlin time, no-run, and each cluster's decision, quoted", rows)
			}
			for _, l := range lines {
				if strings.HasPrefix(l, "forged line") {
					t.Errorf("a tenant's reason printed a line of its own: %q", l)
				}
			}
			if last := lines[len(lines)-1]; !strings.HasPrefix(last, "1 missed window since ") || !strings.HasSuffix(last, "; 0 silent keys") {
				t.Errorf("summary %q", last)
			}
			_, out, _ = run(t, "missed", "--database-url", tg.DSN, "--key", silent)
			if rows := tableRows(out, silent); !strings.Contains(out, "LAST-DECIDED") || len(rows) != 1 || !strings.Contains(rows[0], "1m0s") ||
				!strings.HasSuffix(strings.TrimSpace(out), "; 1 silent key") {
				t.Errorf("missed --key %s: want its row under KEY LAST-DECIDED PERIOD and the summary:\n%s", silent, out)
			}

			code, out, _ = run(t, "missed", "--database-url", tg.DSN, "--key", failed, "-o", "yaml")
			var fromYAML missedOutput
			if err := yaml.Unmarshal([]byte(out), &fromYAML); code != 0 || err != nil || len(fromYAML.Missed) != 1 ||
				!fromYAML.Missed[0].Window.Equal(minute(5)) || fromYAML.Missed[0].Kind != ledger.MissedFailed {
				t.Errorf("missed -o yaml: exit %d, %v, %+v:\n%s", code, err, fromYAML, out)
			}

			for _, tc := range []struct {
				key  string
				code int
			}{{allRan, 0}, {failed, 3}, {silent, 3}} {
				code, _, errOut := run(t, "missed", "--database-url", tg.DSN, "--key", tc.key, "--fail-on-missed")
				if code != tc.code || (tc.code == 3) != strings.Contains(errOut, "--fail-on-missed") {
					t.Errorf("missed --key %s --fail-on-missed: exit %d, stderr %q; want %d", tc.key, code, errOut, tc.code)
				}
			}
		})
	}
}
