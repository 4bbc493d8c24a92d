package agent

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/lockagent/protocol"
)

// supervise keeps what the pod holds alive until SIGTERM: a heartbeat every
// ttl/3 renews the lease and the window's liveness; after each success the
// safety deadline moves on. If no renewal succeeds before the deadline, or
// the database says the lock is gone, the agent revokes: the wrappers stop
// the app before the database could give the lease to someone else.
//
// It also watches the app-start timeout: a winner whose app never starts
// (an image that cannot be pulled, a missing ConfigMap) must not hold the
// window in every cluster forever.
func (a *agent) supervise(ctx context.Context) {
	if a.decision.Action != protocol.ActionRun || (a.windowToken == 0 && a.leaseToken == 0) || a.revoked {
		<-ctx.Done()
		return
	}
	interval := a.cfg.HeartbeatInterval()
	beat := time.NewTimer(interval)
	defer beat.Stop()
	expire := time.NewTimer(time.Hour)
	defer expire.Stop()
	decidedAt := a.decision.DecidedAt
	if decidedAt == 0 {
		decidedAt = protocol.MonotonicNow() // a decision from before DecidedAt existed
	}
	appStart := time.NewTimer(time.Duration(decidedAt + int64(a.cfg.AppStartTimeout) - protocol.MonotonicNow()))
	defer appStart.Stop()
	appStartC := appStart.C
	for {
		if a.windowToken == 0 && a.leaseToken == 0 {
			// Given up: nothing left to keep alive.
			<-ctx.Done()
			return
		}
		// The deadline timer is re-armed from the current deadline each time
		// round; a nil channel never fires once revoked or with no deadline.
		var expireC <-chan time.Time
		if dl := a.deadline(); dl != 0 && !a.revoked {
			expire.Reset(time.Duration(dl - protocol.MonotonicNow()))
			expireC = expire.C
		}
		select {
		case <-ctx.Done():
			return
		case <-appStartC:
			appStartC = nil
			a.checkAppStarted(ctx)
		case <-expireC:
			a.revoke(fmt.Sprintf("no renewal succeeded for %s; the safety deadline passed before the lease could expire at database time", a.cfg.TTL-a.cfg.Margin()))
		case <-beat.C:
			if a.revoked {
				continue
			}
			err := a.heartbeat(ctx)
			switch {
			case errors.Is(err, lock.ErrLeaseLost), errors.Is(err, lock.ErrWindowLost):
				a.revoke(err.Error())
			case err != nil:
				a.log.Warn("heartbeat failed; retrying before the safety deadline", "err", err)
				beat.Reset(min(time.Second, interval))
			default:
				beat.Reset(interval)
			}
		}
	}
}

// heartbeat renews the lease and the window's liveness in one round and, if
// both succeed, moves the safety deadlines and republishes the earliest.
func (a *agent) heartbeat(ctx context.Context) error {
	sent := protocol.MonotonicNow()
	callCtx, cancel := context.WithTimeout(ctx, a.callTimeout())
	defer cancel()
	if a.windowToken != 0 {
		if _, _, err := a.store.Heartbeat(callCtx, a.cfg.Key, a.window, a.cfg.JobIndex, a.windowToken, a.cfg.TTL); err != nil {
			return err
		}
		a.windowUntil = a.safeFrom(sent)
	}
	if a.leaseToken != 0 {
		if _, _, err := a.store.RenewLease(callCtx, a.cfg.Key, a.leaseToken, a.cfg.TTL); err != nil {
			return err
		}
		a.leaseUntil = a.safeFrom(sent)
	}
	if dl := a.deadline(); dl != 0 {
		return a.dir.WriteDeadline(dl)
	}
	return nil
}

