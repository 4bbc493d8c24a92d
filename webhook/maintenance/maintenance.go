package maintenance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/ledger"
	"github.com/dislock/dislock/lockagent/store/migrate"
)

// DefaultRetentionInterval is how often old windows are deleted.
const DefaultRetentionInterval = time.Hour

// Options configure the database loops (set from the webhook's flags).
type Options struct {
	// DatabaseURL is the owner's credential (--database-url): every replica
	// migrates the schema with it at start, and the elected leader deletes
	// windows older than Retention (--retention). It never leaves the
	// webhook's namespace.
	DatabaseURL string
	Retention   time.Duration
	// Cluster names this cluster (--cluster-name) in the ledger metrics it
	// stores and in the token record it writes.
	Cluster string
	// Namespace is the webhook's: the token record is a ConfigMap there.
	Namespace string
	// LedgerInterval is how often the elected leader computes the metrics
	// the ledger gives (missed windows, decisions, run durations) and
	// stores them for every replica to serve (--ledger-interval; 0:
	// DefaultLedgerInterval).
	LedgerInterval time.Duration
	// AlertingCandidate lets this cluster take the role of alerting
	// cluster (--alerting-candidate): set where Prometheus evaluates
	// dislock's rules (the chart sets it with prometheusRule.enabled).
	// Scrapes alone do not tell: any client of the metrics port, a
	// tenant's pod too, looks like a Prometheus.
	AlertingCandidate bool
	// TokenRecordInterval is how often the elected leader confirms the
	// fencing token epoch and records its high water in the ConfigMap
	// tokenrecord.Name (--token-record-interval; 0:
	// DefaultTokenRecordInterval).
	TokenRecordInterval time.Duration
}

// Validate lists every problem; the retention matters only with a
// database URL.
func (o Options) Validate() error {
	var errs []error
	if o.DatabaseURL != "" && o.Retention < store.MinRetention {
		errs = append(errs, fmt.Errorf("retention %s is shorter than %s (set --retention to at least %s): a pod that starts late could claim a deleted window and run it again",
			o.Retention, store.MinRetention, store.MinRetention))
	}
	if o.LedgerInterval < 0 || o.LedgerInterval > 0 && o.LedgerInterval < MinLedgerInterval {
		errs = append(errs, fmt.Errorf("ledger interval %s is shorter than %s (set --ledger-interval to at least %s, or leave it 0 for %s)",
			o.LedgerInterval, MinLedgerInterval, MinLedgerInterval, DefaultLedgerInterval))
	}
	if o.LedgerInterval > MaxLedgerInterval {
		errs = append(errs, fmt.Errorf("ledger interval %s is longer than %s (set --ledger-interval to at most %s): the metrics would be that stale, and a stopped alerting cluster would keep the alerts three intervals",
			o.LedgerInterval, MaxLedgerInterval, MaxLedgerInterval))
	}
	if o.TokenRecordInterval < 0 || o.TokenRecordInterval > MaxTokenRecordInterval {
		errs = append(errs, fmt.Errorf("token record interval %s is outside (0, %s] (set --token-record-interval, or leave it 0 for %s): it is how long a restored database may hand out tokens before the epoch moves past the record",
			o.TokenRecordInterval, MaxTokenRecordInterval, DefaultTokenRecordInterval))
	}
	return errors.Join(errs...)
}

// SetupWithManager adds the database gate and its readiness check (every
// replica), the retention and comparison loop (the elected leader), the
// ledger metrics (computed by the leader, served by every replica) and the
// token keeper (the leader).
func SetupWithManager(mgr manager.Manager, o Options) error {
	gate := newDatabaseGate(migrateDatabase(o.DatabaseURL))
	if err := mgr.Add(gate); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("database", gate.Check); err != nil {
		return err
	}
	if err := mgr.Add(&maintenance{databaseURL: o.DatabaseURL, retention: o.Retention, ready: gate.passed,
		cronJobs: mgr.GetClient(), events: mgr.GetEventRecorder("dislock-webhook")}); err != nil {
		return err
	}
	if err := setupLedgerMetrics(mgr, o, gate.passed); err != nil {
		return err
	}
	if err := setupTokenKeeper(mgr, o, gate.passed); err != nil {
		return fmt.Errorf("adding the token keeper: %w", err)
	}
	return nil
}

// maintenance deletes old windows every hour and compares the clusters'
// views of the jobs, on the elected leader only, once the databaseGate
// found the schema usable (the gate migrates it, on every replica).
type maintenance struct {
	databaseURL string
	retention   time.Duration
	// ready is closed when the databaseGate passed.
	ready <-chan struct{}
	// cronJobs and events report clusters that see a job differently as
	// Events on this cluster's CronJobs.
	cronJobs client.Reader
	events   events.EventRecorder
}

// DisagreementInterval is how often the views the clusters recorded are
// compared; a disagreement is in the agents' logs at once.
const DisagreementInterval = 5 * time.Minute

