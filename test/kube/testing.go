package kube

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

// The shared cluster of a test binary, set up by Main.
var (
	shared *Cluster
	// sharedErr says why there is no shared cluster although Main ran.
	sharedErr  error
	mainCalled bool
)

// inCI reports whether missing binaries must fail tests rather than skip them:
// CI runs `make tools` first, so a missing binary there is a broken pipeline.
func inCI() bool { return os.Getenv("CI") == "true" }

// New starts a Cluster for one test and closes it when the test ends. Progress
// lines go to t.Logf unless opts.Logf is set; if the test failed, the tails of
// the component logs are logged before they are removed. A missing binary
// fails the test under CI=true and skips it otherwise.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	c, err := Start(opts)
	if err != nil {
		Missing(t, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s", c.logTails())
		}
		if err := c.Close(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return c
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
	mainCalled = true
	if opts.Logf == nil {
		opts.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	c, err := Start(opts)
	switch {
	case err == nil:
		shared = c
	case errors.Is(err, ErrMissingBinary) && !inCI():
		sharedErr = err
		fmt.Fprintf(os.Stderr, "%v\nkube: tests that need a Kubernetes control plane will be skipped\n", err)
	case errors.Is(err, ErrMissingBinary):
		fmt.Fprintf(os.Stderr, "%v\nkube: failing because CI=true\n", err)
		return 1
	default:
		fmt.Fprintf(os.Stderr, "%v\n", err)
		return 1
	}

	code := m.Run()
	if shared != nil {
		if code != 0 {
			fmt.Fprintf(os.Stderr, "%s", shared.logTails())
		}
		if err := shared.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "%v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Shared returns the cluster started by Main, or nil if there is none.
func Shared() *Cluster { return shared }

// Need returns the shared cluster. Without one it skips the test, or fails it
// under CI=true or when Main was never called (a wiring mistake, not a missing
// binary).
func Need(t testing.TB) *Cluster {
	t.Helper()
	if shared != nil {
		return shared
	}
	if !mainCalled {
		t.Fatalf("kube: no shared cluster: call os.Exit(kube.Main(m, kube.Options{})) from TestMain")
	}
	Missing(t, sharedErr)
	return nil
}

// Missing ends a test that cannot get a cluster: a missing binary
// (ErrMissingBinary) skips it with the hint to run `make tools`, except under
// CI=true, where it fails; any other error fails it.
func Missing(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrMissingBinary) && !inCI() {
		t.Skipf("%v", err)
	}
	t.Fatalf("%v", err)
}
