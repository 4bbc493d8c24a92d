package window

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// ErrNoActivation is returned (wrapped) by Schedule.Latest when the schedule
// did not fire within the lookback.
var ErrNoActivation = errors.New("no activation")

// lookbackYears bounds Schedule.Latest. The sparsest schedule that fires at
// all is a leap day ("0 0 29 2 *"), whose activations can be eight years apart
// (2096 → 2104: 2100 is not a leap year); nine years always holds one.
const lookbackYears = 9

// Schedule is a parsed CronJob schedule in its time zone.
//
// It evaluates the schedule with robfig/cron/v3, the library the Kubernetes
// CronJob controller uses, so it fires at exactly the instants the controller
// schedules Jobs for, including robfig's behaviour at DST changes (see
// docs/windows.md). The zero Schedule never fires.
type Schedule struct {
	spec *cron.SpecSchedule
	text string
	zone string
}

// ParseSchedule parses spec with cron.ParseStandard semantics (five fields,
// or a descriptor such as @hourly) in timeZone, an IANA zone name; "" means UTC.
//
// It refuses what Kubernetes refuses (TZ= or CRON_TZ= inside the schedule, the
// "Local" zone) and one thing Kubernetes accepts: "@every <duration>", whose
// ticks are counted from when each cluster created its CronJob, so two
// clusters would never agree on a window.
func ParseSchedule(spec, timeZone string) (s Schedule, err error) {
	if strings.Contains(spec, "TZ") {
		return Schedule{}, fmt.Errorf("schedule %q: cannot use TZ or CRON_TZ in the schedule, set the CronJob's spec.timeZone instead", spec)
	}
	loc, err := loadZone(timeZone)
	if err != nil {
		return Schedule{}, err
	}
	// robfig/cron is third-party parsing of user input; a panic in it must
	// become a rejected schedule, not a crashed webhook or agent.
	defer func() {
		if r := recover(); r != nil {
			s, err = Schedule{}, fmt.Errorf("schedule %q: cannot be parsed: %v", spec, r)
		}
	}()
	parsed, err := cron.ParseStandard(spec)
	if err != nil {
		return Schedule{}, fmt.Errorf("schedule %q: %w (want five fields such as \"*/5 * * * *\", or @hourly, @daily, @weekly, @monthly, @yearly)", spec, err)
	}
	ss, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return Schedule{}, fmt.Errorf("schedule %q: @every is not supported: its ticks count from when each cluster created the CronJob, so clusters never agree on a window (use a cron expression such as \"0 * * * *\")", spec)
	}
	local := *ss
	local.Location = loc
	return Schedule{spec: &local, text: spec, zone: loc.String()}, nil
}

