package pgtest

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

// The shared server of a test binary, set up by Main.
var (
	shared *Server
	// sharedErr says why there is no shared server although Main ran.
	sharedErr  error
	mainCalled bool
)

// inCI reports whether missing components must fail tests rather than skip
// them: a CI machine is expected to have everything installed.
func inCI() bool { return os.Getenv("CI") == "true" }

// New starts a Server for one test and closes it when the test ends. Progress
// lines go to t.Logf unless opts.Logf is set; if the test failed, the tails of
// the server logs are logged before they are removed. A missing program fails
// the test under CI=true and skips it otherwise.
func New(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	s, err := Start(opts)
	if err != nil {
		Missing(t, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s", s.logTails())
		}
		if err := s.Close(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return s
}

// Main is for TestMain: it starts the shared server, runs the tests, closes
// the server and returns the exit code:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, pgtest.Options{})) }
//
// If a program is missing it still runs the tests (Need skips the ones that
// need the server), except under CI=true, where it prints why and returns 1.
func Main(m *testing.M, opts Options) int {
	mainCalled = true
	s, err := Start(opts)
	switch {
	case err == nil:
		shared = s
	case errors.Is(err, ErrMissingBinary) && !inCI():
		sharedErr = err
		fmt.Fprintf(os.Stderr, "%v\npgtest: tests that need PostgreSQL will be skipped\n", err)
	case errors.Is(err, ErrMissingBinary):
		fmt.Fprintf(os.Stderr, "%v\npgtest: failing because CI=true\n", err)
		return 1
	default:
		fmt.Fprintf(os.Stderr, "%v\n", err)
		return 1
	}

	code := m.Run()
	if shared != nil {
		if err := shared.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "%v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Shared returns the server started by Main, or nil if there is none.
func Shared() *Server { return shared }

// Need returns the shared server. Without one it skips the test, or fails it
// under CI=true or when Main was never called (a wiring mistake, not a
// missing package).
func Need(t testing.TB) *Server {
	t.Helper()
	if shared != nil {
		return shared
	}
	if !mainCalled {
		t.Fatalf("pgtest: no shared server: call os.Exit(pgtest.Main(m, pgtest.Options{})) from TestMain")
	}
	Missing(t, sharedErr)
	return nil
}

// Missing ends a test that cannot get a component: a missing program
// (ErrMissingBinary) skips it, except under CI=true, where everything must be
// installed and it fails; any other error fails it.
func Missing(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrMissingBinary) && !inCI() {
		t.Skipf("%v", err)
	}
	t.Fatalf("%v", err)
}
