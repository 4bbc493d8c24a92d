package protocol_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/protocol"
)

func newDir(t *testing.T) protocol.Dir {
	t.Helper()
	return protocol.Dir(t.TempDir())
}

// hidden lists the temp files a write left behind.
func hidden(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	return names
}

func TestADecisionRoundTrips(t *testing.T) {
	t.Parallel()
	d := newDir(t)
	if _, ok, err := d.ReadDecision(); ok || err != nil {
		t.Fatalf("before any write: ok=%v err=%v, want no decision and no error", ok, err)
	}
	want := protocol.Decision{
		Action: protocol.ActionRun, Reason: "claimed the window", Token: 42, Window: "2024-05-01T12:00:00Z",
		Key: "ns/report", Owner: "dc-a/ns/report-1/uid", KillGrace: protocol.Duration(1500 * time.Millisecond),
		AwaitRecord: true, Containers: []string{"app", "report"},
	}
	if err := d.WriteDecision(want); err != nil {
		t.Fatal(err)
	}
	got, ok, err := d.ReadDecision()
	if err != nil || !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadDecision() = %+v, %v, %v; want %+v", got, ok, err, want)
	}
	raw, err := os.ReadFile(d.Path(protocol.DecisionFile))
	if err != nil {
		t.Fatal(err)
	}
	// The field names are the documented contract.
	for _, field := range []string{`"action":"run"`, `"reason":"claimed the window"`, `"token":42`, `"window":"2024-05-01T12:00:00Z"`, `"owner":"dc-a/ns/report-1/uid"`, `"killGrace":"1.5s"`} {
		if !strings.Contains(string(raw), field) {
			t.Errorf("decision file %s lacks %s", raw, field)
		}
	}
	if h := hidden(t, string(d)); len(h) != 0 {
		t.Errorf("temp files left behind: %v", h)
	}
}

func TestAReaderNeverSeesHalfADecision(t *testing.T) {
	t.Parallel()
	d := newDir(t)
	long := strings.Repeat("x", 64<<10) // larger than one write
	if err := d.WriteDecision(protocol.Decision{Action: protocol.ActionSkip, Reason: long}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			action := protocol.ActionSkip
			if i%2 == 0 {
				action = protocol.ActionRun
			}
			if err := d.WriteDecision(protocol.Decision{Action: action, Reason: long}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 300 {
		dec, ok, err := d.ReadDecision()
		if err != nil || !ok || dec.Reason != long {
			t.Errorf("read a partial decision: ok=%v err=%v reason of %d bytes", ok, err, len(dec.Reason))
			break
		}
	}
	close(stop)
	wg.Wait()
}

func TestABadDecisionIsAnError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, content, want string
	}{
		{"an unknown action is rejected", `{"action":"maybe"}`, `unknown action "maybe"`},
		{"a missing action is rejected", `{"reason":"x"}`, `unknown action ""`},
		{"a garbled file is an error", `{"action":"ru`, "decision file"},
		{"a bad kill grace is an error", `{"action":"run","killGrace":"soon"}`, "soon"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDir(t)
			if err := os.WriteFile(d.Path(protocol.DecisionFile), []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, ok, err := d.ReadDecision()
			if ok || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ReadDecision() ok=%v err=%v; want an error containing %q", ok, err, tc.want)
			}
		})
	}
}

