package lock

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
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
	Action       Action
	N            int64
}

// HeldLease is a key's oldest lease that has not expired (an Indexed Job
// holds one per index).
type HeldLease struct {
	Key string
	// Age is how long its holder has held it, by database time.
	Age time.Duration
}

// LedgerStats is everything the metrics read, with each query's database time.
type LedgerStats struct {
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

// ReadLedgerStats reads every key's statistics, the decision counts and the
// held leases.
func (s *Store) ReadLedgerStats(ctx context.Context) (LedgerStats, error) {
	st := LedgerStats{QueryTime: map[string]time.Duration{}}
	timed := func(name string, f func() error) error {
		start := time.Now()
		err := f()
		st.QueryTime[name] = time.Since(start)
		return err
	}
	err := timed("key_stats", func() error {
		rows, err := s.pool.Query(ctx, qKeyStats, MaxKeysPerNamespace)
		if err != nil {
			return s.classify("reading key statistics", err)
		}
		defer rows.Close()
		for rows.Next() {
			var k KeyStats
			if err := rows.Scan(&k.Key, &k.LastSuccess, &k.MissedTotal, &k.LastMissedWindow, &k.DurationCount,
				&k.DurationSum, &k.DurationBuckets, &st.At); err != nil {
				return s.classify("reading key statistics", err)
			}
			utcPtr(k.LastSuccess)
			utcPtr(k.LastMissedWindow)
			st.Keys = append(st.Keys, k)
		}
		return s.classify("reading key statistics", rows.Err())
	})
	if err != nil {
		return st, err
	}
	err = timed("decision_counts", func() error {
		rows, err := s.pool.Query(ctx, qDecisionCounts, MaxKeysPerNamespace)
		if err != nil {
			return s.classify("reading decision counts", err)
		}
		defer rows.Close()
		for rows.Next() {
			var c DecisionCount
			var action string
			if err := rows.Scan(&c.Key, &c.Cluster, &action, &c.N); err != nil {
				return s.classify("reading decision counts", err)
			}
			c.Action = Action(action)
			st.Counts = append(st.Counts, c)
		}
		return s.classify("reading decision counts", rows.Err())
	})
	if err != nil {
		return st, err
	}
	err = timed("leases", func() error {
		rows, err := s.pool.Query(ctx, qHeldLeases, MaxKeysPerNamespace)
		if err != nil {
			return s.classify("reading held leases", err)
		}
		defer rows.Close()
		for rows.Next() {
			var l HeldLease
			var micros int64
			if err := rows.Scan(&l.Key, &micros); err != nil {
				return s.classify("reading held leases", err)
			}
			l.Age = time.Duration(micros) * time.Microsecond
			st.Leases = append(st.Leases, l)
		}
		return s.classify("reading held leases", rows.Err())
	})
	if err != nil {
		return st, err
	}
	err = timed("keys_left_out", func() error {
		return s.classify("counting the keys left out", s.pool.QueryRow(ctx, qKeysLeftOut, MaxKeysPerNamespace).Scan(&st.KeysLeftOut))
	})
	if err != nil {
		return st, err
	}
	if st.At.IsZero() {
		st.At, err = s.Now(ctx)
	}
	return st, err
}

func utcPtr(t *time.Time) {
	if t != nil {
		*t = t.UTC()
	}
}

// SaveMetricsSnapshot stores the metrics a cluster's leader computed.
func (s *Store) SaveMetricsSnapshot(ctx context.Context, cluster string, body []byte) error {
	_, err := s.pool.Exec(ctx, qSaveSnapshot, cluster, body)
	return s.classify("saving the metrics snapshot", err)
}

// LoadMetricsSnapshot returns the cluster's snapshot and when it was
// computed, if it was computed after newerThan (zero: any); ok is false
// when there is no such snapshot.
func (s *Store) LoadMetricsSnapshot(ctx context.Context, cluster string, newerThan time.Time) (body []byte, computedAt time.Time, ok bool, err error) {
	err = s.pool.QueryRow(ctx, qLoadSnapshot, cluster, nullTime(newerThan)).Scan(&body, &computedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, time.Time{}, false, nil
	}
	if err != nil {
		return nil, time.Time{}, false, s.classify("loading the metrics snapshot", err)
	}
	return body, computedAt.UTC(), true, nil
}
