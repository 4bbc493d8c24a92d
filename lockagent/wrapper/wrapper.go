// Package wrapper is `dislock-agent exec`, the wrapper the webhook puts in
// front of every app container's command. It owns the app side of the agent ⇄
// wrapper file protocol: wait for the agent's decision; on "run" start the
// command with its fencing token, forward signals to it and reap as PID 1;
// stop it when the lease is revoked or when the safety deadline passes — the
// wrapper reads the deadline itself, so a dead agent cannot leave the app
// running past its lease; and record how the command ended for the agent to
// report. Like the agent it links no Kubernetes code: it is copied into every
// pod.
package wrapper

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
)

// Exit codes of the wrapper itself; otherwise it exits with the command's
// code, 128+signal when the command was killed, or 126/127 when it could not
// be started.
const (
	// ExitUsage (EX_USAGE): bad flags or no command. Nothing ran.
	ExitUsage = 64
	// ExitError (EX_TEMPFAIL): the agent decided "error", its decision was
	// unreadable, or the lease was already lost. Nothing ran; failing makes
	// the Job retry.
	ExitError = 75
	// exitInternal (EX_SOFTWARE): the wrapper lost track of the command.
	// Should not happen.
	exitInternal = 70
)

// Defaults of the flags.
const (
	DefaultPoll = 100 * time.Millisecond
	// DefaultKillGrace applies when the decision carries no kill grace.
	DefaultKillGrace = 2 * time.Second
	// waitLogEvery paces the "still waiting" log line.
	waitLogEvery = 30 * time.Second
)

const usageLine = "dislock-agent exec [--shared-dir DIR] [--name NAME] [--poll DURATION] [--decision-timeout DURATION] -- COMMAND [ARGS...]"

// reapOrphans makes the wrapper reap every child, not only the command. A
// container's PID 1 inherits every orphan the app leaves behind and must reap
// them, or they stay zombies. Tests set it in a child subreaper, the one
// other place where orphans are re-parented to us.
var reapOrphans = os.Getpid() == 1

// Options is the parsed command line.
type Options struct {
	// SharedDir is the emptyDir shared with the agent.
	SharedDir string
	// Name is this wrapper's result file name under results/.
	Name string
	// Poll is how often the decision, revoked and deadline files are read.
	Poll time.Duration
	// DecisionTimeout bounds the wait for the decision; 0 waits forever (in
	// a pod the app container starts once the sidecar's postStart hook saw
	// the binary installed, and the decision follows within milliseconds).
	DecisionTimeout time.Duration
	// Command is the command and its arguments.
	Command []string
}

// Validate lists every problem with the options.
func (o Options) Validate() error {
	var errs []error
	if o.SharedDir == "" {
		errs = append(errs, errors.New(`--shared-dir is empty (want the directory shared with the agent, e.g. "/dislock")`))
	}
	if !protocol.PlainName(o.Name) {
		errs = append(errs, fmt.Errorf(`--name %q is not a plain file name (want e.g. the container name "app")`, o.Name))
	}
	if o.Poll <= 0 {
		errs = append(errs, fmt.Errorf(`--poll %s is not positive (want e.g. "100ms")`, o.Poll))
	}
	if o.DecisionTimeout < 0 {
		errs = append(errs, fmt.Errorf(`--decision-timeout %s is negative (want 0 to wait forever, or e.g. "5m")`, o.DecisionTimeout))
	}
	if len(o.Command) == 0 || o.Command[0] == "" {
		errs = append(errs, errors.New("no command to run (usage: "+usageLine+")"))
	}
	return errors.Join(errs...)
}

// Main runs the wrapper. args are the arguments after "exec" (flags, then
// "--", then the command). It returns the process exit code: 64 for misuse,
// 75 when the agent decided "error" (or its decision is unreadable), 0 on
// skip, else the command's code (128+signal when it was killed by a signal).
func Main(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	log := slog.New(slog.NewJSONHandler(stderr, nil)).With("component", "dislock-agent exec", "pid", os.Getpid())
	opts, err := parseArgs(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return ExitUsage // usage printed; nothing ran
	}
	if err != nil {
		log.Error("bad usage: "+err.Error(), "usage", usageLine)
		return ExitUsage
	}
	w := &wrapper{
		opts:         opts,
		dir:          protocol.Dir(opts.SharedDir),
		log:          log.With("container", opts.Name),
		stdout:       stdout,
		stderr:       stderr,
		environ:      os.Environ(),
		reapAll:      reapOrphans,
		waitLogEvery: waitLogEvery,
		now:          protocol.MonotonicNow,
	}
	return w.run()
}

