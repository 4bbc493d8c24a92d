// Package cli is the operator's command line: migrate the schema, read which
// cluster ran which window and what every cluster decided, find the windows
// that ran nowhere, inspect and release leases, pause and resume keys in
// every cluster. It answers questions such as
// "which DC ran the 12:00 run of ns/report, how long did it take, did it
// succeed, why did dc-b skip it" from the same tables the agents write.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/dislock/dislock/internal/flagusage"
	"github.com/dislock/dislock/internal/version"
	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/migrate"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	// exitProblems: `dislock check` ran and found problems, or `dislock
	// missed --fail-on-missed` listed something.
	exitProblems = 3
)

// DefaultWindowsLimit bounds `dislock windows` output.
const DefaultWindowsLimit = 50

// Main runs one operator command and returns the process exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return run(ctx, nil, args, stdout, stderr)
}

// Served are the commands a cluster's webhook runs for `kubectl dislock`
// (webhook/pluginapi), on its own Store: what they print is what dislock
// prints.
var Served = []string{"windows", "missed", "leases", "paused", "pause", "resume"}

// MainWithStore runs one of the Served commands on s (no --database-url),
// as Main does.
func MainWithStore(ctx context.Context, s *store.Store, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || !slices.Contains(Served, args[0]) {
		fmt.Fprintf(stderr, "dislock: %q is not a command served through the cluster (want %s)\n", strings.Join(args[:min(len(args), 1)], ""), orList(Served))
		return exitUsage
	}
	return run(ctx, s, args, stdout, stderr)
}

func run(ctx context.Context, s *store.Store, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] == "--version" {
		args = []string{"version"}
	}
	if args[0] == "completion" {
		return completion(args[1:], stdout, stderr)
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "dislock: unknown command %q\n\n", args[0])
		usage(stderr)
		return exitUsage
	}
	c := &common{store: s}
	fs, body := cmd.flags(args[0], c, stderr)
	formats := cmd.outputFormats()
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "dislock %s: unexpected argument %q (flags only; see -h)\n", args[0], fs.Arg(0))
		return exitUsage
	}
	if !slices.Contains(formats, c.output) {
		fmt.Fprintf(stderr, "dislock %s: -o %q is not a format of dislock %s (want %s)\n", args[0], c.output, args[0], orList(formats))
		return exitUsage
	}
	c.stdout, c.stderr = stdout, stderr
	if cmd.db && c.store == nil {
		if c.databaseURL == "" {
			c.databaseURL = os.Getenv(contract.EnvDatabaseURL)
		}
		s, err := store.Open(ctx, c.databaseURL, store.Options{MaxConns: 2})
		if err != nil {
			fmt.Fprintf(stderr, "dislock %s: %v\n", args[0], err)
			return exitError
		}
		defer s.Close()
		c.store = s
	}
	if err := body(ctx, c); err != nil {
		fmt.Fprintf(stderr, "dislock %s: %v\n", args[0], err)
		var u usageError
		if errors.As(err, &u) {
			return exitUsage
		}
		if errors.Is(err, errProblems) || errors.Is(err, errMissedFound) {
			return exitProblems
		}
		return exitError
	}
	return exitOK
}

// common is what every command gets after flag parsing.
type common struct {
	output      string
	databaseURL string
	store       *store.Store
	stdout      io.Writer
	// stderr is for what a long-running command notes on the side (a
	// --watch that lost the database for a while).
	stderr io.Writer
}

type usageError struct{ error }

type command struct {
	summary string
	db      bool
	// setup registers the command's flags and returns its body.
	setup func(fs *flag.FlagSet) func(ctx context.Context, c *common) error
	// formats are the -o values the command prints; nil means table and
	// json.
	formats []string
}

// flags is the command's flag set, writing its usage to stderr, and its
// body; what the flags set lands in c.
func (cmd command) flags(name string, c *common, stderr io.Writer) (*flag.FlagSet, func(context.Context, *common) error) {
	fs := flag.NewFlagSet("dislock "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.output, "o", formatTable, "output format: "+orList(cmd.outputFormats()))
	if cmd.db && c.store == nil {
		fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL URL (default $"+contract.EnvDatabaseURL+")")
	}
	run := cmd.setup(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: dislock %s [flags]\n\n%s\n\nFlags:\n", name, cmd.summary)
		flagusage.Print(stderr, fs)
	}
	return fs, run
}

func (c command) outputFormats() []string {
	if c.formats == nil {
		return []string{formatTable, formatJSON}
	}
	return c.formats
}

