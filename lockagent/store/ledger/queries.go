package ledger

// The owner's statements on the history the agents leave, as data: each
// takes its time from now() in SQL, and durations travel as microseconds.

// Retention (DeleteOldWindows) deletes rows older than $1 microseconds, at
// most $2 per statement, and only rows it can lock at once (FOR UPDATE SKIP
// LOCKED): a tenant may hold its own old rows locked for as long as it
// likes, and waiting for one held every other namespace's retention, and
// the locks it had taken on their rows, behind it. A row skipped is deleted
// at a later run. ctid = ANY(ARRAY(...)) deletes each locked row by its
// position (a TID scan), not through a join with the whole table; a row
// updated since the statement began is not visible at its new position and
// is left for a later run too.

// qStatementBounds bounds the statements after it in the same pipeline
// (one implicit transaction) or transaction: set_config(…, true) ends with
// the transaction, also behind PgBouncer. $1 lock_timeout, $2
// statement_timeout, in milliseconds.
const qStatementBounds = `SELECT set_config('lock_timeout', $1::text, true), set_config('statement_timeout', $2::text, true)`

// qDeleteOldWindows keeps a window that still claims to be running and is
// alive, however old: deleting it would let another cluster claim it.
const qDeleteOldWindows = `
DELETE FROM dislock.windows WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM dislock.windows
    WHERE window_start < now() - $1::bigint * interval '1 microsecond'
      AND (state <> 'running' OR alive_until < now())
    LIMIT $2::int FOR UPDATE SKIP LOCKED))`

// qDeleteOldWindowUnits forgets the shapes (migration 7) of windows whose
// rows retention deleted. A unit of a window with a row left (alive, or
// locked when its row was skipped) stays until a later run; no pod claims
// a window this old (MaxClaimAge).
const qDeleteOldWindowUnits = `
DELETE FROM dislock.window_units WHERE ctid = ANY(ARRAY(
    SELECT u.ctid FROM dislock.window_units u
    WHERE u.window_start < now() - $1::bigint * interval '1 microsecond'
      AND NOT EXISTS (SELECT 1 FROM dislock.windows w WHERE w.lock_key = u.lock_key AND w.window_start = u.window_start)
    LIMIT $2::int FOR UPDATE SKIP LOCKED))`

const qDeleteOldViews = `
DELETE FROM dislock.views WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM dislock.views WHERE seen_at < now() - $1::bigint * interval '1 microsecond'
    LIMIT $2::int FOR UPDATE SKIP LOCKED))`

// qListDecisions lists ledger rows by key ($1, ” for all), window ($2) and
// window range ($3, $4; decision time for rows without a window), newest
// first, at most $5.
const qListDecisions = `
SELECT lock_key, window_start, job_index, cluster, job, pod, action, reason, token, decided_at, now()
FROM dislock.decisions
WHERE ($1::text = '' OR lock_key = $1::text)
  AND ($2::timestamptz IS NULL OR window_start = $2::timestamptz)
  AND ($3::timestamptz IS NULL OR window_start >= $3::timestamptz OR (window_start IS NULL AND decided_at >= $3::timestamptz))
  AND ($4::timestamptz IS NULL OR window_start < $4::timestamptz OR (window_start IS NULL AND decided_at < $4::timestamptz))
ORDER BY coalesce(window_start, decided_at) DESC, lock_key, job_index, decided_at
LIMIT $5::int`

// Retention of the ledger, as of the windows (see qDeleteOldWindows): its
// rows and the missed windows go with the windows; a key's counts and
// statistics go once nothing was decided for it within the retention (its
// CronJob is gone everywhere). The counts go first, and the statistics row
// only once no count of its key is left: a count skipped (its row locked)
// keeps its key's statistics, and both go at a later run.
const (
	qDeleteOldDecisions = `
DELETE FROM dislock.decisions WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM dislock.decisions WHERE decided_at < now() - $1::bigint * interval '1 microsecond'
    LIMIT $2::int FOR UPDATE SKIP LOCKED))`

	qDeleteOldMissed = `
DELETE FROM dislock.missed WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM dislock.missed WHERE window_start < now() - $1::bigint * interval '1 microsecond'
    LIMIT $2::int FOR UPDATE SKIP LOCKED))`

	qDeleteOldCounts = `
DELETE FROM dislock.decision_counts WHERE ctid = ANY(ARRAY(
    SELECT c.ctid FROM dislock.decision_counts c JOIN dislock.key_stats k USING (lock_key)
    WHERE k.last_decided < now() - $1::bigint * interval '1 microsecond'
    LIMIT $2::int FOR UPDATE OF c SKIP LOCKED))`

	qDeleteOldKeyStats = `
DELETE FROM dislock.key_stats WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM dislock.key_stats k
    WHERE last_decided < now() - $1::bigint * interval '1 microsecond'
      AND NOT EXISTS (SELECT 1 FROM dislock.decision_counts c WHERE c.lock_key = k.lock_key)
    LIMIT $2::int FOR UPDATE SKIP LOCKED))`
)