// parseArgs parses the flags, with defaults from the environment. Usage text
// goes to output only when asked for (-h); errors are returned.
func parseArgs(args []string, getenv func(string) string, output io.Writer) (Options, error) {
	fs := flag.NewFlagSet("dislock-agent exec", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o Options
	fs.StringVar(&o.SharedDir, "shared-dir", envOr(getenv, contract.EnvSharedDir, contract.DefaultSharedDir),
		"directory shared with the agent (env "+contract.EnvSharedDir+")")
	fs.StringVar(&o.Name, "name", getenv(contract.EnvContainerName),
		"result file name under results/ (env "+contract.EnvContainerName+"; default app-<random hex>)")
	fs.DurationVar(&o.Poll, "poll", DefaultPoll, "how often the agent's files are read")
	fs.DurationVar(&o.DecisionTimeout, "decision-timeout", 0, "how long to wait for the agent's decision (0: forever)")
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(output)
		fmt.Fprintln(output, "usage: "+usageLine)
		fs.PrintDefaults()
		return o, err
	}
	if err != nil {
		return o, err
	}
	o.Command = fs.Args()
	if o.Name == "" {
		o.Name = randomName()
	}
	return o, o.Validate()
}

func envOr(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

func randomName() string {
	var b [4]byte
	rand.Read(b[:]) // never fails (crypto/rand panics rather than return an error)
	return "app-" + hex.EncodeToString(b[:])
}

// wrapper is one run of `dislock-agent exec`.
type wrapper struct {
	opts           Options
	dir            protocol.Dir
	log            *slog.Logger
	stdout, stderr io.Writer
	environ        []string // the wrapper's own environment, passed on to the command
	reapAll        bool
	waitLogEvery   time.Duration
	now            func() int64 // CLOCK_MONOTONIC ns
	// terminated: a terminating signal reached the wrapper while the app
	// ran (and was forwarded to it).
	terminated bool
}

func (w *wrapper) run() int {
	// Catch every signal from the start: a SIGTERM while waiting for the
	// decision then ends the wait with a result, and no signal can fall
	// between starting the command and forwarding to it.
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs)
	defer signal.Stop(sigs)

	dec, err := w.awaitDecision(sigs)
	if stopped := (*stoppedError)(nil); errors.As(err, &stopped) {
		code := 128 + int(stopped.sig)
		w.log.Warn(err.Error()+"; not running the command", "exitCode", code)
		w.record(protocol.Result{ExitCode: code})
		return code
	}
	if err != nil {
		w.log.Error("no usable decision; not running the command", "err", err)
		w.record(protocol.Result{ExitCode: ExitError})
		return ExitError
	}
	switch dec.Action {
	case protocol.ActionSkip:
		return w.skip(dec)
	case protocol.ActionError:
		return w.fail(dec)
	}
	if dec.AwaitRecord {
		// A container the kubelet restarts after its app succeeded in this
		// pod (a liveness kill while it waited for the record) does not
		// run the app again: the success stands.
		if results, err := w.dir.ReadResults(); err == nil {
			if r, ok := results[w.opts.Name]; ok && r.Ran && r.ExitCode == 0 && !r.Revoked {
				w.log.Info("the command already succeeded in this pod; not running it again", "key", dec.Key, "window", dec.Window)
				return 0
			}
		}
	}
	return w.runCommand(dec, sigs)
}

// stoppedError: a terminating signal arrived before there was a decision.
type stoppedError struct{ sig syscall.Signal }

func (e *stoppedError) Error() string {
	return fmt.Sprintf("stopped by %s while waiting for the decision", status{signal: e.sig}.signalName())
}

// awaitDecision polls for the decision file until it is there, the decision
// timeout passes, or a terminating signal arrives. It logs once when it
// starts waiting and then every waitLogEvery, so a pod stuck here says why.
func (w *wrapper) awaitDecision(sigs <-chan os.Signal) (protocol.Decision, error) {
	start := time.Now()
	var timeout <-chan time.Time
	if w.opts.DecisionTimeout > 0 {
		t := time.NewTimer(w.opts.DecisionTimeout)
		defer t.Stop()
		timeout = t.C
	}
	tick := time.NewTicker(w.opts.Poll)
	defer tick.Stop()
	var nextLog time.Duration
	for {
		dec, ok, err := w.dir.ReadDecision()
		if err != nil || ok {
			return dec, err
		}
		if waited := time.Since(start); waited >= nextLog {
			w.log.Info("waiting for the agent's decision", "path", w.dir.Path(protocol.DecisionFile), "waited", waited.Round(time.Second).String())
			nextLog = waited + w.waitLogEvery
		}
		select {
		case <-tick.C:
		case <-timeout:
			return dec, fmt.Errorf("no decision at %s after %s (is the dislock-agent sidecar running?)", w.dir.Path(protocol.DecisionFile), w.opts.DecisionTimeout)
		case sig := <-sigs:
			if s, ok := sig.(syscall.Signal); ok && terminating(s) {
				return dec, &stoppedError{sig: s}
			}
		}
	}
}

