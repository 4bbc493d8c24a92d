// Package window owns the identity of a schedule window: the UTC instant the
// Kubernetes CronJob controller scheduled a Job for.
//
// Every cluster must derive the same instant for the same tick, or the
// schedule lock cannot tell that two Jobs are the same run. So the identity
// comes from what the controller itself wrote on the Job (its scheduled-time
// annotation, then the minutes-since-epoch suffix of the Job name) and, only
// when neither is there, from the CronJob's schedule evaluated against the
// database clock. Everything here is a pure function of its inputs: no local
// wall clock, no process time zone, no I/O beyond loading time zone data.
package window

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Source tells which rule produced the window.
type Source string

const (
	// SourceAnnotation: the Job's batch.kubernetes.io/cronjob-scheduled-timestamp annotation.
	SourceAnnotation Source = "annotation"
	// SourceJobName: the <cronjob>-<minutes since epoch> suffix of the Job name.
	SourceJobName Source = "job-name"
	// SourceSchedule: the schedule's latest activation at or before the DB time.
	SourceSchedule Source = "schedule"
	// SourceManual: the Job was created by hand from the CronJob; it has no window.
	SourceManual Source = "manual"
)

// ScheduledTimestampAnnotation is set by the CronJob controller (Kubernetes
// 1.28 and later) to the scheduled time in RFC 3339, written in the CronJob's
// time zone (UTC when spec.timeZone is unset).
const ScheduledTimestampAnnotation = "batch.kubernetes.io/cronjob-scheduled-timestamp"

// InstantiateAnnotation is set to InstantiateManual by
// `kubectl create job --from=cronjob/x`.
const InstantiateAnnotation = "cronjob.kubernetes.io/instantiate"

// InstantiateManual is the value of InstantiateAnnotation on manual runs.
const InstantiateManual = "manual"

// The supported range of window instants. The lower bound rejects values that
// cannot be a CronJob tick (a zero or near-zero time would also be mistaken
// for "no window"); the upper bound keeps every window representable in
// RFC 3339, which is how DISLOCK_WINDOW carries it.
var (
	minWindow = time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC)
	maxWindow = time.Date(10000, time.January, 1, 0, 0, 0, 0, time.UTC) // exclusive
)

// Input is what Resolve needs to know about a Job and its CronJob.
type Input struct {
	Annotations map[string]string // the Job's annotations (may be nil)
	JobName     string
	CronJobName string
	Schedule    string // CronJob spec.schedule
	// TimeZone is CronJob spec.timeZone. Empty means the controller's local
	// zone, which dislock cannot see; it is taken as UTC (what
	// kube-controller-manager runs in almost everywhere).
	TimeZone string
}

// Resolve returns the window start in UTC and the rule that produced it.
// Manual runs return (time.Time{}, SourceManual, nil).
//
// The rules, first match wins:
//  1. cronjob.kubernetes.io/instantiate: manual → no window;
//  2. the batch.kubernetes.io/cronjob-scheduled-timestamp annotation;
//  3. the Job name's <cronjob>-<minutes since epoch> suffix;
//  4. the schedule's latest activation at or before now.
//
// now must be the database clock: it is the only clock every cluster shares,
// and it is the only clock Resolve reads. A present but malformed scheduled
// timestamp is an error rather than a fall-through to the next rule, because a
// wrongly derived window is a second run of the same tick.
func Resolve(in Input, now time.Time) (time.Time, Source, error) {
	if in.Annotations[InstantiateAnnotation] == InstantiateManual {
		return time.Time{}, SourceManual, nil
	}
	if v, ok := in.Annotations[ScheduledTimestampAnnotation]; ok {
		t, err := ParseScheduledTimestamp(v)
		if err != nil {
			return time.Time{}, SourceAnnotation, fmt.Errorf("annotation %s: %w", ScheduledTimestampAnnotation, err)
		}
		return t, SourceAnnotation, nil
	}
	if t, ok := FromJobName(in.JobName, in.CronJobName); ok {
		return t, SourceJobName, nil
	}
	if strings.TrimSpace(in.Schedule) == "" {
		return time.Time{}, SourceSchedule, fmt.Errorf(
			"no window for job %q: no %s annotation, no %q+<minutes> name suffix, and no schedule to fall back on",
			in.JobName, ScheduledTimestampAnnotation, in.CronJobName+"-")
	}
	s, err := ParseSchedule(in.Schedule, in.TimeZone)
	if err != nil {
		return time.Time{}, SourceSchedule, err
	}
	t, err := s.Latest(now)
	if err != nil {
		return time.Time{}, SourceSchedule, err
	}
	if err := CheckRange(t); err != nil {
		return time.Time{}, SourceSchedule, fmt.Errorf("schedule %q: latest activation %w", in.Schedule, err)
	}
	return t, SourceSchedule, nil
}

// ParseScheduledTimestamp parses the controller's scheduled-timestamp
// annotation (RFC 3339, any offset) and returns the instant in UTC.
func ParseScheduledTimestamp(v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not an RFC 3339 time (want e.g. \"2026-03-29T03:00:00+02:00\")", v)
	}
	t = t.UTC()
	if err := CheckRange(t); err != nil {
		return time.Time{}, fmt.Errorf("%q %w", v, err)
	}
	return t, nil
}

// FromJobName inverts the controller's Job naming, <cronjob>-<minutes since
// the Unix epoch> (scheduledTime.Unix()/60 in the controller). It reports false
// unless jobName is cronJobName, a dash, and a decimal number without sign or
// leading zeros that lands inside the supported range; anything else is not a
// name the controller made, and guessing would risk a wrong window.
func FromJobName(jobName, cronJobName string) (time.Time, bool) {
	if cronJobName == "" {
		return time.Time{}, false
	}
	suffix, ok := strings.CutPrefix(jobName, cronJobName+"-")
	if !ok || suffix == "" || suffix[0] == '0' || len(suffix) > 18 {
		return time.Time{}, false
	}
	for i := 0; i < len(suffix); i++ {
		if suffix[i] < '0' || suffix[i] > '9' {
			return time.Time{}, false
		}
	}
	minutes, err := strconv.ParseInt(suffix, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	if minutes < minWindow.Unix()/60 || minutes >= maxWindow.Unix()/60 {
		return time.Time{}, false
	}
	return time.Unix(minutes*60, 0).UTC(), true
}

// CheckRange reports whether t can be a window; the error reads after a
// value. DISLOCK_WINDOW is held to the same range (package contract).
func CheckRange(t time.Time) error {
	if t.Before(minWindow) || !t.Before(maxWindow) {
		return fmt.Errorf("is outside the supported range (want between %s and 9999-12-31T23:59:59Z)",
			minWindow.Format(time.RFC3339))
	}
	return nil
}
