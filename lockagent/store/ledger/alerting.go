package ledger

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
)

// The alerting cluster (migration 13): the one cluster whose Prometheus
// raises the alerts on the metrics every cluster computes from this
// database. The webhook leaders of all clusters claim it as a lease by the
// database clock; each statement is one round trip in autocommit (safe
// behind PgBouncer's transaction pooling) and answers with the row as it
// left it, durations counted from now() and carried as microseconds.

// alertingRow reads the row as the statements before it left it: the
// holder, and the microseconds from now() to when it may alert and to when
// its claim lapses.
const alertingRow = `cluster,
    (extract(epoch FROM alerting_from - now()) * 1000000)::bigint,
    (extract(epoch FROM expire_at - now()) * 1000000)::bigint`

// alertingOrRead answers with the row a write returned ($w) or, when it
// wrote nothing (another cluster holds the role), the row as it was.
func alertingOrRead(w string) string {
	return `WITH w AS (` + w + ` RETURNING cluster, alerting_from, expire_at)
SELECT ` + alertingRow + ` FROM w
UNION ALL
SELECT ` + alertingRow + ` FROM dislock.alerting_cluster WHERE NOT EXISTS (SELECT 1 FROM w)`
}

// qClaimAlerting takes the role for cluster $1 for $2 microseconds when it
// is free or lapsed, and renews it when $1 holds it. A cluster taking it
// over may alert from the lapse of the claim before it plus $3
// microseconds (the settle time), or now if that has passed; a renewal
// keeps when its holder began.
var qClaimAlerting = alertingOrRead(`
INSERT INTO dislock.alerting_cluster AS a (one, cluster, alerting_from, expire_at)
VALUES (true, $1::text, now(), now() + $2::bigint * interval '1 microsecond')
ON CONFLICT (one) DO UPDATE SET
    cluster = EXCLUDED.cluster,
    alerting_from = CASE WHEN a.cluster = EXCLUDED.cluster AND a.expire_at > now() THEN a.alerting_from
                         ELSE greatest(now(), a.expire_at + $3::bigint * interval '1 microsecond') END,
    expire_at = EXCLUDED.expire_at
WHERE a.cluster = EXCLUDED.cluster OR a.expire_at <= now()`)

// qKeepAlerting renews cluster $1's live claim for $2 microseconds and
// never takes the role.
var qKeepAlerting = alertingOrRead(`
UPDATE dislock.alerting_cluster SET expire_at = now() + $2::bigint * interval '1 microsecond'
WHERE cluster = $1::text AND expire_at > now()`)

// qLeaveAlerting ends cluster $1's live claim now.
var qLeaveAlerting = alertingOrRead(`
UPDATE dislock.alerting_cluster SET expire_at = now()
WHERE cluster = $1::text AND expire_at > now()`)

const qReadAlerting = `SELECT ` + alertingRow + ` FROM dislock.alerting_cluster`

// AlertingCluster is the alerting cluster as one statement saw it, its
// times counted from that statement's database clock.
type AlertingCluster struct {
	// Cluster holds the role, or held it last; "" when no cluster ever
	// did, or when a claim raced with another cluster's first and the
	// statement could not see the row it lost to.
	Cluster string
	// From is how long until Cluster may alert: zero or less once it may.
	From time.Duration
	// Left is how long until Cluster's claim lapses: zero or less once it
	// has.
	Left time.Duration
}

// Alerting reports whether cluster held the role, and could alert, when
// the statement ran.
func (a AlertingCluster) Alerting(cluster string) bool {
	return cluster != "" && a.Cluster == cluster && a.From <= 0 && a.Left > 0
}

// ClaimAlerting takes the role of alerting cluster for cluster, for ttl,
// when no cluster holds it (or its claim lapsed), and renews it when
// cluster holds it. A cluster taking it over may alert only once settle
// has passed since the claim before lapsed, so that the cluster before it
// has stopped alerting by then. It answers with the holder after the
// statement, whoever that is.
func ClaimAlerting(ctx context.Context, s *store.Store, cluster string, ttl, settle time.Duration) (AlertingCluster, error) {
	return alertingStatement(ctx, s, "claiming the alerting cluster", qClaimAlerting, cluster, ttl.Microseconds(), settle.Microseconds())
}

// KeepAlerting renews cluster's live claim for ttl and never takes the
// role: a webhook that has not been scraped yet keeps what its cluster
// holds, and takes nothing.
func KeepAlerting(ctx context.Context, s *store.Store, cluster string, ttl time.Duration) (AlertingCluster, error) {
	return alertingStatement(ctx, s, "keeping the alerting cluster", qKeepAlerting, cluster, ttl.Microseconds())
}

// LeaveAlerting ends cluster's live claim now, so that another cluster
// takes the role at its next claim (after the settle time).
func LeaveAlerting(ctx context.Context, s *store.Store, cluster string) (AlertingCluster, error) {
	return alertingStatement(ctx, s, "leaving the alerting cluster", qLeaveAlerting, cluster)
}

// ReadAlerting reads the alerting cluster.
func ReadAlerting(ctx context.Context, s *store.Store) (AlertingCluster, error) {
	return alertingStatement(ctx, s, "reading the alerting cluster", qReadAlerting)
}

// alertingStatement runs one statement on the row, bounded on the server
// like the snapshot's (StatsLockTimeout, StatsStatementTimeout): the
// leaders of other clusters hold the row's lock only for their own claim,
// and no tenant may touch it.
func alertingStatement(ctx context.Context, s *store.Store, op, query string, args ...any) (AlertingCluster, error) {
	h := s.Handle()
	batch := &pgx.Batch{}
	batch.Queue(qStatementBounds, statsBounds()...)
	batch.Queue(query, args...)
	br := h.Pool.SendBatch(ctx, batch)
	var a AlertingCluster
	var fromUS, leftUS int64
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&a.Cluster, &fromUS, &leftUS)
	}
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return AlertingCluster{}, nil
	}
	if err != nil {
		return AlertingCluster{}, h.Classify(op, err)
	}
	a.From, a.Left = time.Duration(fromUS)*time.Microsecond, time.Duration(leftUS)*time.Microsecond
	return a, nil
}
