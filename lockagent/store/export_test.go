package store

import "time"

// GetWindowTakeableSQL lets the ownership table check the rule the claim
// applies (dislock.window_takeable) on its own: whether the claim of owner
// $4 (Job prefix $5, standby $6) may take window ($1, $2, $3) now.
const GetWindowTakeableSQL = `SELECT ` + windowColumns + `, now(), dislock.window_takeable(w, $4::text, $5::text, $6::boolean)
FROM dislock.windows w
WHERE lock_key = $1::text AND window_start = $2::timestamptz AND job_index = $3::int`

// ClaimWindowSchema15SQL is the claim without the pause columns, as it runs
// on schemas before 16: the statement of the schema-10 baselines.
var ClaimWindowSchema15SQL = qClaimWindowSchema15

// AcquireLeaseSchema16SQL and LeaseRefusalSQL are what AcquireLease sends
// on a database at schema 16 (no dislock.acquire_lease): the grant ($1..$4:
// key, owner, TTL in µs, PauseKey(key)), and on no row the refusal's read
// ($1 key, $2 PauseKey(key)).
const AcquireLeaseSchema16SQL = qAcquireLeaseSchema16

var LeaseRefusalSQL = qLeaseRefusal

// SetProbeInterval sets how long a Store that found the database without
// a function it calls keeps to the older statements, until the test ends.
func SetProbeInterval(t interface{ Cleanup(func()) }, d time.Duration) {
	old := probeInterval
	probeInterval = d
	t.Cleanup(func() { probeInterval = old })
}

// CommitGuardSQL is the commit guard's two columns as a statement sends
// them, after a first column (see commitGuard).
const CommitGuardSQL = `SELECT 1` + commitGuard
