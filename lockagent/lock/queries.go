package lock

// SQL lives here as data. Each statement runs alone in autocommit; durations
// travel as microseconds and become intervals inside SQL so that every
// timestamp is computed from the database clock.

const qNow = `SELECT now()`

// qClaimWindow inserts the window or, on conflict, takes it over when the
// caller is the same owner (a retry of the owner's Job) or when standby is on
// and the owner failed or stopped proving it is alive. A succeeded or skipped
// window never changes hands. Re-entry keeps the token and claim time. A
// takeover draws its token only once it holds the row lock, so it is larger
// than any token handed out for the row before (the VALUES token is drawn
// before the conflict is known and may be older). xmax = 0 only for a freshly
// inserted row.
const qClaimWindow = `
INSERT INTO dislock.windows AS w
    (lock_key, window_start, owner, cluster, pod, token, state, claimed_at, alive_until)
VALUES ($1::text, $2::timestamptz, $3::text, $4::text, $5::text,
        nextval('dislock.fencing_token'), 'running', now(), now() + $6::bigint * interval '1 microsecond')
ON CONFLICT (lock_key, window_start) DO UPDATE SET
    token       = CASE WHEN w.owner = EXCLUDED.owner THEN w.token ELSE nextval('dislock.fencing_token') END,
    claimed_at  = CASE WHEN w.owner = EXCLUDED.owner THEN w.claimed_at ELSE EXCLUDED.claimed_at END,
    owner       = EXCLUDED.owner,
    cluster     = EXCLUDED.cluster,
    pod         = EXCLUDED.pod,
    state       = 'running',
    alive_until = EXCLUDED.alive_until,
    finished_at = NULL,
    exit_code   = NULL
WHERE w.state IN ('running', 'failed')
  AND (w.owner = EXCLUDED.owner
       OR ($7::boolean AND (w.state = 'failed' OR w.alive_until <= now())))
RETURNING ` + windowColumns + `, (xmax = 0), now()`

const windowColumns = `lock_key, window_start, owner, cluster, pod, token, state,
    claimed_at, alive_until, finished_at, exit_code`

const qGetWindow = `SELECT ` + windowColumns + `, now() FROM dislock.windows
WHERE lock_key = $1::text AND window_start = $2::timestamptz`

// qHeartbeatWindow extends the owner's liveness. The token identifies the
// claim: after a takeover the old owner's token no longer matches.
const qHeartbeatWindow = `
UPDATE dislock.windows SET alive_until = now() + $4::bigint * interval '1 microsecond'
WHERE lock_key = $1::text AND window_start = $2::timestamptz AND token = $3::bigint AND state = 'running'
RETURNING alive_until, now()`

// qFinishWindow records the outcome. Repeating the same outcome succeeds, so
// a retry after a lost reply does not report a lost window. Liveness ends at
// once so that a standby does not wait out the TTL of a finished run.
const qFinishWindow = `
UPDATE dislock.windows
SET state = $4::text, exit_code = $5::int, finished_at = COALESCE(finished_at, now()),
    alive_until = LEAST(alive_until, now())
WHERE lock_key = $1::text AND window_start = $2::timestamptz AND token = $3::bigint
  AND (state = 'running' OR (state = $4::text AND exit_code IS NOT DISTINCT FROM $5::int))
RETURNING finished_at`

const qListWindows = `SELECT ` + windowColumns + `, now() FROM dislock.windows
WHERE ($1::text = '' OR lock_key = $1::text)
ORDER BY window_start DESC, lock_key
LIMIT $2::int`

const qDeleteWindow = `DELETE FROM dislock.windows WHERE lock_key = $1::text AND window_start = $2::timestamptz`

// qDeleteOldWindows keeps a window that still claims to be running and is
// alive, however old: deleting it would let another cluster claim it.
const qDeleteOldWindows = `
DELETE FROM dislock.windows
WHERE window_start < now() - $1::bigint * interval '1 microsecond'
  AND (state <> 'running' OR alive_until < now())`

// qAcquireLease takes a free or expired lease, or re-enters the caller's own
// live lease (same pod: a restarted sidecar) keeping its token. Taking an
// expired or released lease, even one's own, is a new grant with a new token.
//
// Fencing tokens must grow in the order leases are granted. The VALUES token
// is drawn before the statement knows whether it will insert, so a slow
// caller could insert with an old token after faster ones came and went.
// Hence a lease row, once created, is never deleted (release and operator
// release only expire it), and every later grant draws its token in DO UPDATE,
// while it holds the row lock.
const qAcquireLease = `
INSERT INTO dislock.leases AS l (lock_key, owner, token, acquired_at, expire_at)
VALUES ($1::text, $2::text, nextval('dislock.fencing_token'), now(), now() + $3::bigint * interval '1 microsecond')
ON CONFLICT (lock_key) DO UPDATE SET
    token       = CASE WHEN l.owner = EXCLUDED.owner AND l.expire_at > now()
                       THEN l.token ELSE nextval('dislock.fencing_token') END,
    acquired_at = CASE WHEN l.owner = EXCLUDED.owner AND l.expire_at > now()
                       THEN l.acquired_at ELSE EXCLUDED.acquired_at END,
    owner       = EXCLUDED.owner,
    expire_at   = EXCLUDED.expire_at
WHERE l.expire_at <= now() OR l.owner = EXCLUDED.owner
RETURNING ` + leaseColumns + `, (xmax = 0), now()`

const leaseColumns = `lock_key, owner, token, acquired_at, expire_at`

const qGetLease = `SELECT ` + leaseColumns + `, now() FROM dislock.leases WHERE lock_key = $1::text`

const qRenewLease = `
UPDATE dislock.leases SET expire_at = now() + $3::bigint * interval '1 microsecond'
WHERE lock_key = $1::text AND token = $2::bigint AND expire_at > now()
RETURNING expire_at, now()`

// qReleaseLease expires the caller's lease now (see qAcquireLease for why the
// row stays).
const qReleaseLease = `UPDATE dislock.leases SET expire_at = now()
WHERE lock_key = $1::text AND token = $2::bigint AND expire_at > now()`

const qForceReleaseLease = `UPDATE dislock.leases SET expire_at = now()
WHERE lock_key = $1::text AND expire_at > now()`

const qListLeases = `SELECT ` + leaseColumns + `, now() FROM dislock.leases ORDER BY lock_key`
