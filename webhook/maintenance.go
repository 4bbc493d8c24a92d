package webhook

import (
	"context"
	"errors"
	"time"

	"github.com/go-logr/logr"

	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dislock/dislock/lockagent/lock"
)

// DefaultRetentionInterval is how often old windows are deleted.
const DefaultRetentionInterval = time.Hour

// maintenance migrates the schema at start and deletes old windows every
// hour. It runs on the elected leader only; the migration is safe to run
// from every cluster at once anyway (it takes an advisory lock).
type maintenance struct {
	databaseURL string
	retention   time.Duration
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
	store, err := lock.Open(ctx, m.databaseURL, lock.Options{MaxConns: 1})
	if err != nil {
		return err
	}
	defer store.Close()
	// The database may come up after the webhook: retry, never crash-loop.
	for backoff := time.Second; ; backoff = min(2*backoff, time.Minute) {
		applied, err := store.Migrate(ctx)
		if err == nil {
			logger.Info("schema dislock is up to date", "applied", applied, "version", lock.SchemaVersion())
			logFindings(ctx, logger, store)
			break
		}
		if !errors.Is(err, lock.ErrUnavailable) {
			logger.Error(err, "migrating failed; the webhook keeps serving, agents need the schema")
		} else {
			logger.Info("database unavailable; will retry the migration", "in", backoff.String(), "err", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
	}
	tick := time.NewTicker(DefaultRetentionInterval)
	defer tick.Stop()
	compare := time.NewTicker(DisagreementInterval)
	defer compare.Stop()
	seen := map[client.ObjectKey]string{}
	for {
		n, err := store.DeleteOldWindows(ctx, m.retention)
		if err != nil {
			logger.Error(err, "deleting old windows")
		} else if n > 0 {
			logger.Info("deleted old windows", "count", n, "olderThan", m.retention.String())
		}
		for again := true; again; {
			if m.cronJobs != nil {
				if err := reportDisagreements(ctx, store, m.cronJobs, m.events, seen); err != nil {
					logger.Error(err, "comparing the clusters' views of the jobs")
				}
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

// logFindings logs what `dislock check` would say about the database, so
// that an asynchronous failover setup is never accepted silently.
func logFindings(ctx context.Context, logger logr.Logger, store *lock.Store) {
	findings, err := store.CheckDatabase(ctx, lock.CheckOptions{})
	if err != nil {
		logger.Error(err, "checking the database")
		return
	}
	for _, f := range findings {
		if f.Status == lock.StatusOK {
			logger.Info("database check", "check", f.Check, "status", f.Status, "detail", f.Detail)
			continue
		}
		logger.Error(nil, "database check: "+f.Detail, "check", f.Check, "status", f.Status, "fix", f.Fix)
	}
}
