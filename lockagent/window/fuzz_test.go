package window

import (
	"strconv"
	"testing"
	"time"
)

func FuzzResolve(f *testing.F) {
	f.Add(true, "2026-03-29T03:00:00+02:00", false, "report-29579040", "report", "*/30 * * * *", "Europe/Berlin", int64(1774746000))
	f.Add(false, "", false, "report-29579040", "report", "", "", int64(1774746000))
	f.Add(false, "", false, "report-manual-abc", "report", "30 2 * * *", "Europe/Berlin", int64(1792892400))
	f.Add(false, "", true, "report-29579040", "report", "@hourly", "", int64(1774746000))
	f.Add(true, "not a time", false, "x-1", "x", "* * * * *", "UTC", int64(0))
	f.Add(false, "", false, "a-5-29000000", "a-5", "0 0 29 2 *", "America/New_York", int64(4102444800))
	f.Add(false, "", false, "", "", "TZ=UTC", "", int64(-1))
	f.Add(false, "", false, "", "", "@every 1h", "Local", int64(1<<62))
	f.Add(false, "", false, "", "", "0 0 30 2 *", "Australia/Lord_Howe", int64(253402300799))
	f.Fuzz(func(t *testing.T, hasAnnotation bool, annotation string, manual bool, jobName, cronJobName, schedule, timeZone string, nowUnix int64) {
		in := Input{JobName: jobName, CronJobName: cronJobName, Schedule: schedule, TimeZone: timeZone}
		if hasAnnotation || manual {
			in.Annotations = map[string]string{}
		}
		if hasAnnotation {
			in.Annotations[ScheduledTimestampAnnotation] = annotation
		}
		if manual {
			in.Annotations[InstantiateAnnotation] = InstantiateManual
		}
		now := time.Unix(nowUnix, 0)

		got, source, err := Resolve(in, now)
		if err != nil {
			if !got.IsZero() {
				t.Fatalf("Resolve returned %v with error %v", got, err)
			}
			return
		}
		if source == SourceManual {
			if !manual || !got.IsZero() {
				t.Fatalf("manual = %v: Resolve = %v, %q", manual, got, source)
			}
			return
		}
		if got.Location() != time.UTC || CheckRange(got) != nil {
			t.Fatalf("Resolve = %v (%s), want a UTC instant in range", got, source)
		}
		switch source {
		case SourceAnnotation:
			want, err := ParseScheduledTimestamp(annotation)
			if err != nil || !want.Equal(got) {
				t.Fatalf("annotation %q: Resolve = %v, ParseScheduledTimestamp = %v, %v", annotation, got, want, err)
			}
		case SourceJobName:
			if name := cronJobName + "-" + strconv.FormatInt(got.Unix()/60, 10); name != jobName {
				t.Fatalf("window %v from job name %q does not name %q", got, jobName, name)
			}
		case SourceSchedule:
			if got.After(now) {
				t.Fatalf("schedule window %v is after now %v", got, now)
			}
			s, err := ParseSchedule(schedule, timeZone)
			if err != nil {
				t.Fatalf("Resolve accepted schedule %q in %q that ParseSchedule rejects: %v", schedule, timeZone, err)
			}
			if n := s.Next(got); !n.IsZero() && !n.After(now) {
				t.Fatalf("schedule window %v is not the latest: %v is also <= %v", got, n, now)
			}
		default:
			t.Fatalf("unknown source %q", source)
		}
	})
}

func FuzzParseSchedule(f *testing.F) {
	for _, s := range []string{
		"* * * * *", "*/5 * * * *", "0 12 * * *", "@hourly", "@every 1h", "0 0 29 2 *", "0 0 30 2 *",
		"30 6-16/4 * * 1-5", "TZ=UTC", "CRON_TZ=Europe/Berlin 0 0 * * *", "5-1 * * * *", "*/0 * * * *",
		"0 0 1,15 * 1", "? ? ? ? ?", "0 0 0 0 0", "0-59/61 * * * *",
	} {
		f.Add(s, "Europe/Berlin", int64(1792892400))
	}
	f.Add("*/30 * * * *", "Australia/Lord_Howe", int64(1775313000))
	f.Fuzz(func(t *testing.T, spec, timeZone string, atUnix int64) {
		s, err := ParseSchedule(spec, timeZone)
		if err != nil {
			return
		}
		at := time.Unix(atUnix, 0)
		latest, err := s.Latest(at)
		if err != nil {
			return
		}
		if latest.Location() != time.UTC || latest.After(at) {
			t.Fatalf("%v: Latest(%v) = %v", s, at, latest)
		}
		if n := s.Next(latest); !n.IsZero() && !n.After(at) {
			t.Fatalf("%v: Latest(%v) = %v, but %v is later and not after it", s, at, latest, n)
		}
	})
}

func FuzzParseScheduledTimestamp(f *testing.F) {
	for _, s := range []string{
		"2026-03-29T03:00:00+02:00", "2026-06-15T12:00:00Z", "2026-06-15T12:00:00.123456789-07:00",
		"9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "2026-06-15", "", "2026-02-30T00:00:00Z",
		"2026-06-15T24:00:00Z", "2026-06-15T12:00:00+24:00",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got, err := ParseScheduledTimestamp(v)
		if err != nil {
			return
		}
		if got.Location() != time.UTC || CheckRange(got) != nil {
			t.Fatalf("ParseScheduledTimestamp(%q) = %v, want a UTC instant in range", v, got)
		}
		again, err := ParseScheduledTimestamp(got.Format(time.RFC3339Nano))
		if err != nil || !again.Equal(got) {
			t.Fatalf("ParseScheduledTimestamp(%q) = %v does not round trip: %v, %v", v, got, again, err)
		}
	})
}

func FuzzFromJobName(f *testing.F) {
	f.Add("report", int64(29000000), "report-29000000")
	f.Add("report-5", int64(29000000), "report-5-29000000")
	f.Add("a", int64(15778080), "a-015778080")
	f.Add("a", int64(-1), "a--1")
	f.Add("", int64(0), "-0")
	f.Add("x", int64(1<<62), "x-99999999999999999999")
	f.Fuzz(func(t *testing.T, cronJobName string, minutes int64, jobName string) {
		// Whatever the name, an accepted one is exactly the controller's name
		// for the window it yields.
		if got, ok := FromJobName(jobName, cronJobName); ok {
			if got.Location() != time.UTC || CheckRange(got) != nil || got.Unix()%60 != 0 {
				t.Fatalf("FromJobName(%q, %q) = %v", jobName, cronJobName, got)
			}
			if name := cronJobName + "-" + strconv.FormatInt(got.Unix()/60, 10); name != jobName {
				t.Fatalf("FromJobName(%q, %q) = %v, which the controller names %q", jobName, cronJobName, got, name)
			}
		}
		// And every name the controller makes for an in-range time is accepted.
		if cronJobName == "" || minutes < minWindow.Unix()/60 || minutes >= maxWindow.Unix()/60 {
			return
		}
		scheduled := time.Unix(minutes*60, 0).UTC()
		got, ok := FromJobName(controllerJobName(cronJobName, scheduled), cronJobName)
		if !ok || !got.Equal(scheduled) {
			t.Fatalf("FromJobName(controller name for %v) = %v, %v", scheduled, got, ok)
		}
	})
}
