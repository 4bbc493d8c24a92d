package store

import "strings"

// SQL lives here as data. Each statement runs alone in autocommit; durations
// travel as microseconds and become intervals inside SQL so that every
// timestamp is computed from the database clock.

// commitGuard ends the RETURNING list of every lock write (see writeRow).
// Its first column says why this session's commit may be less durable than
// an acknowledgement must mean, or is empty: a role or database default can
// turn the wait for the synchronous standby off, or hide the warning that
// says it was cut short. Settings cannot change within one statement, so
// the answer holds for the commit that follows. The second column tells
// whether the server's messages are surely in English, which writeRow needs
// to tell that warning from harmless ones: only lc_messages C or POSIX is
// (under any other value, including C.UTF-8 and the empty default, gettext
// may follow the server's LANGUAGE environment).
const commitGuard = `,
    CASE WHEN current_setting('synchronous_commit') = 'off'
              THEN 'synchronous_commit = off: a commit is acknowledged before it is on disk'
         WHEN current_setting('synchronous_commit') = 'local' AND current_setting('synchronous_standby_names') <> ''
              THEN 'synchronous_commit = local: a commit is acknowledged before the synchronous standby has it'
         WHEN current_setting('client_min_messages') NOT IN ('debug5', 'debug4', 'debug3', 'debug2', 'debug1', 'log', 'notice', 'info', 'warning')
              THEN 'client_min_messages = ' || current_setting('client_min_messages') ||
                   ': the server would not say that a commit''s wait for the synchronous standby was cut short'
         ELSE '' END,
    current_setting('lc_messages') IN ('C', 'POSIX')` // as englishMessages

// qClaimWindow claims through dislock.claim_unless_paused (migration 16),
// which is dislock.claim_window (migration 10), the one
// place the rule of "Ownership and re-entry" is decided: the same pod
// re-enters its running claim and keeps its token and claim time; another
// pod of the same Job ($8 is the Job's owner prefix), or any pod when
// standby ($9) is on, takes a window whose owner failed or whose liveness
// lapsed at database time, with a new token drawn under the row lock. A
// succeeded or skipped window never changes hands, and a live owner is
// never displaced. A refusal (the common answer at the top of the hour:
// another cluster's pod claimed first) locks and writes nothing.
//
// With a view ($10, JSON; $11 the recency of others' views, $12 how often
// an unchanged view is written again) the same call records the cluster's
// view of the job and returns the other clusters' recent views that differ
// from it; with $13 it refuses a window started longer ago than that, by
// the database's clock. Durations travel as microseconds. A key paused
// everywhere (migration 16) is answered 'paused' with the pause's author,
// reason and end, and nothing is written.
//
// The call comes first in the text, so that pg_stat_activity's cut of a
// long statement still names it.
var qClaimWindow = claimWindowQuery(", c.paused_by, c.pause_reason, c.paused_until")

// qClaimWindowSchema15 is qClaimWindow on a database not migrated to schema
// 16 yet, whose claim_window knows no pause (see Store.noPauses).
var qClaimWindowSchema15 = claimWindowQuery("")

// qClaimGuarded is qClaimWindow as one call of dislock.claim_guarded
// (migration 20), which answers the same columns in the same order, the
// commit guard's included: nothing else in the statement for PostgreSQL
// to parse and plan on every call. A database not migrated to schema 20
// yet is sent qClaimWindow (see Store.noGuardedCalls).
const qClaimGuarded = `SELECT * FROM dislock.claim_guarded($1::text, $2::timestamptz, $3::int, $4::text, $5::text, $6::text,
    $7::bigint, $8::text, $9::boolean, $10::jsonb, $11::bigint, $12::bigint, $13::bigint)`

func claimWindowQuery(pauseColumns string) string {
	function := "dislock.claim_unless_paused"
	if pauseColumns == "" {
		function = "dislock.claim_window"
	}
	return `
WITH c AS (SELECT * FROM ` + function + `($1::text, $2::timestamptz, $3::int, $4::text, $5::text, $6::text,
    $7::bigint, $8::text, $9::boolean, $10::jsonb, $11::bigint, $12::bigint, $13::bigint))
SELECT ` + qualified("(c.w).", windowColumns) + `, c.outcome, c.db_now,
    c.other_clusters, c.other_views, c.other_seen` + pauseColumns + commitGuard + `
FROM c`
}

