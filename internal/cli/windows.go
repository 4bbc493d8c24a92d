package cli

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/ledger"
)

// Watching `dislock windows`.
const (
	// DefaultWatchInterval is how often --watch asks the database.
	DefaultWatchInterval = 5 * time.Second
	// MinWatchInterval keeps a watch from hammering the database every
	// cluster's claims go to.
	MinWatchInterval = time.Second
)

func setupWindows(fs *flag.FlagSet) func(context.Context, *common) error {
	sc := addScope(fs)
	limit := fs.Int("limit", DefaultWindowsLimit, "show at most this many windows, newest first (rows of the owners; windows with -o wide)")
	tr := addTimeRange(fs, 0, "only windows that started within this `duration` before now, by database time, e.g. 2h (0: no bound)")
	watch := fs.Bool("watch", false, "after the listing, print what is new every --interval until interrupted")
	interval := fs.Duration("interval", DefaultWatchInterval, "how often --watch asks the database (at least "+MinWatchInterval.String()+")")
	return func(ctx context.Context, c *common) error {
		var errs []error
		if err := sc.validate(); err != nil {
			errs = append(errs, err)
		}
		if *limit <= 0 {
			errs = append(errs, fmt.Errorf("--limit %d must be positive", *limit))
		}
		if *interval < MinWatchInterval {
			errs = append(errs, fmt.Errorf("--interval %s is too short (want at least %s, e.g. 5s)", *interval, MinWatchInterval))
		}
		if err := tr.parse(); err != nil {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			return usageError{err}
		}
		l := &windowsListing{c: c, scope: sc, limit: *limit, tr: tr}
		entries, err := l.entries(ctx)
		if err != nil {
			return err
		}
		if err := l.print(entries, nil); err != nil {
			return err
		}
		if !*watch {
			return nil
		}
		return l.watch(ctx, *interval, entries)
	}
}

// windowsListing is one `dislock windows` invocation: what it asks for and
// how it prints.
type windowsListing struct {
	c     *common
	scope *scope
	limit int
	tr    *timeRange
}

// entry is one printed row or line of a listing, with what identifies it
// across the queries of --watch.
type entry struct {
	id    string
	cells []string // a table row; nil for a line
	line  string
	item  any // what -o json and -o yaml print; nil for none
}

var (
	windowsHeader = []string{"KEY", "WINDOW", "INDEX", "STATE", "CLUSTER", "TOKEN", "DURATION", "EXIT", "OWNER"}
	wideHeader    = []string{"KEY", "WINDOW", "INDEX", "CLUSTER", "ACTION", "TOKEN", "AT", "POD", "REASON"}
)

// entries queries the database and renders what it found.
func (l *windowsListing) entries(ctx context.Context) ([]entry, error) {
	from, to, err := l.tr.resolve(ctx, l.c.store)
	if err != nil {
		return nil, err
	}
	f := store.WindowFilter{Key: l.scope.key, Namespace: l.scope.namespace, From: from, To: to, Limit: l.limit}
	rows, dbNow, err := l.c.store.ListWindowsIn(ctx, f)
	if err != nil {
		return nil, err
	}
	if l.c.machine() {
		out := make([]entry, 0, len(rows))
		for _, w := range rows {
			out = append(out, entry{id: windowID(w), item: windowIn(w, l.tr.loc)})
		}
		return out, nil
	}
	var out []entry
	listed := map[string]bool{}
	if l.c.output == formatWide {
		decisions, _, err := ledger.ListWindowDecisions(ctx, l.c.store, f)
		if err != nil {
			return nil, err
		}
		for _, g := range groupWindows(rows, decisions, l.limit) {
			listed[g.key] = true
			out = append(out, l.wideEntries(g)...)
		}
	} else {
		for _, w := range rows {
			listed[w.Key] = true
			out = append(out, entry{id: windowID(w), cells: []string{w.Key, l.tr.format(w.Start), index(w.Index), string(w.State), w.Cluster,
				fmt.Sprint(w.Token), windowDuration(w, dbNow, l.tr.loc), exitCode(w.ExitCode), w.Owner}})
		}
	}
	warnings, err := disagreements(ctx, l.c.store, listed)
	if err != nil {
		return nil, err
	}
	for _, w := range warnings {
		out = append(out, entry{id: "warning " + w, line: w})
	}
	return out, nil
}