func terminating(sig syscall.Signal) bool {
	switch sig {
	case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT:
		return true
	}
	return false
}

// skip: another pod owns the window (or the lease). One log line says who and
// why; exit 0 so the Job completes.
func (w *wrapper) skip(dec protocol.Decision) int {
	w.log.Info("skipped: the command does not run in this pod",
		"key", dec.Key, "window", dec.Window, "owner", dec.Owner, "cluster", clusterOf(dec.Owner), "reason", dec.Reason)
	w.record(protocol.Result{})
	return 0
}

// fail: the agent could not decide (database unreachable, bad config). Fail
// closed, and fail the container so the Job retries.
func (w *wrapper) fail(dec protocol.Decision) int {
	w.log.Error("the agent decided error; not running the command",
		"key", dec.Key, "window", dec.Window, "owner", dec.Owner, "reason", dec.Reason)
	w.record(protocol.Result{ExitCode: ExitError})
	return ExitError
}

// clusterOf is the cluster part of an owner string (<cluster>/<namespace>/...).
func clusterOf(owner string) string {
	cluster, _, _ := strings.Cut(owner, "/")
	return cluster
}

// runCommand starts the command, supervises it until it exits, and records
// the result.
func (w *wrapper) runCommand(dec protocol.Decision, sigs <-chan os.Signal) int {
	// Mark first, then look at revoked: the agent's app-start timeout
	// revokes first, then looks for marks (see protocol.Dir.MarkStarted), so
	// an app never starts after the agent gave its claim up.
	if err := w.dir.MarkStarted(w.opts.Name, time.Now()); err != nil {
		w.log.Error("not running the command: cannot tell the agent it starts", "err", err)
		w.record(protocol.Result{ExitCode: ExitError})
		return ExitError
	}
	watch := &leaseWatch{dir: w.dir, now: w.now, ttl: int64(dec.TTL)}
	if why, lost := watch.check(); lost {
		// Starting it only to stop it at the next poll would let it act
		// without a lease.
		w.log.Error("not running the command: "+why, "key", dec.Key, "window", dec.Window, "token", dec.Token)
		w.record(protocol.Result{ExitCode: ExitError, Revoked: true})
		return ExitError
	}
	started := time.Now()
	c, err := startChild(w.opts.Command, childEnv(w.environ, dec), os.Stdin, w.stdout, w.stderr, w.reapAll)
	if err != nil {
		code := startErrorCode(err)
		w.log.Error("cannot start the command", "command", w.opts.Command[0], "err", err, "exitCode", code)
		w.record(protocol.Result{ExitCode: code})
		return code
	}
	w.log.Info("running the command", "key", dec.Key, "window", dec.Window, "owner", dec.Owner,
		"token", dec.Token, "reason", dec.Reason, "childPid", c.pid)

	res, stopped := w.supervise(c, dec, watch, sigs)
	finished := time.Now()
	// Whatever the app left running in its group must not act on once its
	// result is out: the agent may record the run at once, release the
	// lease, and another pod take the window (in a container the rest dies
	// with the wrapper anyway, but only once it exits).
	w.signal(c, syscall.SIGKILL)
	// A signal is delivered, not yet acted on, when kill returns: wait until
	// no member of the group still runs (a zombie does not), so that the
	// result goes out after the leftovers stopped, not just after they
	// were told to.
	if !c.awaitGroupStopped(groupStopTimeout) {
		w.log.Warn("processes of the command's group still run after SIGKILL", "waited", groupStopTimeout.String())
	}
	if res.err != nil {
		w.log.Error("lost track of the command", "err", res.err)
		w.record(protocol.Result{Ran: true, ExitCode: exitInternal, Revoked: stopped, Started: started.UTC(), Finished: finished.UTC()})
		return exitInternal
	}
	code := res.status.code()
	w.record(protocol.Result{
		Ran:      true,
		ExitCode: code,
		Signal:   res.status.signalName(),
		Revoked:  stopped,
		Started:  started.UTC(),
		Finished: finished.UTC(),
	})
	w.log.Info("the command ended", "exitCode", code, "signal", res.status.signalName(), "revoked", stopped,
		"duration", finished.Sub(started).String())
	if code == 0 && !stopped && dec.AwaitRecord && !w.terminated && w.lastToFinish(dec) {
		w.awaitRecord(dec, watch, sigs)
	}
	return code
}

