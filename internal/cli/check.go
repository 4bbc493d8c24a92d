package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/dislock/dislock/lockagent/lock"
)

// errProblems makes `dislock check` exit non-zero after printing its findings.
var errProblems = errors.New("found problems that can lose claims or stop every job (see fix: lines)")

func setupCheck(fs *flag.FlagSet) func(context.Context, *common) error {
	allowAsync := fs.Bool(lock.AllowAsyncFlag[2:], false,
		"accept a database whose failover may lose commits (asynchronous replication, or a managed service whose replication dislock cannot see): "+
			"a window can then run twice after a failover; fencing tokens still never go back")
	return func(ctx context.Context, c *common) error {
		findings, err := c.store.CheckDatabase(ctx, lock.CheckOptions{AllowAsync: *allowAsync})
		if err != nil {
			return err
		}
		if err := c.print(findings, func(t *table) { printFindings(t, findings) }); err != nil {
			return err
		}
		if lock.Failed(findings) {
			return errProblems
		}
		return nil
	}
}

// printFindings writes one line per finding, and the fix under any that is
// not ok.
func printFindings(t *table, findings []lock.Finding) {
	for _, f := range findings {
		t.row(string(f.Status), f.Check, f.Detail)
		if f.Fix != "" {
			t.row("", "", "fix: "+f.Fix)
		}
	}
}

// migrateFindings checks the database after a migration and renders what
// is not ok as lines for the migrate output: migrate still succeeds.
func migrateFindings(ctx context.Context, s *lock.Store) ([]lock.Finding, error) {
	findings, err := s.CheckDatabase(ctx, lock.CheckOptions{})
	if err != nil {
		return nil, fmt.Errorf("checking the database after migrating: %w", err)
	}
	var notOK []lock.Finding
	for _, f := range findings {
		if f.Status != lock.StatusOK {
			notOK = append(notOK, f)
		}
	}
	return notOK, nil
}
