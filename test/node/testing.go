package node

import (
	"testing"

	"github.com/dislock/dislock/test/harness"
)

// New starts a Node for one test and closes it when the test ends. Progress
// lines go to t.Logf unless opts.Logf is set; if the test failed, the tails of
// the logs are logged first. A missing prerequisite fails the test under
// CI=true and skips it otherwise.
func New(t testing.TB, opts Options) *Node {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	return harness.New(t, func() (*Node, error) { return Start(opts) }, ErrMissing, (*Node).LogTails)
}
