package contract

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// What the agent writes reads back as written: the outcome and took-over
// from the record, the message as a person reads it (without its outer
// blanks), however the message looks.
func TestATerminationReadsBackAsWritten(t *testing.T) {
	t.Parallel()
	messages := []string{
		"ran window 2026-12-02T02:00:00Z of reports/nightly with token 7: succeeded (1 container(s), exit code 0)",
		"skip: window 2026-12-02T02:00:00Z already claimed by dc-b/reports/nightly-29123/uid/nightly-29123-x (running)",
		"error: could not decide: database unavailable",
		"a message\nover lines\nending in what looks like a record\ndislock.io/outcome=skipped",
		"  blanks around it \n",
		"ünïcödé, and an emoji 🙂",
		"",
	}
	for _, o := range Outcomes {
		for _, took := range []bool{false, true} {
			for _, msg := range messages {
				in := Termination{Outcome: o, TookOver: took, Message: msg}
				enc := in.Encode()
				got, err := ParseTermination(enc + "\n") // the agent's trailing newline
				want := in
				want.Message = strings.TrimSpace(msg)
				if err != nil || got != want {
					t.Errorf("ParseTermination(%q) = %+v, %v; want %+v", enc, got, err, want)
				}
				if first, _, _ := strings.Cut(enc, "\n"); want.Message != "" && !strings.HasPrefix(want.Message, first) {
					t.Errorf("the encoded message does not start with the account a person reads: %q", enc)
				}
			}
		}
	}
}

// The record line says the outcome in the labels' words, after the
// message, so that kubectl describe still shows the account first.
func TestTheRecordIsTheLastLineInTheLabelsWords(t *testing.T) {
	t.Parallel()
	got := Termination{Outcome: OutcomeFailed, TookOver: true, Message: "ran window W of K with token 9: failed: container app exit code 1"}.Encode()
	want := "ran window W of K with token 9: failed: container app exit code 1\n" + LabelOutcome + "=failed " + LabelTookOver + "=true"
	if got != want {
		t.Errorf("Encode() = %q, want %q", got, want)
	}
	if got := (Termination{Outcome: OutcomeSkipped, Message: "skip: stale"}).Encode(); got != "skip: stale\n"+LabelOutcome+"=skipped" {
		t.Errorf("Encode() = %q", got)
	}
}

// A long account is cut on a rune boundary so that the whole record fits
// what the kubelet keeps, and its outcome survives the cut.
func TestALongTerminationFitsTheKubeletsLimitWithItsRecord(t *testing.T) {
	t.Parallel()
	in := Termination{Outcome: OutcomeSucceeded, TookOver: true, Message: "ran window W: succeeded; " + strings.Repeat("ü", 3000)}
	enc := in.Encode()
	if len(enc) > MaxTerminationBytes || !utf8.ValidString(enc) {
		t.Fatalf("encoded %d bytes (limit %d), valid UTF-8 %v", len(enc), MaxTerminationBytes, utf8.ValidString(enc))
	}
	got, err := ParseTermination(enc)
	if err != nil || got.Outcome != OutcomeSucceeded || !got.TookOver || !strings.HasPrefix(in.Message, got.Message) {
		t.Errorf("ParseTermination of the cut record = %+v, %v", got, err)
	}
}

// A record line dislock does not write (forged, or cut by the kubelet,
// which keeps only the beginning of a long message) is an error, and the
// pod's outcome is then what the account before it says, as for an agent
// from before the record: never a guess from the broken record.
func TestABrokenRecordIsReadByTheAccountBeforeIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		msg      string
		outcome  Outcome
		tookOver bool
	}{
		{"ran window W with token 1: succeeded\n" + LabelOutcome + "=", OutcomeSucceeded, false},
		{"ran window W with token 1: failed: exit code 1\n" + LabelOutcome + "=succeded", OutcomeFailed, false},
		{"ran window W (taken over from a failed or lapsed owner) with token 1: succeeded\n" + LabelOutcome + "=succeeded " + LabelTookOver + "=yes", OutcomeSucceeded, true},
		{"skip: stale\n" + LabelOutcome + "=succeeded " + LabelTookOver + "=true " + LabelTookOver + "=true", OutcomeSkipped, false},
		{LabelOutcome + "=Succeeded", OutcomeError, false},
	} {
		got, err := ParseTermination(tc.msg)
		if err == nil || got.Outcome != tc.outcome || got.TookOver != tc.tookOver {
			t.Errorf("ParseTermination(%q) = %+v, %v; want an error and %s, took over %v, from the account", tc.msg, got, err, tc.outcome, tc.tookOver)
		}
	}
}

