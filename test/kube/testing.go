package kube

import (
	"fmt"
	"os"
	"testing"

	"github.com/dislock/dislock/test/harness"
)

// shared is the shared cluster of a test binary, set up by Main.
var shared = harness.Shared[*Cluster]{
	Prefix:     "kube",
	What:       "a Kubernetes control plane",
	Unwired:    "kube: no shared cluster: call os.Exit(kube.Main(m, kube.Options{})) from TestMain",
	MissingErr: ErrMissingBinary,
}

// New starts a Cluster for one test and closes it when the test ends. Progress
// lines go to t.Logf unless opts.Logf is set; if the test failed, the tails of
// the component logs are logged before they are removed. A missing binary
// fails the test under CI=true and skips it otherwise.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	return harness.New(t, func() (*Cluster, error) { return Start(opts) }, ErrMissingBinary, (*Cluster).logTails)
}

// Main is for TestMain: it starts the shared cluster, runs the tests, closes
// the cluster and returns the exit code:
//
//	func TestMain(m *testing.M) { os.Exit(kube.Main(m, kube.Options{ControllerManager: true})) }
//
// If a binary is missing it still runs the tests (Need skips the ones that
// need the cluster), except under CI=true, where it prints why and returns 1.
// If the tests fail, the tails of the component logs are printed.
func Main(m *testing.M, opts Options) int {
	if opts.Logf == nil {
		opts.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	return shared.Main(m, func() (*Cluster, error) { return Start(opts) }, (*Cluster).logTails)
}

// Shared returns the cluster started by Main, or nil if there is none.
func Shared() *Cluster {
	c, _ := shared.Get()
	return c
}

// Need returns the shared cluster. Without one it skips the test, or fails it
// under CI=true or when Main was never called (a wiring mistake, not a missing
// binary).
func Need(t testing.TB) *Cluster {
	t.Helper()
	return shared.Need(t)
}

// Missing ends a test that cannot get a cluster: a missing binary
// (ErrMissingBinary) skips it with the hint to run `make tools`, except under
// CI=true, where it fails; any other error fails it.
func Missing(t testing.TB, err error) {
	t.Helper()
	harness.Missing(t, err, ErrMissingBinary)
}