// checkAppStarted runs once the app-start timeout passed after "run". If no
// wrapper marked that it starts its app, the agent revokes first and looks
// again (the wrappers mark first and then look at revoked; see
// protocol.Dir.MarkStarted): if still nobody started, nobody can, and the
// claim is given up at once — the window recorded failed, the lease released
// — so that a standby or the Job's retry takes it. If a wrapper marked in
// between, it sees revoked and stops its app; the claim then lapses as after
// any revocation.
func (a *agent) checkAppStarted(ctx context.Context) {
	if names, err := a.dir.Started(); err != nil || len(names) > 0 {
		if err != nil {
			a.log.Error("cannot tell whether an app container started; keeping the claim", "err", err)
		}
		return
	}
	why := fmt.Sprintf("no app container started within the app-start timeout %s after the run decision (image pull failing, or a missing volume?)", a.cfg.AppStartTimeout)
	a.revoke(why)
	if names, err := a.dir.Started(); err != nil || len(names) > 0 {
		a.log.Warn("an app container started just as the claim was given up; it is stopped and the claim lapses", "containers", names, "err", err)
		return
	}
	a.gaveUp = why
	recordCtx, cancel := context.WithTimeout(ctx, a.cfg.StopTimeout)
	defer cancel()
	if err := a.finishWindow(recordCtx, lock.StateFailed, nil); err != nil {
		a.log.Error("recording the given-up window as failed failed; it lapses after the TTL instead", "err", err)
	}
	a.releaseLease(recordCtx)
	a.windowToken, a.leaseToken = 0, 0
	msg := "gave the claim up: " + why
	a.terminationMessage(msg)
	a.log.Error(msg, "key", a.cfg.Key, "window", formatWindow(a.window))
}

// revoke tells the wrappers to stop the app now.
func (a *agent) revoke(reason string) {
	a.revoked = true
	a.log.Error("lease lost: stopping the app", "key", a.cfg.Key, "window", formatWindow(a.window), "reason", reason)
	if err := a.dir.Revoke(reason); err != nil {
		a.log.Error("writing revoked failed; the wrappers still enforce the deadline", "err", err)
	}
}

// resume is a restarted agent (the kubelet restarts a native sidecar that
// died) picking up its own decision: it re-enters its window claim and lease
// as the same owner and resumes heartbeats. If either is gone, it revokes.
//
// A revocation stands: the app was stopped (or never started), and a
// restarted sidecar must not lift it.
func (a *agent) resume(ctx context.Context, prev protocol.Decision) {
	a.decision = prev
	a.log.Info("restarted: resuming the earlier decision", "action", prev.Action, "window", prev.Window, "token", prev.Token)
	if revoked, why := a.dir.Revoked(); revoked {
		a.revoked = true
		a.log.Info("the claim was revoked before the restart; it stays revoked", "reason", why)
		return
	}
	if prev.Window != "" {
		a.window, _ = time.Parse(time.RFC3339, prev.Window)
	}
	if a.cfg.Mode.Schedule && !a.window.IsZero() {
		req := lock.ClaimRequest{Key: a.cfg.Key, Window: a.window, Index: a.cfg.JobIndex, Owner: a.cfg.Owner, TTL: a.cfg.TTL}
		sent := protocol.MonotonicNow()
		var claim lock.Claim
		err := a.retry(ctx, "re-entering the window", func(ctx context.Context) (err error) {
			claim, err = a.store.ClaimWindow(ctx, req)
			return err
		})
		if err != nil {
			a.revoke("re-entering the window after a restart: " + err.Error())
			return
		}
		a.windowToken, a.windowUntil = claim.Window.Token, a.safeFrom(sent)
	}
	if a.cfg.Mode.Lease {
		sent := protocol.MonotonicNow()
		var grant lock.LeaseGrant
		err := a.retry(ctx, "re-entering the lease", func(ctx context.Context) (err error) {
			grant, err = a.store.AcquireLease(ctx, a.cfg.Key, a.cfg.Owner, a.cfg.TTL)
			return err
		})
		if err == nil {
			a.leaseToken, a.leaseUntil = grant.Lease.Token, a.safeFrom(sent)
		}
		if err != nil || grant.Lease.Token != prev.Token {
			// A new token means the old lease expired while the agent was
			// down: the app was past its deadline and must not go on.
			a.revoke(fmt.Sprintf("re-entering the lease after a restart: token %d, had %d (%v)", grant.Lease.Token, prev.Token, err))
			return
		}
	}
	if dl := a.deadline(); dl != 0 {
		if err := a.dir.WriteDeadline(dl); err != nil {
			a.log.Error("writing the deadline failed", "err", err)
		}
	}
}

