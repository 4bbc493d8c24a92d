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

// SetPauseProbeInterval sets how long a Store that found no pauses keeps to
// schema 15's statements, until the test ends.
func SetPauseProbeInterval(t interface{ Cleanup(func()) }, d time.Duration) {
	old := pauseProbeInterval
	pauseProbeInterval = d
	t.Cleanup(func() { pauseProbeInterval = old })
}
