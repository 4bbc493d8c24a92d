package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/secret"
)

// probePoll is how often a waiting probe looks for the binary: the app
// containers start this much later at most, next to the kubelet's own
// 1-second relist.
const probePoll = 10 * time.Millisecond

// probe succeeds once the agent has installed its binary in the shared
// directory, so the kubelet starts the app containers only when their
// wrapped command exists. It does not wait for the decision: the wrapper
// waits for that itself, and a standby may wait for the owner's whole run,
// hours. A gate that waited for the decision would have the kubelet restart
// a sidecar that is waiting as it should.
//
// Without --wait it looks once (a startupProbe, or a person). With --wait D
// it is the sidecar's postStart hook: the kubelet counts the sidecar started
// only once the hook returned, and starts the app containers at its next
// look at the pod, without waiting for a probe period. The kubelet puts no
// time limit on a hook, so the probe bounds itself: after D it fails, and
// the kubelet kills and restarts the sidecar rather than holding the pod
// forever. A restarted sidecar finds its binary installed and passes at once.
//
// The kubelet execs the probe with the sidecar container's environment, the
// credential included, so the probe turns non-dumpable as soon as its main
// runs. That narrows, but does not close, what an app that shares the pod's
// process namespace and can become the sidecar's uid (root with the
// runtime's default capabilities can) may read in the probe's /proc entries:
// the Go runtime starts before main (docs/install.md, "What a tenant can
// see").
func probe(args []string, stderr io.Writer) int {
	_ = secret.NonDumpable() // best effort: the probe reads no secret itself
	fs := flag.NewFlagSet("dislock-agent probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	wait := fs.Duration("wait", 0, "wait up to this long for the binary (the postStart hook); 0 looks once")
	if err := fs.Parse(args); err != nil {
		return 64
	}
	if fs.NArg() > 0 || *wait < 0 {
		fmt.Fprintf(stderr, "dislock-agent probe: want no arguments and --wait ≥ 0 (e.g. --wait=5m), got %q\n", args)
		return 64
	}
	dir := os.Getenv(contract.EnvSharedDir)
	if dir == "" {
		dir = contract.DefaultSharedDir
	}
	bin := filepath.Join(dir, protocol.BinPath)
	if installed(bin) {
		return 0
	}
	if *wait == 0 {
		return 1
	}
	deadline := time.Now().Add(*wait)
	tick := time.NewTicker(probePoll)
	defer tick.Stop()
	for range tick.C {
		if installed(bin) {
			return 0
		}
		if time.Now().After(deadline) {
			break
		}
	}
	fmt.Fprintf(stderr, "dislock-agent probe: the agent did not install %s within %v; the kubelet restarts the sidecar (its log says why the install failed)\n",
		bin, *wait)
	return 1
}

// installed reports whether bin is the agent's installed binary. The agent
// installs it by rename, so a regular executable file there is a whole one.
func installed(bin string) bool {
	fi, err := os.Stat(bin)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
