package ledger

import (
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
)

// The grace of a window is the view's missed-after when it is one
// dislock.io/missed-after accepts, the default when it is empty, and an
// error naming the annotation otherwise: the bounds are contract's.
func TestTheGraceIsTheMissedAfterTheAnnotationAccepts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		after  string
		period time.Duration
		want   time.Duration
		err    string
	}{
		{"", 5 * time.Minute, 5 * time.Minute, ""},
		{"", time.Second, contract.MinMissedAfter, ""},
		{"", 24 * time.Hour, MaxDefaultMissedGrace, ""},
		{"90m", time.Minute, 90 * time.Minute, ""},
		{contract.MinMissedAfter.String(), time.Hour, contract.MinMissedAfter, ""},
		{contract.MaxMissedAfter.String(), time.Hour, contract.MaxMissedAfter, ""},
		{"59s", time.Minute, 0, "is out of range"},
		{"25h", time.Minute, 0, "is out of range"},
		{"-5m", time.Minute, 0, "is out of range"},
		{"soon", time.Minute, 0, "is not a duration"},
	} {
		got, err := missedGrace(tc.after, tc.period)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("missedGrace(%q, %s) = %s, %v; want %s", tc.after, tc.period, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), contract.AnnotationMissedAfter)):
			t.Errorf("missedGrace(%q, %s) = %s, %v; want an error naming %s that %s", tc.after, tc.period, got, err, contract.AnnotationMissedAfter, tc.err)
		}
	}
}
