package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
)

// Each decision leaves the outcome the pod comes to should it end then: a
// run whose end is never recorded has failed (and took over if its claim
// did), a skip is a skip, anything else an error. The webhook reads the
// record back as written.
func TestEachDecisionLeavesTheOutcomeThePodComesTo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		action   protocol.Action
		tookOver bool
		want     contract.Termination
	}{
		{protocol.ActionRun, false, contract.Termination{Outcome: contract.OutcomeFailed, Message: "run: why"}},
		{protocol.ActionRun, true, contract.Termination{Outcome: contract.OutcomeFailed, TookOver: true, Message: "run: why"}},
		{protocol.ActionSkip, true, contract.Termination{Outcome: contract.OutcomeSkipped, Message: "skip: why"}},
		{protocol.ActionError, false, contract.Termination{Outcome: contract.OutcomeError, Message: "error: why"}},
	} {
		log := filepath.Join(t.TempDir(), "termination-log")
		a := &agent{cfg: Config{TerminationLog: log}, log: slog.New(slog.DiscardHandler), tookOver: tc.tookOver}
		a.terminate(a.decided(protocol.Decision{Action: tc.action, Reason: "why"}))
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := contract.ParseTermination(string(b)); err != nil || got != tc.want {
			t.Errorf("%s (took over %v) leaves %q, read as %+v, %v; want %+v", tc.action, tc.tookOver, b, got, err, tc.want)
		}
	}
}

// A run's termination message (what `kubectl get pod` shows) is its summary,
// with the clusters' disagreement after it only when there is one: never a
// dangling separator.
func TestARunsMessageAddsOnlyWhatThereIsToSay(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ a, b, want string }{
		{"ran window W of k with token 7: succeeded", "", "ran window W of k with token 7: succeeded"},
		{"ran window W of k with token 7: succeeded", "WARNING clusters disagree", "ran window W of k with token 7: succeeded; WARNING clusters disagree"},
		{"", "lease k acquired", "lease k acquired"},
	} {
		if got := joinReason(tc.a, tc.b); got != tc.want {
			t.Errorf("joinReason(%q, %q) = %q, want %q", tc.a, tc.b, got, tc.want)
		}
	}
}
