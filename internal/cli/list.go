package cli

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/dislock/dislock/lockagent/lock"
)

func setupWindows(fs *flag.FlagSet) func(context.Context, *common) error {
	key := fs.String("key", "", "only this lock key <namespace>/<name>")
	limit := fs.Int("limit", DefaultWindowsLimit, "show at most this many windows, newest first")
	return func(ctx context.Context, c *common) error {
		if err := validKey(*key, false); err != nil {
			return err
		}
		if *limit <= 0 {
			return usageError{fmt.Errorf("--limit %d must be positive", *limit)}
		}
		rows, dbNow, err := c.store.ListWindows(ctx, *key, *limit)
		if err != nil {
			return err
		}
		if rows == nil {
			rows = []lock.Window{}
		}
		return c.print(rows, func(t *table) {
			t.row("KEY", "WINDOW", "STATE", "CLUSTER", "TOKEN", "DURATION", "EXIT", "OWNER")
			for _, w := range rows {
				t.row(w.Key, w.Start.Format(time.RFC3339), string(w.State), w.Cluster, fmt.Sprint(w.Token),
					windowDuration(w, dbNow), exitCode(w.ExitCode), w.Owner)
			}
		})
	}
}

// windowDuration is how long the run took, or has been running, by database time.
func windowDuration(w lock.Window, dbNow time.Time) string {
	switch {
	case w.FinishedAt != nil:
		return w.FinishedAt.Sub(w.ClaimedAt).Round(time.Millisecond).String()
	case w.State == lock.StateRunning && w.AliveUntil.After(dbNow):
		return dbNow.Sub(w.ClaimedAt).Round(time.Second).String() + " so far"
	case w.State == lock.StateRunning:
		return "owner silent since " + w.AliveUntil.Format(time.RFC3339)
	}
	return "-"
}

func exitCode(c *int) string {
	if c == nil {
		return "-"
	}
	return fmt.Sprint(*c)
}

func setupLeases(*flag.FlagSet) func(context.Context, *common) error {
	return func(ctx context.Context, c *common) error {
		rows, dbNow, err := c.store.ListLeases(ctx)
		if err != nil {
			return err
		}
		type leaseView struct {
			lock.Lease
			Live bool `json:"live"`
		}
		views := make([]leaseView, 0, len(rows))
		for _, l := range rows {
			views = append(views, leaseView{l, l.ExpireAt.After(dbNow)})
		}
		return c.print(views, func(t *table) {
			t.row("KEY", "STATE", "TOKEN", "HELD FOR", "EXPIRES", "OWNER")
			for _, l := range views {
				// An expired lease was held until it expired (or was released).
				state, expires, until := "expired", "-", l.ExpireAt
				if l.Live {
					state, expires, until = "held", "in "+l.ExpireAt.Sub(dbNow).Round(time.Second).String(), dbNow
				}
				t.row(l.Key, state, fmt.Sprint(l.Token), until.Sub(l.AcquiredAt).Round(time.Second).String(), expires, l.Owner)
			}
		})
	}
}
