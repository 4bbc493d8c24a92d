package maintenance

import (
	"context"
	"strings"
	"testing"

	"k8s.io/client-go/tools/events"

	"github.com/dislock/dislock/lockagent/store/pause"
)

// drain returns the Events recorded so far.
func drain(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// A pause, whichever cluster or operator set it, is told on this cluster's
// CronJob once when it begins and once when it ends, and is a metric while
// it holds.
func TestAPauseIsAnEventOnTheCronJobAndAMetricWhileItHolds(t *testing.T) {
	d := newTenantsDB(t)
	ctx := context.Background()
	m, rec := eventingMetrics(t, d, optedIn("reports", "nightly", "0 2 * * *"), 100)
	const metric = `dislock_key_paused{cronjob="nightly",namespace="reports"} 1`

	if _, err := pause.Set(ctx, d.own, pause.Request{Key: "reports/nightly", By: "alice", Reason: "bad release"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Compute(ctx); err != nil {
		t.Fatal(err)
	}
	got := drain(rec)
	if len(got) != 1 || !strings.Contains(got[0], "Normal "+ReasonPaused) ||
		!strings.Contains(got[0], `reports/nightly is paused by alice until resumed ("bad release") in every cluster`) {
		t.Fatalf("Events after the pause: %q", got)
	}
	if out := exposition(t, m.Collector()); !strings.Contains(out, metric) {
		t.Fatalf("no %s in:\n%s", metric, out)
	}
	if err := m.Compute(ctx); err != nil {
		t.Fatal(err)
	}
	if got := drain(rec); len(got) != 0 {
		t.Fatalf("the same pause told again: %q", got)
	}

	if _, ok, err := pause.Resume(ctx, d.own, "reports/nightly", "bob"); err != nil || !ok {
		t.Fatalf("resume: %t, %v", ok, err)
	}
	if err := m.Compute(ctx); err != nil {
		t.Fatal(err)
	}
	got = drain(rec)
	if len(got) != 1 || !strings.Contains(got[0], "Normal "+ReasonResumed) || !strings.Contains(got[0], "no longer paused") {
		t.Fatalf("Events after the resume: %q", got)
	}
	if out := exposition(t, m.Collector()); strings.Contains(out, "dislock_key_paused") {
		t.Fatalf("dislock_key_paused after the resume:\n%s", out)
	}
}
