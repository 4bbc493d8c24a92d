package maintenance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/ledger"
	"github.com/dislock/dislock/lockagent/store/pause"
	"github.com/dislock/dislock/webhook/internal/eventnote"
)

// The ledger's metrics (dislock_decisions_total, dislock_missed_windows_total
// and the rest below) are read from the database, not counted in this
// process: every replica of every cluster would count the same rows. The
// elected leader of each cluster computes them every LedgerInterval and
// stores them as one snapshot under its cluster's name; every replica loads
// the newest snapshot every LedgerLoadInterval and serves it, so whichever
// replica Prometheus scrapes answers alike, and a new leader changes
// nothing a query sees. Each replica measures its own reach of the database
// (dislock_database_up). The webhook serves all of this only when it has the
// owner's database URL. Every cluster's replicas serve the same metrics, so
// only the alerting cluster's Prometheus raises alerts on them (alerting.go).

// Intervals of the ledger metrics.
const (
	DefaultLedgerInterval = 30 * time.Second
	// MinLedgerInterval keeps the detection, which reads every key's
	// statistics, from running back to back.
	MinLedgerInterval = 5 * time.Second
	// MaxLedgerInterval bounds how stale the metrics get, and the
	// alerting cluster's claim, three intervals long (AlertingTTL): a
	// cluster that stops leaves the alerts to another within 15 minutes.
	MaxLedgerInterval = 5 * time.Minute
	// LedgerLoadInterval is how often every replica pings the database and
	// loads the newest snapshot.
	LedgerLoadInterval = 15 * time.Second
	// ledgerPingTimeout bounds a ping: PgBouncer queues a query while its
	// server is down, and a replica must then say the database is down.
	ledgerPingTimeout = 10 * time.Second
)

// ReasonMissedWindow is the reason of the Warning Event put on this
// cluster's CronJob of a key when the detection finds a window of it missed.
const ReasonMissedWindow = "DislockMissedWindow"

// maxMissedEvents bounds the Events one computation puts on a CronJob: a
// detection after a long outage can find hundreds of windows of one key.
const maxMissedEvents = 5

// Values of the looks label of dislock_key_silent: what this cluster's
// CronJob of a silent key looks like.
const (
	LooksDeleted   = "deleted"   // no CronJob of the key here
	LooksSuspended = "suspended" // spec.suspend
	LooksUnknown   = "unknown"   // there and not suspended: dislock removed from it, or its pods never reach the database
)

// Values of the query label of dislock_ledger_query_duration_seconds, beside
// ledger.ReadStats' own (key_stats, decision_counts, leases).
const (
	QueryDetectMissed  = "detect_missed"
	QueryDisagreements = "disagreements"
)

// ledgerSnapshotVersion is the snapshot's format. A replica serves only its
// own version's snapshots (replicas of two versions during an upgrade serve
// what they served until a leader of their version computes).
const ledgerSnapshotVersion = 1

// ledgerSnapshot is one computation of the ledger metrics, stored as JSON
// in dislock.metrics_snapshot. Times are Unix seconds by the database clock.
type ledgerSnapshot struct {
	Version int `json:"v"`
	// At is when the statistics were read.
	At float64 `json:"at"`
	// Bounds are the upper bounds (seconds) of the run duration buckets.
	Bounds []float64 `json:"b"`
	// Queries is each query's time (seconds).
	Queries map[string]float64 `json:"q"`
	Keys    []keySnapshot      `json:"k"`
	// LeftOut counts the keys beyond ledger.MaxKeysPerNamespace, whose
	// metrics and windows were left out.
	LeftOut int64 `json:"l,omitempty"`
}

// keySnapshot is one lock key's metrics.
type keySnapshot struct {
	Key string `json:"key"`
	// Decisions counts the decisions by cluster, then action.
	Decisions map[string]map[string]int64 `json:"d,omitempty"`
	// LastSuccess is 0 until a run succeeded.
	LastSuccess float64 `json:"ls,omitempty"`
	// Missed is set for every key with statistics, 0 included, so that the
	// counter exists before its first miss.
	Missed *int64 `json:"m,omitempty"`
	// LastMissed is the newest missed window's start, 0 if none.
	LastMissed float64 `json:"lm,omitempty"`
	// Silent is the looks label while the key is silent.
	Silent string `json:"s,omitempty"`
	// Disagree is set while the clusters' recent views differ.
	Disagree bool `json:"x,omitempty"`
	// Paused is set while the key is paused everywhere.
	Paused bool `json:"p,omitempty"`
	// Lease is the age (seconds) of the oldest unexpired lease of the key
	// (an Indexed Job holds one per index).
	Lease *float64 `json:"l,omitempty"`
	// Runs is set for every key with statistics.
	Runs *runHistogram `json:"r,omitempty"`
}