// lastToFinish reports whether every other app container of the pod has
// reported: only the last one waits for the record, so the others end at
// once as they always did (a container that stayed to wait could be
// restarted by the kubelet and run its app again).
func (w *wrapper) lastToFinish(dec protocol.Decision) bool {
	results, err := w.dir.ReadResults()
	if err != nil {
		return true
	}
	for _, name := range dec.Containers {
		if _, ok := results[name]; !ok && name != w.opts.Name {
			return false
		}
	}
	return true
}

// awaitRecord keeps the container, and so the pod, alive after a success
// until the agent has recorded it: once the pod ends the kubelet stops the
// sidecar, and a sidecar stopped before it recorded (one restarted just as
// the app ended cannot even catch the signal yet) would leave the window to
// lapse to a standby that runs it again. The wait ends when the agent wrote
// recorded; when another container failed (the agent then records at its
// stop, as for any failure); when the claim can no longer be alive (the
// agent stopped renewing at the safety deadline, and a record after the
// lapse could not keep the claim anyway: see leaseWatch.lapsed); or on a
// terminating signal. The app has ended, so waiting past the safety
// deadline lets nothing run without the lease.
func (w *wrapper) awaitRecord(dec protocol.Decision, watch *leaseWatch, sigs <-chan os.Signal) {
	fallback := w.now() + int64(dec.TTL)
	tick := time.NewTicker(w.opts.Poll)
	defer tick.Stop()
	logged := false
	for {
		if w.dir.Recorded() {
			return
		}
		if name, failed := w.anotherFailed(); failed {
			w.log.Info("not waiting for the agent to record: container " + name + " failed, so the outcome is recorded when the pod stops")
			return
		}
		if watch.lapsed(fallback) {
			w.log.Warn("stopped waiting for the agent to record the success: the claim lapsed without a renewal or a record", "key", dec.Key, "window", dec.Window)
			return
		}
		if !logged {
			w.log.Info("waiting for the agent to record the success before exiting", "key", dec.Key, "window", dec.Window)
			logged = true
		}
		select {
		case <-tick.C:
		case sig := <-sigs:
			if s, ok := sig.(syscall.Signal); ok && terminating(s) {
				w.log.Warn("stopped by "+status{signal: s}.signalName()+" while waiting for the agent to record the success", "key", dec.Key, "window", dec.Window)
				return
			}
		}
	}
}

// anotherFailed reports a container whose result is not a success.
func (w *wrapper) anotherFailed() (string, bool) {
	results, err := w.dir.ReadResults()
	if err != nil {
		return "", false
	}
	for _, name := range slices.Sorted(maps.Keys(results)) {
		if r := results[name]; !r.Ran || r.ExitCode != 0 || r.Revoked {
			return name, true
		}
	}
	return "", false
}

// childEnv is the wrapper's environment plus the fencing token and window.
// They are always set, so a stale value in the container's env never leaks
// through; the token is empty when this run holds no lease (token 0: a manual
// run without lease mode). os/exec keeps the last of duplicate keys.
func childEnv(environ []string, dec protocol.Decision) []string {
	token := ""
	if dec.Token != 0 {
		token = strconv.FormatInt(dec.Token, 10)
	}
	return append(slices.Clip(environ),
		contract.EnvFencingToken+"="+token,
		contract.EnvWindow+"="+dec.Window)
}

