package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

func index(i int) string {
	if i == store.NotIndexed {
		return "-"
	}
	return fmt.Sprint(i)
}

// disagreements warns, for each listed key, about clusters whose recent view
// of the job differs: one tick may then be a different window in each.
func disagreements(ctx context.Context, s *store.Store, listed map[string]bool) ([]string, error) {
	views, err := s.ListDisagreements(ctx, store.DefaultViewRecency)
	if err != nil {
		return nil, err
	}
	byKey := map[string][]string{}
	var keys []string
	for _, v := range views {
		if !listed[v.Key] {
			continue
		}
		if byKey[v.Key] == nil {
			keys = append(keys, v.Key)
		}
		byKey[v.Key] = append(byKey[v.Key], fmt.Sprintf("%s: schedule %q timeZone %q mode %s standby %t leaseTTL %s catchup %q",
			v.Cluster, v.View.Schedule, v.View.TimeZone, v.View.Mode, v.View.Standby, v.View.LeaseTTL, v.View.Catchup))
	}
	var out []string
	for _, k := range keys {
		out = append(out, fmt.Sprintf("WARNING clusters disagree about %s (make the CronJobs identical; set spec.timeZone): %s",
			k, strings.Join(byKey[k], "; ")))
	}
	return out, nil
}

// windowDuration is how long the run took, or has been running, by database
// time; a time it names is in zone loc.
func windowDuration(w store.Window, dbNow time.Time, loc *time.Location) string {
	switch {
	case w.FinishedAt != nil:
		return w.FinishedAt.Sub(w.ClaimedAt).Round(time.Millisecond).String()
	case w.State == store.StateRunning && w.AliveUntil.After(dbNow):
		return dbNow.Sub(w.ClaimedAt).Round(time.Second).String() + " so far"
	case w.State == store.StateRunning:
		return "owner silent since " + w.AliveUntil.In(loc).Format(time.RFC3339)
	}
	return "-"
}

func exitCode(c *int) string {
	if c == nil {
		return "-"
	}
	return fmt.Sprint(*c)
}

func setupLeases(fs *flag.FlagSet) func(context.Context, *common) error {
	sc := addScope(fs)
	limit := fs.Int("limit", 0, "list at most this many leases, by key (0: all)")
	return func(ctx context.Context, c *common) error {
		if err := sc.validate(); err != nil {
			return err
		}
		if *limit < 0 {
			return usageError{fmt.Errorf("--limit %d is negative", *limit)}
		}
		rows, dbNow, err := c.store.ListLeasesOf(ctx, store.LeaseFilter{Namespace: sc.namespace, Key: sc.key, Limit: *limit})
		if err != nil {
			return err
		}
		type leaseView struct {
			store.Lease
			Live bool `json:"live"`
		}
		views := make([]leaseView, 0, len(rows))
		for _, l := range rows {
			if !sc.covers(store.PauseKey(l.Key)) {
				continue
			}
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
