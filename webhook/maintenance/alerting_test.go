package maintenance

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store/ledger"
)

// A leader takes the role of alerting cluster only while a Prometheus
// scrapes it; one that started lately and was not scraped yet keeps what
// its cluster holds (a rollout does not move the role) and takes nothing;
// one nobody scrapes leaves it.
func TestALeaderTakesTheAlertingRoleOnlyWhileAPrometheusScrapesIt(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	for _, tc := range []struct {
		name             string
		started, scraped time.Time
		want             alertingStep
	}{
		{"scraped a scrape interval ago: take", ago(time.Hour), ago(30 * time.Second), alertingTake},
		{"scraped just within the recency: take", ago(time.Hour), ago(AlertingScrapeRecency - time.Second), alertingTake},
		{"started a minute ago, not scraped yet: keep", ago(time.Minute), time.Time{}, alertingKeep},
		{"started a minute ago, scraped just then: take", ago(time.Minute), ago(time.Second), alertingTake},
		{"never scraped since it started long ago: leave", ago(time.Hour), time.Time{}, alertingLeave},
		{"no scrape for the recency: leave", ago(time.Hour), ago(AlertingScrapeRecency), alertingLeave},
		{"started lately, its last scrape long gone: keep", ago(time.Minute), ago(time.Hour), alertingKeep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := alertingStepAt(now, tc.started, tc.scraped); got != tc.want {
				t.Errorf("step %s, want %s", got, tc.want)
			}
		})
	}
}

// A replica says its cluster is the alerting cluster only inside the window
// the database gave, shrunk by the read's own duration: from the read's end
// plus the time to wait, until its start plus the time left. A read of
// another cluster's role, or an older read answering late, ends what it
// said.
func TestAReplicaSaysItsClusterAlertsOnlyWithinTheWindowTheDatabaseGave(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	end := start.Add(200 * time.Millisecond)
	for _, tc := range []struct {
		name   string
		role   ledger.AlertingCluster
		at     []time.Duration // after start
		saysAt []bool
	}{
		{"held for 90s, alerting since before the read",
			ledger.AlertingCluster{Cluster: "dc-a", From: -time.Minute, Left: 90 * time.Second},
			[]time.Duration{0, 89999 * time.Millisecond, 90 * time.Second}, []bool{true, true, false}},
		{"taken over, alerting in 60s",
			ledger.AlertingCluster{Cluster: "dc-a", From: time.Minute, Left: 90 * time.Second},
			[]time.Duration{0, time.Minute, time.Minute + 200*time.Millisecond}, []bool{false, false, true}},
		{"lapsed", ledger.AlertingCluster{Cluster: "dc-a", From: -time.Hour, Left: -time.Second},
			[]time.Duration{0}, []bool{false}},
		{"held by another cluster", ledger.AlertingCluster{Cluster: "dc-b", From: -time.Minute, Left: 90 * time.Second},
			[]time.Duration{0, time.Second}, []bool{false, false}},
		{"held by nobody ever", ledger.AlertingCluster{}, []time.Duration{0}, []bool{false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := windowOf("dc-a", tc.role, start, end)
			for i, d := range tc.at {
				if got := w.alerting(start.Add(d)); got != tc.saysAt[i] {
					t.Errorf("at start+%s: says alerting %v, want %v (window %+v)", d, got, tc.saysAt[i], w)
				}
			}
		})
	}

	t.Run("an older read answering late does not override a newer", func(t *testing.T) {
		t.Parallel()
		st := &ledgerState{clock: func() time.Time { return start.Add(time.Second) }}
		held := ledger.AlertingCluster{Cluster: "dc-a", From: -time.Minute, Left: 90 * time.Second}
		st.learnAlerting(windowOf("dc-a", held, start, end))
		st.learnAlerting(windowOf("dc-a", ledger.AlertingCluster{Cluster: "dc-b", Left: time.Minute}, start.Add(-time.Second), end))
		if got := alertingServed(t, st); got != "1" {
			t.Errorf("after a late older read of dc-b's role: dislock_alerting_cluster %s, want 1", got)
		}
		st.learnAlerting(windowOf("dc-a", ledger.AlertingCluster{Cluster: "dc-b", Left: time.Minute}, start.Add(time.Millisecond), end))
		if got := alertingServed(t, st); got != "0" {
			t.Errorf("after a newer read of dc-b's role: dislock_alerting_cluster %s, want 0", got)
		}
	})

	t.Run("nothing is served before the first read", func(t *testing.T) {
		t.Parallel()
		if got := alertingServed(t, &ledgerState{}); got != "" {
			t.Errorf("dislock_alerting_cluster %s before any read, want none", got)
		}
	})
}

// alertingServed scrapes st and returns the value of dislock_alerting_cluster,
// "" when it is not served.
func alertingServed(t *testing.T, st *ledgerState) string {
	t.Helper()
	for line := range strings.Lines(exposition(t, ledgerCollector{state: st})) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "dislock_alerting_cluster "); ok {
			return v
		}
	}
	return ""
}

// saysAlerting is whether m's replica says, now, that its cluster is the
// alerting cluster, without counting as a scrape.
func saysAlerting(m *LedgerMetrics) (bool, alertingWindow) {
	m.state.mu.RLock()
	w := m.state.alerting
	m.state.mu.RUnlock()
	return w.alerting(time.Now()), w
}

