package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/window"
)

// decide takes the locks the mode asks for and publishes run, skip or error.
// The database being unreachable for longer than StartTimeout is "error":
// nothing runs unlocked (fail closed). Waiting as a standby, or for a
// predecessor's lease, is not bounded by it: that wait ends when the owner
// finishes, fails or goes silent.
func (a *agent) decide(ctx context.Context) {
	d, err := a.take(ctx)
	switch {
	case err == nil:
		a.publish(d)
	case ctx.Err() != nil:
		// SIGTERM before a decision (e.g. a standby's pod deleted while it
		// waited): nothing ran; record says so.
		a.publish(protocol.Decision{Action: protocol.ActionSkip, Key: a.cfg.Key, Window: formatWindow(a.window),
			Reason: "stopped before a decision was reached"})
	default:
		a.publish(protocol.Decision{Action: protocol.ActionError, Key: a.cfg.Key, Window: formatWindow(a.window),
			Reason: "could not decide: " + err.Error()})
		a.retryAfterError(ctx)
	}
}

// Pauses between decision attempts after an "error" decision.
const (
	errorRetryFirst = 5 * time.Second
	errorRetryMax   = time.Minute
)

// retryAfterError keeps trying to decide after publishing "error". With
// restartPolicy OnFailure the kubelet restarts the app container inside this
// pod and its wrapper reads the decision again: once the database answers,
// that restart must get run or skip instead of the same error until the
// Job's backoffLimit is used up. With restartPolicy Never the pod ends after
// the wrapper's exit 75 and the kubelet stops the agent (ctx), and the Job's
// next pod decides afresh.
func (a *agent) retryAfterError(ctx context.Context) {
	pause := errorRetryFirst
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		d, err := a.take(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			a.log.Info("decided after an earlier error; the app container's next start uses this decision", "action", d.Action)
			a.publish(d)
			return
		}
		a.log.Warn("still cannot decide; retrying", "err", err, "in", min(2*pause, errorRetryMax).String())
		pause = min(2*pause, errorRetryMax)
	}
}