// runHistogram is the run durations of a key.
type runHistogram struct {
	Count uint64  `json:"n"`
	Sum   float64 `json:"s"`
	// Buckets are cumulative: Buckets[i] runs took at most Bounds[i].
	Buckets []uint64 `json:"b,omitempty"`
}

// ledgerInputs is what one computation read.
type ledgerInputs struct {
	stats       ledger.Stats
	detection   ledger.Detection
	disagreeing []store.ClusterView
	paused      []pause.Pause
	// looks is this cluster's look of each silent key (LooksUnknown when
	// missing).
	looks map[string]string
	// queries are the times of the reads beside ledger.ReadStats'.
	queries map[string]time.Duration
}

// buildLedgerSnapshot turns what a computation read into the snapshot.
// Pure: the caller reads and stores.
func buildLedgerSnapshot(in ledgerInputs) ledgerSnapshot {
	snap := ledgerSnapshot{Version: ledgerSnapshotVersion, At: unixSeconds(in.stats.At),
		Bounds: slices.Clone(store.DurationBuckets), Queries: map[string]float64{}, LeftOut: in.stats.KeysLeftOut}
	byKey := map[string]*keySnapshot{}
	key := func(k string) *keySnapshot {
		if ks, ok := byKey[k]; ok {
			return ks
		}
		ks := &keySnapshot{Key: k}
		byKey[k] = ks
		return ks
	}
	for _, st := range in.stats.Keys {
		ks := key(st.Key)
		ks.Missed = ptr.To(st.MissedTotal)
		if st.LastSuccess != nil {
			ks.LastSuccess = unixSeconds(*st.LastSuccess)
		}
		if st.LastMissedWindow != nil {
			ks.LastMissed = unixSeconds(*st.LastMissedWindow)
		}
		h := &runHistogram{Count: uint64(max(st.DurationCount, 0)), Sum: st.DurationSum}
		// A row of another version's bounds keeps the buckets both know.
		for i := range min(len(snap.Bounds), len(st.DurationBuckets)) {
			h.Buckets = append(h.Buckets, uint64(max(st.DurationBuckets[i], 0)))
		}
		ks.Runs = h
	}
	for _, c := range in.stats.Counts {
		ks := key(c.Key)
		if ks.Decisions == nil {
			ks.Decisions = map[string]map[string]int64{}
		}
		if ks.Decisions[c.Cluster] == nil {
			ks.Decisions[c.Cluster] = map[string]int64{}
		}
		ks.Decisions[c.Cluster][string(c.Action)] += c.N
	}
	for _, l := range in.stats.Leases {
		ks := key(leaseLockKey(l.Key))
		if age := l.Age.Seconds(); ks.Lease == nil || age > *ks.Lease {
			ks.Lease = &age
		}
	}
	for _, s := range in.detection.Silent {
		looks := in.looks[s.Key]
		if looks == "" {
			looks = LooksUnknown
		}
		key(s.Key).Silent = looks
	}
	for _, v := range in.disagreeing {
		key(v.Key).Disagree = true
	}
	for _, p := range in.paused {
		key(p.Key).Paused = true
	}
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		snap.Keys = append(snap.Keys, *byKey[k])
	}
	for name, d := range in.stats.QueryTime {
		snap.Queries[name] = d.Seconds()
	}
	for name, d := range in.queries {
		snap.Queries[name] = d.Seconds()
	}
	return snap
}

// leaseLockKey is the lock key of a lease key: an Indexed Job's pods hold
// "<key>#<index>".
func leaseLockKey(k string) string {
	if i := strings.LastIndexByte(k, '#'); i > 0 {
		return k[:i]
	}
	return k
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixMicro()) / 1e6 }

// decodeLedgerSnapshot reads a stored snapshot.
func decodeLedgerSnapshot(body []byte) (*ledgerSnapshot, error) {
	var snap ledgerSnapshot
	if err := json.Unmarshal(body, &snap); err != nil {
		return nil, err
	}
	if snap.Version != ledgerSnapshotVersion {
		return nil, fmt.Errorf("version %d, this webhook reads %d (it serves its last snapshot until a leader of its version computes one)",
			snap.Version, ledgerSnapshotVersion)
	}
	return &snap, nil
}

