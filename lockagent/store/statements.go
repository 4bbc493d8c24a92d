package store

// HeartbeatWindowSQL is the statement Store.Heartbeat runs, with its
// parameters $1..$5 (key, window, job index, token, TTL in µs). The herd
// benchmark hands it to pgbench, so that the heartbeats' share of what the
// database can do is measured against this very statement.
const HeartbeatWindowSQL = qHeartbeatWindow