var commands = map[string]command{
	"migrate": {"create or upgrade schema dislock", true, setupMigrate, nil},
	"check":   {"preflight each role's URL (--tenant-database-url too): connection, pooling, TLS, clock, privileges, primary, synchronous replication, schema, fencing tokens", true, setupCheck, nil},
	"windows": {"list schedule windows: who ran them, when, how it ended, what every cluster decided", true, setupWindows,
		[]string{formatTable, formatWide, formatJSON, formatYAML}},
	"missed": {"find and list the windows that ran nowhere, and the keys nobody decides for", true, setupMissed,
		[]string{formatTable, formatJSON, formatYAML}},
	"leases":  {"list leases and who holds them", true, setupLeases, nil},
	"release": {"release a lease, or delete a window so that it can run again", true, setupRelease, nil},
	"pause":   {"pause a key in every cluster: its pods skip, saying who paused it, until when and why; a run already going goes on", true, setupPause, nil},
	"resume":  {"resume a paused key in every cluster: its next window runs", true, setupResume, nil},
	"paused":  {"list the keys paused now", true, setupPaused, nil},
	"tokens":  {"confirm the fencing token epoch, moving it past a restore or a recorded high water (--new-epoch: always)", true, setupTokens, nil},
	"version": {"print the version and schema version", false, setupVersion, nil},
}

// commandOrder is the order usage lists the commands in.
var commandOrder = []string{"migrate", "check", "windows", "missed", "leases", "release", "pause", "resume", "paused", "tokens", "version"}

// servers are the commands main runs before this package: the ones a
// Deployment runs, with flags of their own (`dislock <server> -h`).
var servers = [][2]string{
	{"webhook", "the admission webhook server (the chart runs it in each cluster)"},
	{"gateway", "the lock gateway: runs the pods' lock calls on its own database connections (one per cluster)"},
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: dislock <command> [flags]\n\nCommands:\n")
	for _, name := range commandOrder {
		fmt.Fprintf(w, "  %-10s %s\n", name, commands[name].summary)
	}
	fmt.Fprintf(w, "  %-10s %s\n", "completion", completionSummary)
	fmt.Fprintf(w, "\nServers:\n")
	for _, sv := range servers {
		fmt.Fprintf(w, "  %-10s %s\n", sv[0], sv[1])
	}
	fmt.Fprintf(w, "\nThe database URL comes from --database-url or $%s. Run `dislock <command> -h` for flags, `dislock --version` for the version.\n", contract.EnvDatabaseURL)
}

func setupMigrate(*flag.FlagSet) func(context.Context, *common) error {
	return func(ctx context.Context, c *common) error {
		applied, err := migrate.Up(ctx, c.store)
		if err != nil {
			return err
		}
		// A newer schema compatible with this build is left as it is: say
		// so, rather than "up to date" at a version the database is not at.
		state, err := migrate.Schema(ctx, c.store)
		if err != nil {
			return err
		}
		warnings, err := migrateFindings(ctx, c.store)
		if err != nil {
			return err
		}
		res := struct {
			Applied       []int           `json:"applied"`
			SchemaVersion int             `json:"schemaVersion"`
			KnownVersion  int             `json:"knownVersion"`
			Warnings      []check.Finding `json:"warnings,omitempty"`
		}{Applied: applied, SchemaVersion: state.Current, KnownVersion: state.Known, Warnings: warnings}
		if res.Applied == nil {
			res.Applied = []int{}
		}
		return c.print(res, func(t *table) {
			switch {
			case state.Newer():
				t.line("schema dislock is at version %d, newer than this dislock knows (%d) and compatible with it: nothing applied", state.Current, state.Known)
			case len(applied) == 0:
				t.line("schema dislock is up to date (version %d)", res.SchemaVersion)
			default:
				t.line("applied migrations %s; schema dislock is at version %d", joinInts(applied), res.SchemaVersion)
			}
			if len(warnings) > 0 {
				t.line("the database has problems (`dislock check` explains them and exits non-zero):")
				printFindings(t, warnings)
			}
		})
	}
}

func setupVersion(*flag.FlagSet) func(context.Context, *common) error {
	return func(_ context.Context, c *common) error {
		res := struct {
			Version       string `json:"version"`
			Commit        string `json:"commit"`
			SchemaVersion int    `json:"schemaVersion"`
		}{version.Version, version.Commit, migrate.SchemaVersion()}
		return c.print(res, func(t *table) {
			t.line("dislock %s (commit %s, schema version %d)", res.Version, res.Commit, res.SchemaVersion)
		})
	}
}

