package skew_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/test/previous"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, pgtest.Options{Name: "skew"})) }

// window0 is the first window of the story; window i is i-1 minutes later.
// Each pod gets its window explicitly, as the webhook renders it, so the
// story needs no clock ticks. They are recent ticks: a window older than the
// retention period is skipped as stale.
var window0 = time.Now().UTC().Truncate(time.Minute).Add(-30 * time.Minute)

func window(i int) time.Time { return window0.Add(time.Duration(i-1) * time.Minute) }

// cli runs a dislock CLI against the database.
func cli(t *testing.T, bin, dsn string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut strings.Builder
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "DISLOCK_DATABASE_URL="+dsn)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

func mustCLI(t *testing.T, bin, dsn string, args ...string) string {
	t.Helper()
	out, errOut, err := cli(t, bin, dsn, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", bin, strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// A platform team upgrades dislock one cluster at a time against one shared
// database, and rolls one cluster back: every window still runs exactly
// once, tokens only grow, and both releases' CLIs read every cluster's
// decisions. Everything goes through PgBouncer in transaction pooling mode.
func TestUpgradingOneClusterAtATime(t *testing.T) {
	srv := pgtest.Need(t)
	dsn := srv.BouncerDSN()
	root := repoRoot(t)
	prev := buildPrevious(t, root)
	cur := buildWorkingTree(t, root)
	ledger := t.TempDir() + "/ledger"
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.DirectDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	schemaVersion := func(t *testing.T) int {
		t.Helper()
		var v int
		if err := conn.QueryRow(ctx, `SELECT max(version) FROM dislock.schema_migrations`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if migrate.SchemaVersion() <= previous.Schema {
		t.Fatalf("this build knows schema %d, no newer than the previous release's %d: move previous.Commit and previous.Schema forward", migrate.SchemaVersion(), previous.Schema)
	}
	decisions := map[int]map[string]string{} // window → cluster → action

	windows := func(from, to int, dcA, dcB binaries, first string) {
		t.Helper()
		for i := from; i <= to; i++ {
			ds := race(t, dsn, ledger, window(i), map[string]string{"dc-a": dcA.agent, "dc-b": dcB.agent}, first)
			decisions[i] = map[string]string{}
			for c, d := range ds {
				decisions[i][c] = string(d.Action)
				t.Logf("window %d, %s: %s (token %d): %s", i, c, d.Action, d.Token, d.Reason)
			}
		}
	}

	t.Run("the previous release installs schema 5 and runs windows 1-3", func(t *testing.T) {
		mustCLI(t, prev.dislock, dsn, "migrate")
		if v := schemaVersion(t); v != previous.Schema {
			t.Fatalf("schema at %d after the previous release's migrate, want %d", v, previous.Schema)
		}
		windows(1, 3, prev, prev, "")
	})

	t.Run("dc-a is upgraded: its webhook migrates to the current schema; windows 4-6 race a new agent against an old one", func(t *testing.T) {
		mustCLI(t, cur.dislock, dsn, "migrate")
		if v := schemaVersion(t); v != migrate.SchemaVersion() {
			t.Fatalf("schema at %d after the current migrate, want %d", v, migrate.SchemaVersion())
		}
		// The previous release cannot be changed: it refuses any newer
		// schema. Its webhook logs this and keeps serving (docs/install.md).
		_, errOut, err := cli(t, prev.dislock, dsn, "migrate")
		if want := "newer than this dislock knows (5); upgrade dislock"; err == nil || !strings.Contains(errOut, want) {
			t.Fatalf("the previous release's migrate against schema %d: %v, %q; want it to fail saying %q", migrate.SchemaVersion(), err, errOut, want)
		}
		windows(4, 5, cur, prev, "")
		// The old agent claims and runs against the current schema, the new one skips.
		windows(6, 6, cur, prev, "dc-b")
		if d := decisions[6]; d["dc-b"] != "run" {
			t.Fatalf("window 6: %v; want the previous release's dc-b to run", d)
		}
	})

	t.Run("dc-b is upgraded too: windows 7-8", func(t *testing.T) {
		mustCLI(t, cur.dislock, dsn, "migrate")
		windows(7, 8, cur, cur, "")
	})

	t.Run("dc-a's agent is rolled back while the schema stays: window 9", func(t *testing.T) {
		windows(9, 9, prev, cur, "dc-a")
		if d := decisions[9]; d["dc-a"] != "run" {
			t.Fatalf("window 9: %v; want the rolled-back dc-a to run", d)
		}
	})

	const last = 9
	t.Run("every window ran exactly once, with ever larger tokens", func(t *testing.T) {
		ran := readLedger(t, ledger)
		var prevToken int64
		for i := 1; i <= last; i++ {
			runs := ran[window(i).Format(time.RFC3339)]
			if len(runs) != 1 {
				t.Fatalf("window %d ran %d times (%v); decisions %v", i, len(runs), runs, decisions[i])
			}
			if runs[0].token <= prevToken {
				t.Errorf("window %d's token %d is not above the previous window's %d", i, runs[0].token, prevToken)
			}
			prevToken = runs[0].token
			if d := decisions[i]; !(d["dc-a"] == "run") != (d["dc-b"] == "run") || d["dc-a"] == d["dc-b"] {
				t.Errorf("window %d: decisions %v, want one run and one skip", i, d)
			}
		}
		if len(ran) != last {
			t.Errorf("the ledger holds %d windows, want %d", len(ran), last)
		}
	})

	t.Run("both releases' CLIs list every window with the cluster that ran it", func(t *testing.T) {
		ran := readLedger(t, ledger)
		for name, bin := range map[string]string{"previous": prev.dislock, "current": cur.dislock} {
			out := mustCLI(t, bin, dsn, "windows", "--key", lockKey, "--limit", "100", "-o", "json")
			listed := listedOwners(t, out)
			for i := 1; i <= last; i++ {
				w := window(i).Format(time.RFC3339)
				want := ran[w][0].cluster
				if got := listed[w]; got.cluster != want || got.state != "succeeded" {
					t.Errorf("the %s release's `dislock windows` lists window %d as %+v, want run by %s, succeeded", name, i, got, want)
				}
			}
		}
	})

	t.Run("a future schema is used when it says it is compatible, and refused when not", func(t *testing.T) {
		next := migrate.SchemaVersion() + 1
		t.Cleanup(func() {
			if _, err := conn.Exec(ctx, `DELETE FROM dislock.schema_migrations WHERE version = $1`, next); err != nil {
				t.Error(err)
			}
		})
		if _, err := conn.Exec(ctx, `INSERT INTO dislock.schema_migrations (version, name, compatible_from) VALUES ($1, 'future.sql', $2)`, next, next-1); err != nil {
			t.Fatal(err)
		}
		out, errOut, err := cli(t, cur.dislock, dsn, "migrate")
		if err != nil {
			t.Fatalf("migrate against a compatible schema %d: %v\n%s", next, err, errOut)
		}
		// It says so, through the schema finding `dislock check` also gives.
		if want := fmt.Sprintf("newer than this dislock knows (%d), and every migration since is compatible with it", next-1); !strings.Contains(out, want) {
			t.Errorf("migrate against a compatible schema %d printed %q; want it to say %q", next, out, want)
		}
		// Its headline names the database's version, not this build's.
		if want := fmt.Sprintf("schema dislock is at version %d, newer than this dislock knows (%d) and compatible with it: nothing applied", next, next-1); !strings.Contains(out, want) {
			t.Errorf("migrate against a compatible schema %d printed %q; want its first line to say %q", next, out, want)
		}
		if _, err := conn.Exec(ctx, `UPDATE dislock.schema_migrations SET compatible_from = $1 WHERE version = $1`, next); err != nil {
			t.Fatal(err)
		}
		_, errOut, err = cli(t, cur.dislock, dsn, "migrate")
		for _, want := range []string{fmt.Sprintf("migration %d (future.sql)", next), fmt.Sprintf("upgrade this cluster's dislock to a release that knows schema version %d", next)} {
			if err == nil || !strings.Contains(errOut, want) {
				t.Errorf("migrate against an incompatible schema %d: %v, %q; want it to fail saying %q", next, err, errOut, want)
			}
		}
	})
}

type ledgerRun struct {
	cluster string
	token   int64
}

// readLedger groups what the apps recorded by window.
func readLedger(t *testing.T, path string) map[string][]ledgerRun {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]ledgerRun{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r ledgerRun
		var w string
		if _, err := fmt.Sscan(sc.Text(), &r.cluster, &w, &r.token); err != nil {
			t.Fatalf("ledger line %q: %v", sc.Text(), err)
		}
		out[w] = append(out[w], r)
	}
	return out
}

type listed struct{ cluster, state string }

// listedOwners reads `dislock windows -o json` (both releases print the
// same shape: the owners' rows) into the owner of every window.
func listedOwners(t *testing.T, out string) map[string]listed {
	t.Helper()
	var rows []struct {
		Key     string    `json:"key"`
		Window  time.Time `json:"window"`
		Cluster string    `json:"cluster"`
		State   string    `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("`dislock windows -o json`: %v\n%s", err, out)
	}
	m := map[string]listed{}
	for _, r := range rows {
		if r.Key == lockKey {
			m[r.Window.UTC().Format(time.RFC3339)] = listed{r.Cluster, r.State}
		}
	}
	return m
}
