package hapg

import (
	"testing"

	"github.com/dislock/dislock/test/harness"
)

// New starts a Cluster for one test and closes it when the test ends.
// Progress lines go to t.Logf unless opts.Logf is set; if the test failed,
// the tails of the logs are logged before they are removed. A missing
// program fails the test under CI=true and skips it otherwise.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	return harness.New(t, func() (*Cluster, error) { return Start(opts) }, ErrMissingBinary, (*Cluster).logTails)
}

// NewAsyncPair starts a Pair for one test and closes it when the test ends,
// like New.
func NewAsyncPair(t testing.TB, opts PairOptions) *Pair {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	return harness.New(t, func() (*Pair, error) { return StartAsyncPair(opts) }, ErrMissingBinary, (*Pair).logTails)
}
