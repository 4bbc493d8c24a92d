package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/db"
)

// The ledger's statistics, read by the owner (the webhook's metrics). Every
// query reads one row per key, per (key, cluster, action) or per lease, never
// the windows or the decisions themselves, so that its cost grows with the
// number of keys and not with their history.

// KeyStats is one key's statistics.
type KeyStats struct {
	Key              string
	LastSuccess      *time.Time
	MissedTotal      int64
	LastMissedWindow *time.Time
	// DurationCount and DurationSum (seconds) summarise the runs' durations;
	// DurationBuckets[i] counts those at most DurationBounds[i] seconds.
	DurationCount   int64
	DurationSum     float64
	DurationBuckets []int64
}

// DecisionCount is how many decisions a cluster made with an action for a key.
type DecisionCount struct {
	Key, Cluster string
	Action       store.Action
	N            int64
}

// HeldLease is a key's oldest lease that has not expired (an Indexed Job
// holds one per index).
type HeldLease struct {
	Key string
	// Age is how long its holder has held it, by database time.
	Age time.Duration
}

// Stats is everything the metrics read, with each query's database time.
type Stats struct {
	Keys      []KeyStats
	Counts    []DecisionCount
	Leases    []HeldLease
	At        time.Time
	QueryTime map[string]time.Duration
	// KeysLeftOut counts the keys beyond MaxKeysPerNamespace, whose
	// statistics were not read.
	KeysLeftOut int64
}

// MaxKeysPerNamespace bounds the keys of one namespace whose statistics the
// metrics read and whose windows the detection judges: those decided last.
// Tenants can write statistics rows for keys of their own namespace at
// will; this keeps one namespace from growing every namespace's metrics.
const MaxKeysPerNamespace = 1000

// Bounds, on the server, of the statements that read the statistics and
// store or load the metrics snapshot. They read rows tenants write, but a
// read waits for no row lock, and no tenant may take a table lock that
// stops one; these bound what is left (an operator's DDL, a read slowed by
// what a tenant wrote), since a client whose context ends does not stop a
// statement dislock never cancels (see db.Dial). The leader's next
// computation tries again.
const (
	StatsLockTimeout      = 2 * time.Second
	StatsStatementTimeout = 30 * time.Second
)

// statsBounds are qStatementBounds' arguments for StatsLockTimeout and
// StatsStatementTimeout.
func statsBounds() []any {
	return []any{fmt.Sprint(StatsLockTimeout.Milliseconds()), fmt.Sprint(StatsStatementTimeout.Milliseconds())}
}

