package e2e

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/dislock/dislock/test/harness"
)

// shared is the environment of a test binary, set up by Main.
var shared = harness.Shared[*Env]{
	Prefix:     "e2e",
	What:       "the multi-DC environment",
	Unwired:    "e2e: no environment: call os.Exit(e2e.Main(m, e2e.Options{})) from TestMain",
	MissingErr: ErrMissing,
}

// Main is for TestMain: it starts the environment, runs the tests, closes
// it and returns the exit code:
//
//	func TestMain(m *testing.M) { os.Exit(e2e.Main(m, e2e.Options{})) }
//
// Without a prerequisite (Kubernetes binaries from `make tools`, the Debian
// packages of hack/install-deps.sh and hack/install-node-deps.sh, root) the
// tests are skipped, except under CI=true, where Main prints what is missing
// and how to get it and returns 1. If the tests fail, Main prints the
// state of every data centre and the database first. Run by Helm as a
// post-renderer (previous.go), it post-renders instead.
func Main(m *testing.M, opts Options) int {
	if len(os.Args) > 1 && os.Args[1] == postRenderArg {
		return postRenderMain(os.Args[2:])
	}
	if opts.Logf == nil {
		opts.Logf = func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
		}
	}
	return shared.Main(m, func() (*Env, error) { return Start(opts) }, nil)
}

// Need returns the environment started by Main; without one it skips the
// test, or fails it under CI=true. If the test fails, it logs the state of
// every data centre and the database when the test ends.
func Need(t testing.TB) *Env {
	t.Helper()
	e := shared.Need(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("state at failure:\n%s", e.Dump())
		}
	})
	return e
}

// New starts an environment of the test's own, for what the shared one does
// not run (Options.HA), and closes it when the test ends. Progress lines go
// to t.Logf unless opts.Logf is set; if the test failed, the state of every
// data centre and the database is logged first. A missing prerequisite
// skips the test, or fails it under CI=true.
func New(t testing.TB, opts Options) *Env {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	return harness.New(t, func() (*Env, error) { return Start(opts) }, ErrMissing, (*Env).Dump)
}
