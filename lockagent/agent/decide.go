package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/window"
)

// decide takes the locks the mode asks for and publishes run, skip or error.
// The database being unreachable for longer than StartTimeout is "error":
// nothing runs unlocked (fail closed). Waiting (a standby, another pod of the
// same Job whose owner is alive, a predecessor's lease) is not bounded by it:
// that wait ends when the owner finishes, fails or lapses.
//
// A stop signal before a decision writes none: a waiting pod that is stopped
// has decided nothing, and a restarted sidecar decides afresh. Publishing
// "skip" here would turn a kubelet restart into a permanent skip.
func (a *agent) decide(ctx context.Context) {
	d, err := a.take(ctx)
	switch {
	case err == nil:
		a.publish(d)
	case ctx.Err() != nil:
		a.log.Info("stopped before a decision was reached; no decision written", "key", a.cfg.Key, "window", formatWindow(a.window))
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
	var now time.Time // database time, when read
	switch {
	case c.Manual:
	case c.Mode.Schedule && !c.Window.IsZero():
		// The window is known: the claim itself refuses it when it is too
		// late by the database's clock (maxLate), in the same round trip.
		a.window, d.Window = c.Window, formatWindow(c.Window)
	default:
		var err error
		if now, err = a.dbNow(ctx); err != nil {
			return d, err
		}
		w, err := a.resolveWindow(now)
		if err != nil {
			return d, err
		}
		a.window, d.Window = w, formatWindow(w)
		if why := a.stale(now); why != "" {
			d.Action, d.Reason = protocol.ActionSkip, why
			return d, nil
		}
	}
	if err := a.yieldToPreferred(ctx, now); err != nil {
		return d, err
	}
	var tookOver bool
	if c.Mode.Schedule && !c.Manual {
		claim, skip, err := a.claimWindow(ctx)
		if err != nil || skip != "" {
			d.Action, d.Reason, d.Owner = protocol.ActionSkip, skip, claim.Window.Owner
			return d, err
		}
		tookOver = claim.Outcome == store.TookOver
		a.tookOver = tookOver
		d.Token, d.Owner = claim.Window.Token, claim.Window.Owner
		d.Reason = fmt.Sprintf("window %s of %s%s %s", d.Window, c.Key, a.indexSuffix(), claim.Outcome)
	}
	if c.Mode.Lease {
		grant, skip, err := a.acquireLease(ctx, tookOver)
		if err != nil {
			return d, err
		}
		if skip != "" {
			if err := a.finishWindow(ctx, store.StateSkipped, nil); err != nil {
				a.log.Warn("marking the window skipped failed", "err", err)
			}
			a.windowToken = 0
			d.Action, d.Reason, d.Owner, d.Token = protocol.ActionSkip, skip, grant.Lease.Owner, 0
			return d, nil
		}
		d.Token, d.Owner = grant.Lease.Token, grant.Lease.Owner
		d.Reason = joinReason(d.Reason, fmt.Sprintf("lease %s acquired until %s", a.leaseKey(), grant.Lease.ExpireAt.Format(time.RFC3339)))
	}
	if c.Manual && !c.Mode.Lease {
		d.Owner = c.Owner.String()
		d.Reason = "manual run: no schedule window to lock, and the mode takes no lease"
	}
	// Waiting for the lease, or retrying an unreachable database, may
	// have used up the window claim's safety deadline: renew both before
	// running rather than hand the app a deadline already passed.
	if dl := a.deadline(); dl != 0 && dl-protocol.MonotonicNow() < int64(a.cfg.Margin()) {
		if err := a.retry(ctx, "renewing the claims before the run", a.heartbeat); err != nil {
			return d, err
		}
	}
	d.Action = protocol.ActionRun
	if a.disagreement != "" {
		d.Reason = joinReason(d.Reason, a.disagreement)
	}
	return d, nil
}

// yieldToPreferred holds a pod of a cluster other than the CronJob's
// preferred one (dislock.io/prefer-cluster) until the window's start + the
// grace, by the database's clock (now, or read now when zero), so that the
// preferred cluster's pods, if they start in time, claim the window first.
// The preference orders claims and changes nothing in them: whoever claims
// after it is refused as before. It returns at once in the preferred
// cluster, for a manual run (no window), and when the grace is over.
//
// The wait is at most the grace, whatever the database says (a window in
// its future), plus a spread of up to a tenth of the grace (at most
// preferSpread), so that the pods of every other cluster, which would all
// wake at one instant, reach the database spread out. It writes nothing to
// the database: at the top of the hour every waiting pod would.
func (a *agent) yieldToPreferred(ctx context.Context, now time.Time) error {
	c := a.cfg
	if c.Manual || c.PreferCluster == "" || c.PreferCluster == c.Owner.Cluster {
		return nil
	}
	if now.IsZero() {
		var err error
		if now, err = a.dbNow(ctx); err != nil {
			return err
		}
	}
	from := a.window.Add(c.PreferGrace)
	left := min(from.Sub(now), c.PreferGrace)
	if left <= 0 {
		return nil
	}
	left += rand.N(min(c.PreferGrace/10, preferSpread) + 1)
	why := fmt.Sprintf("cluster %s is preferred for this job: this cluster claims window %s%s only from %s, its start + prefer-grace %s, by database time",
		c.PreferCluster, formatWindow(a.window), a.indexSuffix(), from.Format(time.RFC3339), c.PreferGrace)
	a.sayWaiting(why, "for", left.Round(time.Millisecond).String())
	return sleep(ctx, left)
}

// preferSpread bounds the spread of the pods that waited for a preferred
// cluster.
const preferSpread = 2 * time.Second

// leaseKey is the lease's key: the lock key, or for an Indexed Job's pod
// "<key>#<index>". The indexes of one window run side by side, each with
// its own window claim; a lease per key would make one index skip another.
// Per index, the lease still keeps a shard's run from overlapping the same
// shard's run of the next window.
func (a *agent) leaseKey() string {
	if a.cfg.JobIndex == store.NotIndexed {
		return a.cfg.Key
	}
	return fmt.Sprintf("%s#%d", a.cfg.Key, a.cfg.JobIndex)
}

// indexSuffix names the completion index of an Indexed Job's pod.
func (a *agent) indexSuffix() string {
	if a.cfg.JobIndex == store.NotIndexed {
		return ""
	}
	return fmt.Sprintf(" index %d", a.cfg.JobIndex)
}

// stale says why the window is too old to run at database time now, or ""
// when it is not: older than the catchup, or, when a window is claimed,
// older than store.MaxClaimAge, after which retention may have deleted its
// record and claiming it again would run it a second time.
func (a *agent) stale(now time.Time) string {
	late := now.Sub(a.window)
	switch {
	case a.cfg.Catchup > 0 && late > a.cfg.Catchup:
		return fmt.Sprintf("stale: window %s started %s ago by database time, more than catchup %s",
			formatWindow(a.window), late.Round(time.Second), a.cfg.Catchup)
	case a.cfg.Mode.Schedule && late > store.MaxClaimAge:
		return fmt.Sprintf("stale: window %s started %s ago by database time, more than %s, after which its record may have been deleted by retention",
			formatWindow(a.window), late.Round(time.Second), store.MaxClaimAge)
	}
	return ""
}

// maxLate is the largest lateness stale allows a claimed window.
func (a *agent) maxLate() time.Duration {
	if a.cfg.Catchup > 0 {
		return min(a.cfg.Catchup, store.MaxClaimAge)
	}
	return store.MaxClaimAge
}

// view is this cluster's view of the job, which every claim records.
func (a *agent) view() store.View {
	c := a.cfg
	v := store.View{Schedule: c.Schedule, TimeZone: c.TimeZone, Mode: c.Mode.String(), Standby: c.Standby, LeaseTTL: c.TTL.String()}
	if c.Catchup > 0 {
		v.Catchup = c.Catchup.String()
	}
	if c.MissedAfter > 0 {
		v.MissedAfter = c.MissedAfter.String()
	}
	if c.PreferCluster != "" {
		v.PreferCluster, v.PreferGrace = c.PreferCluster, c.PreferGrace.String()
	}
	v.CompletionMode = store.CompletionModeNonIndexed
	if c.JobIndex != store.NotIndexed {
		v.CompletionMode, v.Completions = store.CompletionModeIndexed, c.Completions
	}
	return v
}

// noteDisagreement warns, once, when another cluster's recent view of the
// job differs from this one's: one tick may then be two windows.
func (a *agent) noteDisagreement(v store.View, others []store.ClusterView) {
	if a.disagreement != "" {
		return
	}
	var parts []string
	views := []store.View{v}
	for _, o := range others {
		// A view differs in what the Diff leaves out (completions an
		// older webhook did not pass on): nothing to warn about.
		if diff := v.Diff(o.View); len(diff) > 0 {
			parts = append(parts, fmt.Sprintf("cluster %s has %s", o.Cluster, strings.Join(diff, ", ")))
			views = append(views, o.View)
		}
	}
	if len(parts) == 0 {
		return
	}
	a.disagreement = "WARNING clusters disagree about this job (" + strings.Join(parts, "; ") + "): " + store.DisagreementAdvice(views...)
	a.log.Warn("clusters disagree about this job", "key", a.cfg.Key, "cluster", a.cfg.Owner.Cluster, "others", parts)
}

// recordView records this cluster's view on its own, for a claim the
// database refused with an error (the clusters disagree on the completion
// mode), which took the view it carried back with it. It never holds up the
// decision; a failure is logged.
func (a *agent) recordView(ctx context.Context, v store.View) {
	// Bounded as a decision's try is (see retry), not by the heartbeat's
	// call timeout: giving up on it while it runs costs the database a
	// backend.
	callCtx, cancel := context.WithTimeout(ctx, a.cfg.StartTimeout)
	defer cancel()
	others, err := a.store.RecordView(callCtx, a.cfg.Key, a.cfg.Owner.Cluster, v, store.DefaultViewRecency)
	if err != nil {
		a.log.Warn("recording this cluster's view of the job failed; disagreement with other clusters goes unnoticed this time", "err", err)
		return
	}
	a.noteDisagreement(v, others)
}

func joinReason(a, b string) string {
	if a == "" || b == "" {
		return a + b
	}
	return a + "; " + b
}

// resolveWindow is DISLOCK_WINDOW, or the schedule's latest activation at or
// before the database clock now.
func (a *agent) resolveWindow(now time.Time) (time.Time, error) {
	if !a.cfg.Window.IsZero() {
		return a.cfg.Window, nil
	}
	sched, err := window.ParseSchedule(a.cfg.Schedule, a.cfg.TimeZone)
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

// claimWindow claims the window (the database applies "Ownership and
// re-entry"). A refusal is a skip, except that the pod waits while the owner
// is alive and running when it is another pod of the owner's Job (a retry, a
// replacement while the old pod terminates: never skip, never run alongside)
// or a standby; the database hands it the window, with a new token, once the
// owner failed or its liveness lapsed.
func (a *agent) claimWindow(ctx context.Context) (store.Claim, string, error) {
	v := a.view()
	req := store.ClaimRequest{Key: a.cfg.Key, Window: a.window, Index: a.cfg.JobIndex, Owner: a.cfg.Owner, TTL: a.cfg.TTL,
		Standby: a.cfg.Standby, View: &v, MaxLate: a.maxLate()}
	waiting := false
	for {
		var claim store.Claim
		sent := protocol.MonotonicNow()
		err := a.retry(ctx, "claiming the window", func(ctx context.Context) (err error) {
			claim, err = a.store.ClaimWindow(ctx, req)
			return err
		})
		a.noteDisagreement(v, claim.Others)
		if err == nil {
			a.windowToken = claim.Window.Token
			a.windowUntil = a.safeFrom(sent, claim.Waited)
			return claim, "", nil
		}
		if errors.Is(err, store.ErrWindowStale) {
			// The database judged it, to the microsecond: never fall
			// through to a run because this clock's rounding differs.
			why := "stale: " + err.Error()
			switch {
			case waiting:
				why = a.staleAfterWait(claim.DBTime)
			case a.stale(claim.DBTime) != "":
				why = a.stale(claim.DBTime)
			}
			return store.Claim{}, why, nil
		}
		if errors.Is(err, store.ErrKeyPaused) {
			return store.Claim{}, pausedSkip(err), nil
		}
		if errors.Is(err, store.ErrCompletionModesDisagree) {
			a.recordView(ctx, v)
			return claim, shapeRefused(err), nil
		}
		if !errors.Is(err, store.ErrWindowTaken) {
			return claim, "", err
		}
		owner := claim.Window
		var why string
		switch {
		case owner.Owner == a.cfg.Owner.String():
			// Only a claim this pod gave up or finished is refused to it.
			return claim, fmt.Sprintf("window %s%s was claimed by this pod and is %s: nothing more to run",
				formatWindow(a.window), a.indexSuffix(), owner.State), nil
		case owner.State != store.StateRunning:
			return claim, fmt.Sprintf("window %s%s already claimed by cluster %s (%s, state %s)",
				formatWindow(a.window), a.indexSuffix(), owner.Cluster, owner.Owner, owner.State), nil
		case a.cfg.Owner.SameJob(owner.Owner):
			why = "another pod of this Job owns the window and is alive; waiting until it finishes, fails or lapses"
		case a.cfg.Standby:
			why = "standby: the window's owner is alive; waiting to take over if it fails or lapses"
		default:
			return claim, fmt.Sprintf("window %s%s already claimed by cluster %s (%s, state %s)",
				formatWindow(a.window), a.indexSuffix(), owner.Cluster, owner.Owner, owner.State), nil
		}
		if !waiting {
			a.waiting(why, "window", formatWindow(a.window), "owner", owner.Owner, "aliveUntil", owner.AliveUntil)
			waiting = true
		}
		now, err := a.awaitOwnerChange(ctx, owner)
		if err != nil {
			return claim, "", err
		}
		// A wait can outlast retention: never claim a window whose record
		// may have been deleted meanwhile. The catchup, though, was
		// judged when the pod began: a pod that waits for a live owner
		// takes its window over however late that is.
		if now.Sub(a.window) > store.MaxClaimAge {
			return claim, a.staleAfterWait(now), nil
		}
		req.MaxLate = store.MaxClaimAge
	}
}

// staleAfterWait is the reason of a pod that waited for an owner until its
// window was too old to claim at database time now.
func (a *agent) staleAfterWait(now time.Time) string {
	return fmt.Sprintf("stale: waited until window %s%s was %s old by database time, more than %s, after which its record may have been deleted by retention",
		formatWindow(a.window), a.indexSuffix(), now.Sub(a.window).Round(time.Second), store.MaxClaimAge)
}

// shapeRefused is the reason of a skip whose claim or lease the database
// refused because the window or key was taken in the other completion
// mode: running it would run the window, or the key, twice.
func shapeRefused(err error) string {
	return "skipped, never run twice: " + err.Error() +
		"; make spec.jobTemplate.spec.completionMode (and completions) the same in every cluster's CronJob"
}

// pausedSkip is the reason of a skip the database answered with
// ErrKeyPaused: an operator paused the key everywhere.
func pausedSkip(err error) string {
	return "skipped: " + err.Error() + "; while a key is paused no run of it starts in any cluster, and a window that started meanwhile never runs (kubectl dislock resume)"
}

// awaitOwnerChange polls the window, reading only, until it may have
// changed hands or may be taken: the owner lapsed, or the row is no longer
// the running claim of owner. Claiming on every poll would draw a fencing
// token and lock the row each time. It returns the database time of its
// last look.
func (a *agent) awaitOwnerChange(ctx context.Context, owner store.Window) (time.Time, error) {
	for {
		if err := sleep(ctx, a.pollInterval()); err != nil {
			return time.Time{}, err
		}
		var w store.Window
		var now time.Time
		err := a.retry(ctx, "watching the window's owner", func(ctx context.Context) (err error) {
			w, now, err = a.store.WindowAt(ctx, a.cfg.Key, a.window, a.cfg.JobIndex)
			return err
		})
		switch {
		case ctx.Err() != nil:
			return time.Time{}, ctx.Err()
		case err != nil:
			// Gone (deleted by an operator, or by retention) or
			// unreadable: the claim says what it is now, once the clock
			// says the window may still be claimed.
			return a.dbNow(ctx)
		case w.Token != owner.Token || w.State != store.StateRunning || !w.AliveUntil.After(now):
			return now, nil
		}
	}
}

// waiting reports that the pod waits (sayWaiting) and leaves it in the
// ledger.
func (a *agent) waiting(why string, attrs ...any) {
	a.sayWaiting(why, attrs...)
	a.ledger(store.ActionWait, why, 0, 0)
}

// sayWaiting leaves a termination message in case the sidecar is stopped or
// restarted before it decides, then logs the wait. In that order, so that
// whoever read the line finds the message written.
func (a *agent) sayWaiting(why string, attrs ...any) {
	a.terminate(contract.Termination{Outcome: contract.OutcomeError, Message: "waiting: " + why})
	a.log.Info("waiting: "+why, append([]any{"key", a.cfg.Key}, attrs...)...)
}

// acquireLease takes the lease. Another Job's live lease means an earlier run
// is still going: skip. A retry pod of this Job, or a standby that took the
// window over from a dead owner, waits for the old holder's lease to be
// released or to expire instead, keeping its window claim alive meanwhile.
func (a *agent) acquireLease(ctx context.Context, tookOver bool) (store.LeaseGrant, string, error) {
	waiting := false
	for {
		var grant store.LeaseGrant
		sent := protocol.MonotonicNow()
		err := a.retry(ctx, "acquiring the lease", func(ctx context.Context) (err error) {
			grant, err = a.store.AcquireLease(ctx, a.leaseKey(), a.cfg.Owner, a.cfg.TTL)
			return err
		})
		if err == nil {
			a.leaseToken = grant.Lease.Token
			a.leaseUntil = a.safeFrom(sent, grant.Waited)
			return grant, "", nil
		}
		if errors.Is(err, store.ErrKeyPaused) {
			return grant, pausedSkip(err), nil
		}
		if errors.Is(err, store.ErrCompletionModesDisagree) {
			return grant, shapeRefused(err), nil
		}
		if !errors.Is(err, store.ErrLeaseHeld) {
			return grant, "", err
		}
		holder := grant.Lease
		if !tookOver && !a.cfg.Owner.SameJob(holder.Owner) {
			return grant, fmt.Sprintf("lease %s held by %s until %s: an earlier run is still going", a.leaseKey(), holder.Owner,
				holder.ExpireAt.Format(time.RFC3339)), nil
		}
		if !waiting {
			a.waiting("the previous holder's lease must be released or expire first", "holder", holder.Owner, "expireAt", holder.ExpireAt)
			waiting = true
		}
		if err := sleep(ctx, a.pollInterval()); err != nil {
			return grant, "", err
		}
		if a.windowToken != 0 {
			sent := protocol.MonotonicNow()
			if err := a.retry(ctx, "heartbeat", func(ctx context.Context) error {
				_, _, err := a.store.Heartbeat(ctx, a.cfg.Key, a.window, a.cfg.JobIndex, a.windowToken, a.cfg.TTL)
				return err
			}); err != nil {
				return grant, "", err
			}
			a.windowUntil = a.safeFrom(sent, 0)
		}
	}
}

// safeFrom is the safety deadline earned by a grant or renewal sent at local
// monotonic time sent that waited so long before it started on the database
// (store.Claim.Waited: a lock gateway's queue): the database computed the
// expiry from a now() no earlier than sent + waited, so that + ttl − margin
// is before the expiry, and no call of the pod's that lands later moves the
// expiry back (schema 15). A herd's claims queue in their gateway; counted
// from when they were sent, a claim that queued longer than the margin
// would reach its pod with its deadline spent, and every such pod would
// renew before it runs, behind the same herd.
//
// The wait is counted on the gateway's clock: at most a ttl of it is
// taken, so that a clock running fast there errs by no more than the
// pod's own clock may over the ttl it counts anyway.
func (a *agent) safeFrom(sent int64, waited time.Duration) int64 {
	return sent + int64(min(waited, a.cfg.TTL)) + int64(a.cfg.TTL-a.cfg.Margin())
}

// deadline is the earliest safety deadline of what this pod holds that
// another pod could take once it lapses: the lease, and the window's liveness
// (another pod of the same Job, or a standby, may take a lapsed window). 0
// when nothing can be taken away.
func (a *agent) deadline() int64 {
	var d int64
	if a.leaseToken != 0 {
		d = a.leaseUntil
	}
	if a.windowToken != 0 && (d == 0 || a.windowUntil < d) {
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
