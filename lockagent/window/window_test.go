package window

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	// Embed the zone database so DST expectations do not depend on the
	// machine's tzdata.
	_ "time/tzdata"
)

// ts parses an RFC 3339 literal from a test table.
func ts(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(fmt.Sprintf("bad test literal %q: %v", s, err))
	}
	return t.UTC()
}

// controllerJobName is how the Kubernetes CronJob controller names the Job for
// a scheduled time: "%s-%d" of the CronJob name and scheduledTime.Unix()/60.
func controllerJobName(cronJobName string, scheduled time.Time) string {
	return fmt.Sprintf("%s-%d", cronJobName, scheduled.Unix()/60)
}

func TestResolve(t *testing.T) {
	t.Parallel()
	now := ts("2026-06-15T12:34:56Z")
	tests := []struct {
		name       string
		in         Input
		want       time.Time
		wantSource Source
		wantErr    []string // substrings of the error; nil = no error
	}{
		{
			name: "a manual run has no window, even with a scheduled timestamp",
			in: Input{
				Annotations: map[string]string{
					InstantiateAnnotation:        "manual",
					ScheduledTimestampAnnotation: "2026-06-15T12:00:00Z",
				},
				JobName: "report-29000000", CronJobName: "report", Schedule: "* * * * *",
			},
			wantSource: SourceManual,
		},
		{
			name: "an instantiate annotation with another value is not a manual run",
			in: Input{
				Annotations: map[string]string{InstantiateAnnotation: "Manual"},
				JobName:     "report-29000000", CronJobName: "report",
			},
			want: time.Unix(29000000*60, 0).UTC(), wantSource: SourceJobName,
		},
		{
			name: "the scheduled timestamp annotation wins over the job name",
			in: Input{
				Annotations: map[string]string{ScheduledTimestampAnnotation: "2026-06-15T12:00:00Z"},
				JobName:     "report-29000000", CronJobName: "report", Schedule: "* * * * *",
			},
			want: ts("2026-06-15T12:00:00Z"), wantSource: SourceAnnotation,
		},
		{
			name: "an annotation with an offset is converted to UTC",
			in: Input{
				Annotations: map[string]string{ScheduledTimestampAnnotation: "2026-03-29T03:00:00+02:00"},
			},
			want: ts("2026-03-29T01:00:00Z"), wantSource: SourceAnnotation,
		},
		{
			name: "the job name suffix wins over the schedule",
			in: Input{
				JobName: "report-29577690", CronJobName: "report", Schedule: "* * * * *",
			},
			want: ts("2026-03-28T01:30:00Z"), wantSource: SourceJobName,
		},
		{
			name: "the schedule is the last resort when the name is not the controller's",
			in: Input{
				Annotations: map[string]string{"unrelated": "x"},
				JobName:     "report-manual-x7k2p", CronJobName: "report", Schedule: "*/15 * * * *",
			},
			want: ts("2026-06-15T12:30:00Z"), wantSource: SourceSchedule,
		},
		{
			name: "the schedule is evaluated in the CronJob's time zone",
			in:   Input{Schedule: "0 12 * * *", TimeZone: "Europe/Berlin"},
			want: ts("2026-06-15T10:00:00Z"), wantSource: SourceSchedule,
		},
		{
			name: "an empty time zone is UTC",
			in:   Input{Schedule: "0 12 * * *"},
			want: ts("2026-06-15T12:00:00Z"), wantSource: SourceSchedule,
		},
		{
			name: "a malformed annotation is an error, not a fall-through to the job name",
			in: Input{
				Annotations: map[string]string{ScheduledTimestampAnnotation: "2026-06-15 12:00"},
				JobName:     "report-29000000", CronJobName: "report",
			},
			wantSource: SourceAnnotation,
			wantErr:    []string{ScheduledTimestampAnnotation, `"2026-06-15 12:00"`, "RFC 3339"},
		},
		{
			name: "an empty annotation is an error",
			in: Input{
				Annotations: map[string]string{ScheduledTimestampAnnotation: ""},
				Schedule:    "* * * * *",
			},
			wantSource: SourceAnnotation,
			wantErr:    []string{ScheduledTimestampAnnotation, `""`},
		},
		{
			name: "an annotation before 2000 is an error",
			in: Input{
				Annotations: map[string]string{ScheduledTimestampAnnotation: "0001-01-01T00:00:00Z"},
			},
			wantSource: SourceAnnotation,
			wantErr:    []string{"outside the supported range"},
		},
		{
			name:       "no rule applies without a schedule",
			in:         Input{JobName: "adhoc", CronJobName: "report"},
			wantSource: SourceSchedule,
			wantErr:    []string{"no window", `"adhoc"`},
		},
		{
			name:       "a schedule that does not parse is an error naming it",
			in:         Input{Schedule: "every day"},
			wantSource: SourceSchedule,
			wantErr:    []string{`"every day"`},
		},
		{
			name:       "an unknown time zone is an error naming it",
			in:         Input{Schedule: "* * * * *", TimeZone: "Mars/Olympus_Mons"},
			wantSource: SourceSchedule,
			wantErr:    []string{`"Mars/Olympus_Mons"`},
		},
		{
			name:       "a schedule that never fires is an error",
			in:         Input{Schedule: "0 0 30 2 *"},
			wantSource: SourceSchedule,
			wantErr:    []string{"no activation"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, source, err := Resolve(tt.in, now)
			if source != tt.wantSource {
				t.Errorf("source = %q, want %q", source, tt.wantSource)
			}
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("Resolve = %v, want an error containing %q", got, tt.wantErr)
				}
				for _, s := range tt.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if !got.Equal(tt.want) || got.Location() != time.UTC {
				t.Errorf("window = %v, want %v in UTC", got, tt.want)
			}
		})
	}
}

