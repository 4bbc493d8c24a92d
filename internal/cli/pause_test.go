package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

func TestPauseStopsNewRunsEverywhereUntilResumeAndPausedListsIt(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			s := migratedStore(t, tg.DSN)
			ns := namespace("pausing")
			key := ns + "/report"
			code, out, errOut := run(t, "pause", "--database-url", tg.DSN, "--key", key, "--for", "2h", "--reason", "bad release", "--by", "alice")
			if code != 0 || !strings.Contains(out, key+` is paused by alice until `) || !strings.Contains(out, `("bad release")`) {
				t.Fatalf("pause: exit %d\n%s%s", code, out, errOut)
			}
			o := store.Owner{Cluster: "dc-a", Namespace: ns, Job: "report-1", JobUID: "u", Pod: "report-1-a"}
			_, err := s.ClaimWindow(context.Background(), store.ClaimRequest{Key: key, Window: dbNow(t, s).Truncate(time.Minute), Index: store.NotIndexed, Owner: o, TTL: time.Minute})
			if !errors.Is(err, store.ErrKeyPaused) {
				t.Fatalf("claim of the paused key: %v", err)
			}
			// Listed in its namespace only.
			_, out, _ = run(t, "paused", "--database-url", tg.DSN, "--namespace", ns, "-o", "json")
			var listed []struct {
				Key, PausedBy, Reason string
				Until                 *time.Time
			}
			if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 1 || listed[0].Key != key ||
				listed[0].PausedBy != "alice" || listed[0].Reason != "bad release" || listed[0].Until == nil {
				t.Fatalf("paused -o json: %v\n%s", err, out)
			}
			if _, out, _ = run(t, "paused", "--database-url", tg.DSN, "--namespace", ns+"-other"); !strings.Contains(out, "no key is paused") {
				t.Fatalf("paused of another namespace:\n%s", out)
			}
			if code, out, errOut = run(t, "resume", "--database-url", tg.DSN, "--key", key, "--by", "bob"); code != 0 || !strings.Contains(out, "resumed "+key) {
				t.Fatalf("resume: exit %d\n%s%s", code, out, errOut)
			}
			if c, err := s.ClaimWindow(context.Background(), store.ClaimRequest{Key: key, Window: dbNow(t, s).Truncate(time.Minute), Index: store.NotIndexed, Owner: o, TTL: time.Minute}); err != nil || c.Outcome != store.Claimed {
				t.Fatalf("claim after the resume: %+v, %v", c, err)
			}
			if code, out, _ = run(t, "resume", "--database-url", tg.DSN, "--key", key); code != 0 || !strings.Contains(out, "was not paused") {
				t.Fatalf("resume again: exit %d\n%s", code, out)
			}
		})
	}
}

func TestPauseFlagsSayWhatIsWrong(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pause"}, "--key is required"},
		{[]string{"pause", "--key", "a/b", "--for", "1h", "--until", "2026-12-07T06:00:00Z"}, "--for and --until both end the pause"},
		{[]string{"pause", "--key", "a/b", "--until", "tomorrow"}, `--until "tomorrow" is not an RFC 3339 time`},
		{[]string{"pause", "--key", "a/b", "--for", "-1h"}, "--for -1h0m0s is shorter than 1s"},
		{[]string{"pause", "--key", "a/b", "--for", "999ns"}, "--for 999ns is shorter than 1s"},
		{[]string{"pause", "--key", "a/b", "--reason", strings.Repeat("x", 1025)}, "--reason has 1025 bytes"},
		{[]string{"resume"}, "--key is required"},
		{[]string{"paused", "--namespace", "a/b"}, `--namespace "a/b" is not a namespace name`},
		{[]string{"windows", "--namespace", "a", "--key", "b/c"}, `--key "b/c" is not a key of --namespace "a"`},
	} {
		code, _, errOut := run(t, append(tc.args, "--database-url", "postgres://u:p@127.0.0.1:1/d?connect_timeout=1")...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, code, errOut, tc.want)
		}
	}
}
