package contract

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Termination is the sidecar's last word on its pod: what the pod's run
// comes to if the pod ends now, and the account a person reads. The agent
// leaves it in its termination log (the container's terminationMessagePath)
// at each decision and when the run ends; the webhook's outcome controller
// reads it back from the pod's status, labels the pod and its Job with
// Outcome and TookOver, and puts Message on the CronJob's Event.
//
// A pod writes it, so whoever reads it takes it as untrusted input:
// ParseTermination accepts only the record Encode writes (or the prose of
// agents from before the record) and reads anything else as an error.
type Termination struct {
	Outcome Outcome
	// TookOver: the run took a failed or lapsed owner's window over.
	TookOver bool
	// Message is the human-readable account `kubectl describe pod` shows.
	Message string
}

// Outcome is what a pod's run came to, as the webhook labels the pod and
// its Job (dislock.io/outcome).
type Outcome string

const (
	OutcomeSucceeded Outcome = "succeeded" // the app ran here and every container exited 0
	OutcomeFailed    Outcome = "failed"    // the app ran here and failed, or the claim was given up or left to lapse
	OutcomeSkipped   Outcome = "skipped"   // another pod or cluster owned the window or lease, or it was stale
	OutcomeError     Outcome = "error"     // the agent could not decide, or was stopped before it did
)

// Outcomes lists every Outcome.
var Outcomes = []Outcome{OutcomeSucceeded, OutcomeFailed, OutcomeSkipped, OutcomeError}

// The termination record is Message, then one line that says the outcome
// in the labels' own words:
//
//	ran window 2026-12-02T02:00:00Z of reports/nightly with token 7: succeeded (1 container(s), exit code 0)
//	dislock.io/outcome=succeeded
//
// with " dislock.io/took-over=true" after the outcome when the run took the
// window over. Agents before the record wrote Message alone.
const (
	recordOutcome  = LabelOutcome + "="
	recordTookOver = " " + LabelTookOver + "=true"
)

// MaxTerminationBytes bounds an encoded Termination: the kubelet keeps at
// most 4096 bytes of a termination message.
const MaxTerminationBytes = 4000

// Encode writes t as the termination message: Message, without its outer
// blanks and cut on a rune boundary to fit MaxTerminationBytes, and the
// record line.
func (t Termination) Encode() string {
	record := recordOutcome + string(t.Outcome)
	if t.TookOver {
		record += recordTookOver
	}
	msg := strings.TrimSpace(t.Message)
	if limit := MaxTerminationBytes - len(record) - 1; len(msg) > limit {
		cut := max(limit, 0)
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = strings.TrimSpace(msg[:cut])
	}
	if msg == "" {
		return record
	}
	return msg + "\n" + record
}

// ParseTermination reads a termination message (the kubelet's trailing
// newline and other outer blanks are no part of it). A message that ends
// in a record line is read by its record; one that does not is the prose
// of an agent from before the record, read by its beginning (see
// parseProse). A record line that is not one Encode writes (a forged one,
// or one the kubelet cut) is an error, and the Termination is then read
// from the account before it, as an older agent's prose is.
func ParseTermination(msg string) (Termination, error) {
	msg = strings.TrimSpace(msg)
	body, last := "", msg
	if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
		body, last = strings.TrimSpace(msg[:i]), msg[i+1:]
	}
	rest, ok := strings.CutPrefix(last, recordOutcome)
	if !ok {
		return parseProse(msg), nil
	}
	t := Termination{Message: body}
	outcome, tookOver := rest, false
	if o, ok := strings.CutSuffix(rest, recordTookOver); ok {
		outcome, tookOver = o, true
	}
	t.Outcome, t.TookOver = Outcome(outcome), tookOver
	// The kubelet keeps only the beginning of a long termination message
	// (its share of 12 KiB per pod), so the record at its end may be cut.
	// The account before it says the same in prose an older webhook reads
	// too: a record that is not whole is read by the account, and a run
	// the account says took over did, whatever a cut record lost.
	prose := parseProse(body)
	if !validOutcome(t.Outcome) {
		return prose, fmt.Errorf("termination record %q (cut, or not one the agent writes): read by its account instead; want %s<%s> with %q after it when the run took over", last, recordOutcome, strings.Join(outcomeNames(), "|"), recordTookOver)
	}
	t.TookOver = t.TookOver || prose.TookOver
	return t, nil
}

func validOutcome(o Outcome) bool {
	for _, v := range Outcomes {
		if o == v {
			return true
		}
	}
	return false
}

func outcomeNames() []string {
	out := make([]string, len(Outcomes))
	for i, o := range Outcomes {
		out[i] = string(o)
	}
	return out
}

// The beginnings of the prose agents wrote before the record (publish,
// record, finishRun and giveUp in lockagent/agent), which parseProse reads.
const (
	proseRan           = "ran "                                       // ran window <W> of <key> with token N: succeeded (...) | failed: ...
	proseTakenOver     = "(taken over from a failed or lapsed owner)" // after the window, in a "ran" message
	proseSkip          = "skip: "                                     // the decision, kept to the end
	proseError         = "error: "                                    // the decision, kept to the end
	proseRun           = "run: "                                      // the decision; the end of the run was never written
	proseGaveUp        = "gave the claim up: "                        // the app did not start in time
	proseStoppedRun    = "stopped while an app"                       // the claim is left to lapse
	proseTookOverClaim = " took-over"                                 // in a "run:" decision: "window W of K took-over"
	proseSucceeded     = "succeeded"                                  // the summary of a successful run
)

// parseProse reads the termination message of an agent from before the
// record by its beginning. Anything it does not recognise (a message of an
// agent that was killed while waiting, or none) is OutcomeError: the pod
// ended without the agent saying how its run ended.
func parseProse(msg string) Termination {
	t := Termination{Outcome: OutcomeError, Message: msg}
	switch {
	case strings.HasPrefix(msg, proseRan):
		// "ran window 2026-12-02T02:00:00Z of team/report with token 7:
		// succeeded (...)": the first ": " ends the head (a window's
		// RFC 3339 time has colons, never followed by a space).
		head, summary, _ := strings.Cut(msg, ": ")
		t.Outcome, t.TookOver = OutcomeFailed, strings.Contains(head, proseTakenOver)
		if strings.HasPrefix(summary, proseSucceeded) {
			t.Outcome = OutcomeSucceeded
		}
	case strings.HasPrefix(msg, proseSkip):
		t.Outcome = OutcomeSkipped
	case strings.HasPrefix(msg, proseError):
		t.Outcome = OutcomeError
	case strings.HasPrefix(msg, proseRun):
		// The agent decided to run and ended before it recorded how the run
		// ended (killed): nothing says the run succeeded, and its claim
		// lapses.
		head, _, _ := strings.Cut(msg, ";")
		t.Outcome, t.TookOver = OutcomeFailed, strings.Contains(head, proseTookOverClaim)
	case strings.HasPrefix(msg, proseGaveUp), strings.HasPrefix(msg, proseStoppedRun):
		t.Outcome = OutcomeFailed
	}
	return t
}