// The metrics, as docs/operations.md names them.
var (
	keyLabels       = []string{"namespace", "cronjob"}
	descDecisions   = prometheus.NewDesc("dislock_decisions_total", "Decisions the agents recorded, by lock key, the cluster whose pod decided, and action (run, takeover, skip, wait, error; succeeded and failed end a run).", append(slices.Clone(keyLabels), "cluster", "action"), nil)
	descLastSuccess = prometheus.NewDesc("dislock_last_success_timestamp_seconds", "When the newest successful run of the lock key finished (database clock).", keyLabels, nil)
	descMissed      = prometheus.NewDesc("dislock_missed_windows_total", "Windows of the lock key found missed: no successful run by the window's start plus its grace (nobody ran it, or its run failed or went silent and nobody took it over).", keyLabels, nil)
	descLastMissed  = prometheus.NewDesc("dislock_last_missed_window_timestamp_seconds", "Start of the lock key's newest missed window.", keyLabels, nil)
	descPaused      = prometheus.NewDesc("dislock_key_paused", "1 while the lock key is paused in every cluster (dislock pause, kubectl dislock pause): its pods skip; absent otherwise.", keyLabels, nil)
	descSilent      = prometheus.NewDesc("dislock_key_silent", "1 while no cluster decided anything for the lock key for several periods; looks is what this cluster's CronJob looks like (deleted, suspended, unknown).", append(slices.Clone(keyLabels), "looks"), nil)
	descDisagree    = prometheus.NewDesc("dislock_clusters_disagree", "1 while the clusters' recent views of the lock key's job (schedule, time zone, mode, ...) differ.", keyLabels, nil)
	descLease       = prometheus.NewDesc("dislock_lease_held_seconds", "Age of the lock key's current unexpired lease (the oldest, for an Indexed Job's per-index leases).", keyLabels, nil)
	descRunDuration = prometheus.NewDesc("dislock_run_duration_seconds", "Duration of the lock key's finished runs, from the claim to the recorded end.", keyLabels, nil)
	descSnapshotAt  = prometheus.NewDesc("dislock_ledger_snapshot_timestamp_seconds", "When the served ledger metrics were computed (database clock).", nil, nil)
	descQueryTime   = prometheus.NewDesc("dislock_ledger_query_duration_seconds", "Time each query of the last ledger metrics computation took.", []string{"query"}, nil)
	descLeftOut     = prometheus.NewDesc("dislock_ledger_keys_left_out", "Keys beyond the 1000 per namespace whose metrics and missed windows the ledger leaves out (those decided least recently).", nil, nil)
	descDatabaseUp  = prometheus.NewDesc("dislock_database_up", "1 if this replica's last ping of the database (every 15s) answered, else 0.", nil, nil)
	descDatabaseRTT = prometheus.NewDesc("dislock_database_round_trip_seconds", "Round trip of this replica's last ping of the database (until it failed, if it did).", nil, nil)
	descAlerting    = prometheus.NewDesc("dislock_alerting_cluster", "1 while this cluster is the alerting cluster, the one of all the clusters sharing the database whose Prometheus raises the alerts on the metrics computed from it; 0 while it is not.", nil, nil)
	ledgerDescs     = []*prometheus.Desc{descDecisions, descLastSuccess, descMissed, descLastMissed, descSilent, descPaused, descDisagree, descLease, descRunDuration, descSnapshotAt, descQueryTime, descLeftOut, descDatabaseUp, descDatabaseRTT, descAlerting}
)

// ledgerState is what a replica serves: the snapshot last computed or
// loaded, its last ping of the database, and whether its cluster is the
// alerting cluster (alerting.go).
type ledgerState struct {
	mu       sync.RWMutex
	snapshot *ledgerSnapshot
	// loaded is the computed_at of the last snapshot loaded: the next load
	// reads the row only if it is newer.
	loaded time.Time
	pinged bool
	up     bool
	rtt    time.Duration

	// clock is this replica's clock (time.Now when nil); a test moves it.
	clock func() time.Time
	// started is when the replica started, and scraped when a Prometheus
	// last scraped it (zero: never): whether the leader may take the role
	// of alerting cluster.
	started, scraped time.Time
	alerting         alertingWindow
}

func (s *ledgerState) now() time.Time {
	if s.clock != nil {
		return s.clock()
	}
	return time.Now()
}

func (s *ledgerState) startedAndScraped() (started, scraped time.Time) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.started, s.scraped
}

// learnAlerting serves w unless what it serves came from a newer read.
func (s *ledgerState) learnAlerting(w alertingWindow) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.alerting.known && w.read.Before(s.alerting.read) {
		return
	}
	s.alerting = w
}

