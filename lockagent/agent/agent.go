// Package agent is the lock agent: the native sidecar the webhook injects
// into every pod of an opted-in CronJob. It runs in phases — install (copy
// itself where the wrappers can exec it), decide (claim the window, then the
// lease, at database time), supervise (heartbeat, keep the safety deadline,
// revoke before the database could give the lease away) and record (on
// SIGTERM: the outcome, the release, the termination message). Each phase is
// a method testable on its own; the agent imports no Kubernetes code.
package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/gateway/client"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
)

// Main runs the agent until SIGTERM and returns its exit code: 0 whenever it
// got to record (a native sidecar that exits non-zero is restarted, and a
// skip must end as a successful Job), 64 for unusable flags.
func Main(args []string, getenv func(string) string, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return run(ctx, args, getenv, stderr)
}

type agent struct {
	cfg   Config
	store store.Locks
	dir   protocol.Dir
	log   *slog.Logger

	decision    protocol.Decision
	window      time.Time // the window this pod claimed (zero: none)
	windowToken int64     // our claim's token, 0 when no window is held
	leaseToken  int64     // our lease's token, 0 when no lease is held
	// Safety deadlines (CLOCK_MONOTONIC ns) of the window's liveness and of
	// the lease; see deadline().
	windowUntil, leaseUntil int64
	revoked                 bool
	// gaveUp says why the claim was given up because no app started in
	// time; empty otherwise.
	gaveUp string
	// finished: the run's outcome was handled (recorded, or left to lapse).
	finished bool
	// disagreement warns that other clusters see the job differently.
	disagreement string
	installed    <-chan struct{} // closed once install is done
	// tookOver: the window was taken from a failed or lapsed owner.
	tookOver bool
	// The ledger's writer (ledger.go).
	ledgerCh   chan ledgerEntry
	ledgerDone chan struct{}
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, cfgErr := parseConfig(args, getenv, stderr)
	if errors.Is(cfgErr, flag.ErrHelp) {
		return 0
	}
	if cfg.SharedDir == "" {
		fmt.Fprintf(stderr, "dislock-agent agent: %v\n", cfgErr)
		return 64
	}
	a := &agent{cfg: cfg, dir: protocol.Dir(cfg.SharedDir), log: newLogger(stderr, cfg.WallClockOffset)}
	// Copying the binary overlaps with reaching the database; publish waits
	// for it, because the app containers exec the copy.
	installed := make(chan struct{})
	go func() {
		defer close(installed)
		if err := a.install(); err != nil {
			a.log.Error("installing the wrapper binary failed; app containers cannot start", "err", err)
		}
	}()
	a.installed = installed
	a.log.Info("starting", "key", cfg.Key, "mode", cfg.Mode.String(), "window", formatWindow(cfg.Window), "manual", cfg.Manual,
		"cluster", cfg.Owner.Cluster, "job", cfg.Owner.Job, "pod", cfg.Owner.Pod, "ttl", cfg.TTL.String(), "standby", cfg.Standby)
	if cfgErr != nil {
		a.publish(protocol.Decision{Action: protocol.ActionError, Key: cfg.Key, Reason: "bad agent configuration: " + cfgErr.Error()})
		a.idle(ctx)
		return 0
	}
	db, err := openLocks(ctx, cfg.DatabaseURL)
	if err != nil {
		a.publish(protocol.Decision{Action: protocol.ActionError, Key: cfg.Key, Reason: err.Error()})
		a.idle(ctx)
		return 0
	}
	defer db.Close()
	a.store = db
	a.startLedger()
	defer a.flushLedger()

	// A restarted sidecar (the kubelet restarts a native sidecar that died)
	// finds its earlier decision. run and skip stand; error is never final
	// while the pod lives, so it is withdrawn and decided again.
	prev, ok, err := a.dir.ReadDecision()
	switch {
	case err != nil:
		a.log.Warn("the earlier decision is unreadable; deciding again", "err", err)
		ok = false
	case ok && prev.Action == protocol.ActionError:
		a.log.Info("restarted after an error decision; deciding again", "reason", prev.Reason)
		ok = false
	}
	switch {
	case ok && prev.Action == protocol.ActionRun:
		a.resume(ctx, prev)
	case ok:
		a.decision = prev
		a.log.Info("restarted: keeping the earlier decision", "action", prev.Action, "reason", prev.Reason)
	default:
		if err := a.dir.RemoveDecision(); err != nil {
			a.log.Error("withdrawing the earlier decision failed", "err", err)
		}
		a.decide(ctx)
	}
	a.supervise(ctx)
	a.record()
	return 0
}

// newLogger writes JSON lines. Log timestamps are the only use of the local
// wall clock, and the test-only offset shifts exactly them.
func newLogger(w io.Writer, offset time.Duration) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey && len(groups) == 0 && offset != 0 {
			a.Value = slog.TimeValue(a.Value.Time().Add(offset))
		}
		return a
	}})).With("component", "dislock-agent", "pid", os.Getpid())
}