// Resolve reads no clock of its own: the window follows the now it is given,
// whatever the machine's wall clock or the location now is expressed in.
func TestResolveDependsOnlyOnNow(t *testing.T) {
	t.Parallel()
	in := Input{Schedule: "0 */6 * * *", TimeZone: "America/New_York"}
	tests := []struct {
		name string
		now  time.Time
		want time.Time
	}{
		{"a DB clock in 2001", ts("2001-07-04T12:00:00Z"), ts("2001-07-04T10:00:00Z")},
		{"a DB clock in 2090", ts("2090-01-02T12:00:00Z"), ts("2090-01-02T11:00:00Z")},
		{"the same instant expressed in Tokyo time", ts("2090-01-02T12:00:00Z").In(time.FixedZone("JST", 9*3600)), ts("2090-01-02T11:00:00Z")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for range 3 {
				got, source, err := Resolve(in, tt.now)
				if err != nil || source != SourceSchedule {
					t.Fatalf("Resolve = %v, %q, %v", got, source, err)
				}
				if !got.Equal(tt.want) {
					t.Fatalf("window = %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestParseScheduledTimestamp(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    time.Time
		wantErr bool
	}{
		{name: "UTC", in: "2026-06-15T12:00:00Z", want: ts("2026-06-15T12:00:00Z")},
		{name: "a positive offset", in: "2026-03-29T03:00:00+02:00", want: ts("2026-03-29T01:00:00Z")},
		{name: "a negative offset", in: "2026-11-01T01:30:00-05:00", want: ts("2026-11-01T06:30:00Z")},
		{name: "the last second of 9999", in: "9999-12-31T23:59:59Z", want: ts("9999-12-31T23:59:59Z")},
		{name: "a date without time is rejected", in: "2026-06-15", wantErr: true},
		{name: "a time without offset is rejected", in: "2026-06-15T12:00:00", wantErr: true},
		{name: "unix seconds are rejected", in: "1781524800", wantErr: true},
		{name: "surrounding spaces are rejected", in: " 2026-06-15T12:00:00Z", wantErr: true},
		{name: "the zero time is rejected", in: "0001-01-01T00:00:00Z", wantErr: true},
		{name: "the epoch is rejected", in: "1970-01-01T00:00:00Z", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseScheduledTimestamp(tt.in)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("ParseScheduledTimestamp(%q) = %v, want an error", tt.in, got)
				}
				if !strings.Contains(err.Error(), fmt.Sprintf("%q", tt.in)) {
					t.Errorf("error %q does not quote the value", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseScheduledTimestamp(%q): %v", tt.in, err)
			}
			if !got.Equal(tt.want) || got.Location() != time.UTC {
				t.Errorf("ParseScheduledTimestamp(%q) = %v, want %v in UTC", tt.in, got, tt.want)
			}
		})
	}
}

func TestFromJobName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		job     string
		cronJob string
		want    time.Time // zero = not a controller name
	}{
		{"a controller name", "report-29000000", "report", time.Unix(29000000*60, 0)},
		{"a cronjob name with dashes and digits", "report-5-29000000", "report-5", time.Unix(29000000*60, 0)},
		{"the shorter cronjob name does not match a longer one's job", "report-5-29000000", "report", time.Time{}},
		{"a wrong prefix", "other-29000000", "report", time.Time{}},
		{"a prefix without the dash", "report29000000", "report", time.Time{}},
		{"non-digits in the suffix", "report-2900000a", "report", time.Time{}},
		{"a signed suffix", "report-+29000000", "report", time.Time{}},
		{"a leading zero the controller never writes", "report-029000000", "report", time.Time{}},
		{"an empty suffix", "report-", "report", time.Time{}},
		{"an empty job name", "", "report", time.Time{}},
		{"an empty cronjob name", "-29000000", "", time.Time{}},
		{"the job name equal to the cronjob name", "report", "report", time.Time{}},
		{"a suffix before 2000", "report-10000000", "report", time.Time{}},
		{"the first minute of 2000", "report-15778080", "report", ts("2000-01-01T00:00:00Z")},
		{"a date-like suffix lands past 9999", "report-202606151200", "report", time.Time{}},
		{"a suffix that overflows int64", "report-99999999999999999999", "report", time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := FromJobName(tt.job, tt.cronJob)
			if ok != !tt.want.IsZero() {
				t.Fatalf("FromJobName(%q, %q) = %v, %v; want ok=%v", tt.job, tt.cronJob, got, ok, !tt.want.IsZero())
			}
			if ok && (!got.Equal(tt.want) || got.Location() != time.UTC) {
				t.Errorf("FromJobName(%q, %q) = %v, want %v in UTC", tt.job, tt.cronJob, got, tt.want)
			}
		})
	}
}