// keysInBounds are the keys of dislock.key_stats the owner's statistics
// and detection read: in each namespace at most $1, those decided last.
// Tenants write key_stats rows for keys of their own namespace at will; the
// bound keeps one namespace from making the metrics and the detection of
// every namespace as large as it likes.
const keysInBounds = `(SELECT * FROM (
    SELECT *, row_number() OVER (PARTITION BY split_part(lock_key, '/', 1) ORDER BY last_decided DESC, lock_key) AS nth
    FROM dislock.key_stats) ranked WHERE nth <= $1::int)`

// qKeysLeftOut counts the keys beyond the bound of keysInBounds.
const qKeysLeftOut = `
SELECT count(*) FROM (
    SELECT row_number() OVER (PARTITION BY split_part(lock_key, '/', 1) ORDER BY last_decided DESC, lock_key) AS nth
    FROM dislock.key_stats) ranked WHERE nth > $1::int`

// qKeysToJudge reads, as of $3 (NULL: now; never later than now), the keys'
// statistics ($2: one namespace's, empty for all) with the newest view of
// each, when a cluster first recorded that view's schedule and time zone,
// the key's newest window, and, for a key never judged, its oldest window
// within $4 microseconds (the lookback). Each read of dislock.windows is
// one descent of its primary key's index.
const qKeysToJudge = `
WITH at AS (SELECT least(coalesce($3::timestamptz, now()), now()) AS t)
SELECT k.lock_key, k.first_seen, k.last_decided, k.checked_until, k.checked_with::text, v.view::text,
    (SELECT min(o.changed_at) FROM dislock.views o
     WHERE o.lock_key = k.lock_key AND o.view->'schedule' IS NOT DISTINCT FROM v.view->'schedule'
       AND coalesce(o.view->>'timeZone', '') = coalesce(v.view->>'timeZone', '')),
    (SELECT max(w.window_start) FROM dislock.windows w WHERE w.lock_key = k.lock_key AND w.window_start <= at.t),
    CASE WHEN k.checked_until IS NULL THEN
        (SELECT min(w.window_start) FROM dislock.windows w
         WHERE w.lock_key = k.lock_key AND w.window_start >= at.t - $4::bigint * interval '1 microsecond') END,
    at.t
FROM ` + keysInBounds + ` k CROSS JOIN at
JOIN LATERAL (SELECT view FROM dislock.views WHERE lock_key = k.lock_key ORDER BY seen_at DESC LIMIT 1) v ON true
WHERE $2::text = '' OR starts_with(k.lock_key, $2::text || '/')
ORDER BY k.lock_key`

// qWindowsToJudge reads, for each window to judge (key $1[i], start
// $2[i]: the schedule's ticks only, one descent of the primary key's index
// each), one row per state of its rows (one per completion index) with the
// latest liveness: what judgeWindow needs, at most four rows a window
// however many rows a tenant wrote into its own windows.
const qWindowsToJudge = `
SELECT w.lock_key, w.window_start, w.state, max(w.alive_until)
FROM unnest($1::text[], $2::timestamptz[]) AS r(lock_key, window_start)
JOIN dislock.windows w ON w.lock_key = r.lock_key AND w.window_start = r.window_start
GROUP BY 1, 2, 3`

// qMissedDecisions reads what each cluster decided for each window ($1[i],
// $2[i]), at most $3 decisions per window.
const qMissedDecisions = `
SELECT r.lock_key, r.window_start, d.cluster, d.action, d.reason
FROM unnest($1::text[], $2::timestamptz[]) AS r(lock_key, window_start)
JOIN LATERAL (SELECT cluster, action, reason, decided_at FROM dislock.decisions
              WHERE lock_key = r.lock_key AND window_start = r.window_start
              ORDER BY decided_at LIMIT $3::int) d ON true
ORDER BY r.lock_key, r.window_start, d.decided_at`