// supervise forwards signals to the command's process group and, every poll,
// checks the lease; once it is lost the group gets SIGTERM, then SIGKILL
// after the decision's kill grace. It returns how the command ended and
// whether the wrapper stopped it.
func (w *wrapper) supervise(c *child, dec protocol.Decision, watch *leaseWatch, sigs <-chan os.Signal) (waitResult, bool) {
	grace := time.Duration(dec.KillGrace)
	if grace <= 0 {
		grace = DefaultKillGrace
	}
	tick := time.NewTicker(w.opts.Poll)
	defer tick.Stop()
	var kill <-chan time.Time
	stopping := false
	for {
		select {
		case res := <-c.done:
			if stopping {
				// The lease is gone: nothing the command left running in
				// its group may go on acting.
				w.signal(c, syscall.SIGKILL)
			}
			return res, stopping
		case sig := <-sigs:
			if forwarded(sig) {
				w.signal(c, sig.(syscall.Signal))
			}
			if s, ok := sig.(syscall.Signal); ok && terminating(s) {
				// The pod is being stopped: the app may end on this very
				// signal, and the wrapper must not wait for a record after.
				w.terminated = true
			}
		case <-tick.C:
			if stopping {
				continue
			}
			why, lost := watch.check()
			if !lost || c.exited() {
				// An app that ended before the lease was lost ended on
				// its own: its status is on its way through c.done.
				continue
			}
			w.log.Error(why, "key", dec.Key, "window", dec.Window, "token", dec.Token, "killGrace", grace.String())
			stopping = true
			w.signal(c, syscall.SIGTERM)
			t := time.NewTimer(grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			w.log.Warn("the command is still running after the kill grace; killing it", "killGrace", grace.String())
			w.signal(c, syscall.SIGKILL)
		}
	}
}

func (w *wrapper) signal(c *child, sig syscall.Signal) {
	if err := c.signalGroup(sig); err != nil {
		w.log.Warn("signalling the command failed", "signal", status{signal: sig}.signalName(), "err", err)
	}
}

// record writes this wrapper's result for the agent. A failure is logged and
// does not change the exit code: the container's own status still tells.
func (w *wrapper) record(r protocol.Result) {
	if err := w.dir.WriteResult(w.opts.Name, r); err != nil {
		w.log.Error("writing the result failed; the agent cannot report how the command ended", "err", err)
	}
}

// leaseWatch decides whether the command must stop: the agent revoked the
// lease, or the safety deadline passed. The deadline is enforced here, not
// only by the agent, so that a SIGKILLed or OOM-killed sidecar cannot leave
// the app running after its lease could have been handed to another pod.
type leaseWatch struct {
	dir protocol.Dir
	now func() int64 // CLOCK_MONOTONIC ns, the clock the agent writes
	// ttl (ns, 0: unknown) bounds how far ahead a deadline can be: a renewal
	// never earns more. A deadline further ahead is of another boot (the
	// monotonic clock starts again at boot), even where the node's boot id
	// cannot be read.
	ttl int64
	// deadline is the last one read; known once one was.
	deadline int64
	known    bool
}

// check returns why the command must stop, or lost=false.
func (lw *leaseWatch) check() (why string, lost bool) {
	if revoked, reason := lw.dir.Revoked(); revoked {
		if reason == "" {
			reason = "the agent revoked it"
		}
		return "lease lost: " + reason, true
	}
	return lw.checkDeadline()
}

// lapsed reports whether the claim behind the safety deadline can no longer
// be alive in the database: the deadline (a margin of ttl/3 before the expiry
// the last renewal earned) passed by two thirds of the TTL, the margin and
// the renewal's own call. While no deadline was ever read, the fallback
// instant counts; a deadline of another boot has lapsed.
func (lw *leaseWatch) lapsed(fallback int64) bool {
	_, lost := lw.checkDeadline()
	switch {
	case !lw.known:
		return lost || lw.now() > fallback
	case lost && lw.now() <= lw.deadline:
		return true // of another boot of the node
	}
	return lw.now() > lw.deadline+2*lw.ttl/3
}

// checkDeadline is check without the revoked file.
func (lw *leaseWatch) checkDeadline() (why string, lost bool) {
	dl, ok, err := lw.dir.ReadDeadline()
	switch {
	case errors.Is(err, protocol.ErrOtherBoot):
		// A node reboot restarted the monotonic clock: the old deadline
		// would read as hours away. It passed with the old boot.
		return "safety deadline passed: " + err.Error(), true
	case err != nil && !lw.known:
		// A deadline exists but says nothing usable: fail closed.
		return "safety deadline unreadable: " + err.Error(), true
	case err == nil && ok:
		lw.deadline, lw.known = dl, true
	}
	// An unreadable or vanished file keeps the last deadline in force: it can
	// only expire, never be lifted, without a fresh renewal.
	if lw.known && lw.now() > lw.deadline {
		return "safety deadline passed: the agent stopped renewing the lease", true
	}
	if lw.known && lw.ttl > 0 && lw.deadline-lw.now() > lw.ttl {
		return "safety deadline passed: it lies further ahead than a renewal can give, so it is of an earlier boot of the node", true
	}
	return "", false
}