// windowID identifies an owner's row as printed: it is printed again by
// --watch once its state, owner or outcome changes.
func windowID(w store.Window) string {
	finished := ""
	if w.FinishedAt != nil {
		finished = w.FinishedAt.Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("window %q %d %d %s %d %q %s %s", w.Key, w.Start.UnixMicro(), w.Index, w.State, w.Token, w.Owner,
		exitCode(w.ExitCode), finished)
}

func decisionID(d store.Decision) string {
	return fmt.Sprintf("decision %q %d %d %q %q %s %d %d %q", d.Key, d.Window.UnixMicro(), d.Index, d.Cluster, d.Pod, d.Action,
		d.Token, d.At.UnixMicro(), d.Reason)
}

// windowGroup is one window of the wide listing: every cluster's decisions
// for it, and its owners' rows (one per completion index).
type windowGroup struct {
	key       string
	start     time.Time
	decisions []store.Decision
	rows      []store.Window
}

// groupWindows gathers rows and decisions by window, newest window first,
// at most limit windows. A window may have decisions and no owner's row
// (every cluster skipped it), or an owner's row and no decisions (the
// ledger lost them, or the window is older than the ledger).
func groupWindows(rows []store.Window, decisions []store.Decision, limit int) []*windowGroup {
	type ref struct {
		key   string
		start int64
	}
	byRef := map[ref]*windowGroup{}
	var groups []*windowGroup
	group := func(key string, start time.Time) *windowGroup {
		r := ref{key, start.UnixMicro()}
		if g := byRef[r]; g != nil {
			return g
		}
		g := &windowGroup{key: key, start: start}
		byRef[r] = g
		groups = append(groups, g)
		return g
	}
	for _, d := range decisions {
		g := group(d.Key, d.Window)
		g.decisions = append(g.decisions, d)
	}
	for _, w := range rows {
		g := group(w.Key, w.Start)
		g.rows = append(g.rows, w)
	}
	slices.SortStableFunc(groups, func(a, b *windowGroup) int {
		return cmp.Or(b.start.Compare(a.start), cmp.Compare(a.key, b.key))
	})
	if len(groups) > limit {
		groups = groups[:limit]
	}
	return groups
}

// wideEntries renders a window's decisions, one row each; a window without
// any shows its owners' rows instead.
func (l *windowsListing) wideEntries(g *windowGroup) []entry {
	var out []entry
	for _, d := range g.decisions {
		out = append(out, entry{id: decisionID(d), cells: []string{d.Key, l.tr.format(d.Window), index(d.Index), d.Cluster,
			string(d.Action), token(d.Token), l.tr.format(d.At), d.Pod, d.Reason}})
	}
	if len(g.decisions) >= ledger.MaxDecisionsPerWindow {
		out = append(out, entry{id: fmt.Sprintf("more %q %d", g.key, g.start.UnixMicro()),
			line: fmt.Sprintf("(window %s of %s has more decisions; the first %d are shown)", l.tr.format(g.start), g.key, ledger.MaxDecisionsPerWindow)})
	}
	if len(g.decisions) > 0 {
		return out
	}
	for _, w := range g.rows {
		reason := "(no decision in the ledger; the window's row: " + string(w.State)
		if w.ExitCode != nil {
			reason += ", exit " + exitCode(w.ExitCode)
		}
		out = append(out, entry{id: windowID(w), cells: []string{w.Key, l.tr.format(w.Start), index(w.Index), w.Cluster,
			"-", token(w.Token), l.tr.format(w.ClaimedAt), w.Pod, reason + ")"}})
	}
	return out
}

func token(t int64) string {
	if t == 0 {
		return "-"
	}
	return fmt.Sprint(t)
}

// windowIn is w with its times in zone loc.
func windowIn(w store.Window, loc *time.Location) store.Window {
	w.Start, w.ClaimedAt, w.AliveUntil = w.Start.In(loc), w.ClaimedAt.In(loc), w.AliveUntil.In(loc)
	if w.FinishedAt != nil {
		f := w.FinishedAt.In(loc)
		w.FinishedAt = &f
	}
	return w
}

// print writes the entries not in seen; seen nil is the first print,
// which writes them all: the listing as it is without --watch. Later
// prints add rows to a table without repeating its header; in JSON they
// are further arrays, in YAML further documents.
func (l *windowsListing) print(entries []entry, seen map[string]bool) error {
	first := seen == nil
	var fresh []entry
	for _, e := range entries {
		if first || !seen[e.id] {
			fresh = append(fresh, e)
		}
	}
	if !first && len(fresh) == 0 {
		return nil
	}
	if l.c.machine() {
		items := make([]any, 0, len(fresh))
		for _, e := range fresh {
			if e.item != nil {
				items = append(items, e.item)
			}
		}
		if !first && l.c.output == formatYAML {
			if _, err := fmt.Fprintln(l.c.stdout, "---"); err != nil {
				return err
			}
		}
		return l.c.print(items, nil)
	}
	t := newTable(l.c.stdout)
	if first {
		if l.c.output == formatWide {
			t.row(wideHeader...)
		} else {
			t.row(windowsHeader...)
		}
	}
	for _, e := range fresh {
		if e.cells != nil {
			t.row(e.cells...)
		} else {
			t.line("%s", e.line)
		}
	}
	return t.tw.Flush()
}

// watch asks again every interval and prints what it has not printed yet,
// until ctx ends (the operator's interrupt). A database that cannot be
// reached for a while is noted and asked again: a watch is most useful
// during an outage.
func (l *windowsListing) watch(ctx context.Context, interval time.Duration, printed []entry) error {
	seen := ids(printed)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		entries, err := l.entries(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, store.ErrUnavailable):
			fmt.Fprintf(l.c.stderr, "dislock windows: %v (asking again in %s)\n", err, interval)
			continue
		case err != nil:
			return err
		}
		if err := l.print(entries, seen); err != nil {
			return err
		}
		// Only what the last query returned is remembered, so that a long
		// watch does not grow.
		seen = ids(entries)
	}
}

func ids(entries []entry) map[string]bool {
	m := make(map[string]bool, len(entries))
	for _, e := range entries {
		m[e.id] = true
	}
	return m
}