// Two clusters' webhooks share a database, each a leader and another
// replica. Only a leader a Prometheus scrapes takes the role; while one
// cluster holds it, every replica of that cluster says it alerts and every
// replica of the other says it does not. When the holder stops, the other
// takes the role once its claim lapsed and says it alerts only after the
// settle time: by its clock, never before the last replica of the old
// holder stopped saying so. A leader no Prometheus scrapes any more gives
// the role up.
func TestOneClusterAtATimeSaysItIsTheAlertingCluster(t *testing.T) {
	d := newTenantsDB(t)
	ctx := context.Background()
	const ttl, settle = 2 * time.Second, 30 * time.Second
	cluster := func(name string) (leader, replica *LedgerMetrics) {
		leader, replica = NewLedgerMetrics(d.own, name, nil), NewLedgerMetrics(d.own, name, nil)
		leader.alertingTTL, leader.alertingSettle = ttl, settle
		leader.state.started = time.Now()
		return leader, replica
	}
	aLeader, aReplica := cluster("dc-a")
	bLeader, bReplica := cluster("dc-b")
	step := func(ms ...*LedgerMetrics) {
		t.Helper()
		for _, m := range ms {
			var err error
			if m == aLeader || m == bLeader {
				err = m.ClaimAlerting(ctx)
			} else {
				err = m.Refresh(ctx)
			}
			if err != nil {
				t.Fatalf("%s: %v", m.cluster, err)
			}
		}
	}
	want := func(when string, a, b bool) {
		t.Helper()
		for _, c := range []struct {
			name string
			ms   []*LedgerMetrics
			want bool
		}{{"dc-a", []*LedgerMetrics{aLeader, aReplica}, a}, {"dc-b", []*LedgerMetrics{bLeader, bReplica}, b}} {
			for i, m := range c.ms {
				if got, w := saysAlerting(m); got != c.want {
					t.Fatalf("%s: %s's replica %d says alerting %v, want %v (window %+v)", when, c.name, i, got, c.want, w)
				}
			}
		}
	}

	// Freshly started, nobody scraped: nobody takes the role.
	step(aLeader, bLeader, aReplica, bReplica)
	want("before any scrape", false, false)
	if got := alertingServed(t, aReplica.state); got != "0" {
		t.Fatalf("dc-a's replica serves dislock_alerting_cluster %q before any cluster holds the role, want 0", got)
	}

	// dc-b is scraped first and takes the role, which nobody held before:
	// it alerts at once. dc-a, scraped next, is refused.
	alertingServed(t, bLeader.state)
	step(bLeader)
	alertingServed(t, aLeader.state)
	step(aLeader, aReplica, bReplica)
	want("dc-b took the role", false, true)
	if got := alertingServed(t, bReplica.state); got != "1" {
		t.Fatalf("dc-b's replica serves dislock_alerting_cluster %q, want 1", got)
	}

	// dc-b stops; once its claim lapsed, dc-a takes the role over, and
	// alerts only after the settle time.
	_, bLast := saysAlerting(bReplica)
	_, bLeaderLast := saysAlerting(bLeader)
	awaitLapse(t, d)
	step(aLeader, aReplica)
	want("dc-a took the role over", false, false)
	for _, m := range []*LedgerMetrics{aLeader, aReplica} {
		_, w := saysAlerting(m)
		if w.from.IsZero() {
			t.Fatalf("dc-a's window %+v: want dc-a's", w)
		}
		// (Less a millisecond: the database rounds what it tells to microseconds.)
		last := bLast.until
		if bLeaderLast.until.After(last) {
			last = bLeaderLast.until
		}
		if w.from.Before(last.Add(settle - time.Millisecond)) {
			t.Errorf("dc-a alerts from %s, less than the settle time %s after dc-b's replicas stopped (%s)", w.from, settle, last)
		}
	}

	// No Prometheus scrapes dc-a any more: its leader gives the role up,
	// and dc-b, scraped again, takes it.
	aLeader.state.mu.Lock()
	aLeader.state.started, aLeader.state.scraped = time.Now().Add(-time.Hour), time.Now().Add(-AlertingScrapeRecency)
	aLeader.state.mu.Unlock()
	step(aLeader)
	if h := holder(t, d); h != "" {
		t.Fatalf("dc-a left the role, yet %s holds it", h)
	}
	alertingServed(t, bLeader.state)
	step(bLeader)
	if h := holder(t, d); h != "dc-b" {
		t.Fatalf("dc-b claimed the role dc-a left, yet %q holds it", h)
	}
}

// awaitLapse waits until the database clock is past the end of the live
// claim of the role: a lapse is a matter of database time.
func awaitLapse(t *testing.T, d tenantsDB) {
	t.Helper()
	ctx := context.Background()
	a, err := ledger.ReadAlerting(ctx, d.own)
	if err != nil {
		t.Fatal(err)
	}
	now, err := d.own.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lapse, deadline := now.Add(a.Left), time.Now().Add(a.Left+30*time.Second)
	for now.Before(lapse) || now.Equal(lapse) {
		if time.Now().After(deadline) {
			t.Fatalf("the database clock is at %s, not past the claim's lapse %s", now, lapse)
		}
		time.Sleep(20 * time.Millisecond)
		if now, err = d.own.Now(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// holder is the cluster whose claim of the role is live, "" when none is.
func holder(t *testing.T, d tenantsDB) string {
	t.Helper()
	a, err := ledger.ReadAlerting(context.Background(), d.own)
	if err != nil {
		t.Fatal(err)
	}
	if a.Left <= 0 {
		return ""
	}
	return a.Cluster
}
