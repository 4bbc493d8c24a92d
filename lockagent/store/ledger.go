package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store/internal/db"
)

// Action is what one pod decided, or how the run it owned ended: the ledger
// keeps one row per Action of every pod of every cluster.
type Action string

const (
	ActionRun       Action = "run"       // claimed the window and/or the lease: the app runs
	ActionTakeover  Action = "takeover"  // took a failed or lapsed owner's window over: the app runs
	ActionSkip      Action = "skip"      // another cluster's or Job's pod owns it, or it is stale
	ActionWait      Action = "wait"      // waits for a live owner or lease to end
	ActionError     Action = "error"     // could not decide (database unreachable, bad configuration)
	ActionSucceeded Action = "succeeded" // the run it owned ended 0
	ActionFailed    Action = "failed"    // the run it owned failed, lost its lease, or never started
)

// Actions lists every Action, in the order listings and metrics use.
var Actions = []Action{ActionRun, ActionTakeover, ActionSkip, ActionWait, ActionError, ActionSucceeded, ActionFailed}

// MaxReason is the longest reason the ledger keeps (bytes); a longer one is
// cut, so that a decision is never lost to its reason's length.
const MaxReason = 2048

// DurationBuckets are the upper bounds (seconds) of the run duration
// histogram the ledger keeps per key: from a second to four hours.
var DurationBuckets = []float64{1, 5, 15, 60, 300, 900, 3600, 14400}

// Decision is one row of the ledger.
type Decision struct {
	Key string `json:"key"`
	// Window is the window start, zero when the pod locked no window.
	Window  time.Time `json:"window,omitzero"`
	Index   int       `json:"index"`
	Cluster string    `json:"cluster"`
	Job     string    `json:"job"`
	Pod     string    `json:"pod"`
	Action  Action    `json:"action"`
	Reason  string    `json:"reason"`
	Token   int64     `json:"token"`
	// At is the database time of the decision.
	At time.Time `json:"at"`
	// Duration is how long the run took (local monotonic clock of the pod),
	// on succeeded and failed only; it is not kept per row, only in the
	// key's histogram.
	Duration time.Duration `json:"-"`
}

// Server-side bounds of a ledger write. The server ends a write that waits
// for a lock or runs long, and the connection comes back to the pool at
// once; a write the client gave up on instead closes its connection, which
// pgx drains in the background for up to 15 s while the pool counts it.
const (
	LedgerLockTimeout      = time.Second
	LedgerStatementTimeout = 2 * time.Second
	// LedgerCallTimeout is the client's bound: past the server's, and past
	// the queue the top of the minute builds in PgBouncer, since a write
	// given up on while it runs makes PgBouncer close its server
	// connection, and thousands of pods doing so at once cost the database
	// a backend each (BenchmarkHerd).
	LedgerCallTimeout = 30 * time.Second
)

// RecordDecision adds d to the ledger and to its key's counts and
// statistics, in one statement sent in one pipeline with the settings that
// bound its lock waits and its run on the server; both run in the
// pipeline's one implicit transaction (pooler-safe: set_config(…, true)
// ends with it). The database sets the time. A failure loses only this row
// of history, never a lock: callers log it and go on.
func (s *Store) RecordDecision(ctx context.Context, d Decision) error {
	if d.Key == "" || d.Cluster == "" || d.Pod == "" {
		return errors.New("recording a decision: key, cluster and pod must be set")
	}
	if !validAction(d.Action) {
		return fmt.Errorf("recording a decision: action %q is not one of %v", d.Action, Actions)
	}
	var window *time.Time
	if !d.Window.IsZero() {
		w := d.Window.UTC()
		window = &w
	}
	var seconds *float64
	if d.Duration > 0 && (d.Action == ActionSucceeded || d.Action == ActionFailed) {
		v := d.Duration.Seconds()
		seconds = &v
	}
	// One round trip: the bounds and the row go out together and run in
	// one implicit transaction (a pipeline ends in a single Sync). An
	// explicit transaction would hold its PgBouncer server connection, and
	// the rows it locked (the key's counts, shared by every cluster's pods
	// of the key), for each of the client's round trips: at the top of the
	// minute, with the pods' CPU contended, those pauses queued every
	// other client of the pool behind them (BenchmarkHerd, 9 000 pods:
	// transactions of 3 to 24 s, PgBouncer's query_wait_timeout).
	batch := &pgx.Batch{}
	// History, not a lock: its commit need not wait for the WAL flush (a
	// crash loses at most the last few hundred milliseconds of decisions,
	// as a failed write does), and at the top of the minute every pod's
	// decision would otherwise hold a server connection through a flush
	// that the claims queue for.
	batch.Queue(qLedgerBounds, fmt.Sprint(LedgerLockTimeout.Milliseconds()), fmt.Sprint(LedgerStatementTimeout.Milliseconds()))
	batch.Queue(qRecordDecision, d.Key, window, d.Index, d.Cluster, d.Job, d.Pod, string(d.Action),
		db.Cut(d.Reason, MaxReason), d.Token, seconds, DurationBuckets)
	err := s.h.Pool.SendBatch(ctx, batch).Close()
	return s.classify("recording the decision of "+d.Key, err)
}

func validAction(a Action) bool {
	for _, v := range Actions {
		if a == v {
			return true
		}
	}
	return false
}

// DefaultListLimit bounds a listing without a limit.
const DefaultListLimit = 1000