// qRecordMissed inserts the missed windows ($1..$4), counts the ones no
// other cluster's detection inserted first into their keys' statistics,
// moves each judged key's checkpoint ($5, $6; NULL: where it is) forward,
// records what it was judged with ($7, JSON; NULL: as it is), and returns
// the new missed windows. Every key's missed windows are checkpointed with
// it (each missed window's key is among $5, once). A key whose statistics
// row another session holds locked (a tenant may lock its own) is left
// alone, windows and checkpoint, until the next run: waiting for it would
// hold up every namespace's detection, and the rows it had locked meanwhile
// would hold up their agents' ledger writes. So the statement waits for no
// tenant: it locks only the statistics rows it can lock at once, inserts
// only those rows' keys' missed windows (dislock.missed is the owner's
// alone), and updates only the rows it locked. qStatementBounds bounds it
// all the same.
const qRecordMissed = `
WITH ck AS (
    SELECT * FROM unnest($5::text[], $6::timestamptz[], $7::text[]) AS c(lock_key, checked_until, checked_with)),
locked AS (
    SELECT lock_key FROM dislock.key_stats WHERE lock_key IN (SELECT lock_key FROM ck)
    FOR NO KEY UPDATE SKIP LOCKED),
m AS (
    INSERT INTO dislock.missed (lock_key, window_start, kind, reason, detected_at)
    SELECT x.*, now() FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[]) AS x(lock_key, window_start, kind, reason)
    WHERE x.lock_key IN (SELECT lock_key FROM locked)
    ON CONFLICT (lock_key, window_start) DO NOTHING
    RETURNING lock_key, window_start, detected_at),
agg AS (SELECT lock_key, count(*) AS n, max(window_start) AS last FROM m GROUP BY lock_key),
u AS (
    UPDATE dislock.key_stats k SET
        missed_total       = k.missed_total + coalesce(agg.n, 0),
        last_missed_window = CASE WHEN agg.last IS NULL THEN k.last_missed_window ELSE greatest(k.last_missed_window, agg.last) END,
        checked_until      = greatest(k.checked_until, ck.checked_until),
        checked_with       = coalesce(ck.checked_with::jsonb, k.checked_with)
    FROM ck LEFT JOIN agg USING (lock_key)
    WHERE k.lock_key = ck.lock_key AND k.lock_key IN (SELECT lock_key FROM locked))
SELECT lock_key, window_start, detected_at FROM m`

// qListMissed lists missed windows by key ($1, empty for all; $7 a namespace, empty for all), window
// range ($2, $3) and detection time ($5), at most $6 per key (0: all),
// newest first, at most $4.
const qListMissed = `
SELECT lock_key, window_start, kind, reason, detected_at, now() FROM (
    SELECT *, row_number() OVER (PARTITION BY lock_key ORDER BY window_start) AS nth FROM dislock.missed
    WHERE ($1::text = '' OR lock_key = $1::text)
      AND ($7::text = '' OR starts_with(lock_key, $7::text || '/'))
      AND ($2::timestamptz IS NULL OR window_start >= $2::timestamptz)
      AND ($3::timestamptz IS NULL OR window_start < $3::timestamptz)
      AND ($5::timestamptz IS NULL OR detected_at > $5::timestamptz)) m
WHERE $6::int <= 0 OR nth <= $6::int
ORDER BY window_start DESC, lock_key
LIMIT $4::int`

const qKeyStats = `
SELECT lock_key, last_success, missed_total, last_missed_window, duration_count, duration_sum, duration_buckets, now()
FROM ` + keysInBounds + ` k ORDER BY lock_key`

// qDecisionCounts reads the counts of the keys in bounds, at most 16 per key,
// the largest (a cluster and an action each: 3 clusters' 5 usual actions; a
// tenant can write any cluster name, and every count is a series).
const qDecisionCounts = `
SELECT c.lock_key, c.cluster, c.action, c.n
FROM ` + keysInBounds + ` k
JOIN LATERAL (SELECT * FROM dislock.decision_counts WHERE lock_key = k.lock_key ORDER BY n DESC, cluster, action LIMIT 16) c ON true
ORDER BY c.lock_key, c.cluster, c.action`

// qHeldLeases reads, for each key in bounds, how long its oldest held lease
// has been held (an Indexed Job's lease keys are "<key>#<index>", one per
// index): one row per key, however many lease rows a tenant writes under
// its key.
const qHeldLeases = `
SELECT l.lock_key, (extract(epoch FROM now() - min(l.acquired_at)) * 1000000)::bigint
FROM (SELECT split_part(lock_key, '#', 1) AS lock_key, acquired_at FROM dislock.leases WHERE expire_at > now()) l
WHERE l.lock_key IN (SELECT lock_key FROM ` + keysInBounds + ` k)
GROUP BY l.lock_key
ORDER BY l.lock_key`

const qSaveSnapshot = `
INSERT INTO dislock.metrics_snapshot (cluster, computed_at, body) VALUES ($1::text, now(), $2::bytea)
ON CONFLICT (cluster) DO UPDATE SET computed_at = EXCLUDED.computed_at, body = EXCLUDED.body`

// qLoadSnapshot returns the cluster's snapshot when it is newer than $2.
const qLoadSnapshot = `
SELECT body, computed_at FROM dislock.metrics_snapshot
WHERE cluster = $1::text AND ($2::timestamptz IS NULL OR computed_at > $2::timestamptz)`