func (s *ledgerState) serve(snap *ledgerSnapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snapshot = snap
}

// collect sends what the replica serves. Being called is itself noted: a
// scrape is how the leader knows that a Prometheus watches its cluster.
func (s *ledgerState) collect(ch chan<- prometheus.Metric) {
	now := s.now()
	s.mu.Lock()
	s.scraped = now
	snap, pinged, up, rtt, alerting := s.snapshot, s.pinged, s.up, s.rtt, s.alerting
	s.mu.Unlock()
	if pinged {
		emit(ch, descDatabaseUp, prometheus.GaugeValue, boolValue(up))
		emit(ch, descDatabaseRTT, prometheus.GaugeValue, rtt.Seconds())
	}
	if alerting.known {
		emit(ch, descAlerting, prometheus.GaugeValue, boolValue(alerting.alerting(now)))
	}
	if snap != nil {
		snap.collect(ch)
	}
}

// collect sends the snapshot's metrics. A series the registry would refuse
// (a key that is not UTF-8, written by hand) is left out rather than failing
// the whole scrape.
func (snap *ledgerSnapshot) collect(ch chan<- prometheus.Metric) {
	emit(ch, descSnapshotAt, prometheus.GaugeValue, snap.At)
	emit(ch, descLeftOut, prometheus.GaugeValue, float64(snap.LeftOut))
	for _, q := range slices.Sorted(maps.Keys(snap.Queries)) {
		emit(ch, descQueryTime, prometheus.GaugeValue, snap.Queries[q], q)
	}
	for _, k := range snap.Keys {
		ns, name := splitLockKey(k.Key)
		for _, cluster := range slices.Sorted(maps.Keys(k.Decisions)) {
			for _, action := range slices.Sorted(maps.Keys(k.Decisions[cluster])) {
				emit(ch, descDecisions, prometheus.CounterValue, float64(k.Decisions[cluster][action]), ns, name, cluster, action)
			}
		}
		if k.LastSuccess != 0 {
			emit(ch, descLastSuccess, prometheus.GaugeValue, k.LastSuccess, ns, name)
		}
		if k.Missed != nil {
			emit(ch, descMissed, prometheus.CounterValue, float64(*k.Missed), ns, name)
		}
		if k.LastMissed != 0 {
			emit(ch, descLastMissed, prometheus.GaugeValue, k.LastMissed, ns, name)
		}
		if k.Silent != "" {
			emit(ch, descSilent, prometheus.GaugeValue, 1, ns, name, k.Silent)
		}
		if k.Paused {
			emit(ch, descPaused, prometheus.GaugeValue, 1, ns, name)
		}
		if k.Missed != nil || k.Disagree {
			emit(ch, descDisagree, prometheus.GaugeValue, boolValue(k.Disagree), ns, name)
		}
		if k.Lease != nil {
			emit(ch, descLease, prometheus.GaugeValue, *k.Lease, ns, name)
		}
		if h := k.Runs; h != nil {
			buckets := make(map[float64]uint64, len(h.Buckets))
			for i, n := range h.Buckets {
				if i < len(snap.Bounds) {
					buckets[snap.Bounds[i]] = n
				}
			}
			if m, err := prometheus.NewConstHistogram(descRunDuration, h.Count, h.Sum, buckets, ns, name); err == nil {
				ch <- m
			}
		}
	}
}

