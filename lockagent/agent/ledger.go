package agent

import (
	"context"
	"time"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
)

// The ledger keeps every pod's decisions in the database, for `dislock
// windows -o wide`, the missed-window detection and the metrics. Its
// writes are history, not locks: one goroutine writes them in order, off
// the path of every decision, heartbeat and record, on at most one of the
// store's two connections, so that a slow database never delays a renewal
// because of them. The server bounds each write (store.LedgerLockTimeout,
// store.LedgerStatementTimeout), so its connection comes back at once. A
// write the client had to give up on (the database stopped answering) may
// keep its connection busy for a while as pgx closes it: the writer then
// writes nothing more, so that it never holds the second connection too. A
// write that fails is logged and dropped.

// ledgerQueue bounds the writes waiting; a pod makes a handful.
const ledgerQueue = 16

// ledgerEntry is a decision on its way to the ledger.
type ledgerEntry = store.Decision

// startLedger starts the writer. flushLedger ends it.
func (a *agent) startLedger() {
	a.ledgerCh = make(chan ledgerEntry, ledgerQueue)
	a.ledgerDone = make(chan struct{})
	go func() {
		defer close(a.ledgerDone)
		gaveUp := false
		for d := range a.ledgerCh {
			if gaveUp {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), store.LedgerCallTimeout)
			err := a.store.RecordDecision(ctx, d)
			timedOut := ctx.Err() != nil
			cancel()
			switch {
			case err != nil && timedOut:
				gaveUp = true
				a.log.Warn("adding the decision to the ledger timed out; this pod adds nothing more to the ledger, so that its lock statements keep a connection",
					"action", d.Action, "err", err)
			case err != nil:
				a.log.Warn("adding the decision to the ledger failed; only its history is lost", "action", d.Action, "err", err)
			}
		}
	}()
}

// ledger queues one decision of this pod. dur is the run's duration, on
// succeeded and failed.
func (a *agent) ledger(action store.Action, reason string, token int64, dur time.Duration) {
	if a.ledgerCh == nil {
		return
	}
	d := ledgerEntry{Key: a.cfg.Key, Window: a.window, Index: a.cfg.JobIndex, Cluster: a.cfg.Owner.Cluster,
		Job: a.cfg.Owner.Job, Pod: a.cfg.Owner.Pod, Action: action, Reason: reason, Token: token, Duration: dur}
	select {
	case a.ledgerCh <- d:
	default:
		a.log.Warn("the ledger's queue is full; this decision's history is lost", "action", action)
	}
}

// ledgerDecision queues a published decision.
func (a *agent) ledgerDecision(d protocol.Decision) {
	action := map[protocol.Action]store.Action{protocol.ActionRun: store.ActionRun, protocol.ActionSkip: store.ActionSkip,
		protocol.ActionError: store.ActionError}[d.Action]
	if action == "" {
		return
	}
	if action == store.ActionRun && a.tookOver {
		action = store.ActionTakeover
	}
	a.ledger(action, d.Reason, d.Token, 0)
}

// ledgerOutcome queues the end of this pod's run.
func (a *agent) ledgerOutcome(state store.State, summary string) {
	action := store.ActionFailed
	if state == store.StateSucceeded {
		action = store.ActionSucceeded
	}
	var dur time.Duration
	if at := a.decision.DecidedAt; at != 0 {
		dur = time.Duration(protocol.MonotonicNow() - at)
	}
	a.ledger(action, summary, a.decision.Token, dur)
}

// ledgerFlushWait bounds how long a stopping pod waits for its ledger
// writes: within the kubelet's grace period, and shorter than a write may
// queue at the top of the minute.
const ledgerFlushWait = 5 * time.Second

// flushLedger lets the writes in flight end, for at most ledgerFlushWait:
// the pod is stopping.
func (a *agent) flushLedger() {
	if a.ledgerCh == nil {
		return
	}
	close(a.ledgerCh)
	select {
	case <-a.ledgerDone:
	case <-time.After(ledgerFlushWait):
		a.log.Warn("stopping before the ledger's last writes ended; their history is lost")
	}
}