// qualified prefixes each of a comma-separated list of columns.
func qualified(prefix, columns string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

const windowColumns = `lock_key, window_start, job_index, owner, cluster, pod, token, state,
    claimed_at, alive_until, finished_at, exit_code`

const qGetWindow = `SELECT ` + windowColumns + `, now() FROM dislock.windows
WHERE lock_key = $1::text AND window_start = $2::timestamptz AND job_index = $3::int`

// qRenew extends, through dislock.renew (migration 11) in one commit, the
// window's liveness and the lease a pod holds, each identified by its
// token: after a takeover the old owner's token no longer matches, and
// that expiry comes back NULL. A lease is live when its row is read
// (clock_timestamp), not when the statement began (now()): a renewal that
// waited on the row lock past the expiry must fail, since the lease of the
// key's other shape ("key#i" for "key", and the other way round: migration
// 7) may have been granted meanwhile, and it checked this row's expiry at
// its own time.
const qRenew = `
WITH r AS (SELECT * FROM dislock.renew($1::text, $2::timestamptz, $3::int, $4::bigint, $5::text, $6::bigint, $7::bigint))
SELECT r.window_until, r.lease_until, r.db_now` + commitGuard + `
FROM r`

// qRenewGuarded is qRenew as one call of dislock.renew_guarded (migration
// 20), which answers the same columns, the commit guard's included. A
// database not migrated to schema 20 yet is sent qRenew (see
// Store.noGuardedCalls).
const qRenewGuarded = `SELECT * FROM dislock.renew_guarded($1::text, $2::timestamptz, $3::int, $4::bigint, $5::text, $6::bigint, $7::bigint)`

// qRenewWindowSchema10 and qRenewLeaseSchema10 renew against schema 10
// (see Store.renewSchema10): no row when the claim or the lease is no
// longer the caller's.
const (
	qRenewWindowSchema10 = `
WITH r AS (SELECT * FROM dislock.renew_window($1::text, $2::timestamptz, $3::int, $4::bigint, $5::bigint))
SELECT r.renewed_until, r.db_now` + commitGuard + `
FROM r`
	qRenewLeaseSchema10 = `
WITH r AS (SELECT * FROM dislock.renew_lease($1::text, $2::bigint, $3::bigint))
SELECT r.renewed_until, r.db_now` + commitGuard + `
FROM r`
)

// qFinishWindow records the outcome. Repeating the same outcome succeeds, so
// a retry after a lost reply does not report a lost window. Liveness ends at
// once so that a waiting pod does not wait out the TTL of a finished run.
const qFinishWindow = `
UPDATE dislock.windows
SET state = $5::text, exit_code = $6::int, finished_at = COALESCE(finished_at, now()),
    alive_until = LEAST(alive_until, now())
WHERE lock_key = $1::text AND window_start = $2::timestamptz AND job_index = $3::int AND token = $4::bigint
  AND (state = 'running' OR (state = $5::text AND exit_code IS NOT DISTINCT FROM $6::int))
RETURNING finished_at` + commitGuard

const qListWindows = `SELECT ` + windowColumns + `, now() FROM dislock.windows
WHERE ($1::text = '' OR lock_key = $1::text)
ORDER BY window_start DESC, lock_key, job_index
LIMIT $2::int`

// qDeleteWindow deletes every completion index of the window, and its
// shape, so that a re-run may have another completion mode.
const qDeleteWindow = `
WITH unit AS (
    DELETE FROM dislock.window_units WHERE lock_key = $1::text AND window_start = $2::timestamptz)
DELETE FROM dislock.windows WHERE lock_key = $1::text AND window_start = $2::timestamptz`

// qAcquireLease calls dislock.acquire_lease (migration 17): lease $1 for
// owner $2 for TTL $3 µs, granted, re-entered or refused in one call: the
// row (the holder's when refused, NULL when there is none or the key is
// paused), the outcome (granted, reentered, held, paused), now(), and who
// paused the key, why and until when. See qAcquireLeaseSchema16 for the
// rule.
var qAcquireLease = `
WITH a AS (SELECT * FROM dislock.acquire_lease($1::text, $2::text, $3::bigint))
SELECT ` + qualified("(a.l).", leaseColumns) + `, a.outcome, a.db_now, a.paused_by, a.pause_reason, a.paused_until` + commitGuard + `
FROM a`

// qAcquireLeaseSchema16 takes a free or expired lease, or re-enters the caller's own
// live lease (same pod: a restarted sidecar) keeping its token. Taking an
// expired or released lease, even one's own, is a new grant with a new token.
//
// Fencing tokens must grow in the order leases are granted. The token the INSERT proposes
// is drawn before the statement knows whether it will insert, so a slow
// caller could insert with an old token after faster ones came and went.
// Hence a lease row, once created, is never deleted (release and operator
// release only expire it), and every later grant draws its token in DO UPDATE,
// while it holds the row lock.
//
// Parameters: lease $1, owner $2, TTL $3 in µs, and $4 the key whose pause
// applies (the CronJob's key: "key" for "key#i"). While $4 is paused
// (migration 16) only the owner's own live lease is re-entered, and
// nothing else is written. No row: refused, and qLeaseRefusal says why.
const qAcquireLeaseSchema16 = `
WITH p AS (SELECT * FROM dislock.pause_of($4::text))
INSERT INTO dislock.leases AS l (lock_key, owner, token, acquired_at, expire_at)
SELECT $1::text, $2::text, dislock.next_token(), now(), now() + $3::bigint * interval '1 microsecond'
WHERE NOT EXISTS (SELECT FROM p)
   OR EXISTS (SELECT FROM dislock.leases x WHERE x.lock_key = $1::text AND x.owner = $2::text AND x.expire_at > now())
` + leaseGrant + `
WHERE (l.expire_at <= now() OR l.owner = EXCLUDED.owner)
  AND (NOT EXISTS (SELECT FROM p) OR (l.owner = EXCLUDED.owner AND l.expire_at > now()))
RETURNING ` + leaseColumns + `, (xmax = 0), now()` + commitGuard

// qAcquireLeaseSchema15 is qAcquireLeaseSchema16 ($1..$3) on a database not migrated
// to schema 16 yet, which knows no pause (see Store.noPauses).
const qAcquireLeaseSchema15 = `
INSERT INTO dislock.leases AS l (lock_key, owner, token, acquired_at, expire_at)
VALUES ($1::text, $2::text, dislock.next_token(), now(), now() + $3::bigint * interval '1 microsecond')
` + leaseGrant + `
WHERE l.expire_at <= now() OR l.owner = EXCLUDED.owner
RETURNING ` + leaseColumns + `, (xmax = 0), now()` + commitGuard

// leaseGrant is how a lease's row is granted again: the same owner's live
// lease keeps its token and acquisition, anyone else's grant draws a new
// token under the row lock.
const leaseGrant = `ON CONFLICT (lock_key) DO UPDATE SET
    token       = CASE WHEN l.owner = EXCLUDED.owner AND l.expire_at > now()
                       THEN l.token ELSE dislock.next_token() END,
    acquired_at = CASE WHEN l.owner = EXCLUDED.owner AND l.expire_at > now()
                       THEN l.acquired_at ELSE EXCLUDED.acquired_at END,
    owner       = EXCLUDED.owner,
    expire_at   = EXCLUDED.expire_at
`

// qLeaseRefusal says why qAcquireLeaseSchema16 returned no row: lease $1's holder
// (NULL columns when there is none) and key $2's pause, if any.
var qLeaseRefusal = `
SELECT ` + qualified("l.", leaseColumns) + `, now(), p.paused_by, p.reason, p.until
FROM (SELECT) one
LEFT JOIN dislock.leases l ON l.lock_key = $1::text
LEFT JOIN dislock.pause_of($2::text) p ON true`

// qLeaseRefusalSchema15 is qLeaseRefusal ($1) before schema 16.
var qLeaseRefusalSchema15 = `
SELECT ` + qualified("l.", leaseColumns) + `, now()
FROM (SELECT) one
LEFT JOIN dislock.leases l ON l.lock_key = $1::text`

const leaseColumns = `lock_key, owner, token, acquired_at, expire_at`

const qGetLease = `SELECT ` + leaseColumns + `, now() FROM dislock.leases WHERE lock_key = $1::text`

// qReleaseLease expires the caller's lease now (see qAcquireLease for why the
// row stays).
const qReleaseLease = `UPDATE dislock.leases SET expire_at = now()
WHERE lock_key = $1::text AND token = $2::bigint AND expire_at > now()`

const qForceReleaseLease = `UPDATE dislock.leases SET expire_at = now()
WHERE lock_key = $1::text AND expire_at > now()`

const qListLeases = `SELECT ` + leaseColumns + `, now() FROM dislock.leases
WHERE ($1::text = '' OR starts_with(lock_key, $1::text || '/'))
  AND ($3::text = '' OR lock_key = $3::text OR starts_with(lock_key, $3::text || '#'))
ORDER BY lock_key LIMIT $2::int`

// qRecordView stores this cluster's view of the job and returns the views of
// other clusters seen within $4 that differ from it: one statement, so it is
// as pooler-safe as the claims. The SELECT does not see the upsert's row, and
// does not need to: it reads other clusters only. Its commit does not wait
// for the WAL flush (synchronous_commit off for this transaction alone): a
// view is advice for the operator, written by every pod before its claim,
// and a crash that loses the last few hundred milliseconds of views loses
// nothing a later pod does not write again.
const qRecordView = `
WITH mine AS (
    INSERT INTO dislock.views AS v (lock_key, cluster, view, seen_at)
    SELECT $1::text, $2::text, $3::jsonb, now() FROM set_config('synchronous_commit', 'off', true)
    ON CONFLICT (lock_key, cluster) DO UPDATE SET view = EXCLUDED.view, seen_at = EXCLUDED.seen_at,
        changed_at = CASE WHEN v.view = EXCLUDED.view THEN v.changed_at ELSE now() END)
SELECT lock_key, cluster, view::text, seen_at FROM dislock.views
WHERE lock_key = $1::text AND cluster <> $2::text AND view <> $3::jsonb
  AND seen_at > now() - $4::bigint * interval '1 microsecond'
ORDER BY cluster`

// qListDisagreements lists the keys whose clusters' recent views differ.
const qListDisagreements = `
SELECT lock_key, cluster, view::text, seen_at FROM dislock.views v
WHERE seen_at > now() - $1::bigint * interval '1 microsecond'
  AND EXISTS (SELECT 1 FROM dislock.views o
              WHERE o.lock_key = v.lock_key AND o.cluster <> v.cluster AND o.view <> v.view
                AND o.seen_at > now() - $1::bigint * interval '1 microsecond')
ORDER BY lock_key, cluster`

// qLedgerBounds bounds, for the rest of its transaction, a ledger write's
// lock waits ($1 ms) and run ($2 ms), and lets its commit go without
// waiting for the WAL flush: RecordDecision sends it and qRecordDecision
// in one pipeline, one implicit transaction.
const qLedgerBounds = `SELECT set_config('lock_timeout', $1::text, true), set_config('statement_timeout', $2::text, true),
    set_config('synchronous_commit', 'off', true)`

// qRecordDecision adds a ledger row and counts it, in one call of
// dislock.record_decision (migration 10): the decision, its (key, cluster,
// action) count, and the key's statistics (its last decision and success,
// and the run's duration in the cumulative histogram whose bounds are $11;
// $10 is the duration in seconds or NULL). A function, so that its plan is
// kept per server connection.
const qRecordDecision = `SELECT dislock.record_decision($1::text, $2::timestamptz, $3::int, $4::text, $5::text, $6::text,
    $7::text, $8::text, $9::bigint, $10::float8, $11::float8[])`