// take claims the window, then the lease, and says what to do.
func (a *agent) take(ctx context.Context) (protocol.Decision, error) {
	c := a.cfg
	d := protocol.Decision{Key: c.Key}
	if !c.Manual {
		w, err := a.resolveWindow(ctx)
		if err != nil {
			return d, err
		}
		a.window, d.Window = w, formatWindow(w)
		if c.Catchup > 0 {
			now, err := a.dbNow(ctx)
			if err != nil {
				return d, err
			}
			if late := now.Sub(w); late > c.Catchup {
				d.Action = protocol.ActionSkip
				d.Reason = fmt.Sprintf("stale: window %s started %s ago by database time, more than catchup %s", d.Window, late.Round(time.Second), c.Catchup)
				return d, nil
			}
		}
	}
	var tookOver bool
	if c.Mode.Schedule && !c.Manual {
		claim, skip, err := a.claimWindow(ctx)
		if err != nil || skip != "" {
			d.Action, d.Reason, d.Owner = protocol.ActionSkip, skip, claim.Window.Owner
			return d, err
		}
		tookOver = claim.Outcome == lock.TookOver
		d.Token, d.Owner = claim.Window.Token, claim.Window.Owner
		d.Reason = fmt.Sprintf("window %s of %s %s", d.Window, c.Key, claim.Outcome)
	}
	if c.Mode.Lease {
		grant, skip, err := a.acquireLease(ctx, tookOver)
		if err != nil {
			return d, err
		}
		if skip != "" {
			if err := a.finishWindow(ctx, lock.StateSkipped, nil); err != nil {
				a.log.Warn("marking the window skipped failed", "err", err)
			}
			d.Action, d.Reason, d.Owner, d.Token = protocol.ActionSkip, skip, grant.Lease.Owner, 0
			return d, nil
		}
		d.Token, d.Owner = grant.Lease.Token, grant.Lease.Owner
		d.Reason = joinReason(d.Reason, fmt.Sprintf("lease %s acquired until %s", c.Key, grant.Lease.ExpireAt.Format(time.RFC3339)))
	}
	if c.Manual && !c.Mode.Lease {
		d.Owner = c.Owner.WindowOwner()
		d.Reason = "manual run: no schedule window to lock, and the mode takes no lease"
	}
	d.Action = protocol.ActionRun
	return d, nil
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// resolveWindow is DISLOCK_WINDOW, or the schedule's latest activation at or
// before the database clock.
func (a *agent) resolveWindow(ctx context.Context) (time.Time, error) {
	if !a.cfg.Window.IsZero() {
		return a.cfg.Window, nil
	}
	sched, err := window.ParseSchedule(a.cfg.Schedule, a.cfg.TimeZone)
	if err != nil {
		return time.Time{}, err
	}
	now, err := a.dbNow(ctx)
	if err != nil {
		return time.Time{}, err
	}
	return sched.Latest(now)
}

// dbNow reads the database clock, retrying while the database is unreachable.
func (a *agent) dbNow(ctx context.Context) (now time.Time, err error) {
	err = a.retry(ctx, "reading database time", func(ctx context.Context) (err error) {
		now, err = a.store.Now(ctx)
		return err
	})
	return now, err
}

// claimWindow claims the window. A refusal is a skip, except for a standby,
// which waits while the owner is alive and running and takes the window over
// once the owner failed or went silent (the store decides, at database time).
func (a *agent) claimWindow(ctx context.Context) (lock.Claim, string, error) {
	req := lock.ClaimRequest{Key: a.cfg.Key, Window: a.window, Owner: a.cfg.Owner, TTL: a.cfg.TTL, Standby: a.cfg.Standby}
	waiting := false
	for {
		var claim lock.Claim
		sent := protocol.MonotonicNow()
		err := a.retry(ctx, "claiming the window", func(ctx context.Context) (err error) {
			claim, err = a.store.ClaimWindow(ctx, req)
			return err
		})
		if err == nil {
			a.windowToken = claim.Window.Token
			a.windowUntil = a.safeFrom(sent)
			return claim, "", nil
		}
		if !errors.Is(err, lock.ErrWindowTaken) {
			return claim, "", err
		}
		owner := claim.Window
		if !a.cfg.Standby || owner.State == lock.StateSucceeded || owner.State == lock.StateSkipped {
			return claim, fmt.Sprintf("window %s already claimed by cluster %s (%s, state %s)",
				formatWindow(a.window), owner.Cluster, owner.Owner, owner.State), nil
		}
		if !waiting {
			a.log.Info("standby: the window's owner is alive; waiting to take over if it fails or goes silent",
				"window", formatWindow(a.window), "owner", owner.Owner, "aliveUntil", owner.AliveUntil)
			waiting = true
		}
		if err := sleep(ctx, a.pollInterval()); err != nil {
			return claim, "", err
		}
	}
}

// acquireLease takes the lease. Another Job's live lease means an earlier run
// is still going: skip. A retry pod of this Job, or a standby that took the
// window over from a dead owner, waits for the old holder's lease to be
// released or to expire instead, keeping its window claim alive meanwhile.
func (a *agent) acquireLease(ctx context.Context, tookOver bool) (lock.LeaseGrant, string, error) {
	waiting := false
	for {
		var grant lock.LeaseGrant
		sent := protocol.MonotonicNow()
		err := a.retry(ctx, "acquiring the lease", func(ctx context.Context) (err error) {
			grant, err = a.store.AcquireLease(ctx, a.cfg.Key, a.cfg.Owner, a.cfg.TTL)
			return err
		})
		if err == nil {
			a.leaseToken = grant.Lease.Token
			a.leaseUntil = a.safeFrom(sent)
			return grant, "", nil
		}
		if !errors.Is(err, lock.ErrLeaseHeld) {
			return grant, "", err
		}
		holder := grant.Lease
		if !tookOver && !a.cfg.Owner.SameJob(holder.Owner) {
			return grant, fmt.Sprintf("lease %s held by %s until %s: an earlier run is still going", a.cfg.Key, holder.Owner,
				holder.ExpireAt.Format(time.RFC3339)), nil
		}
		if !waiting {
			a.log.Info("waiting for the previous holder's lease to be released or expire", "holder", holder.Owner, "expireAt", holder.ExpireAt)
			waiting = true
		}
		if err := sleep(ctx, a.pollInterval()); err != nil {
			return grant, "", err
		}
		if a.windowToken != 0 {
			sent := protocol.MonotonicNow()
			if err := a.retry(ctx, "heartbeat", func(ctx context.Context) error {
				_, _, err := a.store.Heartbeat(ctx, a.cfg.Key, a.window, a.windowToken, a.cfg.TTL)
				return err
			}); err != nil {
				return grant, "", err
			}
			a.windowUntil = a.safeFrom(sent)
		}
	}
}

// safeFrom is the safety deadline earned by a grant or renewal sent at local
// monotonic time sent: the database computed the expiry from a now() no
// earlier than that, so sent + ttl − margin is before the expiry.
func (a *agent) safeFrom(sent int64) int64 {
	return sent + int64(a.cfg.TTL-a.cfg.Margin())
}

// deadline is the earliest safety deadline of what this pod holds that
// another cluster could take once it lapses: the lease, and a standby
// window's liveness. 0 when nothing can be taken away.
func (a *agent) deadline() int64 {
	var d int64
	if a.leaseToken != 0 {
		d = a.leaseUntil
	}
	if a.windowToken != 0 && a.cfg.Standby && (d == 0 || a.windowUntil < d) {
		d = a.windowUntil
	}
	return d
}

func formatWindow(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}
