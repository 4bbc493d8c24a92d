// Command dislock-agent is copied into every pod of an opted-in CronJob:
//
//	dislock-agent agent            the native sidecar: decide, heartbeat, record
//	dislock-agent exec -- CMD...   the wrapper around each app container's command
//	dislock-agent probe [--wait D]  the sidecar's postStart hook: exit 0 once the agent binary is installed
//	dislock-agent version
//
// It links no Kubernetes client code, to stay small (it is in every pod).
package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"syscall"

	"github.com/dislock/dislock/internal/version"
	"github.com/dislock/dislock/lockagent/agent"
	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/secret"
	"github.com/dislock/dislock/lockagent/wrapper"

	// CronJobs name IANA zones; a static binary in a minimal image may
	// have no zoneinfo files.
	_ "time/tzdata"
)

const usage = "usage: dislock-agent agent | exec [flags] -- CMD [ARGS...] | probe [--wait D] | version"

// init keeps the main goroutine on the process's main thread. The agent's
// credential hand-off re-executes the process (package secret), and execve
// ends every other thread: a SIGTERM the kernel gave to another thread,
// whose handler had not finished, died with it, and the re-executed agent
// never learnt it was stopped (a pod deleted just as it started ran on until
// SIGKILL). The kernel gives a signal sent to the process to its main
// thread first; with execve called there, a SIGTERM arriving meanwhile is
// either handled before execve or delivered after it, where its default
// action ends the process.
func init() { runtime.LockOSThread() }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(64)
	}
	switch os.Args[1] {
	case "agent":
		os.Exit(runAgent())
	case "exec":
		os.Exit(wrapper.Main(os.Args[2:], os.Getenv, os.Stdout, os.Stderr))
	case "probe":
		os.Exit(probe(os.Args[2:], os.Stderr))
	case "version":
		fmt.Printf("dislock-agent %s (commit %s)\n", version.Version, version.Commit)
	default:
		fmt.Fprintf(os.Stderr, "dislock-agent: unknown command %q\n%s\n", os.Args[1], usage)
		os.Exit(64)
	}
}

// runAgent hides the database credential before the agent starts: see
// package secret. The wrapper runs in app containers, which never get the
// credential; the probe does (see probe).
func runAgent() int {
	dsn, stopped, err := secret.Take(contract.EnvDatabaseURL, syscall.SIGTERM, os.Interrupt)
	// The agent's own logger starts in agent.Main; these lines look the same.
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "dislock-agent", "pid", os.Getpid())
	if err != nil {
		// Locking is unaffected, and the agent still runs: failing here
		// would fail every pod of the CronJob over a kernel feature.
		log.Warn("the database credential could not be hidden from other processes of this pod", "err", err)
	}
	if stopped != nil {
		log.Info("stopped before a decision was reached: nothing ran", "signal", stopped.String())
		return 0
	}
	getenv := func(name string) string {
		if name == contract.EnvDatabaseURL {
			return dsn
		}
		return os.Getenv(name)
	}
	return agent.Main(os.Args[2:], getenv, os.Stderr)
}
