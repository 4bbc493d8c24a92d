package cli_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

// `dislock tokens --new-epoch`, the restore procedure's step and the renewal
// of a filling counter: every token after it is above the one before, and
// the output says so; with a floor above the database it moves past the
// floor; bad flags name the fix.
func TestTokensMovesToANewEpochAboveEverythingBefore(t *testing.T) {
	t.Parallel() // its own server: the epoch moves
	srv := pgtest.New(t, pgtest.Options{Name: "cli-tokens"})
	dsn := srv.DirectDSN()
	s := migratedStore(t, dsn)
	ctx := context.Background()
	ns := namespace("tokens")
	grant := func(pod string) int64 {
		t.Helper()
		g, err := s.AcquireLease(ctx, ns+"/job-"+pod, store.Owner{Cluster: "dc-a", Namespace: ns, Job: "job", JobUID: "uid", Pod: pod}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return g.Lease.Token
	}
	before := grant("a")
	code, out, errOut := run(t, "tokens", "--database-url", dsn, "--new-epoch")
	if code != 0 || !strings.Contains(out, "moved the fencing tokens to epoch 17") || !strings.Contains(out, "a new epoch was asked for") {
		t.Fatalf("dislock tokens --new-epoch: exit %d\n%s%s", code, out, errOut)
	}
	after := grant("b")
	if after <= before {
		t.Fatalf("token %d after a new epoch, not above %d", after, before)
	}
	if e, off := store.TokenEpoch(after); e != 17 || off > 2 {
		t.Fatalf("token %d: epoch %d offset %d, want epoch 17 with the offset started again", after, e, off)
	}

	floor := int64(40)<<40 + 5
	code, out, errOut = run(t, "tokens", "--database-url", dsn, "--token-floor", fmt.Sprint(floor), "-o", "json")
	if code != 0 || !strings.Contains(out, `"epoch": 56`) || !strings.Contains(out, fmt.Sprint("behind the recorded high water ", floor)) {
		t.Fatalf("dislock tokens --token-floor %d: exit %d\n%s%s", floor, code, out, errOut)
	}
	if tok := grant("c"); tok <= floor {
		t.Fatalf("token %d, not above the floor %d", tok, floor)
	}
	code, out, errOut = run(t, "tokens", "--database-url", dsn)
	if code != 0 || !strings.Contains(out, "stay in epoch 56") {
		t.Fatalf("dislock tokens with nothing to move: exit %d\n%s%s", code, out, errOut)
	}

	for _, bad := range [][]string{{"--token-floor", "-1"}, {"--token-record", "no-slash"}} {
		if code, _, errOut := run(t, append([]string{"tokens", "--database-url", dsn}, bad...)...); code != 2 || !strings.Contains(errOut, bad[0][2:]) && !strings.Contains(errOut, "<namespace>/<name>") {
			t.Errorf("dislock tokens %v: exit %d, want 2 naming the flag: %s", bad, code, errOut)
		}
	}
}
