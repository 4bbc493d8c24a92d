package agent_test

// A key paused everywhere (dislock pause, kubectl dislock pause): its pods
// skip, in every mode, saying who paused it, until when and why, and the
// Job succeeds; a run already going runs to its end; resumed, the next
// window runs. Directly, through PgBouncer, and through lock gateways.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/ledger"
	"github.com/dislock/dislock/lockagent/store/pause"
)

// pauseKey pauses j's key as alice would, for an hour.
func pauseKey(t *testing.T, j job) pause.Pause {
	t.Helper()
	p, err := pause.Set(context.Background(), openStore(t, j.dsn), pause.Request{Key: j.key, By: "alice", Reason: "bad release", For: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mustSkipForThePause checks that po skipped, naming the pause, and exited
// as a skip does.
func mustSkipForThePause(t *testing.T, name string, po *pod, p pause.Pause) {
	t.Helper()
	said := p.Text()
	if code := po.finish(); code != 0 {
		t.Errorf("%s: exit %d, want 0 (a skip: the Job succeeds)", name, code)
	}
	if d := po.decision(); d.Action != protocol.ActionSkip || !strings.Contains(d.Reason, said) {
		t.Errorf("%s: decision %+v, want a skip saying %q", name, d, said)
	}
	if msg := po.terminationMessage(); !strings.Contains(msg, said) {
		t.Errorf("%s: termination message %q, want %q in it", name, msg, said)
	}
}

func TestAPausedKeysPodsSkipInEveryModeSayingWhoPausedItAndTheJobSucceeds(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		for _, tc := range []struct {
			name, mode string
			standby    bool
			index      int // -1: not Indexed
			gateways   bool
		}{
			{name: "schedule", mode: "schedule", index: -1},
			{name: "lease", mode: "lease", index: -1},
			{name: "schedule,lease", mode: "schedule,lease", index: -1},
			{name: "standby", mode: "schedule", standby: true, index: -1},
			{name: "an index of an Indexed Job", mode: "schedule,lease", index: 1},
			{name: "through lock gateways", mode: "schedule,lease", index: -1, gateways: true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				j := newJob(t, dsn, tc.mode, 5*time.Second)
				j.standby = tc.standby
				if tc.gateways {
					j = j.throughGateways(t, "dc-a", "dc-b")
				}
				p := pauseKey(t, j)
				w := nowWindow()
				for _, cluster := range []string{"dc-a", "dc-b"} {
					spec := podSpec{cluster: cluster, window: w, app: app(0, 0)}
					if tc.index >= 0 {
						spec.env = indexEnv(cluster, tc.index)
					}
					mustSkipForThePause(t, cluster, j.start(t, spec), p)
				}
				if runs := readLedger(t, j.ledger); len(runs) != 0 {
					t.Fatalf("the app ran while its key was paused: %+v", runs)
				}
				// The skips are in the ledger, with the reason.
				decisions, _, err := ledger.ListDecisions(context.Background(), openStore(t, dsn), ledger.DecisionFilter{Key: j.key})
				if err != nil {
					t.Fatal(err)
				}
				skipped := 0
				for _, d := range decisions {
					if d.Action == store.ActionSkip && strings.Contains(d.Reason, p.Text()) {
						skipped++
					}
				}
				if skipped != 2 {
					t.Errorf("the ledger has %d skips for the pause, want 2: %+v", skipped, decisions)
				}
			})
		}
	})
}

func TestARunGoingWhenItsKeyIsPausedRunsToItsEndAndTheNextWindowRunsOnceResumed(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		j := newJob(t, dsn, "schedule,lease", 5*time.Second)
		w := nowWindow()
		running := j.start(t, podSpec{cluster: "dc-a", window: w, app: app(3, 0)})
		if d := running.decision(); d.Action != protocol.ActionRun {
			t.Fatalf("dc-a: decision %+v, want run", d)
		}
		pauseKey(t, j)
		// Another cluster's pod of the same window skips for the run it
		// meets, paused or not.
		other := j.start(t, podSpec{cluster: "dc-b", window: w, app: app(0, 0)})
		if code := other.finish(); code != 0 || other.decision().Action != protocol.ActionSkip || !strings.Contains(other.decision().Reason, "already claimed by cluster dc-a") {
			t.Fatalf("dc-b: exit %d, decision %+v; want a skip for dc-a's run", code, other.decision())
		}
		if code := running.finish(); code != 0 {
			t.Fatalf("the run going when the key was paused: exit %d, want it to run to its end", code)
		}
		if _, ok, err := pause.Resume(context.Background(), openStore(t, dsn), j.key, "bob"); err != nil || !ok {
			t.Fatalf("resume: %t, %v", ok, err)
		}
		next := j.start(t, podSpec{cluster: "dc-b", window: w.Add(time.Minute), app: app(0, 0)})
		if code := next.finish(); code != 0 || next.decision().Action != protocol.ActionRun {
			t.Fatalf("the next window after the resume: exit %d, decision %+v", code, next.decision())
		}
		if runs := readLedger(t, j.ledger); len(runs) != 2 || runs[0].cluster != "dc-a" || runs[1].cluster != "dc-b" {
			t.Fatalf("runs %+v, want dc-a's of the paused window's start and dc-b's after the resume", runs)
		}
	})
}

// A replacement pod of the Job whose run is going (its node lost, the pod
// evicted) waits for that run while the key is paused, as it would
// unpaused: had it skipped, its success would complete the Job, and the
// Job controller would delete the running pod.
func TestAReplacementPodWaitsForTheRunningPodOfItsJobWhileTheKeyIsPaused(t *testing.T) {
	eachTarget(t, func(t *testing.T, dsn string) {
		for _, mode := range []string{"schedule", "lease", "schedule,lease"} {
			t.Run(mode, func(t *testing.T) {
				j := newJob(t, dsn, mode, 5*time.Second)
				w := nowWindow()
				first := j.start(t, podSpec{cluster: "dc-a", window: w, app: app(3, 0)})
				if d := first.decision(); d.Action != protocol.ActionRun {
					t.Fatalf("the first pod: decision %+v, want run", d)
				}
				pauseKey(t, j)
				replacement := j.start(t, podSpec{cluster: "dc-a", window: w, jobName: first.spec.jobName,
					podName: first.spec.jobName + "-replacement", app: app(0, 0)})
				if msg := replacement.terminationMessage(); !strings.HasPrefix(msg, "waiting: ") {
					t.Fatalf("the replacement's termination message while the run goes on: %q, want it to wait", msg)
				}
				if code := first.finish(); code != 0 {
					t.Fatalf("the running pod: exit %d", code)
				}
				if code := replacement.finish(); code != 0 || replacement.decision().Action != protocol.ActionSkip {
					t.Fatalf("the replacement: exit %d, decision %+v; want a skip once the run ended", code, replacement.decision())
				}
				if runs := readLedger(t, j.ledger); len(runs) != 1 || runs[0].stop == 0 {
					t.Fatalf("runs %+v, want the first pod's, to its end", runs)
				}
			})
		}
	})
}
