-- dislock: compatible-from 7
-- Version 18: the skips of a window mark their key's statistics once, and
-- never queue for them.
--
-- At the top of the hour a key's pods of every cluster decide at the same
-- instant, and each wrote the key's one statistics row (key_stats): the
-- winner's row lock queued the other clusters' skips behind it, though all
-- a skip or a wait writes there is the time (last_decided). What reads it
-- needs no more than "decided in this window": the missed-window detection
-- counts a key silent only after several periods without a sign, the
-- retention only after days, the metrics keep each namespace's newest keys.
--
-- So a skip or a wait of a window leaves the row alone when it already
-- says the key was decided at or after the window's start, and when another
-- session holds the row locked: that session is in almost every case
-- another decision of the key writing the same time (else the owner's
-- missed-window detection, for a moment). Only a row written before the
-- window, free, is marked. A window skipped everywhere (its key paused)
-- still marks the row, unless every one of its skips found it held. A row
-- last decided more than a day ago is written as before, waiting for its
-- lock: it may be the retention's, deleting it (the retention takes only
-- keys idle for its floor, 48 hours, or longer), and the skip must make it
-- again. Every other action (a run, a takeover, an error, a result), a
-- decision without a window, and a key's first decision write as before.
-- The key's statistics are written first and then the decision's own row
-- and its (key, cluster, action) count, in the order every version of the
-- ledger's write takes their locks.
CREATE OR REPLACE FUNCTION dislock.record_decision_unchecked(
    p_key text, p_window timestamptz, p_index int, p_cluster text, p_job text, p_pod text,
    p_action text, p_reason text, p_token bigint, p_seconds float8, p_buckets float8[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    seen timestamptz;
    mark boolean := true;
BEGIN
    IF p_action IN ('skip', 'wait') AND p_window IS NOT NULL AND p_seconds IS NULL THEN
        SELECT k.last_decided INTO seen FROM dislock.key_stats k WHERE k.lock_key = p_key;
        IF FOUND AND seen >= p_window THEN
            mark := false;
        ELSIF FOUND AND seen >= now() - interval '1 day' THEN
            PERFORM 1 FROM dislock.key_stats k WHERE k.lock_key = p_key FOR NO KEY UPDATE SKIP LOCKED;
            IF FOUND THEN
                UPDATE dislock.key_stats k SET last_decided = now() WHERE k.lock_key = p_key;
            END IF;
            mark := false;
        END IF;
    END IF;
    IF mark THEN
        INSERT INTO dislock.key_stats AS k (lock_key, first_seen, last_decided, last_success, duration_count, duration_sum, duration_buckets)
        VALUES (p_key, now(), now(), CASE WHEN p_action = 'succeeded' THEN now() END,
                CASE WHEN p_seconds IS NULL THEN 0 ELSE 1 END, coalesce(p_seconds, 0),
                ARRAY(SELECT CASE WHEN p_seconds <= le THEN 1 ELSE 0 END::bigint FROM unnest(p_buckets) WITH ORDINALITY AS b(le, i) ORDER BY i))
        ON CONFLICT (lock_key) DO UPDATE SET
            last_decided     = EXCLUDED.last_decided,
            last_success     = coalesce(EXCLUDED.last_success, k.last_success),
            duration_count   = k.duration_count + EXCLUDED.duration_count,
            duration_sum     = k.duration_sum + EXCLUDED.duration_sum,
            duration_buckets = ARRAY(SELECT coalesce(o, 0) + coalesce(n, 0)
                                     FROM unnest(k.duration_buckets, EXCLUDED.duration_buckets) WITH ORDINALITY AS b(o, n, i) ORDER BY i);
    END IF;
    INSERT INTO dislock.decisions (lock_key, window_start, job_index, cluster, job, pod, action, reason, token, decided_at)
    VALUES (p_key, p_window, p_index, p_cluster, p_job, p_pod, p_action, p_reason, p_token, now());
    INSERT INTO dislock.decision_counts AS c (lock_key, cluster, action, n) VALUES (p_key, p_cluster, p_action, 1)
    ON CONFLICT (lock_key, cluster, action) DO UPDATE SET n = c.n + 1;
END
$$;

REVOKE ALL ON FUNCTION dislock.record_decision_unchecked(text, timestamptz, int, text, text, text, text, text, bigint, float8, float8[])
    FROM PUBLIC, dislock_tenant;
