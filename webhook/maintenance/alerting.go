package maintenance

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dislock/dislock/lockagent/store/ledger"
)

// Every cluster's webhook serves the same metrics computed from the shared
// database, so every cluster's Prometheus would raise the same alert on
// them, and one missed window would page once per cluster. The webhook
// leaders of all clusters therefore elect one alerting cluster through the
// database (ledger.ClaimAlerting: a claim by the database clock, which
// PgBouncer's transaction pooling leaves alone, unlike a session's advisory
// lock), and every replica serves dislock_alerting_cluster: 1 in the
// alerting cluster, 0 in the others. Only the leaders of candidate clusters
// (Options.AlertingCandidate: their Prometheus evaluates the rules) claim. The shipped rules raise the alerts on
// those metrics only where it is 1.
//
// Every cluster keeps serving every series: each cluster's dashboard stays
// whole, and each Prometheus keeps a counter's whole history, so a window
// found missed while the role moves still raises DislockWindowMissed in the
// cluster that takes it over (increase() never counts a series that is new
// to a Prometheus).

const (
	// AlertingSettle is how long a cluster that takes the role over waits,
	// after the claim before it lapsed, before it says it alerts. The
	// cluster before it says so until its claim lapses, and its Prometheus
	// alerts on the last sample it scraped for up to a scrape interval and
	// a rule evaluation interval more (30 s each in kube-prometheus-stack):
	// without the wait, both would page for the same window.
	AlertingSettle = time.Minute
	// AlertingScrapeRecency: a leader takes the role only while a
	// Prometheus scrapes it, and leaves it once none has for this long, so
	// that a cluster without a Prometheus, or whose Prometheus is down,
	// does not hold the role while another could alert. It allows a scrape
	// interval of up to a minute and two lost scrapes; a leader that
	// started less than this ago keeps what its cluster holds (a rollout
	// does not move the role) and takes nothing.
	AlertingScrapeRecency = 3 * time.Minute
)

// AlertingTTL is how long a claim of the role lasts after its last
// renewal; the leader renews it every third of it. Three times the ledger
// interval (0: DefaultLedgerInterval), and at least three of every
// replica's loads (LedgerLoadInterval), so that every replica of the
// holding cluster sees it held from one load to the next.
func AlertingTTL(ledgerInterval time.Duration) time.Duration {
	if ledgerInterval == 0 {
		ledgerInterval = DefaultLedgerInterval
	}
	return 3 * max(ledgerInterval, LedgerLoadInterval)
}

// alertingStep is what a leader does with the role at one of its turns.
type alertingStep int

const (
	// alertingTake takes the role if no cluster holds it, and renews it if
	// this one does.
	alertingTake alertingStep = iota
	// alertingKeep renews the role if this cluster holds it and takes
	// nothing: the replica started lately and has not been scraped yet.
	alertingKeep
	// alertingLeave ends this cluster's claim: no Prometheus scrapes it.
	alertingLeave
)

func (s alertingStep) String() string {
	return [...]string{"take", "keep", "leave"}[s]
}

// alertingStepAt is the step of a leader that started at started and was
// last scraped at scraped (zero: never), at now.
func alertingStepAt(now, started, scraped time.Time) alertingStep {
	switch {
	case !scraped.IsZero() && now.Sub(scraped) < AlertingScrapeRecency:
		return alertingTake
	case now.Sub(started) < AlertingScrapeRecency:
		return alertingKeep
	}
	return alertingLeave
}

// alertingWindow is when, by this replica's clock, its cluster may say it
// is the alerting cluster, as one read of the role told.
type alertingWindow struct {
	// known is set once a read answered.
	known bool
	// read is when that read began: an older read never overrides a newer.
	read time.Time
	// from and until bound the window; both zero when another cluster
	// holds the role.
	from, until time.Time
}

// windowOf is the window of cluster that a read of the role, begun at start
// and answered at end, gives: from end+From until start+Left. The
// database's now(), from which From and Left count, lies between the two,
// so by this replica's clock the window lies within the one the database
// gave (the local clock runs at the database's rate; only elapsed time is
// used, never compared with the database's).
func windowOf(cluster string, a ledger.AlertingCluster, start, end time.Time) alertingWindow {
	w := alertingWindow{known: true, read: start}
	if cluster != "" && a.Cluster == cluster {
		w.from, w.until = end.Add(a.From), start.Add(a.Left)
	}
	return w
}

// alerting reports whether the cluster is the alerting cluster at now.
func (w alertingWindow) alerting(now time.Time) bool {
	return w.known && !now.Before(w.from) && now.Before(w.until)
}

// ClaimAlerting takes, keeps or leaves the role of alerting cluster, as this
// replica's scrapes tell (alertingStepAt), and serves what the database
// answered. The elected leader calls it every third of the claim's TTL.
func (m *LedgerMetrics) ClaimAlerting(ctx context.Context) error {
	start := m.state.now()
	started, scraped := m.state.startedAndScraped()
	step := alertingStepAt(start, started, scraped)
	var a ledger.AlertingCluster
	var err error
	switch step {
	case alertingTake:
		a, err = ledger.ClaimAlerting(ctx, m.store, m.cluster, m.alertingTTL, m.alertingSettle)
	case alertingKeep:
		a, err = ledger.KeepAlerting(ctx, m.store, m.cluster, m.alertingTTL)
	default:
		a, err = ledger.LeaveAlerting(ctx, m.store, m.cluster)
	}
	if err != nil {
		return err
	}
	m.state.learnAlerting(windowOf(m.cluster, a, start, m.state.now()))
	m.logAlerting(ctx, step, a)
	return nil
}

// logAlerting logs when what this cluster knows of the role changes: who
// holds it, and whether this cluster leaves it for want of scrapes.
func (m *LedgerMetrics) logAlerting(ctx context.Context, step alertingStep, a ledger.AlertingCluster) {
	holder := a.Cluster
	if a.Left <= 0 {
		holder = ""
	}
	said := step.String() + "/" + holder
	if step == alertingTake || step == alertingKeep {
		said = "/" + holder // taking or keeping: only the holder matters
	}
	if said == m.alertingSaid {
		return
	}
	m.alertingSaid = said
	logger := log.FromContext(ctx)
	switch {
	case step == alertingLeave:
		logger.Info("no Prometheus has scraped this replica for "+AlertingScrapeRecency.String()+
			": this cluster neither takes nor keeps the role of alerting cluster, so that another cluster's Prometheus raises the alerts on the database's metrics",
			"holder", holder)
	case holder == m.cluster:
		logger.Info("this cluster is the alerting cluster: its Prometheus raises the alerts on the metrics computed from the database, the other clusters' do not",
			"alertingIn", max(a.From, 0).String())
	case holder == "":
		logger.Info("no cluster is the alerting cluster: this replica takes the role once a Prometheus scrapes it")
	default:
		logger.Info("another cluster is the alerting cluster: its Prometheus raises the alerts on the metrics computed from the database", "cluster", holder)
	}
}