func emit(ch chan<- prometheus.Metric, desc *prometheus.Desc, kind prometheus.ValueType, v float64, labels ...string) {
	if m, err := prometheus.NewConstMetric(desc, kind, v, labels...); err == nil {
		ch <- m
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// splitLockKey splits "<namespace>/<name>" into the namespace and cronjob
// labels.
func splitLockKey(key string) (namespace, name string) {
	if ns, n, ok := strings.Cut(key, "/"); ok {
		return ns, n
	}
	return "", key
}

// ledgerCollector serves a ledgerState's metrics as constant metrics; its
// zero value serves the state SetupWithManager set up (activeLedger).
type ledgerCollector struct{ state *ledgerState }

// activeLedger is what the manager's metrics endpoint serves: the state the
// last SetupWithManager with a database URL made (a process runs one
// webhook; tests run several in turn).
var activeLedger atomic.Pointer[ledgerState]

func init() { metrics.Registry.MustRegister(ledgerCollector{}) }

func (c ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range ledgerDescs {
		ch <- d
	}
}

func (c ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.state
	if st == nil {
		st = activeLedger.Load()
	}
	if st != nil {
		st.collect(ch)
	}
}

// LedgerMetrics computes, stores, loads and serves the ledger metrics of one
// cluster. The webhook's elected leader calls Compute every LedgerInterval
// and every replica Refresh every LedgerLoadInterval; a test can do either
// without leader election and read Collector.
type LedgerMetrics struct {
	// Events, when set, gets a Warning Event DislockMissedWindow on this
	// cluster's CronJob of each window Compute finds missed.
	Events events.EventRecorder
	// Missed bounds the detection; zero fields take lock's defaults.
	Missed ledger.MissedOptions

	store    *store.Store
	cluster  string
	cronJobs client.Reader
	state    *ledgerState
	// alertingTTL and alertingSettle are ClaimAlerting's: AlertingTTL of
	// the ledger interval, and AlertingSettle.
	alertingTTL, alertingSettle time.Duration
	// alertingSaid is what logAlerting last logged.
	alertingSaid string
	// pausesSaid are the pauses this cluster put an Event for, by key:
	// each pause, and its end, is told once per leader.
	pausesSaid map[string]pause.Pause
	// reportedThrough is the detection time of the newest missed window
	// this cluster put an Event for: the detection of another cluster may
	// find a window first, and this cluster's CronJob gets its Event too.
	reportedThrough time.Time
}

// NewLedgerMetrics returns the ledger metrics of cluster (the
// --cluster-name), read from store with the owner's credential. cronJobs
// reads this cluster's CronJobs, for dislock_key_silent's looks label and
// the missed-window Events; nil makes every silent key look unknown and
// puts no Event anywhere.
func NewLedgerMetrics(db *store.Store, cluster string, cronJobs client.Reader) *LedgerMetrics {
	return &LedgerMetrics{store: db, cluster: cluster, cronJobs: cronJobs, state: &ledgerState{},
		alertingTTL: AlertingTTL(DefaultLedgerInterval), alertingSettle: AlertingSettle}
}

// Collector serves what Compute computed or Refresh loaded last, and the
// last ping's result.
func (m *LedgerMetrics) Collector() prometheus.Collector { return ledgerCollector{state: m.state} }

// Compute runs the missed-window detection, reads the ledger's statistics
// and the clusters' disagreeing views, stores the snapshot under this
// cluster's name for every replica, and serves it. Windows it finds missed
// become Events. Nothing is stored unless every read succeeded: a partial
// snapshot would turn a failed read into a false all-clear.
func (m *LedgerMetrics) Compute(ctx context.Context) error {
	logger := log.FromContext(ctx)
	queries := map[string]time.Duration{}
	start := time.Now()
	det, err := ledger.DetectMissed(ctx, m.store, m.Missed)
	queries[QueryDetectMissed] = time.Since(start)
	if err != nil {
		return fmt.Errorf("computing the ledger metrics: %w", err)
	}
	for _, p := range det.Problems {
		logger.Error(nil, "a key's windows cannot be judged", "problem", p)
	}
	cronJobs := &cronJobsByKey{reader: m.cronJobs}
	m.reportMissed(ctx, cronJobs, m.toReport(ctx, det.New))

	stats, err := ledger.ReadStats(ctx, m.store)
	if err != nil {
		return fmt.Errorf("computing the ledger metrics: %w", err)
	}
	start = time.Now()
	views, err := m.store.ListDisagreements(ctx, store.DefaultViewRecency)
	queries[QueryDisagreements] = time.Since(start)
	if err != nil {
		return fmt.Errorf("computing the ledger metrics: %w", err)
	}
	paused, _, err := pause.Active(ctx, m.store, "")
	if err != nil {
		return fmt.Errorf("computing the ledger metrics: %w", err)
	}
	m.reportPauses(ctx, cronJobs, paused)
	looks := map[string]string{}
	for _, s := range det.Silent {
		if m.cronJobs == nil {
			break // every silent key looks unknown
		}
		cjs, err := cronJobs.of(ctx, s.Key)
		if err != nil {
			// The metric says "unknown" rather than wait for the API server.
			logger.Error(err, "reading the CronJobs of a silent key", "key", s.Key)
			continue
		}
		looks[s.Key] = looksOf(cjs)
	}
	snap := buildLedgerSnapshot(ledgerInputs{stats: stats, detection: det, disagreeing: views, paused: paused, looks: looks, queries: queries})
	body, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("encoding the ledger metrics: %w", err)
	}
	if err := ledger.SaveMetricsSnapshot(ctx, m.store, m.cluster, body); err != nil {
		return fmt.Errorf("storing the ledger metrics: %w", err)
	}
	m.state.serve(&snap)
	logger.V(1).Info("ledger metrics computed", "keys", len(snap.Keys), "missed", len(det.New), "silent", len(det.Silent), "bytes", len(body))
	if stats.KeysLeftOut > 0 {
		logger.Info("keys left out of the ledger metrics and the missed-window detection: a namespace has more than the keys it may have judged",
			"leftOut", stats.KeysLeftOut, "perNamespace", ledger.MaxKeysPerNamespace)
	}
	return nil
}

// Refresh pings the database, reads which cluster is the alerting cluster,
// then loads this cluster's newest snapshot if it is newer than the one this
// replica loaded last.
func (m *LedgerMetrics) Refresh(ctx context.Context) error {
	pingCtx, cancel := context.WithTimeout(ctx, ledgerPingTimeout)
	start := time.Now()
	err := m.store.Ping(pingCtx)
	rtt := time.Since(start)
	cancel()
	m.state.mu.Lock()
	m.state.pinged, m.state.up, m.state.rtt = true, err == nil, rtt
	newerThan := m.state.loaded
	m.state.mu.Unlock()
	if err != nil {
		return fmt.Errorf("pinging the database: %w", err)
	}
	readStart := m.state.now()
	alerting, alertingErr := ledger.ReadAlerting(ctx, m.store)
	if alertingErr == nil {
		m.state.learnAlerting(windowOf(m.cluster, alerting, readStart, m.state.now()))
	}
	body, at, ok, err := ledger.LoadMetricsSnapshot(ctx, m.store, m.cluster, newerThan)
	if err != nil || !ok {
		return errors.Join(alertingErr, err)
	}
	m.state.mu.Lock()
	m.state.loaded = at
	m.state.mu.Unlock()
	snap, err := decodeLedgerSnapshot(body)
	if err != nil {
		return fmt.Errorf("the ledger metrics of cluster %s computed at %s: %w", m.cluster, at.Format(time.RFC3339), err)
	}
	m.state.serve(snap)
	return alertingErr
}

// maxMissedReported bounds the missed windows one computation reads to put
// Events for: at most maxMissedEvents+1 of each key (the notes count the
// rest as "more"), so that one namespace's many cannot crowd out another's.
const maxMissedReported = 20000

// toReport returns the missed windows this cluster has not put Events for:
// those its own detection found (found) and those other clusters' found
// since its last computation. The first computation of a leader reports
// only what it found itself: the windows found before it led are old news.
func (m *LedgerMetrics) toReport(ctx context.Context, found []ledger.MissedWindow) []ledger.MissedWindow {
	if m.Events == nil || m.cronJobs == nil {
		return nil
	}
	out := found
	if !m.reportedThrough.IsZero() {
		listed, _, err := ledger.ListMissed(ctx, m.store, ledger.MissedFilter{DetectedAfter: m.reportedThrough, PerKey: maxMissedEvents + 1, Limit: maxMissedReported})
		if err != nil {
			log.FromContext(ctx).Error(err, "listing the windows other clusters found missed; their Events are left out")
		} else {
			out = listed
		}
	}
	for _, w := range append(slices.Clone(found), out...) {
		if w.DetectedAt.After(m.reportedThrough) {
			m.reportedThrough = w.DetectedAt
		}
	}
	if m.reportedThrough.IsZero() {
		if now, err := m.store.Now(ctx); err == nil {
			m.reportedThrough = now
		}
	}
	// Oldest window first, as the Events' notes count them.
	slices.SortFunc(out, func(a, b ledger.MissedWindow) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return a.Window.Compare(b.Window)
	})
	return out
}

