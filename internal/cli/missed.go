package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/ledger"
)

// DefaultMissedSince is how far back `dislock missed` lists by default.
const DefaultMissedSince = 24 * time.Hour

// errMissedFound makes `dislock missed --fail-on-missed` exit non-zero
// after printing what it found.
var errMissedFound = errors.New("found missed windows or silent keys (--fail-on-missed)")

// missedReport is what `dislock missed` prints.
type missedReport struct {
	Missed []ledger.MissedWindow `json:"missed"`
	Silent []silentKey           `json:"silent"`
	// NewlyDetected counts the listed windows this run's detection found
	// (another cluster's webhook, or an earlier run, found the others).
	NewlyDetected int `json:"newlyDetected"`
	// Problems are keys the detection could not judge.
	Problems []string `json:"problems,omitempty"`
}

// silentKey is ledger.SilentKey with its period as text (e.g. "1h0m0s").
type silentKey struct {
	Key          string    `json:"key"`
	LastDecided  time.Time `json:"lastDecided"`
	Period       string    `json:"period"`
	ExpectedNext time.Time `json:"expectedNext"`
}

func setupMissed(fs *flag.FlagSet) func(context.Context, *common) error {
	sc := addScope(fs)
	limit := fs.Int("limit", store.DefaultListLimit, "list at most this many missed windows, newest first")
	tr := addTimeRange(fs, DefaultMissedSince, "only windows that started within this `duration` before now, by database time (0: no bound)")
	failOnMissed := fs.Bool("fail-on-missed", false, fmt.Sprintf("exit %d when a missed window or a silent key is listed", exitProblems))
	return func(ctx context.Context, c *common) error {
		var errs []error
		if err := sc.validate(); err != nil {
			errs = append(errs, err)
		}
		if *limit <= 0 {
			errs = append(errs, fmt.Errorf("--limit %d must be positive", *limit))
		}
		if err := tr.parse(); err != nil {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			return usageError{err}
		}
		// The detection is idempotent and safe beside every webhook's:
		// each window is judged and recorded once, whoever runs it.
		det, err := ledger.DetectMissed(ctx, c.store, ledger.MissedOptions{Namespace: sc.namespace})
		if err != nil {
			return err
		}
		from, to, err := tr.resolve(ctx, c.store)
		if err != nil {
			return err
		}
		missed, _, err := ledger.ListMissed(ctx, c.store, ledger.MissedFilter{Key: sc.key, Namespace: sc.namespace, From: from, To: to, Limit: *limit})
		if err != nil {
			return err
		}
		rep := report(det, missed, sc, tr.loc)
		err = c.print(rep, func(t *table) {
			if len(rep.Missed) > 0 {
				t.row("KEY", "WINDOW", "KIND", "DETECTED", "REASON")
				for _, m := range rep.Missed {
					t.row(m.Key, tr.format(m.Window), m.Kind, tr.format(m.DetectedAt), m.Reason)
				}
				t.line("")
			}
			if len(rep.Silent) > 0 {
				t.row("KEY", "LAST-DECIDED", "PERIOD")
				for _, k := range rep.Silent {
					t.row(k.Key, tr.format(k.LastDecided), k.Period)
				}
				t.line("")
			}
			for _, p := range rep.Problems {
				t.line("could not judge %s", p)
			}
			summary := fmt.Sprintf("%s%s (%d newly detected; %s of %s judged now); %s",
				plural(len(rep.Missed), "missed window"), tr.describe(from, to), rep.NewlyDetected, plural(det.Windows, "window"),
				plural(det.Keys, "key"), plural(len(rep.Silent), "silent key"))
			if len(rep.Missed) == *limit {
				summary += fmt.Sprintf("; only the newest %d are listed (see --limit)", *limit)
			}
			t.line("%s", summary)
		})
		if err != nil {
			return err
		}
		if *failOnMissed && (len(rep.Missed) > 0 || len(rep.Silent) > 0) {
			return errMissedFound
		}
		return nil
	}
}

// report keeps what concerns the scope and puts times in zone loc.
func report(det ledger.Detection, missed []ledger.MissedWindow, sc *scope, loc *time.Location) missedReport {
	rep := missedReport{Missed: make([]ledger.MissedWindow, 0, len(missed)), Silent: []silentKey{}}
	isNew := map[string]bool{}
	for _, m := range det.New {
		isNew[missedID(m)] = true
	}
	for _, m := range missed {
		if isNew[missedID(m)] {
			rep.NewlyDetected++
		}
		m.Window, m.DetectedAt = m.Window.In(loc), m.DetectedAt.In(loc)
		rep.Missed = append(rep.Missed, m)
	}
	for _, k := range det.Silent {
		if sc.covers(k.Key) {
			rep.Silent = append(rep.Silent, silentKey{Key: k.Key, LastDecided: k.LastDecided.In(loc), Period: k.Period.String(),
				ExpectedNext: k.ExpectedNext.In(loc)})
		}
	}
	for _, p := range det.Problems {
		if k, _, _ := strings.Cut(p, ": "); sc.covers(k) {
			rep.Problems = append(rep.Problems, p)
		}
	}
	return rep
}

func missedID(m ledger.MissedWindow) string { return fmt.Sprintf("%q %d", m.Key, m.Window.UnixMicro()) }

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
