// Command demo is `make demo`: it starts two (or three) data centres on this
// machine with the e2e harness — per data centre a control plane, a real
// node (kubelet + containerd), a PgBouncer and dislock installed with `helm
// install` (the harness's progress lines print the command), all sharing one
// PostgreSQL — applies one `* * * * *` CronJob annotated with
// dislock.io/mode to every data centre, and prints a row per schedule window
// as it completes: which data centre ran it, with which fencing token, how
// long the run took, and why every other data centre skipped it, in the
// words of its sidecar's termination message. Then a summary, and
// everything it started is removed.
//
// It needs root, the Debian packages of hack/install-deps.sh and
// hack/install-node-deps.sh, and bin/ from `make tools`. Ctrl-C at any
// moment stops everything and exits non-zero; a second Ctrl-C exits at once
// and leaves the cleanup to the harness's watchdogs. The exit code is 0 only
// when every window ran exactly once and every data centre's Job completed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/dislock/dislock/test/e2e"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1 // a window did not run exactly once, or a Job failed
	exitUsage       = 2
	exitInterrupted = 130
)

// config is what the flags choose.
type config struct {
	windows int
	mode    string
	dcs     int
	verbose bool
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	fs.IntVar(&c.windows, "minutes", 3, "how many one-minute schedule windows to watch (1-60)")
	fs.StringVar(&c.mode, "mode", "schedule", `the CronJob's dislock.io/mode: "schedule" or "schedule,lease"`)
	fs.IntVar(&c.dcs, "dcs", 2, "how many data centres: 2 or 3")
	fs.BoolVar(&c.verbose, "v", false, "also print the progress lines of every component")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	var errs []error
	if c.windows < 1 || c.windows > 60 {
		errs = append(errs, fmt.Errorf("-minutes %d: want 1 to 60", c.windows))
	}
	if c.mode != "schedule" && c.mode != "schedule,lease" {
		errs = append(errs, fmt.Errorf("-mode %q: want schedule or schedule,lease", c.mode))
	}
	if c.dcs != 2 && c.dcs != 3 {
		errs = append(errs, fmt.Errorf("-dcs %d: want 2 or 3", c.dcs))
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	return c, errors.Join(errs...)
}

func main() { os.Exit(run()) }

func run() int {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return exitUsage
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: it runs real kubelets and containerd, which need root: run it as root (sudo make demo)")
		return exitUsage
	}
	// The harness's dry-run probes draw the webhook's warnings; the demo
	// shows the one kubectl prints for the user's own CronJob.
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	out := &printer{w: os.Stdout, verbose: cfg.verbose}
	ctx := interruptible(out)

	names := []string{"dc-a", "dc-b", "dc-c"}[:cfg.dcs]
	begun := time.Now()
	out.step("dislock demo: %d data centres (%s) sharing one PostgreSQL, %d windows",
		len(names), strings.Join(names, ", "), cfg.windows)
	out.step("starting: the images, PostgreSQL, and per data centre (in parallel) a control plane,")
	out.print("          a node (kubelet + containerd), a PgBouncer, and `helm install dislock`\n")
	env, err := e2e.Start(e2e.Options{DCs: names, Logf: out.component})
	switch {
	case err != nil && ctx.Err() != nil:
		// A ^C from the terminal also stops the start's own children (go
		// build, helm): the error is the interrupt's.
		fmt.Fprintln(os.Stderr, "demo: interrupted while starting; what was started is removed")
		return exitInterrupted
	case err != nil:
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		if errors.Is(err, e2e.ErrMissing) {
			fmt.Fprintln(os.Stderr, "demo: install what is missing with `make deps node-deps tools` (or run `make demo`, which does)")
		}
		return exitFailed
	}
	started := time.Now()

	code := watch(ctx, env, cfg, out)

	stopping := time.Now()
	out.step("stopping: every process, mount, cgroup and directory the demo made")
	if err := env.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "demo: stopping: %v\n", err)
		if code == exitOK {
			code = exitFailed
		}
	}
	out.step("stopped in %v; wall time %v (start %v, windows %v)", round(time.Since(stopping)),
		round(time.Since(begun)), round(started.Sub(begun)), round(stopping.Sub(started)))
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "demo: interrupted")
		return exitInterrupted
	}
	return code
}

// interruptible returns a context that the first SIGINT or SIGTERM cancels:
// the demo then finishes the step it is in (a start in progress cannot be
// abandoned half-way without leaking what it made) and closes the
// environment. A second signal exits at once: every part of the environment
// has a watchdog that removes it when this process is gone.
func interruptible(out *printer) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-signals
		out.step("interrupted: stopping everything (interrupt again to exit at once; the watchdogs clean up)")
		cancel()
		<-signals
		fmt.Fprintln(os.Stderr, "demo: interrupted twice: exiting now; the watchdogs remove what is left within seconds")
		os.Exit(exitInterrupted)
	}()
	return ctx
}

// printer writes the demo's output. Progress lines start with the UTC time,
// the clock the windows are in.
type printer struct {
	mu      sync.Mutex
	w       io.Writer
	verbose bool
}

func (p *printer) step(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "%s  %s\n", time.Now().UTC().Format(time.TimeOnly), fmt.Sprintf(format, args...))
}

func (p *printer) print(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprint(p.w, s)
}

// component receives the harness's progress lines: the environment's own
// (images built, a data centre up, stopped) always, those of its parts
// (etcd ready, node Ready, ...) with -v.
func (p *printer) component(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if rest, ok := strings.CutPrefix(msg, "e2e: "); ok {
		p.step("%s", rest)
	} else if p.verbose {
		p.step("  %s", msg)
	}
}

func round(d time.Duration) time.Duration {
	if d < time.Minute {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}
