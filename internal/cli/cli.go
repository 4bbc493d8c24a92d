// Package cli is the operator's command line: migrate the schema, read which
// cluster ran which window, inspect and release leases. It answers questions
// such as "which DC ran the 12:00 run of ns/report, how long did it take, did
// it succeed" from the same tables the agents write.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/dislock/dislock/internal/version"
	"github.com/dislock/dislock/lockagent/lock"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	// exitProblems: `dislock check` ran and found problems.
	exitProblems = 3
)

// EnvDatabaseURL is read when --database-url is not given.
const EnvDatabaseURL = "DISLOCK_DATABASE_URL"

// DefaultWindowsLimit bounds `dislock windows` output.
const DefaultWindowsLimit = 50

// Main runs one operator command and returns the process exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "dislock: unknown command %q\n\n", args[0])
		usage(stderr)
		return exitUsage
	}
	fs := flag.NewFlagSet("dislock "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &common{}
	fs.StringVar(&c.output, "o", "table", "output format: table or json")
	if cmd.db {
		fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL URL (default $"+EnvDatabaseURL+")")
	}
	run := cmd.setup(fs)
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
	if c.output != "table" && c.output != "json" {
		fmt.Fprintf(stderr, "dislock %s: -o %q is not a format (want table or json)\n", args[0], c.output)
		return exitUsage
	}
	c.stdout = stdout
	if cmd.db {
		if c.databaseURL == "" {
			c.databaseURL = os.Getenv(EnvDatabaseURL)
		}
		s, err := lock.Open(ctx, c.databaseURL, lock.Options{MaxConns: 2})
		if err != nil {
			fmt.Fprintf(stderr, "dislock %s: %v\n", args[0], err)
			return exitError
		}
		defer s.Close()
		c.store = s
	}
	if err := run(ctx, c); err != nil {
		fmt.Fprintf(stderr, "dislock %s: %v\n", args[0], err)
		var u usageError
		if errors.As(err, &u) {
			return exitUsage
		}
		if errors.Is(err, errProblems) {
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
	store       *lock.Store
	stdout      io.Writer
}

type usageError struct{ error }

type command struct {
	summary string
	db      bool
	// setup registers the command's flags and returns its body.
	setup func(fs *flag.FlagSet) func(ctx context.Context, c *common) error
}

var commands = map[string]command{
	"migrate": {"create or upgrade schema dislock", true, setupMigrate},
	"check":   {"check the database: primary, synchronous replication, schema, fencing tokens", true, setupCheck},
	"windows": {"list schedule windows: who ran them, when, how it ended", true, setupWindows},
	"leases":  {"list leases and who holds them", true, setupLeases},
	"release": {"release a lease, or delete a window so that it can run again", true, setupRelease},
	"version": {"print the version and schema version", false, setupVersion},
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: dislock <command> [flags]\n\nCommands:\n")
	for _, name := range []string{"migrate", "check", "windows", "leases", "release", "version"} {
		fmt.Fprintf(w, "  %-8s %s\n", name, commands[name].summary)
	}
	fmt.Fprintf(w, "\nThe database URL comes from --database-url or $%s. Run `dislock <command> -h` for flags.\n", EnvDatabaseURL)
}

func setupMigrate(*flag.FlagSet) func(context.Context, *common) error {
	return func(ctx context.Context, c *common) error {
		applied, err := c.store.Migrate(ctx)
		if err != nil {
			return err
		}
		warnings, err := migrateFindings(ctx, c.store)
		if err != nil {
			return err
		}
		res := struct {
			Applied       []int          `json:"applied"`
			SchemaVersion int            `json:"schemaVersion"`
			Warnings      []lock.Finding `json:"warnings,omitempty"`
		}{Applied: applied, SchemaVersion: lock.SchemaVersion(), Warnings: warnings}
		if res.Applied == nil {
			res.Applied = []int{}
		}
		return c.print(res, func(t *table) {
			if len(applied) == 0 {
				t.line("schema dislock is up to date (version %d)", res.SchemaVersion)
			} else {
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
		}{version.Version, version.Commit, lock.SchemaVersion()}
		return c.print(res, func(t *table) {
			t.line("dislock %s (commit %s, schema version %d)", res.Version, res.Commit, res.SchemaVersion)
		})
	}
}

func setupRelease(fs *flag.FlagSet) func(context.Context, *common) error {
	key := fs.String("key", "", "lock key <namespace>/<name> (required)")
	window := fs.String("window", "", "delete this window (RFC 3339) instead of releasing the lease")
	return func(ctx context.Context, c *common) error {
		if err := validKey(*key, true); err != nil {
			return err
		}
		if *window == "" {
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
		if err := c.store.DeleteWindow(ctx, *key, w); err != nil {
			return err
		}
		return c.print(map[string]string{"released": "window", "key": *key, "window": w.UTC().Format(time.RFC3339)}, func(t *table) {
			t.line("deleted window %s of %s: the next claim of it runs it again", w.UTC().Format(time.RFC3339), *key)
		})
	}
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

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}