func setupRelease(fs *flag.FlagSet) func(context.Context, *common) error {
	key := fs.String("key", "", "lock key <namespace>/<name> (required)")
	window := fs.String("window", "", "delete this window (RFC 3339) instead of releasing the lease")
	dryRun := fs.Bool("dry-run", false, "print what would be released or deleted, from the current rows, and change nothing")
	return func(ctx context.Context, c *common) error {
		if err := validKey(*key, true); err != nil {
			return err
		}
		if *window == "" {
			if *dryRun {
				return releaseLeaseDryRun(ctx, c, *key)
			}
			if err := c.store.ForceReleaseLease(ctx, *key); err != nil {
				return err
			}
			return c.print(map[string]string{"released": "lease", "key": *key}, func(t *table) {
				t.line("released the lease of %s", *key)
			})
		}
		w, err := time.Parse(time.RFC3339, *window)
		if err != nil {
			return usageError{fmt.Errorf("--window %q is not an RFC 3339 time (want e.g. 2026-12-02T12:00:00Z)", *window)}
		}
		if *dryRun {
			return deleteWindowDryRun(ctx, c, *key, w)
		}
		if err := c.store.DeleteWindow(ctx, *key, w); err != nil {
			return err
		}
		return c.print(map[string]string{"released": "window", "key": *key, "window": w.UTC().Format(time.RFC3339)}, func(t *table) {
			t.line("deleted window %s of %s: the next claim of it runs it again", w.UTC().Format(time.RFC3339), *key)
		})
	}
}

// dryRunNote ends every line of a dry run that found something to do.
const dryRunNote = "nothing changed (--dry-run)"

// releaseLeaseDryRun says whose lease `release` would expire. Like the
// release itself, it fails when no live lease exists.
func releaseLeaseDryRun(ctx context.Context, c *common, key string) error {
	l, dbNow, err := c.store.GetLease(ctx, key)
	if err != nil {
		return fmt.Errorf("%w: release would fail; %s", err, dryRunNote)
	}
	if !l.ExpireAt.After(dbNow) {
		return fmt.Errorf("lease %s: %w: no one holds it (it expired at %s; last holder %s): release would fail; %s",
			key, store.ErrNotFound, l.ExpireAt.Format(time.RFC3339), printable(l.Owner), dryRunNote)
	}
	res := struct {
		DryRun       bool        `json:"dryRun"`
		WouldRelease string      `json:"wouldRelease"`
		Key          string      `json:"key"`
		Lease        store.Lease `json:"lease"`
	}{true, "lease", key, l}
	return c.print(res, func(t *table) {
		t.line("would release the lease of %s held by %s (token %d, held for %s, expires in %s); %s",
			key, l.Owner, l.Token, dbNow.Sub(l.AcquiredAt).Round(time.Second), l.ExpireAt.Sub(dbNow).Round(time.Second), dryRunNote)
	})
}

// deleteWindowDryRun lists the rows (one per completion index) that
// `release --window` would delete, and warns about a run that is still
// alive: deleting its window lets another cluster run it at the same time.
func deleteWindowDryRun(ctx context.Context, c *common, key string, w time.Time) error {
	start := w.UTC().Truncate(time.Microsecond) // the database's resolution
	rows, dbNow, err := c.store.ListWindowsIn(ctx, store.WindowFilter{Key: key, From: start, To: start.Add(time.Microsecond)})
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		return fmt.Errorf("window %s of %s: %w: release would fail; %s", start.Format(time.RFC3339), key, store.ErrNotFound, dryRunNote)
	}
	res := struct {
		DryRun       bool           `json:"dryRun"`
		WouldRelease string         `json:"wouldRelease"`
		Key          string         `json:"key"`
		Window       time.Time      `json:"window"`
		Rows         []store.Window `json:"rows"`
	}{true, "window", key, start, rows}
	return c.print(res, func(t *table) {
		t.line("would delete window %s of %s (%d row(s)); the next claim of it would run it again; %s",
			start.Format(time.RFC3339), key, len(rows), dryRunNote)
		t.row("INDEX", "STATE", "CLUSTER", "TOKEN", "DURATION", "EXIT", "OWNER")
		for _, r := range rows {
			t.row(index(r.Index), string(r.State), r.Cluster, fmt.Sprint(r.Token), windowDuration(r, dbNow, time.UTC), exitCode(r.ExitCode), r.Owner)
		}
		for _, r := range rows {
			if r.State == store.StateRunning && r.AliveUntil.After(dbNow) {
				t.line("WARNING index %s is running and its owner is alive: once the window is deleted another pod can claim it and run it while this run goes on", index(r.Index))
			}
		}
	})
}

// validKey checks a <namespace>/<name> key given on the command line.
func validKey(key string, required bool) error {
	if key == "" {
		if required {
			return usageError{errors.New("--key is required (want <namespace>/<name>, e.g. default/report)")}
		}
		return nil
	}
	ns, name, ok := strings.Cut(key, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return usageError{fmt.Errorf("--key %q is not <namespace>/<name> (e.g. default/report)", key)}
	}
	return nil
}

// orList joins choices as "a, b or c".
func orList(choices []string) string {
	if len(choices) < 2 {
		return strings.Join(choices, "")
	}
	return strings.Join(choices[:len(choices)-1], ", ") + " or " + choices[len(choices)-1]
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}