func (m *maintenance) NeedLeaderElection() bool { return true }

func (m *maintenance) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("maintenance")
	db, err := openWhenReady(ctx, m.ready, m.databaseURL)
	if db == nil {
		return err
	}
	defer db.Close()
	runStep(ctx, logger, "checking the database", checkStepTimeout, func(ctx context.Context) error {
		logFindings(ctx, logger, db)
		return nil
	})
	tick := time.NewTicker(DefaultRetentionInterval)
	defer tick.Stop()
	compare := time.NewTicker(DisagreementInterval)
	defer compare.Stop()
	seen := map[client.ObjectKey]string{}
	for {
		runStep(ctx, logger, "deleting old windows", retentionStepTimeout, func(ctx context.Context) error {
			n, err := ledger.DeleteOldWindows(ctx, db, m.retention)
			if n > 0 {
				logger.Info("deleted old windows", "count", n, "olderThan", m.retention.String())
			}
			return err
		})
		for again := true; again; {
			if m.cronJobs != nil {
				runStep(ctx, logger, "comparing the clusters' views of the jobs", comparisonStepTimeout, func(ctx context.Context) error {
					return reportDisagreements(ctx, db, m.cronJobs, m.events, seen)
				})
			}
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
				again = false
			case <-compare.C:
			}
		}
	}
}

// openWhenReady waits for the databaseGate to pass (ready closed) and opens
// a one-connection store for a leader's loop; a nil store with a nil error
// means ctx ended first.
func openWhenReady(ctx context.Context, ready <-chan struct{}, databaseURL string) (*store.Store, error) {
	select {
	case <-ctx.Done():
		return nil, nil
	case <-ready:
	}
	return store.Open(ctx, databaseURL, store.Options{MaxConns: 1})
}

// Client-side bounds of the maintenance steps. The server bounds each of
// their statements that could wait for what a tenant holds (retention skips
// rows another session holds locked, within ledger.RetentionLockTimeout and
// ledger.RetentionStatementTimeout per statement); these are the backstop for
// what the server cannot see, a connection whose peer is gone or an API
// server that does not answer. A step cut short is logged by name, and the
// loop goes on with the next: no step can stop the others.
const (
	// retentionStepTimeout leaves a large backlog (batches of a thousand
	// rows) time to go; what is left goes at the next run, an hour later.
	retentionStepTimeout  = 15 * time.Minute
	comparisonStepTimeout = time.Minute
	checkStepTimeout      = time.Minute
)

// runStep runs one maintenance step within timeout and logs its failure,
// naming it; it returns when the step does, or soon after its timeout.
func runStep(ctx context.Context, logger logr.Logger, step string, timeout time.Duration, fn func(context.Context) error) {
	stepCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	err := fn(stepCtx)
	if err == nil || ctx.Err() != nil {
		return
	}
	logger.Error(err, "a maintenance step failed; going on with the next", "step", step,
		"took", time.Since(start).Round(time.Millisecond).String(), "timedOut", errors.Is(stepCtx.Err(), context.DeadlineExceeded))
}

// logFindings logs what `dislock check` would say about the database, so
// that an asynchronous failover setup is never accepted silently.
func logFindings(ctx context.Context, logger logr.Logger, db *store.Store) {
	findings, err := check.Database(ctx, db, check.Options{})
	if err != nil {
		logger.Error(err, "checking the database")
		return
	}
	for _, f := range findings {
		if f.Status == check.StatusOK {
			logger.Info("database check", "check", f.Check, "status", f.Status, "detail", f.Detail)
			continue
		}
		logger.Error(nil, "database check: "+f.Detail, "check", f.Check, "status", f.Status, "fix", f.Fix)
	}
}

// Backoff of the databaseGate's attempts. An incompatible schema is asked
// again at the longest pause only: it changes when an operator acts.
const (
	gateBackoffFirst = time.Second
	gateBackoffMax   = time.Minute
)

// migration is what one attempt of the databaseGate found.
type migration struct {
	applied []int
	schema  migrate.SchemaState
}

// databaseGate keeps a replica unready until it has once reached the
// database, migrated schema dislock (or found it migrated by another
// replica or cluster) and found it usable by this build. A wrong URL, a
// missing grant, an unreachable PgBouncer or a schema a newer dislock made
// incompatible then fails the install or the rollout (`helm install
// --wait`, a Deployment's rolling update keeping the old replicas) instead
// of the next tick's pods.
//
// Once passed, a database outage never makes it unready: with failurePolicy
// Fail, unready replicas would make the API server refuse every Job while
// the database is down, though the agents fail closed anyway and admission
// needs no database. A later outage shows in the logs, in
// dislock_database_up and in the DislockDatabaseUnreachable alert instead.
// The schema, though, is asked again every recheck: when another cluster's
// newer dislock applies a migration this build cannot work with, the replica
// goes unready (saying so) rather than inject agents against it, and ready
// again once the schema is usable.
type databaseGate struct {
	migrate               func(context.Context) (migration, error)
	backoffFirst, backoff time.Duration
	passed                chan struct{}

	// recheck is the pause between the schema's checks once passed.
	recheck time.Duration

	mu     sync.Mutex
	reason error // why it has not passed yet
	lost   error // why a passed gate is unready again: the schema became unusable
}

