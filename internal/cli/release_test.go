package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

// `dislock release --dry-run` says whose lease it would expire, or which
// window rows it would delete (warning about a run that is alive), from the
// current rows, and changes nothing; where there is nothing to release it
// fails as the release would.
func TestReleaseDryRunSaysWhatItWouldDoAndChangesNothing(t *testing.T) {
	srv := pgtest.Need(t)
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			ctx := context.Background()
			s := migratedStore(t, tg.DSN)
			ns := namespace("dry-run")
			key := ns + "/sync"
			a := store.Owner{Cluster: "dc-a", Namespace: ns, Job: "sync-1", JobUID: "u1", Pod: "p1"}
			g, err := s.AcquireLease(ctx, key, a, time.Hour)
			if err != nil {
				t.Fatal(err)
			}

			code, out, errOut := run(t, "release", "--database-url", tg.DSN, "--key", key, "--dry-run")
			if code != 0 {
				t.Fatalf("release --dry-run: exit %d: %s", code, errOut)
			}
			for _, want := range []string{"would release the lease of " + key + " held by " + a.LeaseOwner(), fmt.Sprintf("token %d", g.Lease.Token), "nothing changed"} {
				if !strings.Contains(out, want) {
					t.Errorf("release --dry-run says %q, lacking %q", out, want)
				}
			}
			_, out, _ = run(t, "release", "--database-url", tg.DSN, "--key", key, "--dry-run", "-o", "json")
			var res struct {
				DryRun bool        `json:"dryRun"`
				Lease  store.Lease `json:"lease"`
			}
			if err := json.Unmarshal([]byte(out), &res); err != nil || !res.DryRun || res.Lease.Owner != a.LeaseOwner() {
				t.Errorf("release --dry-run -o json: %v %+v:\n%s", err, res, out)
			}
			l, now, err := s.GetLease(ctx, key)
			if err != nil || !l.ExpireAt.After(now) || l.Token != g.Lease.Token {
				t.Fatalf("after the dry runs the lease is %+v at %s (%v), want it still held with token %d", l, now, err, g.Lease.Token)
			}

			// A window whose run is alive: deleting it would let another pod
			// run it at the same time, which the dry run says.
			w := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
			runWindow(t, s, key, w, "dc-b", store.StateRunning, time.Hour)
			code, out, errOut = run(t, "release", "--database-url", tg.DSN, "--key", key, "--window", w.Format(time.RFC3339), "--dry-run")
			if code != 0 {
				t.Fatalf("release --window --dry-run: exit %d: %s", code, errOut)
			}
			for _, want := range []string{"would delete window 2026-12-02T12:00:00Z of " + key + " (1 row(s))", "dc-b/" + ns, "running",
				"WARNING index - is running and its owner is alive", "nothing changed"} {
				if !strings.Contains(out, want) {
					t.Errorf("release --window --dry-run lacks %q:\n%s", want, out)
				}
			}
			if got, err := s.GetWindow(ctx, key, w, store.NotIndexed); err != nil || got.State != store.StateRunning {
				t.Fatalf("after the dry run the window is %+v (%v), want it still running", got, err)
			}

			// Nothing to release: the dry run fails as the release would.
			for _, args := range [][]string{
				{"--key", ns + "/free"},
				{"--key", key, "--window", w.Add(time.Minute).Format(time.RFC3339)},
			} {
				code, _, errOut := run(t, append([]string{"release", "--database-url", tg.DSN, "--dry-run"}, args...)...)
				if code != 1 || !strings.Contains(errOut, "not found") || !strings.Contains(errOut, "nothing changed") {
					t.Errorf("release --dry-run %q: exit %d, stderr %q; want 1, not found, nothing changed", args, code, errOut)
				}
			}
			if err := s.ForceReleaseLease(ctx, key); err != nil {
				t.Fatal(err)
			}
			code, _, errOut = run(t, "release", "--database-url", tg.DSN, "--key", key, "--dry-run")
			if code != 1 || !strings.Contains(errOut, "no one holds it") || !strings.Contains(errOut, a.LeaseOwner()) {
				t.Errorf("release --dry-run of an expired lease: exit %d, stderr %q; want 1 naming the last holder", code, errOut)
			}
		})
	}
}
