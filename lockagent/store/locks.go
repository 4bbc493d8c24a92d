package store

import (
	"context"
	"time"
)

// Locks is what a pod does with the database: the calls of one agent's
// life, from its first clock reading to its outcome and ledger row. *Store
// runs them against PostgreSQL; lockagent/gateway's Client sends them to a
// lock gateway, which runs them with a Store of its own. Both answer with
// this package's errors (errors.Is with ErrUnavailable, ErrWindowTaken, …),
// so the agent decides the same way on either path.
type Locks interface {
	// Now is the database's clock.
	Now(ctx context.Context) (time.Time, error)
	RecordView(ctx context.Context, key, cluster string, v View, recency time.Duration) ([]ClusterView, error)
	ClaimWindow(ctx context.Context, r ClaimRequest) (Claim, error)
	WindowAt(ctx context.Context, key string, window time.Time, index int) (Window, time.Time, error)
	AcquireLease(ctx context.Context, key string, owner Owner, ttl time.Duration) (LeaseGrant, error)
	Heartbeat(ctx context.Context, key string, window time.Time, index int, token int64, ttl time.Duration) (aliveUntil, dbTime time.Time, err error)
	Renew(ctx context.Context, r Renewal) (Renewed, error)
	Finish(ctx context.Context, key string, window time.Time, index int, token int64, state State, exitCode *int) (finishedAt time.Time, err error)
	ReleaseLease(ctx context.Context, key string, token int64) (bool, error)
	RecordDecision(ctx context.Context, d Decision) error
	Close()
}

var _ Locks = (*Store)(nil)