func newDatabaseGate(migrate func(context.Context) (migration, error)) *databaseGate {
	return &databaseGate{migrate: migrate, backoffFirst: gateBackoffFirst, backoff: gateBackoffMax, recheck: gateBackoffMax,
		passed: make(chan struct{}), reason: errors.New("not connected to the database yet")}
}

// migrateDatabase is the databaseGate's attempt against the owner's URL:
// every replica migrates (a table lock no tenant can take serialises them,
// and a current schema takes no lock at all), so each replica's readiness
// says itself what is wrong.
func migrateDatabase(databaseURL string) func(context.Context) (migration, error) {
	return func(ctx context.Context) (migration, error) {
		db, err := store.Open(ctx, databaseURL, store.Options{MaxConns: 1})
		if err != nil {
			return migration{}, err
		}
		defer db.Close()
		applied, err := migrate.Up(ctx, db)
		if err != nil {
			return migration{}, err
		}
		st, err := migrate.Schema(ctx, db)
		return migration{applied: applied, schema: st}, err
	}
}

// Every replica passes the gate, not only the elected leader.
func (g *databaseGate) NeedLeaderElection() bool { return false }

func (g *databaseGate) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("database")
	for backoff := g.backoffFirst; ; backoff = min(2*backoff, g.backoff) {
		m, err := g.migrate(ctx)
		if err == nil && !m.schema.Usable() {
			// Migrate answered, yet the schema moved away since (another
			// cluster's newer dislock migrated meanwhile): ask again.
			err = fmt.Errorf("schema dislock is at version %d after migrating, which this dislock (%d) cannot use", m.schema.Current, m.schema.Known)
		}
		if err == nil {
			if m.schema.Newer() {
				logger.Info("ready: schema dislock is newer than this dislock knows, and every migration since is compatible with it; upgrade this cluster's dislock when convenient",
					"schemaVersion", m.schema.Current, "knownVersion", m.schema.Known)
			} else {
				logger.Info("ready: schema dislock is up to date", "applied", m.applied, "schemaVersion", m.schema.Current)
			}
			close(g.passed)
			return g.watchSchema(ctx, logger)
		}
		g.mu.Lock()
		g.reason = err
		g.mu.Unlock()
		switch {
		case errors.Is(err, migrate.ErrSchemaIncompatible):
			logger.Error(err, "not ready: this dislock cannot work against the database's schema", "retryIn", g.backoff.String())
			backoff = g.backoff
		case errors.Is(err, store.ErrUnavailable):
			logger.Error(err, "not ready: the database is unreachable; check --database-url, the network and PgBouncer", "retryIn", backoff.String())
		default:
			logger.Error(err, "not ready: migrating schema dislock failed", "retryIn", backoff.String())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
	}
}

// watchSchema asks again, every recheck, whether the schema is still usable,
// and keeps g.lost: only an incompatible schema makes a passed gate
// unready; an outage or another failure is logged and changes nothing.
func (g *databaseGate) watchSchema(ctx context.Context, logger logr.Logger) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(g.recheck):
		}
		m, err := g.migrate(ctx)
		incompatible := errors.Is(err, migrate.ErrSchemaIncompatible)
		if err == nil && !m.schema.Usable() {
			incompatible = true
			err = fmt.Errorf("schema dislock is at version %d, which this dislock (%d) cannot use", m.schema.Current, m.schema.Known)
		}
		g.mu.Lock()
		was := g.lost
		switch {
		case incompatible:
			g.lost = err
		case err == nil:
			g.lost = nil
		}
		now := g.lost
		g.mu.Unlock()
		switch {
		case now != nil && was == nil:
			logger.Error(now, "not ready: another cluster's dislock made the schema incompatible with this one; upgrade this cluster")
		case now == nil && was != nil:
			logger.Info("ready again: schema dislock is usable", "schemaVersion", m.schema.Current)
		case err != nil && !incompatible:
			logger.Error(err, "checking schema dislock failed; readiness unchanged (an outage never makes a ready replica unready)")
		}
	}
}

// Check is the readiness check: /readyz/database gives the reason.
func (g *databaseGate) Check(*http.Request) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.passed:
		if g.lost != nil {
			return fmt.Errorf("not ready while schema dislock is incompatible with this dislock: %w", g.lost)
		}
		return nil
	default:
	}
	return fmt.Errorf("not ready until this replica has reached the database once and found schema dislock usable: %w", g.reason)
}