// The kubelet keeps the first 12 KiB of a pod's termination messages,
// shared by its containers: a long account in a pod of many containers
// loses its end. Cut anywhere after the account's summary, the message
// still says the run succeeded and took over.
func TestACutTerminationKeepsItsOutcome(t *testing.T) {
	t.Parallel()
	account := "ran window 2026-12-02T02:00:00Z of reports/nightly (taken over from a failed or lapsed owner) with token 7: succeeded (12 container(s), exit code 0)"
	enc := Termination{Outcome: OutcomeSucceeded, TookOver: true, Message: account + "; warning: " + strings.Repeat("the clusters disagree ", 40)}.Encode()
	for cut := len(account); cut <= len(enc); cut++ {
		got, _ := ParseTermination(enc[:cut])
		if got.Outcome != OutcomeSucceeded || !got.TookOver {
			t.Fatalf("cut at %d of %d (…%q): %+v, want succeeded and took over", cut, len(enc), enc[max(cut-30, 0):cut], got)
		}
	}
}

// The prose of agents from before the record, which pods of an older
// release still leave while a cluster upgrades, gives the outcome it gave.
func TestProseFromBeforeTheRecordGivesItsOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		msg      string
		outcome  Outcome
		tookOver bool
	}{
		{"ran window 2026-12-02T02:00:00Z (taken over from a failed or lapsed owner) of reports/nightly with token 9: succeeded (2 container(s), exit code 0)", OutcomeSucceeded, true},
		{"ran manual run of reports/nightly with token 3: failed: container app exit code 2", OutcomeFailed, false},
		{"skip: stale\n", OutcomeSkipped, false},
		{"run: window 2026-12-02T02:00:00Z of reports/nightly took-over", OutcomeFailed, true},
		{"gave the claim up: app container(s) app did not start", OutcomeFailed, false},
		{"waiting: standby: the window's owner is alive", OutcomeError, false},
		{"", OutcomeError, false},
	} {
		got, err := ParseTermination(tc.msg)
		if err != nil || got.Outcome != tc.outcome || got.TookOver != tc.tookOver || got.Message != strings.TrimSpace(tc.msg) {
			t.Errorf("ParseTermination(%q) = %+v, %v; want %s, took over %v", tc.msg, got, err, tc.outcome, tc.tookOver)
		}
	}
}

// ParseTermination reads what a pod wrote: whatever it is, it answers
// with a known outcome (an error for what it cannot read), and what it
// read encodes and reads back the same.
func FuzzTerminationDecode(f *testing.F) {
	for _, s := range []string{
		"ran window 2026-12-02T02:00:00Z of reports/nightly with token 7: succeeded (1 container(s), exit code 0)\n" + LabelOutcome + "=succeeded\n",
		"run: window W of K took-over\n" + LabelOutcome + "=failed " + LabelTookOver + "=true",
		"skip: stale",
		LabelOutcome + "=error",
		"x\n" + LabelOutcome + "=nope",
		"",
		"\n\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, msg string) {
		got, err := ParseTermination(msg)
		valid := false
		for _, o := range Outcomes {
			valid = valid || got.Outcome == o
		}
		if !valid {
			t.Fatalf("ParseTermination(%q) = %+v, %v", msg, got, err)
		}
		if err != nil || !strings.HasPrefix(got.Encode(), got.Message) {
			return // an error, or an account too long to re-encode whole
		}
		again, err := ParseTermination(got.Encode())
		if err != nil || again != got {
			t.Fatalf("ParseTermination(%q) = %+v; encoded (%q) it reads back as %+v, %v", msg, got, got.Encode(), again, err)
		}
	})
}