// record runs after SIGTERM (the kubelet stops a native sidecar after the app
// containers exited): it reads the wrappers' results, records the window's
// outcome at database time, releases the lease and leaves a one-line
// termination message.
func (a *agent) record() {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.StopTimeout)
	defer cancel()
	d := a.decision
	switch {
	case d.Action == "":
		// Stopped while waiting or deciding: nothing ran. A window claimed
		// while waiting for the lease is recorded failed so that another pod
		// of the Job, or a standby, need not wait out its liveness.
		if a.windowToken != 0 {
			if err := a.finishWindow(ctx, lock.StateFailed, nil); err != nil {
				a.log.Error("recording the unused window claim failed; it lapses after the TTL", "err", err)
			}
		}
		a.releaseLease(ctx)
		msg := "stopped before a decision was reached: nothing ran; a restarted sidecar decides again"
		a.terminationMessage(msg)
		a.log.Info("stopping: " + msg)
		return
	case d.Action != protocol.ActionRun:
		a.terminationMessage(fmt.Sprintf("%s: %s", d.Action, d.Reason))
		a.log.Info("stopping", "action", d.Action, "reason", d.Reason)
		return
	case a.gaveUp != "":
		a.terminationMessage("gave the claim up: " + a.gaveUp)
		a.log.Info("stopping after giving the claim up", "reason", a.gaveUp)
		return
	}
	results, err := a.dir.ReadResults()
	if err != nil {
		a.log.Error("reading the wrappers' results failed", "err", err)
	}
	state, code, summary := outcome(results, a.revoked)
	if a.windowToken != 0 {
		if err := a.finishWindow(ctx, state, code); err != nil {
			a.log.Error("recording the outcome failed", "state", state, "err", err)
			summary += " (not recorded: " + err.Error() + ")"
		}
	}
	a.releaseLease(ctx)
	where := "manual run"
	if d.Window != "" {
		where = "window " + d.Window
	}
	msg := fmt.Sprintf("ran %s of %s with token %d: %s", where, d.Key, d.Token, summary)
	a.terminationMessage(joinReason(msg, a.disagreement))
	a.log.Info("recorded", "key", d.Key, "window", d.Window, "token", d.Token, "state", state, "exitCode", code, "summary", summary)
}

func (a *agent) finishWindow(ctx context.Context, state lock.State, code *int) error {
	if a.windowToken == 0 {
		return nil
	}
	return a.retry(ctx, "recording the outcome", func(ctx context.Context) error {
		_, err := a.store.Finish(ctx, a.cfg.Key, a.window, a.cfg.JobIndex, a.windowToken, state, code)
		return err
	})
}

// releaseLease gives the pod's lease up, if it holds one.
func (a *agent) releaseLease(ctx context.Context) {
	if a.leaseToken == 0 {
		return
	}
	err := a.retry(ctx, "releasing the lease", func(ctx context.Context) error {
		_, err := a.store.ReleaseLease(ctx, a.cfg.Key, a.leaseToken)
		return err
	})
	if err != nil {
		a.log.Error("releasing the lease failed; it expires on its own", "err", err)
	}
}

// outcome folds the wrappers' results into the window's state: succeeded
// only if every app container ran and exited 0 and the lease was never lost.
func outcome(results map[string]protocol.Result, revoked bool) (lock.State, *int, string) {
	if len(results) == 0 {
		return lock.StateFailed, nil, "failed: no app container reported a result (killed, or never started)"
	}
	names := make([]string, 0, len(results))
	for n := range results {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		r := results[n]
		switch {
		case !r.Ran:
			return lock.StateFailed, nil, fmt.Sprintf("failed: container %s did not run its app", n)
		case r.ExitCode != 0 || r.Revoked:
			code := r.ExitCode
			why := fmt.Sprintf("exit code %d", code)
			if r.Revoked {
				why += ", stopped because the lease was lost"
			}
			return lock.StateFailed, &code, fmt.Sprintf("failed: container %s %s", n, why)
		}
	}
	if revoked {
		return lock.StateFailed, nil, "failed: the lease was lost during the run"
	}
	zero := 0
	return lock.StateSucceeded, &zero, fmt.Sprintf("succeeded (%d container(s), exit code 0)", len(results))
}
