package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

// timeRange is the --since, --from, --to and --tz flags of a listing:
// which window starts it shows, and in which zone it prints times.
type timeRange struct {
	since    boundDuration
	from, to string
	tz       string

	// Set by parse.
	loc            *time.Location
	fromAt, toAt   time.Time
	hasFrom, hasTo bool
}

// dateTimeLayouts are the forms --from and --to accept besides RFC 3339,
// read in the --tz zone.
var dateTimeLayouts = []string{"2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"}

const timeForms = "want RFC 3339, e.g. 2026-12-02T12:00:00Z or 2026-12-02T13:00:00+01:00, " +
	"or a date-time in the --tz zone: 2026-12-02T12:00, 2026-12-02 12:00:00 or 2026-12-02"

func addTimeRange(fs *flag.FlagSet, defaultSince time.Duration, sinceUsage string) *timeRange {
	r := &timeRange{since: boundDuration(defaultSince)}
	fs.Var(&r.since, "since", sinceUsage)
	fs.StringVar(&r.from, "from", "", "only windows that started at or after this time ("+timeForms+")")
	fs.StringVar(&r.to, "to", "", "only windows that started before this time (same forms as --from)")
	fs.StringVar(&r.tz, "tz", "UTC", "print times in this IANA time zone, e.g. Europe/Berlin; also the zone of a --from/--to without one")
	return r
}

// parse checks the flags; every problem is a usage error naming its flag.
func (r *timeRange) parse() error {
	var errs []error
	loc, err := time.LoadLocation(r.tz)
	if err != nil || r.tz == "" {
		errs = append(errs, fmt.Errorf("--tz %q is not a time zone (want an IANA name such as Europe/Berlin, or UTC)", r.tz))
		loc = time.UTC // to check --from and --to all the same
	}
	r.loc = loc
	if r.from != "" {
		if r.fromAt, err = parseTime(r.from, loc); err != nil {
			errs = append(errs, fmt.Errorf("--from %q is not a time (%s)", r.from, timeForms))
		}
		r.hasFrom = err == nil
	}
	if r.to != "" {
		if r.toAt, err = parseTime(r.to, loc); err != nil {
			errs = append(errs, fmt.Errorf("--to %q is not a time (%s)", r.to, timeForms))
		}
		r.hasTo = err == nil
	}
	if r.hasFrom && r.hasTo && !r.fromAt.Before(r.toAt) {
		errs = append(errs, fmt.Errorf("--from %s is not before --to %s (windows from --from up to, not including, --to)",
			r.format(r.fromAt), r.format(r.toAt)))
	}
	if err := errors.Join(errs...); err != nil {
		return usageError{err}
	}
	return nil
}

func parseTime(v string, loc *time.Location) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	for _, layout := range dateTimeLayouts {
		if t, err := time.ParseInLocation(layout, v, loc); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New("no accepted form")
}

// sinceSlack is how far past the database's time now --since still looks:
// a window starts at or before the clock of the pod that claims it, give or
// take the nodes' clock error. Rows further in the future were written by
// hand (or by a tenant into its own keys) and are no part of "the last two
// hours".
const sinceSlack = time.Minute

// bounds resolves the range at the database's time now: --since counts
// back from it, and the later of --since and --from is the lower bound;
// without --to, --since ends at now (plus sinceSlack).
func (r *timeRange) bounds(now time.Time) (from, to time.Time) {
	if r.hasFrom {
		from = r.fromAt
	}
	if r.since > 0 {
		if s := now.Add(-time.Duration(r.since)); s.After(from) {
			from = s
		}
		to = now.Add(sinceSlack)
	}
	if r.hasTo {
		to = r.toAt
	}
	return from, to
}

// resolve is bounds at the database's time, read only when --since needs it.
func (r *timeRange) resolve(ctx context.Context, s *store.Store) (from, to time.Time, err error) {
	var now time.Time
	if r.since > 0 {
		if now, err = s.Now(ctx); err != nil {
			return time.Time{}, time.Time{}, err
		}
	}
	from, to = r.bounds(now)
	return from, to, nil
}

// format prints t in the --tz zone, RFC 3339.
func (r *timeRange) format(t time.Time) string { return t.In(r.loc).Format(time.RFC3339) }

// describe says which window starts [from, to) covers, for summaries; a
// range that ends where --since ends it, now, is "since".
func (r *timeRange) describe(from, to time.Time) string {
	switch {
	case !from.IsZero() && r.hasTo:
		return " from " + r.format(from) + " up to " + r.format(to)
	case !from.IsZero():
		return " since " + r.format(from) // up to now
	case r.hasTo:
		return " before " + r.format(to)
	}
	return ""
}

// boundDuration is a flag.Value for a duration that is not negative;
// zero means no bound.
type boundDuration time.Duration

func (d *boundDuration) String() string { return time.Duration(*d).String() }

func (d *boundDuration) Set(v string) error {
	p, err := time.ParseDuration(v)
	if err != nil || p < 0 {
		return errors.New("want a duration such as 2h, 30m or 90s (0: no bound)")
	}
	*d = boundDuration(p)
	return nil
}