// loadZone resolves a CronJob spec.timeZone. The name checks mirror the
// Kubernetes API validation so that dislock accepts exactly the zones the
// controller does, and keep arbitrary strings away from the zoneinfo lookup.
func loadZone(name string) (*time.Location, error) {
	if name == "" {
		return time.UTC, nil
	}
	if strings.EqualFold(name, "Local") {
		return nil, fmt.Errorf("time zone %q: want an explicit IANA time zone such as \"Europe/Berlin\"", name)
	}
	if !validZoneName(name) {
		return nil, fmt.Errorf("unknown time zone %q (want an IANA name such as \"Europe/Berlin\")", name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone %q (want an IANA name such as \"Europe/Berlin\"): %w", name, err)
	}
	return loc, nil
}

// validZoneName follows the IANA naming rules Kubernetes enforces: '/'-separated
// parts of 1..14 characters from [A-Za-z0-9._+-], not "." or "..", not starting with '-'.
func validZoneName(name string) bool {
	for part := range strings.SplitSeq(name, "/") {
		if part == "" || len(part) > 14 || part == "." || part == ".." || part[0] == '-' {
			return false
		}
		for i := 0; i < len(part); i++ {
			c := part[i]
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
				c == '.' || c == '-' || c == '_' || c == '+'
			if !ok {
				return false
			}
		}
	}
	return true
}

// String returns the schedule and its zone, e.g. `"30 2 * * *" in Europe/Berlin`.
func (s Schedule) String() string {
	if s.spec == nil {
		return "<zero schedule>"
	}
	return fmt.Sprintf("%q in %s", s.text, s.zone)
}

// Next returns the first activation strictly after after, in UTC. It returns
// the zero Time when the schedule does not fire by the end of the fifth year
// after after (robfig's own limit), for the zero Schedule, and for after
// outside years 1..9999.
func (s Schedule) Next(after time.Time) time.Time {
	if s.spec == nil || after.Year() < 1 || after.Year() > 9999 {
		return time.Time{}
	}
	return s.next(after)
}

func (s Schedule) next(after time.Time) time.Time {
	t := s.spec.Next(after.UTC())
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

// ShortestGap is the shortest time between two consecutive activations
// among the first n+1 after after: the period of a regular schedule, and of
// an irregular one ("0 1,2 * * *") its densest stretch. It is 0 when the
// schedule fires fewer than twice in that time.
func (s Schedule) ShortestGap(after time.Time, n int) time.Duration {
	var gap time.Duration
	prev := s.Next(after)
	for range n {
		next := s.Next(prev)
		if prev.IsZero() || next.IsZero() {
			break
		}
		if d := next.Sub(prev); gap == 0 || d < gap {
			gap = d
		}
		prev = next
	}
	return gap
}

// Latest returns the latest activation at or before at, in UTC; an activation
// exactly at at counts. It looks back at most nine years and wraps
// ErrNoActivation when the schedule did not fire in that time (e.g.
// "0 0 30 2 *"). at must be between 2000-01-01 and the end of 9999 UTC.
//
// robfig/cron only steps forward, so Latest first doubles a lookback until it
// holds an activation (one step for "* * * * *") and then bisects it to the
// last one: about sixty Next calls at worst, for dense and sparse schedules alike.
func (s Schedule) Latest(at time.Time) (time.Time, error) {
	if s.spec == nil {
		return time.Time{}, errors.New("zero Schedule: use ParseSchedule")
	}
	if err := CheckRange(at); err != nil {
		return time.Time{}, fmt.Errorf("schedule %s: time %s %w", s, at.UTC().Format(time.RFC3339), err)
	}
	// Activations fall on whole seconds, so work in whole seconds: then
	// next(x) is the first activation >= x+1s and bisection ends exactly.
	at = at.UTC().Truncate(time.Second)
	floor := at.AddDate(-lookbackYears, 0, 0)

	// firesBy reports whether there is an activation in (x, at].
	firesBy := func(x time.Time) bool {
		n := s.next(x)
		return !n.IsZero() && !n.After(at)
	}

	// Invariant from here on: !firesBy(hi) and, once found, firesBy(lo).
	// hi = at holds trivially: nothing is in (at, at].
	hi := at
	var lo time.Time
	for d := time.Minute; ; d *= 2 {
		x := at.Add(-d)
		if x.Before(floor) {
			x = floor
		}
		if firesBy(x) {
			lo = x
			break
		}
		if x.Equal(floor) {
			return time.Time{}, fmt.Errorf("schedule %s: %w in the %d years up to %s",
				s, ErrNoActivation, lookbackYears, at.Format(time.RFC3339))
		}
		hi = x
	}
	for hi.Sub(lo) > time.Second {
		mid := lo.Add(hi.Sub(lo) / 2).Truncate(time.Second)
		if firesBy(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	latest := s.next(lo)
	// With robfig's Next returning the first match after its argument this
	// loop exits at once. It is here so that, should Next ever skip an
	// instant around a DST change, the answer is still the end of a Next
	// chain, which is what the controller walks when it schedules Jobs.
	for range 1000 {
		n := s.next(latest)
		if n.IsZero() || n.After(at) {
			break
		}
		latest = n
	}
	return latest, nil
}