// reportMissed puts a Warning Event on this cluster's CronJob of each newly
// missed window's key, at most maxMissedEvents per key: the rest are told
// in the last one.
func (m *LedgerMetrics) reportMissed(ctx context.Context, cronJobs *cronJobsByKey, missed []ledger.MissedWindow) {
	if m.Events == nil || m.cronJobs == nil {
		return
	}
	byKey := map[string][]ledger.MissedWindow{}
	for _, w := range missed {
		byKey[w.Key] = append(byKey[w.Key], w)
	}
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		cjs, err := cronJobs.of(ctx, key)
		if err != nil {
			log.FromContext(ctx).Error(err, "reading the CronJobs of a key with missed windows", "key", key)
			continue
		}
		for _, note := range missedNotes(byKey[key]) {
			for i := range cjs {
				m.Events.Eventf(&cjs[i], nil, corev1.EventTypeWarning, ReasonMissedWindow, "Detect", "%s", note)
			}
		}
	}
}

// Reasons of the Normal Events put on this cluster's CronJobs of a key when
// a pause of it begins (or changes) and when it ends.
const (
	ReasonPaused  = "DislockPaused"
	ReasonResumed = "DislockResumed"
)

// reportPauses puts an Event on this cluster's CronJobs of each key whose
// pause began or changed, or ended, since the last computation.
func (m *LedgerMetrics) reportPauses(ctx context.Context, cronJobs *cronJobsByKey, active []pause.Pause) {
	if m.Events == nil || m.cronJobs == nil {
		return
	}
	now := map[string]pause.Pause{}
	for _, p := range active {
		now[p.Key] = p
	}
	event := func(key, reason, note string) {
		cjs, err := cronJobs.of(ctx, key)
		if err != nil {
			log.FromContext(ctx).Error(err, "reading the CronJobs of a paused key", "key", key)
			return
		}
		for i := range cjs {
			m.Events.Eventf(&cjs[i], nil, corev1.EventTypeNormal, reason, "Pause", "%s", eventnote.Cut(note))
		}
	}
	for _, key := range slices.Sorted(maps.Keys(now)) {
		p := now[key]
		if said, ok := m.pausesSaid[key]; ok && samePause(said, p) {
			continue
		}
		event(key, ReasonPaused, fmt.Sprintf("%s is %s in every cluster since %s: its pods skip, a run already going goes on",
			key, p.Text(), rfc3339(p.PausedAt)))
	}
	for _, key := range slices.Sorted(maps.Keys(m.pausesSaid)) {
		if _, ok := now[key]; !ok {
			event(key, ReasonResumed, fmt.Sprintf("%s is no longer paused (it was %s): its next window runs", key, m.pausesSaid[key].Text()))
		}
	}
	m.pausesSaid = now
}

