package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
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
		a.idle(ctx)
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
	// With the app containers known, a success is recorded as soon as every
	// one of them succeeded, not only when the kubelet stops the sidecar:
	// the wrappers of a successful run wait for it before they exit (see
	// protocol.Decision.AwaitRecord), so the pod cannot end, and the
	// sidecar be stopped, before the success is in the database. Polled as
	// often as the wrappers poll, since their exit waits on it.
	var doneC <-chan time.Time
	if len(a.cfg.AppContainers) > 0 {
		done := time.NewTicker(100 * time.Millisecond)
		defer done.Stop()
		doneC = done.C
	}
	for {
		if a.windowToken == 0 && a.leaseToken == 0 {
			// Given up or finished: nothing left to keep alive.
			a.idle(ctx)
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
		case <-doneC:
			// A failure is recorded at once too where it is final (see
			// allEnded): a pod whose classic mesh sidecar never exits
			// would otherwise never stop the agent, and its lease would be
			// renewed for ever.
			if a.allSucceeded() || a.allEnded() {
				// Its own context: the kubelet's SIGTERM, which follows
				// the apps' exit at once, must not cut the recording short.
				recordCtx, cancel := a.recordContext()
				a.finishRun(recordCtx)
				cancel()
			}
		case <-expireC:
			a.revoke(fmt.Sprintf("no renewal succeeded for %s; the safety deadline passed before the lease could expire at database time", a.cfg.TTL-a.cfg.Margin()))
		case <-beat.C:
			if a.revoked {
				continue
			}
			err := a.heartbeat(ctx)
			switch {
			case errors.Is(err, store.ErrLeaseLost), errors.Is(err, store.ErrWindowLost):
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

// heartbeat renews the window's liveness and the lease in one call and, if
// both succeed, moves the safety deadlines and republishes the earliest.
func (a *agent) heartbeat(ctx context.Context) error {
	sent := protocol.MonotonicNow()
	callCtx, cancel := context.WithTimeout(ctx, a.callTimeout())
	defer cancel()
	r, err := a.store.Renew(callCtx, store.Renewal{Key: a.cfg.Key, Window: a.window, Index: a.cfg.JobIndex, WindowToken: a.windowToken,
		LeaseKey: a.leaseKey(), LeaseToken: a.leaseToken, TTL: a.cfg.TTL})
	if err != nil {
		return err
	}
	if a.windowToken != 0 {
		a.windowUntil = a.safeFrom(sent, r.Waited)
	}
	if a.leaseToken != 0 {
		a.leaseUntil = a.safeFrom(sent, r.Waited)
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
	missing, err := a.notStarted()
	switch {
	case err != nil:
		a.log.Error("cannot tell whether the app containers started; keeping the claim", "err", err)
		return
	case len(missing) == 0:
		return
	}
	why := fmt.Sprintf("app container(s) %s did not start within the app-start timeout %s after the run decision (image pull failing, or a missing volume?)",
		strings.Join(missing, ", "), a.cfg.AppStartTimeout)
	a.revoke(why)
	if names, err := a.dir.Started(); err != nil || len(names) > 0 {
		// Some wrapper marked before it saw revoked: its app may run until
		// it sees it. Recording the window now would let another pod run
		// alongside; the revocation stops the app and the claim lapses.
		a.log.Warn("an app container started before the claim was given up; it is stopped and the claim lapses", "containers", names, "err", err)
		return
	}
	a.gaveUp = why
	recordCtx, cancel := context.WithTimeout(ctx, a.cfg.StopTimeout)
	defer cancel()
	if err := a.finishWindow(recordCtx, store.StateFailed, nil); err != nil {
		a.log.Error("recording the given-up window as failed failed; it lapses after the TTL instead", "err", err)
	}
	a.releaseLease(recordCtx)
	a.windowToken, a.leaseToken = 0, 0
	msg := "gave the claim up: " + why
	a.ledgerOutcome(store.StateFailed, msg)
	a.terminate(contract.Termination{Outcome: contract.OutcomeFailed, Message: msg})
	a.log.Error(msg, "key", a.cfg.Key, "window", formatWindow(a.window))
}

// notStarted lists the app containers that have not marked started: every
// one of AppContainers, or, when those are unknown, "any" until one has.
func (a *agent) notStarted() ([]string, error) {
	names, err := a.dir.Started()
	if err != nil {
		return nil, err
	}
	if len(a.cfg.AppContainers) == 0 {
		if len(names) == 0 {
			return []string{"any"}, nil
		}
		return nil, nil
	}
	var missing []string
	for _, c := range a.cfg.AppContainers {
		if !slices.Contains(names, c) {
			missing = append(missing, c)
		}
	}
	return missing, nil
}

// allEnded reports whether every app container ended for good: its wrapper
// reported, and the kubelet will not start it again (it exited 0, or the
// pod's restartPolicy is Never). False when the app containers are unknown.
func (a *agent) allEnded() bool {
	if len(a.cfg.AppContainers) == 0 {
		return false
	}
	results, err := a.dir.ReadResults()
	if err != nil {
		return false
	}
	for _, c := range a.cfg.AppContainers {
		r, ok := results[c]
		if !ok || r.ExitCode != 0 && a.cfg.RestartPolicy != contract.RestartNever {
			return false
		}
	}
	return true
}

// allSucceeded reports whether every app container ran and exited 0.
func (a *agent) allSucceeded() bool {
	results, err := a.dir.ReadResults()
	if err != nil {
		return false
	}
	for _, c := range a.cfg.AppContainers {
		r, ok := results[c]
		if !ok || !r.Ran || r.ExitCode != 0 || r.Revoked {
			return false
		}
	}
	return true
}

// revoke tells the wrappers to stop the app now: the file first, then the
// log line, so that the app's stop waits for nothing and whoever read the
// line finds the file.
func (a *agent) revoke(reason string) {
	a.revoked = true
	err := a.dir.Revoke(reason)
	a.log.Error("lease lost: stopping the app", "key", a.cfg.Key, "window", formatWindow(a.window), "reason", reason)
	if err != nil {
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
	// Until re-entered, the claims are the earlier process's: its tokens let
	// record finish them (every write is guarded by the token) even if the
	// pod is stopped before the database answers, and its deadline (or, not
	// knowing it, the longest one a renewal could have given) bounds how
	// long an app it let run may still be running.
	a.windowToken, a.leaseToken = prev.WindowToken, prev.LeaseToken
	until := protocol.MonotonicNow() + int64(a.cfg.TTL)
	if dl, ok, err := a.dir.ReadDeadline(); err == nil && ok {
		until = dl
	}
	a.windowUntil, a.leaseUntil = until, until
	if prev.Window != "" {
		a.window, _ = time.Parse(time.RFC3339, prev.Window)
	}
	if revoked, why := a.dir.Revoked(); revoked {
		a.revoked = true
		a.log.Info("the claim was revoked before the restart; it stays revoked", "reason", why)
		return
	}
	if prev.BootID != "" && prev.BootID != protocol.BootID() {
		// The node rebooted: whatever ran was stopped with it, and the
		// monotonic deadline and decision time are of another boot.
		a.revoke("the node rebooted since the decision; the pod's claim ended with it")
		return
	}
	// Re-entering races the claims' liveness (see retryRacing), for at
	// most StartTimeout, as any start.
	reenterCtx, cancel := context.WithTimeout(ctx, a.cfg.StartTimeout)
	defer cancel()
	lapse := a.lapseBound(until)
	if a.cfg.Mode.Schedule && !a.window.IsZero() {
		req := store.ClaimRequest{Key: a.cfg.Key, Window: a.window, Index: a.cfg.JobIndex, Owner: a.cfg.Owner, TTL: a.cfg.TTL}
		sent := protocol.MonotonicNow()
		var claim store.Claim
		err := a.retryRacing(reenterCtx, "re-entering the window", lapse, func(ctx context.Context) (err error) {
			claim, err = a.store.ClaimWindow(ctx, req)
			return err
		})
		if err != nil {
			a.revoke("re-entering the window after a restart: " + err.Error())
			return
		}
		if claim.Outcome != store.Reentered {
			// The claim lapsed and another pod of this Job took it and let
			// it go, so this pod took it anew with a new token: the app
			// may have been stopped at its deadline meanwhile, and must not
			// run on with its old token. Give the new claim back.
			a.windowToken = claim.Window.Token
			if err := a.finishWindow(ctx, store.StateFailed, nil); err != nil {
				a.log.Error("giving back the window taken anew failed; it lapses", "err", err)
			}
			a.windowToken = 0
			a.revoke(fmt.Sprintf("re-entering the window after a restart: the claim had lapsed (%s with token %d, had %d)", claim.Outcome, claim.Window.Token, prev.Token))
			return
		}
		a.windowToken, a.windowUntil = claim.Window.Token, a.safeFrom(sent, claim.Waited)
	}
	if a.cfg.Mode.Lease {
		sent := protocol.MonotonicNow()
		var grant store.LeaseGrant
		err := a.retryRacing(reenterCtx, "re-entering the lease", lapse, func(ctx context.Context) (err error) {
			grant, err = a.store.AcquireLease(ctx, a.leaseKey(), a.cfg.Owner, a.cfg.TTL)
			return err
		})
		if err == nil {
			a.leaseToken, a.leaseUntil = grant.Lease.Token, a.safeFrom(sent, grant.Waited)
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
		// meanwhile is left to lapse, not recorded failed: a restarted
		// sidecar of this pod re-enters it (a failed claim it would have to
		// skip), and anyone else may take it after the TTL.
		msg := "stopped before a decision was reached: nothing ran; a restarted sidecar decides again"
		a.terminate(contract.Termination{Outcome: contract.OutcomeError, Message: msg})
		a.log.Info("stopping: " + msg)
		return
	case d.Action != protocol.ActionRun:
		a.terminate(a.decided(d))
		a.log.Info("stopping", "action", d.Action, "reason", d.Reason)
		return
	case a.gaveUp != "":
		a.terminate(contract.Termination{Outcome: contract.OutcomeFailed, Message: "gave the claim up: " + a.gaveUp})
		a.log.Info("stopping after giving the claim up", "reason", a.gaveUp)
		return
	case a.finished:
		return
	}
	a.finishRun(ctx)
}

// finishRun ends the pod's run: it revokes first, so that no wrapper starts
// or goes on after it; waits until every app that started has reported (the
// kubelet normally stops the sidecar only after the apps exited, but a
// sidecar can also be stopped while they run); then records the outcome at
// database time, releases the lease and leaves the termination message.
func (a *agent) finishRun(ctx context.Context) {
	d := a.decision
	if err := a.dir.Revoke("the pod's run is over"); err != nil {
		a.log.Error("writing revoked failed", "err", err)
	}
	results, settled := a.awaitResults(ctx)
	a.finished = true
	if !settled {
		// An app may still run on its deadline: recording now would let
		// another pod run alongside. The claim is left to lapse: no more
		// renewals, so the wrapper stops the app at the safety deadline,
		// before anyone else can take the claim.
		msg := fmt.Sprintf("stopped while an app of window %s of %s may still run; the claim is left to lapse", d.Window, d.Key)
		a.terminate(contract.Termination{Outcome: contract.OutcomeFailed, Message: msg})
		a.log.Error(msg)
		a.markRecorded(msg)
		a.revoked = true
		a.windowToken, a.leaseToken = 0, 0
		return
	}
	state, code, summary := outcome(results, a.cfg.AppContainers)
	switch {
	case a.windowToken != 0:
		a.log.Info("recording the outcome", "key", d.Key, "window", d.Window, "token", d.Token, "state", state)
		if err := a.finishWindow(ctx, state, code); err != nil {
			a.log.Error("recording the outcome failed", "state", state, "err", err)
			summary += " (not recorded: " + err.Error() + ")"
		}
	case a.cfg.Mode.Schedule && !a.cfg.Manual:
		summary += " (not recorded: this pod holds no window claim)"
	}
	a.releaseLease(ctx)
	a.windowToken, a.leaseToken = 0, 0
	where := "manual run"
	if d.Window != "" {
		where = "window " + d.Window
	}
	if a.tookOver {
		where += " (taken over from a failed or lapsed owner)"
	}
	msg := fmt.Sprintf("ran %s of %s with token %d: %s", where, d.Key, d.Token, summary)
	ran := contract.Termination{Outcome: contract.OutcomeFailed, TookOver: a.tookOver, Message: joinReason(msg, a.disagreement)}
	if state == store.StateSucceeded {
		ran.Outcome = contract.OutcomeSucceeded
	}
	a.terminate(ran)
	a.log.Info("recorded", "key", d.Key, "window", d.Window, "token", d.Token, "state", state, "exitCode", code, "summary", summary)
	a.markRecorded(msg)
	a.ledgerOutcome(state, summary)
}

// markRecorded lets the waiting wrappers exit: the outcome is handled.
func (a *agent) markRecorded(summary string) {
	if err := a.dir.MarkRecorded(summary); err != nil {
		a.log.Error("writing recorded failed; the wrappers wait until the safety deadline", "err", err)
	}
}

// awaitResults waits until every wrapper that marked started has written its
// result, or until the safety deadline and the wrappers' kill grace passed
// (a wrapper stops its app by then on its own), or ctx ends. settled is
// false only when an app may still be running.
func (a *agent) awaitResults(ctx context.Context) (map[string]protocol.Result, bool) {
	for {
		results, err := a.dir.ReadResults()
		if err != nil {
			a.log.Error("reading the wrappers' results failed", "err", err)
		}
		started, err := a.dir.Started()
		if err != nil {
			a.log.Error("reading which app containers started failed", "err", err)
		}
		// Only the app containers count, when known: a started file of
		// another name is no container of this pod.
		pending := slices.DeleteFunc(started, func(n string) bool {
			_, ok := results[n]
			return ok || len(a.cfg.AppContainers) > 0 && !slices.Contains(a.cfg.AppContainers, n)
		})
		dl := a.deadline()
		// The wrappers poll every 100 ms; a second covers a slow one.
		if len(pending) == 0 || dl == 0 || protocol.MonotonicNow() > dl+int64(a.cfg.KillGrace()+time.Second) {
			return results, true
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			a.log.Error("app container(s) still running when the stop timeout ended", "containers", pending)
			return results, false
		}
	}
}

func (a *agent) finishWindow(ctx context.Context, state store.State, code *int) error {
	if a.windowToken == 0 {
		return nil
	}
	return a.retryRacing(ctx, "recording the outcome", a.lapseBound(a.windowUntil), func(ctx context.Context) error {
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
		_, err := a.store.ReleaseLease(ctx, a.leaseKey(), a.leaseToken)
		return err
	})
	if err != nil {
		a.log.Error("releasing the lease failed; it expires on its own", "err", err)
	}
}

// outcome folds the wrappers' results into the window's state: succeeded
// only if every app container (every one of expected, when known) ran,
// exited 0 and was not stopped because the claim was lost. A revocation
// after the apps ended does not undo their success.
func outcome(results map[string]protocol.Result, expected []string) (store.State, *int, string) {
	if len(results) == 0 {
		return store.StateFailed, nil, "failed: no app container reported a result (killed, or never started)"
	}
	for _, n := range expected {
		if _, ok := results[n]; !ok {
			return store.StateFailed, nil, fmt.Sprintf("failed: container %s reported no result (killed, or never started)", n)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(results)) {
		r := results[n]
		switch {
		case !r.Ran:
			return store.StateFailed, nil, fmt.Sprintf("failed: container %s did not run its app", n)
		case r.ExitCode != 0 || r.Revoked:
			code := r.ExitCode
			why := fmt.Sprintf("exit code %d", code)
			if r.Revoked {
				why += ", stopped because the lease was lost"
			}
			return store.StateFailed, &code, fmt.Sprintf("failed: container %s %s", n, why)
		}
	}
	zero := 0
	return store.StateSucceeded, &zero, fmt.Sprintf("succeeded (%d container(s), exit code 0)", len(results))
}