// executable is the file install copies: this binary. The herd benchmark
// (herd_test.go) runs thousands of agents inside the test binary and points
// it at a small file instead of copying the test binary thousands of times.
var executable = os.Executable

// install copies the agent's own executable into the shared directory, where
// the app containers' wrapped commands exec it. Atomic, so a wrapper never
// runs a half-copied binary.
func (a *agent) install() error {
	self, err := executable()
	if err != nil {
		return err
	}
	src, err := os.Open(self)
	if err != nil {
		return err
	}
	defer src.Close()
	dst := a.dir.Path(protocol.BinPath)
	if err := os.MkdirAll(a.dir.Path("bin"), 0o755); err != nil {
		return err
	}
	// App containers may run as other users than the agent and than each
	// other; each must be able to write its own result and started files.
	for _, dir := range []string{protocol.ResultsDir, protocol.StartedDir} {
		if err := os.MkdirAll(a.dir.Path(dir), 0o755); err != nil {
			return err
		}
		if err := os.Chmod(a.dir.Path(dir), 0o1777); err != nil {
			return err
		}
	}
	tmp, err := os.CreateTemp(a.dir.Path("bin"), ".dislock-agent.*")
	if err != nil {
		return err
	}
	_, err = io.Copy(tmp, src)
	err = errors.Join(err, tmp.Chmod(0o555), tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// publish writes the deadline (when something can expire) before the
// decision, so a wrapper that sees "run" always sees the deadline too; then
// the termination message and the decision log line.
func (a *agent) publish(d protocol.Decision) {
	<-a.installed
	if d.Action == protocol.ActionRun {
		d.KillGrace = protocol.Duration(a.cfg.KillGrace())
		d.TTL = protocol.Duration(a.cfg.TTL)
		d.WindowToken, d.LeaseToken = a.windowToken, a.leaseToken
		d.DecidedAt = protocol.MonotonicNow()
		d.BootID = protocol.BootID()
		// With the app containers known, finishRun records as soon as all
		// of them reported; the wrappers wait for that (see AwaitRecord).
		d.AwaitRecord = len(a.cfg.AppContainers) > 0 && (a.windowToken != 0 || a.leaseToken != 0)
		if d.AwaitRecord {
			d.Containers = a.cfg.AppContainers
		}
		if dl := a.deadline(); dl != 0 {
			if err := a.dir.WriteDeadline(dl); err != nil {
				a.log.Error("writing the deadline failed", "err", err)
			}
		}
	}
	a.decision = d
	if err := a.dir.WriteDecision(d); err != nil {
		a.log.Error("writing the decision failed", "err", err)
	}
	a.terminate(a.decided(d))
	a.log.Info("decision", "action", d.Action, "key", d.Key, "window", d.Window, "owner", d.Owner, "token", d.Token, "reason", d.Reason)
	a.ledgerDecision(d)
}

// terminate leaves t as the sidecar's termination message: the outcome the
// webhook labels the pod with should the pod end now, and the account
// kubectl describe shows.
func (a *agent) terminate(t contract.Termination) {
	if err := os.WriteFile(a.cfg.TerminationLog, []byte(t.Encode()+"\n"), 0o644); err != nil {
		a.log.Warn("writing the termination message failed", "path", a.cfg.TerminationLog, "err", err)
	}
}

// decided is the Termination of decision d. A pod that decided to run and
// ends before the run's end is recorded has failed: nothing says the run
// succeeded, and its claim lapses.
func (a *agent) decided(d protocol.Decision) contract.Termination {
	t := contract.Termination{Outcome: contract.OutcomeError, Message: fmt.Sprintf("%s: %s", d.Action, d.Reason)}
	switch d.Action {
	case protocol.ActionRun:
		t.Outcome, t.TookOver = contract.OutcomeFailed, a.tookOver
	case protocol.ActionSkip:
		t.Outcome = contract.OutcomeSkipped
	}
	return t
}

// callTimeout bounds one database call: PgBouncer queues a query while its
// server is down, and a heartbeat that hangs is as bad as one that failed.
func (a *agent) callTimeout() time.Duration { return min(5*time.Second, a.cfg.HeartbeatInterval()) }

// retry runs op until it succeeds, fails for a reason other than an
// unreachable database, the database stayed unreachable for StartTimeout,
// or ctx ends; then it returns op's last error. It backs off from 100 ms,
// doubling up to a heartbeat interval, each pause jittered: what it serves
// can wait, and a database that is down is not hammered by every pod at
// once, nor in step.
//
// A try is not cut short before StartTimeout. Before a decision nothing is
// at risk from a slow answer, and a try given up on is worse than waiting:
// a client that closes while PgBouncer runs its statement makes PgBouncer
// close that server connection too, and when the pods of a herd queued
// behind a busy database give up together, each of their retries costs
// the database a new backend (~35 ms of CPU on a 2-vCPU machine) on top of
// the queue they left. BenchmarkHerd saw 3 000 pods, queued for longer than
// a 5 s bound, start 4 600 backends and never drain, and 9 000 pods do the
// same behind a 30 s bound; waiting in the queue instead, they drain
// (docs/benchmarks.md). A dead connection still ends the try (the
// connection's own errors, PgBouncer's query_wait_timeout) and so does
// StartTimeout.
func (a *agent) retry(ctx context.Context, what string, op func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.StartTimeout)
	defer cancel()
	return a.retryPaced(ctx, what, a.cfg.StartTimeout, a.backoff, op)
}

// backoff is the wait after prev (0 before the first wait): 100 ms,
// doubling up to a heartbeat interval or 5 s, and then jittered to between
// half and all of it, so that the pods that failed together do not retry
// together.
func (a *agent) backoff(prev time.Duration) time.Duration {
	d := 100 * time.Millisecond
	if prev != 0 {
		d = min(2*prev, 5*time.Second, a.cfg.HeartbeatInterval())
	}
	return d/2 + rand.N(d/2+1)
}

// racingRetryInterval paces retryRacing: shorter than any outage the
// database comes back from (a restart, PgBouncer's server_login_retry).
const racingRetryInterval = 100 * time.Millisecond

// retryRacing is retry for what races the claim's liveness: recording a
// finished run's outcome, and re-entering a claim after a restart. The claim
// lapses at a fixed time; a database back for a few hundred milliseconds
// before then must not be slept through (a success not recorded in time lets
// another cluster run the window again). So until lapse (CLOCK_MONOTONIC ns:
// by then the claim cannot be alive any more) it tries every 100 ms, ±50 %
// so that the pods of one outage do not knock in step; after it, it backs
// off as retry does. Only ctx bounds it.
func (a *agent) retryRacing(ctx context.Context, what string, lapse int64, op func(ctx context.Context) error) error {
	return a.retryPaced(ctx, what, a.callTimeout(), func(prev time.Duration) time.Duration {
		if protocol.MonotonicNow() < lapse {
			return racingRetryInterval/2 + rand.N(racingRetryInterval)
		}
		return a.backoff(max(prev, racingRetryInterval))
	}, op)
}

// retryPaced runs op until it succeeds, fails for a reason other than an
// unreachable database, or ctx ends, giving each try callTimeout and
// waiting next(previous wait) between tries (0 before the first wait). It
// logs the first failure and then at most one a second.
func (a *agent) retryPaced(ctx context.Context, what string, callTimeout time.Duration, next func(time.Duration) time.Duration, op func(ctx context.Context) error) error {
	var wait time.Duration
	var logged time.Time
	for tries := 1; ; tries++ {
		callCtx, cancel := context.WithTimeout(ctx, callTimeout)
		err := op(callCtx)
		cancel()
		if err == nil || !errors.Is(err, store.ErrUnavailable) {
			if err == nil && tries > 1 {
				a.log.Info("database available again", "op", what, "tries", tries)
			}
			return err
		}
		wait = next(wait)
		if time.Since(logged) >= time.Second {
			a.log.Warn("database unavailable, retrying", "op", what, "in", wait.String(), "tries", tries, "err", err)
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// lapseBound is when a claim whose safety deadline is until (CLOCK_MONOTONIC
// ns) can no longer be alive in the database: the deadline is a margin
// (ttl/3) before the expiry the last renewal earned, counted from when it
// was sent (and waited, see safeFrom); the database counted from when it
// ran, at most a call timeout after it was sent: StartTimeout when the
// claim itself earned it (see retry).
func (a *agent) lapseBound(until int64) int64 {
	return until + int64(a.cfg.Margin()+max(a.callTimeout(), a.cfg.StartTimeout))
}

// recordContext bounds recording a run's outcome before SIGTERM: for
// StopTimeout, and at least until the window's claim can no longer be alive,
// since until then a record keeps another pod from running the window again.
func (a *agent) recordContext() (context.Context, context.CancelFunc) {
	end := time.Now().Add(a.cfg.StopTimeout)
	if a.windowToken != 0 {
		end = later(end, time.Now().Add(time.Duration(a.lapseBound(a.windowUntil)-protocol.MonotonicNow())))
	}
	return context.WithDeadline(context.Background(), end)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// pollInterval paces waiting (standby, a retry pod waiting for its
// predecessor's lease): often enough to take over soon after expiry.
func (a *agent) pollInterval() time.Duration {
	return min(max(a.cfg.TTL/10, 100*time.Millisecond), 2*time.Second)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// openLocks reaches the database through url: a lock gateway's
// (https://…), or PostgreSQL's.
func openLocks(ctx context.Context, url string) (store.Locks, error) {
	if client.IsURL(url) {
		return client.Dial(url)
	}
	return store.Open(ctx, url, store.Options{MaxConns: 2})
}