// samePause reports whether a and b are the same pause, unchanged.
func samePause(a, b pause.Pause) bool {
	return a.PausedAt.Equal(b.PausedAt) && a.PausedBy == b.PausedBy && a.Reason == b.Reason &&
		((a.Until == nil) == (b.Until == nil)) && (a.Until == nil || a.Until.Equal(*b.Until))
}

// missedNotes are the Event notes of one key's missed windows, oldest
// first: one per window, and when there are more than maxMissedEvents, a
// last one that counts the rest.
func missedNotes(ws []ledger.MissedWindow) []string {
	var out []string
	for i, w := range ws {
		if i == maxMissedEvents-1 && len(ws) > maxMissedEvents {
			rest := ws[i:]
			out = append(out, eventnote.Cut(fmt.Sprintf("%d more windows of %s were missed, from %s to %s (dislock missed --key %s lists them)",
				len(rest), w.Key, rfc3339(rest[0].Window), rfc3339(rest[len(rest)-1].Window), w.Key)))
			break
		}
		out = append(out, eventnote.Cut(fmt.Sprintf("window %s of %s was missed (%s): %s", rfc3339(w.Window), w.Key, w.Kind, w.Reason)))
	}
	return out
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// cronJobsByKey finds this cluster's CronJobs of lock keys, listing each
// namespace once per computation (from the manager's cache).
type cronJobsByKey struct {
	reader      client.Reader
	byNamespace map[string][]batchv1.CronJob
}

// of returns the CronJobs of key's namespace that lock it (by their
// dislock.io/key, or their name), else the one named like the key (no
// longer opted in).
func (c *cronJobsByKey) of(ctx context.Context, key string) ([]batchv1.CronJob, error) {
	if c.reader == nil {
		return nil, nil
	}
	ns, name := splitLockKey(key)
	list, ok := c.byNamespace[ns]
	if !ok {
		var l batchv1.CronJobList
		if err := c.reader.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return nil, fmt.Errorf("listing the CronJobs of namespace %s: %w", ns, err)
		}
		if c.byNamespace == nil {
			c.byNamespace = map[string][]batchv1.CronJob{}
		}
		list = l.Items
		c.byNamespace[ns] = list
	}
	var locking, named []batchv1.CronJob
	for _, cj := range list {
		annotations := contract.Merge(cj.Annotations, cj.Spec.JobTemplate.Annotations)
		if contract.Enabled(annotations) {
			if s, err := contract.FromAnnotations(annotations, cj.Namespace, cj.Name); err == nil && s.Key() == key {
				locking = append(locking, cj)
				continue
			}
		}
		if cj.Name == name {
			named = append(named, cj)
		}
	}
	if len(locking) > 0 {
		return locking, nil
	}
	return named, nil
}