// FromJobName must be the exact inverse of the controller's naming, or a
// cluster that only has the Job name derives a different window than one that
// has the annotation.
func TestFromJobNameInvertsControllerNaming(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"2000-01-01T00:00:00Z",
		"2026-03-29T01:00:00Z", // Berlin, first instant after the spring gap
		"2026-10-25T00:30:00Z", // Berlin 02:30 CEST
		"2026-10-25T01:30:00Z", // Berlin 02:30 CET, the repeat
		"2038-01-19T03:14:00Z", // past int32 seconds
		"9999-12-31T23:59:00Z",
	} {
		scheduled := ts(s)
		for _, cronJob := range []string{"report", "report-5", "a-1-2-3"} {
			name := controllerJobName(cronJob, scheduled)
			got, ok := FromJobName(name, cronJob)
			if !ok || !got.Equal(scheduled) {
				t.Errorf("FromJobName(%q, %q) = %v, %v; want %v", name, cronJob, got, ok, scheduled)
			}
			if again := controllerJobName(cronJob, got); again != name {
				t.Errorf("round trip of %q gave %q", name, again)
			}
		}
	}
}

func TestParseSchedule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		spec     string
		timeZone string
		wantErr  []string // nil = valid
	}{
		{name: "five fields", spec: "*/5 * * * *"},
		{name: "a descriptor", spec: "@hourly"},
		{name: "names of months and days", spec: "0 9 * jan-mar mon-fri"},
		{name: "extra spaces between fields", spec: "0  9 * * *"},
		{name: "an IANA zone", spec: "@daily", timeZone: "Europe/Berlin"},
		{name: "a legacy zone name with digits", spec: "@daily", timeZone: "Etc/GMT+5"},
		{name: "TZ= in the schedule", spec: "TZ=Europe/Berlin 0 9 * * *", wantErr: []string{"spec.timeZone"}},
		{name: "CRON_TZ= in the schedule", spec: "CRON_TZ=UTC 0 9 * * *", wantErr: []string{"spec.timeZone"}},
		{name: "TZ= without a schedule, which panics robfig", spec: "TZ=UTC", wantErr: []string{"spec.timeZone"}},
		{name: "@every", spec: "@every 1h", wantErr: []string{"@every is not supported"}},
		{name: "six fields", spec: "0 0 9 * * *", wantErr: []string{`"0 0 9 * * *"`}},
		{name: "an empty schedule", spec: "", wantErr: []string{`""`}},
		{name: "an out of range minute", spec: "60 * * * *", wantErr: []string{"60"}},
		{name: "an unknown descriptor", spec: "@fortnightly", wantErr: []string{"@fortnightly"}},
		{name: "an unknown zone", spec: "@daily", timeZone: "Europe/Atlantis", wantErr: []string{`"Europe/Atlantis"`}},
		{name: "the Local zone", spec: "@daily", timeZone: "Local", wantErr: []string{`"Local"`, "explicit"}},
		{name: "a path as zone", spec: "@daily", timeZone: "../etc/passwd", wantErr: []string{`"../etc/passwd"`}},
		{name: "an absolute path as zone", spec: "@daily", timeZone: "/etc/localtime", wantErr: []string{`"/etc/localtime"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := ParseSchedule(tt.spec, tt.timeZone)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("ParseSchedule(%q, %q): %v", tt.spec, tt.timeZone, err)
				}
				if s.Next(ts("2026-06-15T12:00:00Z")).IsZero() {
					t.Errorf("%v never fires", s)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseSchedule(%q, %q) = %v, want an error", tt.spec, tt.timeZone, s)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestScheduleLatest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		spec     string
		timeZone string
		at       string
		want     string // "" = ErrNoActivation
	}{
		{name: "every minute", spec: "* * * * *", at: "2026-06-15T12:34:56.789Z", want: "2026-06-15T12:34:00Z"},
		{name: "every five minutes", spec: "*/5 * * * *", at: "2026-06-15T12:34:56Z", want: "2026-06-15T12:30:00Z"},
		{name: "daily at noon, just before noon", spec: "0 12 * * *", at: "2026-06-15T11:59:59Z", want: "2026-06-14T12:00:00Z"},
		{name: "hourly descriptor", spec: "@hourly", at: "2026-06-15T12:59:59Z", want: "2026-06-15T12:00:00Z"},
		{name: "an activation exactly at the given time counts", spec: "0 12 * * *", at: "2026-06-15T12:00:00Z", want: "2026-06-15T12:00:00Z"},
		{name: "a nanosecond before an activation does not", spec: "0 12 * * *", at: "2026-06-15T11:59:59.999999999Z", want: "2026-06-14T12:00:00Z"},
		{name: "a leap day", spec: "0 0 29 2 *", at: "2026-06-15T12:00:00Z", want: "2024-02-29T00:00:00Z"},
		{name: "a leap day across the 2100 gap", spec: "0 0 29 2 *", at: "2104-02-28T23:59:59Z", want: "2096-02-29T00:00:00Z"},
		{name: "a leap day right after it fired", spec: "0 0 29 2 *", at: "2104-02-29T00:00:00Z", want: "2104-02-29T00:00:00Z"},
		{name: "a burst long ago: every minute of February, asked in December", spec: "* * * 2 *", at: "2026-12-01T00:00:00Z", want: "2026-02-28T23:59:00Z"},
		{name: "an irregular schedule", spec: "30 6-16/4 * * 1-5", at: "2026-06-15T06:29:00Z", want: "2026-06-12T14:30:00Z"},
		{name: "day of month or day of week", spec: "0 0 13 * 5", at: "2026-06-14T00:00:00Z", want: "2026-06-13T00:00:00Z"},
		{name: "yearly in a zone east of UTC", spec: "@yearly", timeZone: "Asia/Tokyo", at: "2026-06-15T00:00:00Z", want: "2025-12-31T15:00:00Z"},
		{name: "a schedule that never fires", spec: "0 0 30 2 *", at: "2026-06-15T12:00:00Z"},
		{name: "a leap day never on a Sunday in the lookback", spec: "0 0 * 2 0", at: "2026-06-15T12:00:00Z", want: "2026-02-22T00:00:00Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := ParseSchedule(tt.spec, tt.timeZone)
			if err != nil {
				t.Fatal(err)
			}
			at, err := time.Parse(time.RFC3339Nano, tt.at)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Latest(at)
			if tt.want == "" {
				if !errors.Is(err, ErrNoActivation) {
					t.Fatalf("Latest(%s) = %v, %v; want ErrNoActivation", tt.at, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Latest(%s): %v", tt.at, err)
			}
			if want := ts(tt.want); !got.Equal(want) || got.Location() != time.UTC {
				t.Errorf("Latest(%s) = %v, want %v in UTC", tt.at, got, want)
			}
		})
	}
}

// Latest must agree with walking the controller's way, Next after Next,
// especially around DST changes.
func TestScheduleLatestMatchesWalkingNext(t *testing.T) {
	t.Parallel()
	specs := []struct{ spec, zone string }{
		{"* * * * *", ""},
		{"*/7 * * * *", "Europe/Berlin"},
		{"30 2 * * *", "Europe/Berlin"},
		{"0,30 1-3 * * *", "America/New_York"},
		{"15 */5 * * 1-5", "Asia/Kolkata"},
		{"*/30 1-3 * * *", "Australia/Lord_Howe"}, // 30-minute DST shift
	}
	// Three days around each 2026 change in Berlin, New York and Lord Howe.
	changes := []string{
		"2026-03-08T07:00:00Z", "2026-03-29T01:00:00Z", "2026-04-04T15:00:00Z",
		"2026-10-03T15:30:00Z", "2026-10-25T01:00:00Z", "2026-11-01T06:00:00Z",
	}
	for _, sp := range specs {
		s, err := ParseSchedule(sp.spec, sp.zone)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range changes {
			start, end := ts(c).AddDate(0, 0, -1), ts(c).AddDate(0, 0, 2)
			want, next := time.Time{}, s.Next(start.AddDate(0, 0, -7))
			// An odd stride lands the probes on and between activations.
			for at := start; at.Before(end); at = at.Add(17*time.Minute + 13*time.Second) {
				for !next.IsZero() && !next.After(at) {
					want, next = next, s.Next(next)
				}
				got, err := s.Latest(at)
				if err != nil || !got.Equal(want) {
					t.Fatalf("%v: Latest(%v) = %v, %v; walking Next gives %v", s, at, got, err, want)
				}
			}
		}
	}
}

// The behaviour of robfig/cron (and so of the CronJob controller) at DST
// changes, measured and pinned here; docs/windows.md describes it to users.
func TestScheduleAcrossDST(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		spec     string
		timeZone string
		from, to string
		want     []string // activations in (from, to], UTC
	}{
		{
			name: "Berlin spring gap: 02:30 does not exist on 2026-03-29, so that day has no run",
			spec: "30 2 * * *", timeZone: "Europe/Berlin",
			from: "2026-03-27T12:00:00Z", to: "2026-03-30T12:00:00Z",
			want: []string{"2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z"},
		},
		{
			name: "Berlin spring gap: half-hourly runs skip from 01:30 CET to 03:00 CEST",
			spec: "*/30 * * * *", timeZone: "Europe/Berlin",
			from: "2026-03-28T23:59:00Z", to: "2026-03-29T01:30:00Z",
			want: []string{"2026-03-29T00:00:00Z", "2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z"},
		},
		{
			name: "Berlin autumn repeat: 02:30 happens twice on 2026-10-25 and both fire",
			spec: "30 2 * * *", timeZone: "Europe/Berlin",
			from: "2026-10-24T12:00:00Z", to: "2026-10-26T12:00:00Z",
			want: []string{"2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", "2026-10-26T01:30:00Z"},
		},
		{
			name: "Berlin autumn repeat: half-hourly runs fire four times in the doubled hour",
			spec: "*/30 * * * *", timeZone: "Europe/Berlin",
			from: "2026-10-24T23:45:00Z", to: "2026-10-25T02:00:00Z",
			want: []string{"2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z", "2026-10-25T01:00:00Z", "2026-10-25T01:30:00Z", "2026-10-25T02:00:00Z"},
		},
		{
			name: "New York spring gap: 02:30 does not exist on 2026-03-08",
			spec: "30 2 * * *", timeZone: "America/New_York",
			from: "2026-03-07T00:00:00Z", to: "2026-03-09T12:00:00Z",
			want: []string{"2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z"},
		},
		{
			name: "New York autumn repeat: 01:30 fires in EDT and again in EST on 2026-11-01",
			spec: "30 1 * * *", timeZone: "America/New_York",
			from: "2026-10-31T12:00:00Z", to: "2026-11-02T12:00:00Z",
			want: []string{"2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := ParseSchedule(tt.spec, tt.timeZone)
			if err != nil {
				t.Fatal(err)
			}
			from, to := ts(tt.from), ts(tt.to)
			var got []string
			for n := s.Next(from); !n.IsZero() && !n.After(to); n = s.Next(n) {
				got = append(got, n.Format(time.RFC3339))
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Fatalf("activations in (%s, %s]:\n got %v\nwant %v", tt.from, tt.to, got, tt.want)
			}
			// Each activation is its own window: Latest finds it from its own
			// instant up to the next one, and the controller's Job names differ.
			names := map[string]bool{}
			for i, w := range tt.want {
				a := ts(w)
				before := to
				if i+1 < len(tt.want) {
					before = ts(tt.want[i+1]).Add(-time.Second)
				}
				for _, at := range []time.Time{a, before} {
					if l, err := s.Latest(at); err != nil || !l.Equal(a) {
						t.Errorf("Latest(%v) = %v, %v; want %v", at, l, err, a)
					}
				}
				names[controllerJobName("report", a)] = true
			}
			if len(names) != len(tt.want) {
				t.Errorf("controller job names collide: %v", names)
			}
		})
	}
}

func TestZeroSchedule(t *testing.T) {
	t.Parallel()
	var s Schedule
	if n := s.Next(ts("2026-06-15T12:00:00Z")); !n.IsZero() {
		t.Errorf("zero Schedule Next = %v, want zero", n)
	}
	if _, err := s.Latest(ts("2026-06-15T12:00:00Z")); err == nil {
		t.Error("zero Schedule Latest: want an error")
	}
	if s.String() == "" {
		t.Error("zero Schedule String is empty")
	}
}

func TestLatestRejectsTimesOutsideTheSupportedRange(t *testing.T) {
	t.Parallel()
	s, err := ParseSchedule("* * * * *", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range []time.Time{{}, ts("1999-12-31T23:59:59Z"), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)} {
		if got, err := s.Latest(at); err == nil {
			t.Errorf("Latest(%v) = %v, want an error", at, got)
		}
	}
}

func BenchmarkLatest(b *testing.B) {
	for _, sp := range []struct{ name, spec string }{
		{"every-minute", "* * * * *"},
		{"daily", "0 12 * * *"},
		{"leap-day", "0 0 29 2 *"},
		{"february-burst", "* * * 2 *"},
		{"never", "0 0 30 2 *"},
	} {
		s, err := ParseSchedule(sp.spec, "Europe/Berlin")
		if err != nil {
			b.Fatal(err)
		}
		at := ts("2026-12-01T00:00:00Z")
		b.Run(sp.name, func(b *testing.B) {
			for b.Loop() {
				_, _ = s.Latest(at)
			}
		})
	}
}

func TestShortestGapIsTheDensestStretchOfTheSchedule(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 3, 1, 0, 0, 30, 0, time.UTC)
	for _, tc := range []struct {
		spec, zone string
		want       time.Duration
	}{
		{"* * * * *", "", time.Minute},
		{"*/15 * * * *", "UTC", 15 * time.Minute},
		{"0 1,2 * * *", "UTC", time.Hour},
		// A day in Berlin is 23 hours once a year, in spring.
		{"30 3 * * *", "Europe/Berlin", 23 * time.Hour},
		{"0 0 1 1 *", "UTC", 365 * 24 * time.Hour},
	} {
		s, err := ParseSchedule(tc.spec, tc.zone)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.ShortestGap(from, 400); got != tc.want {
			t.Errorf("%s: ShortestGap = %s, want %s", s, got, tc.want)
		}
	}
	if got := (Schedule{}).ShortestGap(from, 10); got != 0 {
		t.Errorf("the zero Schedule's gap is %s, want 0", got)
	}
}
