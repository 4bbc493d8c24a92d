package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
)

// errProblems makes `dislock check` exit non-zero after printing its findings.
var errProblems = errors.New("found problems that can lose claims or stop every job (see fix: lines)")

func setupCheck(fs *flag.FlagSet) func(context.Context, *common) error {
	allowAsync := fs.Bool(check.AllowAsyncFlag[2:], false,
		"accept a database whose failover may lose commits (asynchronous replication, or a managed service whose replication dislock cannot see): "+
			"a window can then run twice after a failover; fencing tokens still never go back")
	var tenants urlList
	fs.Var(&tenants, "tenant-database-url",
		"also check a namespace's tenant role with this URL (the namespace's Secret dislock-db, key url); repeatable")
	var floor tokenFloor
	floor.flags(fs)
	return func(ctx context.Context, c *common) error {
		opts, err := floor.checkOptions(ctx, check.Options{AllowAsync: *allowAsync})
		if err != nil {
			return err
		}
		// The owner's URL first, then each tenant's: one role's failure
		// does not stop the others' checks.
		reports := []check.RoleReport{check.URL(ctx, c.databaseURL, opts)}
		for _, u := range tenants {
			reports = append(reports, check.URL(ctx, u, opts))
		}
		var all []check.Finding
		for _, r := range reports {
			for _, f := range r.Findings {
				f.Role = r.Heading()
				all = append(all, f)
			}
		}
		if err := c.print(all, func(t *table) {
			for _, r := range reports {
				t.line("%s:", r.Heading())
				printFindings(t, r.Findings)
			}
		}); err != nil {
			return err
		}
		if check.Failed(all) {
			return errProblems
		}
		return nil
	}
}

// urlList collects a repeatable URL flag. Its String never shows a value:
// flag prints defaults with it, and the values hold passwords.
type urlList []string

func (l *urlList) String() string { return "" }

func (l *urlList) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("empty URL (want postgres://<role>:<password>@<host>:<port>/<database>)")
	}
	*l = append(*l, v)
	return nil
}

// printFindings writes one line per finding, and the fix under any that is
// not ok. A detail of several lines (a driver's error for each address it
// tried) is joined into one with "; ": never split into rows, since a
// detail may carry what a tenant chose (its role name, its server's error),
// which must not print a line of its own such as a forged "fix:".
func printFindings(t *table, findings []check.Finding) {
	for _, f := range findings {
		var lines []string
		for l := range strings.Lines(f.Detail) {
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, l)
			}
		}
		t.row(string(f.Status), f.Check, strings.Join(lines, "; "))
		if f.Fix != "" {
			t.row("", "", "fix: "+f.Fix)
		}
	}
}

// migrateFindings checks the database after a migration and renders what
// is not ok as lines for the migrate output: migrate still succeeds.
func migrateFindings(ctx context.Context, s *store.Store) ([]check.Finding, error) {
	findings, err := check.Database(ctx, s, check.Options{})
	if err != nil {
		return nil, fmt.Errorf("checking the database after migrating: %w", err)
	}
	var notOK []check.Finding
	for _, f := range findings {
		if f.Status != check.StatusOK {
			notOK = append(notOK, f)
		}
	}
	return notOK, nil
}
