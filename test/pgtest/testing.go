package pgtest

import (
	"testing"

	"github.com/dislock/dislock/test/harness"
)

// shared is the shared server of a test binary, set up by Main.
var shared = harness.Shared[*Server]{
	Prefix:     "pgtest",
	What:       "PostgreSQL",
	Unwired:    "pgtest: no shared server: call os.Exit(pgtest.Main(m, pgtest.Options{})) from TestMain",
	MissingErr: ErrMissingBinary,
}

// New starts a Server for one test and closes it when the test ends. Progress
// lines go to t.Logf unless opts.Logf is set; if the test failed, the tails of
// the server logs are logged before they are removed. A missing program fails
// the test under CI=true and skips it otherwise.
func New(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	return harness.New(t, func() (*Server, error) { return Start(opts) }, ErrMissingBinary, (*Server).logTails)
}

// Main is for TestMain: it starts the shared server, runs the tests, closes
// the server and returns the exit code:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, pgtest.Options{})) }
//
// If a program is missing it still runs the tests (Need skips the ones that
// need the server), except under CI=true, where it prints why and returns 1.
func Main(m *testing.M, opts Options) int {
	return shared.Main(m, func() (*Server, error) { return Start(opts) }, nil)
}

// Shared returns the server started by Main, or nil if there is none.
func Shared() *Server {
	s, _ := shared.Get()
	return s
}

// Need returns the shared server. Without one it skips the test, or fails it
// under CI=true or when Main was never called (a wiring mistake, not a
// missing package).
func Need(t testing.TB) *Server {
	t.Helper()
	return shared.Need(t)
}

// Missing ends a test that cannot get a component: a missing program
// (ErrMissingBinary) skips it, except under CI=true, where everything must be
// installed and it fails; any other error fails it.
func Missing(t testing.TB, err error) {
	t.Helper()
	harness.Missing(t, err, ErrMissingBinary)
}