// looksOf is the looks label of a silent key whose CronJobs here are cjs.
func looksOf(cjs []batchv1.CronJob) string {
	if len(cjs) == 0 {
		return LooksDeleted
	}
	for _, cj := range cjs {
		if !ptr.Deref(cj.Spec.Suspend, false) {
			return LooksUnknown
		}
	}
	return LooksSuspended
}

// setupLedgerMetrics adds the leader's computation and every replica's
// load, serving what they read on the manager's metrics endpoint, and, in
// a candidate cluster (Options.AlertingCandidate), the leader's claim of
// the alerting cluster once the databaseGate passed (ready closed): the
// schema has its row then.
func setupLedgerMetrics(mgr manager.Manager, o Options, ready <-chan struct{}) error {
	interval := o.LedgerInterval
	if interval == 0 {
		interval = DefaultLedgerInterval
	}
	state := &ledgerState{started: time.Now()}
	activeLedger.Store(state)
	ttl := AlertingTTL(interval)
	newMetrics := func(db *store.Store) *LedgerMetrics {
		m := NewLedgerMetrics(db, o.Cluster, mgr.GetClient())
		m.state, m.Events, m.alertingTTL = state, mgr.GetEventRecorder("dislock-webhook"), ttl
		return m
	}
	const failing, recovered = "the ledger metrics are not current", "the ledger metrics are current again"
	if err := mgr.Add(&ledgerLoop{name: "ledger-metrics", databaseURL: o.DatabaseURL, interval: interval, leader: true,
		run: (*LedgerMetrics).Compute, metrics: newMetrics, failing: failing, recovered: recovered}); err != nil {
		return fmt.Errorf("adding the ledger metrics: %w", err)
	}
	if err := mgr.Add(&ledgerLoop{name: "ledger-load", databaseURL: o.DatabaseURL, interval: LedgerLoadInterval,
		run: (*LedgerMetrics).Refresh, metrics: newMetrics, failing: failing, recovered: recovered}); err != nil {
		return fmt.Errorf("adding the ledger metrics' loader: %w", err)
	}
	if !o.AlertingCandidate {
		// This cluster's replicas still read the role and serve
		// dislock_alerting_cluster (0), and a claim it held lapses.
		return nil
	}
	if err := mgr.Add(&ledgerLoop{name: "alerting-cluster", databaseURL: o.DatabaseURL, interval: ttl / 3, leader: true,
		ready: ready, run: (*LedgerMetrics).ClaimAlerting, metrics: newMetrics,
		failing:   "this cluster cannot take or keep the role of alerting cluster; another cluster takes it once its claim lapses",
		recovered: "this cluster claims the role of alerting cluster again"}); err != nil {
		return fmt.Errorf("adding the alerting cluster's claim: %w", err)
	}
	return nil
}

// ledgerLoop runs one of LedgerMetrics' methods at once and then every
// interval, with a store of its own (one connection).
type ledgerLoop struct {
	name        string
	databaseURL string
	interval    time.Duration
	leader      bool
	run         func(*LedgerMetrics, context.Context) error
	metrics     func(*store.Store) *LedgerMetrics
	// failing and recovered are what the log says when run starts to fail
	// and when it succeeds again.
	failing, recovered string
	// ready, when set, is closed when the loop may start.
	ready <-chan struct{}
}

func (l *ledgerLoop) NeedLeaderElection() bool { return l.leader }

func (l *ledgerLoop) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName(l.name)
	ctx = log.IntoContext(ctx, logger)
	if l.ready != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-l.ready:
		}
	}
	db, err := store.Open(ctx, l.databaseURL, store.Options{MaxConns: 1})
	if err != nil {
		return err
	}
	defer db.Close()
	m := l.metrics(db)
	tick := time.NewTicker(l.interval)
	defer tick.Stop()
	failing := false
	for {
		runCtx, cancel := context.WithTimeout(ctx, l.interval)
		err := l.run(m, runCtx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil && failing:
			logger.Info(l.recovered)
		case err != nil && !failing:
			// Once per outage, not every interval; the metrics say the rest
			// (dislock_database_up, dislock_ledger_snapshot_timestamp_seconds,
			// dislock_alerting_cluster).
			logger.Error(err, l.failing+"; retrying every "+l.interval.String())
		case err != nil:
			logger.V(1).Info("still failing: "+l.failing, "err", err.Error())
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