func TestTheDeadlineRoundTrips(t *testing.T) {
	t.Parallel()
	d := newDir(t)
	if _, ok, err := d.ReadDeadline(); ok || err != nil {
		t.Fatalf("before any write: ok=%v err=%v, want no deadline and no error", ok, err)
	}
	want := protocol.MonotonicNow() + int64(30*time.Second)
	if err := d.WriteDeadline(want); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := d.ReadDeadline(); got != want || !ok || err != nil {
		t.Errorf("ReadDeadline() = %d, %v, %v; want %d", got, ok, err, want)
	}

	if err := os.WriteFile(d.Path(protocol.DeadlineFile), []byte("soon\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := d.ReadDeadline(); ok || err == nil {
		t.Errorf("a garbled deadline: ok=%v err=%v, want an error", ok, err)
	}
}

func TestRevocation(t *testing.T) {
	t.Parallel()
	d := newDir(t)
	if revoked, why := d.Revoked(); revoked || why != "" {
		t.Fatalf("Revoked() = %v, %q before any revocation", revoked, why)
	}
	if err := d.Revoke("renewal failed: lease taken"); err != nil {
		t.Fatal(err)
	}
	if revoked, why := d.Revoked(); !revoked || why != "renewal failed: lease taken" {
		t.Errorf("Revoked() = %v, %q; want true with the reason", revoked, why)
	}
}

func TestResults(t *testing.T) {
	t.Parallel()

	t.Run("none yet is an empty set", func(t *testing.T) {
		t.Parallel()
		got, err := newDir(t).ReadResults()
		if err != nil || len(got) != 0 {
			t.Errorf("ReadResults() = %v, %v; want empty", got, err)
		}
	})

	t.Run("each wrapper's result is read back by name", func(t *testing.T) {
		t.Parallel()
		d := newDir(t)
		started := time.Date(2024, 5, 1, 12, 0, 1, 5, time.UTC)
		want := map[string]protocol.Result{
			"app":     {Ran: true, ExitCode: 137, Signal: "SIGKILL", Revoked: true, Started: started, Finished: started.Add(time.Minute)},
			"sidecar": {},
		}
		for name, r := range want {
			if err := d.WriteResult(name, r); err != nil {
				t.Fatal(err)
			}
		}
		got, err := d.ReadResults()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("ReadResults() = %+v, want %+v", got, want)
		}
		for name, r := range want {
			if g := got[name]; g.Ran != r.Ran || g.ExitCode != r.ExitCode || g.Signal != r.Signal || g.Revoked != r.Revoked ||
				!g.Started.Equal(r.Started) || !g.Finished.Equal(r.Finished) {
				t.Errorf("result %s = %+v, want %+v", name, g, r)
			}
		}
		raw, err := os.ReadFile(filepath.Join(d.Path(protocol.ResultsDir), "sidecar"))
		if err != nil {
			t.Fatal(err)
		}
		var fields map[string]any
		if err := json.Unmarshal(raw, &fields); err != nil {
			t.Fatal(err)
		}
		if _, ok := fields["started"]; ok {
			t.Errorf("a result that never started records a start time: %s", raw)
		}
	})

	t.Run("a write in progress is ignored", func(t *testing.T) {
		t.Parallel()
		d := newDir(t)
		if err := d.WriteResult("app", protocol.Result{Ran: true}); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d.Path(protocol.ResultsDir), ".app.123"), []byte(`{"ra`), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := d.ReadResults()
		if err != nil || len(got) != 1 || !got["app"].Ran {
			t.Errorf("ReadResults() = %+v, %v; want only app", got, err)
		}
	})

	t.Run("a garbled result is an error", func(t *testing.T) {
		t.Parallel()
		d := newDir(t)
		if err := os.MkdirAll(d.Path(protocol.ResultsDir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d.Path(protocol.ResultsDir), "app"), []byte(`{"ra`), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := d.ReadResults(); err == nil || !strings.Contains(err.Error(), "app") {
			t.Errorf("ReadResults() err = %v, want one naming the file", err)
		}
	})

	t.Run("a name that is not a plain file name is rejected", func(t *testing.T) {
		t.Parallel()
		d := newDir(t)
		for _, name := range []string{"", ".", "..", "a/b", "../escape", `a\b`} {
			if err := d.WriteResult(name, protocol.Result{}); err == nil {
				t.Errorf("WriteResult(%q) succeeded", name)
			}
		}
		if _, err := os.Stat(d.Path("escape")); err == nil {
			t.Error("a result escaped the results directory")
		}
	})
}

func TestMonotonicNowMovesForwardWithElapsedTime(t *testing.T) {
	t.Parallel()
	start := time.Now()
	a := protocol.MonotonicNow()
	time.Sleep(20 * time.Millisecond) // measuring the clock, not waiting for an event
	b := protocol.MonotonicNow()
	elapsed := time.Since(start)
	if d := time.Duration(b - a); d < 20*time.Millisecond || d > elapsed {
		t.Errorf("MonotonicNow advanced %v over a %v sleep (%v elapsed)", d, 20*time.Millisecond, elapsed)
	}
	for prev, i := protocol.MonotonicNow(), 0; i < 1000; i++ {
		now := protocol.MonotonicNow()
		if now < prev {
			t.Fatalf("MonotonicNow went back from %d to %d", prev, now)
		}
		prev = now
	}
}

// A container's new start clears the result of its previous attempt in the
// same pod, so the agent waits for this attempt's.
func TestMarkingAStartClearsTheContainersEarlierResult(t *testing.T) {
	d := newDir(t)
	if err := d.WriteResult("app", protocol.Result{Ran: true, ExitCode: 1}); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteResult("sidecar-app", protocol.Result{Ran: true}); err != nil {
		t.Fatal(err)
	}
	if err := d.MarkStarted("app", time.Now()); err != nil {
		t.Fatal(err)
	}
	results, err := d.ReadResults()
	if _, stale := results["app"]; err != nil || stale || len(results) != 1 {
		t.Fatalf("results after app's new start: %+v, %v; want only sidecar-app's", results, err)
	}
	if started, err := d.Started(); err != nil || len(started) != 1 || started[0] != "app" {
		t.Fatalf("started = %v, %v", started, err)
	}
	if err := d.MarkStarted("../app", time.Now()); err == nil {
		t.Fatal("a name with a path was accepted")
	}
}

// A deadline written before the node rebooted reads as ErrOtherBoot: the
// monotonic clock started again, so its instant means nothing now.
func TestADeadlineOfAnotherBootIsAnError(t *testing.T) {
	d := newDir(t)
	if protocol.BootID() == "" {
		t.Fatal("no boot id on this machine: /proc/sys/kernel/random/boot_id unreadable")
	}
	if err := os.WriteFile(d.Path(protocol.DeadlineFile), []byte("123 00000000-0000-0000-0000-000000000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.ReadDeadline(); !errors.Is(err, protocol.ErrOtherBoot) {
		t.Fatalf("ReadDeadline = %v, want ErrOtherBoot", err)
	}
	if err := d.WriteDeadline(456); err != nil {
		t.Fatal(err)
	}
	if dl, ok, err := d.ReadDeadline(); err != nil || !ok || dl != 456 {
		t.Fatalf("ReadDeadline = %d %v %v", dl, ok, err)
	}
}