// ReadStats reads every key's statistics, the decision counts and the
// held leases, in one transaction whose statements and pauses are bounded
// on the server (StatsLockTimeout, StatsStatementTimeout).
func ReadStats(ctx context.Context, s *store.Store) (Stats, error) {
	h := s.Handle()
	st := Stats{QueryTime: map[string]time.Duration{}}
	tx, err := h.Pool.Begin(ctx)
	if err != nil {
		return st, h.Classify("reading the ledger's statistics", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only: nothing to commit
	if _, err := tx.Exec(ctx, qStatementBounds, statsBounds()...); err != nil {
		return st, h.Classify("reading the ledger's statistics: bounding the statements", err)
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('idle_in_transaction_session_timeout', $1::text, true)`,
		fmt.Sprint(StatsStatementTimeout.Milliseconds())); err != nil {
		return st, h.Classify("reading the ledger's statistics: bounding the pauses", err)
	}
	timed := func(name string, f func() error) error {
		start := time.Now()
		err := f()
		st.QueryTime[name] = time.Since(start)
		return err
	}
	err = timed("key_stats", func() error {
		rows, err := tx.Query(ctx, qKeyStats, MaxKeysPerNamespace)
		if err != nil {
			return h.Classify("reading key statistics", err)
		}
		defer rows.Close()
		for rows.Next() {
			var k KeyStats
			if err := rows.Scan(&k.Key, &k.LastSuccess, &k.MissedTotal, &k.LastMissedWindow, &k.DurationCount,
				&k.DurationSum, &k.DurationBuckets, &st.At); err != nil {
				return h.Classify("reading key statistics", err)
			}
			db.UTCPtr(k.LastSuccess)
			db.UTCPtr(k.LastMissedWindow)
			st.Keys = append(st.Keys, k)
		}
		return h.Classify("reading key statistics", rows.Err())
	})
	if err != nil {
		return st, err
	}
	err = timed("decision_counts", func() error {
		rows, err := tx.Query(ctx, qDecisionCounts, MaxKeysPerNamespace)
		if err != nil {
			return h.Classify("reading decision counts", err)
		}
		defer rows.Close()
		for rows.Next() {
			var c DecisionCount
			var action string
			if err := rows.Scan(&c.Key, &c.Cluster, &action, &c.N); err != nil {
				return h.Classify("reading decision counts", err)
			}
			c.Action = store.Action(action)
			st.Counts = append(st.Counts, c)
		}
		return h.Classify("reading decision counts", rows.Err())
	})
	if err != nil {
		return st, err
	}
	err = timed("leases", func() error {
		rows, err := tx.Query(ctx, qHeldLeases, MaxKeysPerNamespace)
		if err != nil {
			return h.Classify("reading held leases", err)
		}
		defer rows.Close()
		for rows.Next() {
			var l HeldLease
			var micros int64
			if err := rows.Scan(&l.Key, &micros); err != nil {
				return h.Classify("reading held leases", err)
			}
			l.Age = time.Duration(micros) * time.Microsecond
			st.Leases = append(st.Leases, l)
		}
		return h.Classify("reading held leases", rows.Err())
	})
	if err != nil {
		return st, err
	}
	err = timed("keys_left_out", func() error {
		return h.Classify("counting the keys left out", tx.QueryRow(ctx, qKeysLeftOut, MaxKeysPerNamespace).Scan(&st.KeysLeftOut))
	})
	if err != nil {
		return st, err
	}
	if st.At.IsZero() {
		if err := tx.QueryRow(ctx, db.QNow).Scan(&st.At); err != nil {
			return st, h.Classify("reading database time", err)
		}
		st.At = st.At.UTC()
	}
	return st, nil
}

// SaveMetricsSnapshot stores the metrics a cluster's leader computed,
// bounded on the server (StatsLockTimeout, StatsStatementTimeout): two
// leaders of one cluster (a handover) write the same row.
func SaveMetricsSnapshot(ctx context.Context, s *store.Store, cluster string, body []byte) error {
	h := s.Handle()
	batch := &pgx.Batch{}
	batch.Queue(qStatementBounds, statsBounds()...)
	batch.Queue(qSaveSnapshot, cluster, body)
	return h.Classify("saving the metrics snapshot", h.Pool.SendBatch(ctx, batch).Close())
}

// LoadMetricsSnapshot returns the cluster's snapshot and when it was
// computed, if it was computed after newerThan (zero: any); ok is false
// when there is no such snapshot.
func LoadMetricsSnapshot(ctx context.Context, s *store.Store, cluster string, newerThan time.Time) (body []byte, computedAt time.Time, ok bool, err error) {
	h := s.Handle()
	batch := &pgx.Batch{}
	batch.Queue(qStatementBounds, statsBounds()...)
	batch.Queue(qLoadSnapshot, cluster, db.NullTime(newerThan))
	br := h.Pool.SendBatch(ctx, batch)
	if _, err = br.Exec(); err == nil {
		err = br.QueryRow().Scan(&body, &computedAt)
	}
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, time.Time{}, false, nil
	}
	if err != nil {
		return nil, time.Time{}, false, h.Classify("loading the metrics snapshot", err)
	}
	return body, computedAt.UTC(), true, nil
}
