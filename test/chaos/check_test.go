package chaos

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestUnrecordable: a double success is the documented exception only when
// the fault log covers the owner's pod from its app's end until its claim
// could have lapsed, give or take recordSlack.
func TestUnrecordable(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const ttl = 2 * time.Second

	type tc struct {
		name      string
		outages   []Outage
		sidecars  []Incarnation // the owner's; default: one running throughout
		take      *time.Time    // the standby's run decision; nil: none
		rowTaken  *time.Time    // the row's last claim, by the standby; nil: the row is the owner's
		ownerLog  []string      // more lines of the owner's agent log
		exception bool
		says      string
	}
	ptr := func(t time.Time) *time.Time { return &t }
	line := func(at time.Time, msg string, token int) string {
		return fmt.Sprintf(`{"time":%q,"level":"INFO","msg":%q,"token":%d}`, at.Format(time.RFC3339Nano), msg, token)
	}
	// The owner decided at 0, its app ran from 100 to 1000 ms.
	cases := []tc{
		{name: "cut from before the end until the take", take: ptr(at(4000)),
			outages:   []Outage{{From: at(500), To: at(6000), Cluster: "dc-a", What: "cut-cluster (pause)"}},
			exception: true, says: "cut-cluster"},
		{name: "cut, then healthy after the lapse bound", take: ptr(at(9000)),
			// M = max(E+TTL, T-TTL) = 7000: healthy from 7000 on does not count.
			outages:   []Outage{{From: at(500), To: at(7000), Cluster: "dc-a", What: "cut-cluster (stop)"}},
			exception: true},
		{name: "healthy for 1.5 s before the lapse bound", take: ptr(at(9000)),
			outages:   []Outage{{From: at(500), To: at(5500), Cluster: "dc-a", What: "cut-cluster (stop)"}},
			exception: false, says: "could reach the database for 1.5s"},
		{name: "healthy for 0.8 s only", take: ptr(at(4000)),
			outages: []Outage{{From: at(500), To: at(1500), Cluster: "dc-a", What: "restart-bouncer"},
				{From: at(2300), To: at(5000), What: "restart-postgres (seed 1)"}},
			exception: true, says: "restart-postgres"},
		{name: "another cluster's cut does not count", take: ptr(at(4000)),
			outages:   []Outage{{From: at(500), To: at(6000), Cluster: "dc-b", What: "cut-cluster (pause)"}},
			exception: false},
		{name: "another pod's pause does not count", take: ptr(at(4000)),
			outages:   []Outage{{From: at(500), To: at(6000), Cluster: "dc-a", Pod: "other", What: "pause-agent"}},
			exception: false},
		{name: "sidecar paused, then dead", take: ptr(at(4000)),
			outages:   []Outage{{From: at(800), To: at(2000), Cluster: "dc-a", Pod: "owner", What: "pause-agent"}},
			sidecars:  []Incarnation{{From: at(-500), To: at(2200), Killed: true}, {From: at(5000)}},
			exception: true, says: "sidecar not running"},
		{name: "sidecar restarted in time", take: ptr(at(6000)),
			sidecars:  []Incarnation{{From: at(-500), To: at(900), Killed: true}, {From: at(2000)}},
			exception: false},
		{name: "claim taken while the app ran", take: ptr(at(700)),
			outages:   []Outage{{From: at(0), To: at(9000), Cluster: "dc-a", What: "cut-cluster (pause)"}},
			exception: false, says: "before its app ended"},
		{name: "no take: sidecar killed while cut off", take: nil,
			outages:   []Outage{{From: at(500), To: at(6000), Cluster: "dc-a", What: "cut-cluster (pause)"}},
			sidecars:  []Incarnation{{From: at(-500), To: at(5000), Killed: true}},
			exception: true, says: "sidecar killed"},
		{name: "no take: sidecar lived on after the cut", take: nil,
			outages:   []Outage{{From: at(500), To: at(6000), Cluster: "dc-a", What: "cut-cluster (pause)"}},
			sidecars:  []Incarnation{{From: at(-500), To: at(8000), Code: 0}},
			exception: false, says: "exited (code 0) at 12:00:08.000, when its pod could reach the database"},
		{name: "no take: sidecar resumed and exited at once", take: nil,
			outages:   []Outage{{From: at(800), To: at(3500), Cluster: "dc-a", Pod: "owner", What: "pause-agent"}},
			sidecars:  []Incarnation{{From: at(-500), To: at(3510), Code: 0}},
			exception: false, says: "exited (code 0) at 12:00:03.510, when its pod could reach the database"},
		{name: "no take: sidecar gave up while cut off, cut lasted", take: nil,
			outages:   []Outage{{From: at(800), To: at(3500), Cluster: "dc-a", What: "cut-cluster (stop)"}},
			sidecars:  []Incarnation{{From: at(-500), To: at(3000), Code: 0}},
			exception: false, says: "could reach the database for"},
		{name: "taken, then the sidecar resumed and exited at once", take: ptr(at(3000)),
			outages:   []Outage{{From: at(800), To: at(3500), Cluster: "dc-a", Pod: "owner", What: "pause-agent"}},
			sidecars:  []Incarnation{{From: at(-500), To: at(3510), Code: 0}},
			exception: true},
		{name: "no take: sidecar exited at once", take: nil,
			sidecars:  []Incarnation{{From: at(-500), To: at(1020), Code: 0}},
			exception: false, says: "without recording the success"},
		{name: "recording from soon after the end until the cut", take: ptr(at(5000)),
			outages:   []Outage{{From: at(2500), To: at(8000), Cluster: "dc-a", What: "cut-cluster (pause)"}},
			ownerLog:  []string{line(at(1100), "recording the outcome", 7)},
			exception: true, says: "cut-cluster"},
		{name: "recording failed while the database was reachable", take: ptr(at(5000)),
			outages: []Outage{{From: at(2500), To: at(8000), Cluster: "dc-a", What: "cut-cluster (pause)"}},
			ownerLog: []string{line(at(1100), "recording the outcome", 7), line(at(1200), "recording the outcome failed", 0),
				line(at(1210), "recorded", 7)},
			exception: false, says: "could reach the database for 1.5s"},
		{name: "recording began long after the end", take: ptr(at(5000)),
			outages:   []Outage{{From: at(2500), To: at(8000), Cluster: "dc-a", What: "cut-cluster (pause)"}},
			ownerLog:  []string{line(at(2400), "recording the outcome", 7)},
			exception: false, says: "could reach the database for 1.4s"},
		{name: "recording another run does not count", take: ptr(at(5000)),
			outages:   []Outage{{From: at(2500), To: at(8000), Cluster: "dc-a", What: "cut-cluster (pause)"}},
			ownerLog:  []string{line(at(1100), "recording the outcome", 6)},
			exception: false, says: "could reach the database for 1.5s"},
		{name: "sidecar exited at once, then taken", take: ptr(at(3500)),
			sidecars:  []Incarnation{{From: at(-500), To: at(1020), Code: 0}},
			exception: false, says: "without recording the success"},
		// A standby that took the row and waited for the lease, or a pod
		// stopped before it decided: the row's claim is the take.
		{name: "taken in the row long before the run decision", take: ptr(at(9000)), rowTaken: ptr(at(3500)),
			outages:   []Outage{{From: at(500), To: at(3600), Cluster: "dc-a", What: "cut-cluster (pause)"}},
			sidecars:  []Incarnation{{From: at(-500), To: at(3700), Code: 0}},
			exception: true, says: "cut-cluster"},
		{name: "taken in the row, never decided", take: nil, rowTaken: ptr(at(3500)),
			outages:   []Outage{{From: at(500), To: at(3600), Cluster: "dc-a", What: "cut-cluster (stop)"}},
			sidecars:  []Incarnation{{From: at(-500), To: at(8000), Code: 0}},
			exception: true, says: "cut-cluster"},
		{name: "taken in the row after the pod could have recorded", take: nil, rowTaken: ptr(at(6000)),
			outages:   []Outage{{From: at(500), To: at(2000), Cluster: "dc-a", What: "cut-cluster (stop)"}},
			sidecars:  []Incarnation{{From: at(-500), To: at(8000), Code: 0}},
			exception: false, says: "could reach the database for"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			log := func(name string, lines ...string) string {
				f := filepath.Join(dir, name+".agent.log")
				if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return f
			}
			dec := func(at time.Time, token int) string {
				return fmt.Sprintf(`{"time":%q,"level":"INFO","msg":"decision","action":"run","token":%d}`, at.Format(time.RFC3339Nano), token)
			}
			sidecars := c.sidecars
			if sidecars == nil {
				sidecars = []Incarnation{{From: at(-500)}}
			}
			owner := PodRecord{Cluster: "dc-a", Name: "owner", Window: 0, Index: -1, Sidecars: sidecars,
				AgentLog: log("owner", append([]string{`{"msg":"starting"}`, dec(at(0), 7)}, c.ownerLog...)...)}
			standby := PodRecord{Cluster: "dc-b", Name: "standby", Window: 0, Index: -1, Sidecars: []Incarnation{{From: at(-500)}}}
			if c.take != nil {
				standby.AgentLog = log("standby", dec(*c.take, 9))
			} else {
				standby.AgentLog = log("standby", `{"msg":"waiting"}`)
			}
			o := &Outcome{Settings: Settings{TTL: ttl}, End: at(20000), Outages: c.outages, Pods: []PodRecord{owner, standby}, Windows: []string{"w0"}}
			if c.rowTaken != nil {
				o.WindowClaims = map[string]WindowClaim{"w0": {Owner: "dc-b/ns/j/uid/standby", Token: 9, ClaimedAt: *c.rowTaken}}
			}
			run := Run{Cluster: "dc-a", Pod: "owner", Window: 0, Index: -1, Token: 7, Start: at(100), End: at(1000), Code: 0}
			ok, why := o.unrecordable(run, unit{0, -1})
			if ok != c.exception || !strings.Contains(why, c.says) {
				t.Errorf("unrecordable = %t, %q; want %t, saying %q", ok, why, c.exception, c.says)
			}
		})
	}
}

// TestRunsTakeTheEndTheWrapperSaw: an app killed after its stop line with
// code 0 but before it exited (a kill-app fault in that instant) failed, for
// the wrapper, the agent and the Job alike; its Job's retry running the window
// again is not a second success. A wrapper killed after it reported the
// success keeps it.
func TestRunsTakeTheEndTheWrapperSaw(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	line := func(what string, at time.Time, pod, code string) string {
		s := fmt.Sprintf("%s %d cluster=dc-a job=j pod=%s w=0 i=-1 token=7", what, at.UnixNano(), pod)
		if code != "" {
			s += " code=" + code
		}
		return s + "\n"
	}
	ledger := line("start", t0, "killed", "") + line("stop", t0.Add(time.Second), "killed", "0") +
		line("start", t0, "exited", "") + line("stop", t0.Add(time.Second), "exited", "0") +
		line("start", t0, "running", "") + line("stop", t0.Add(time.Second), "running", "0") +
		line("start", t0, "reported", "") + line("stop", t0.Add(time.Second), "reported", "0")
	end := t0.Add(time.Second + time.Millisecond)
	o := &Outcome{End: t0.Add(time.Minute), Ledger: ledger, Pods: []PodRecord{
		{Cluster: "dc-a", Name: "killed", AppRan: true, AppEnd: end, AppCode: 137, AppResult: 137},
		{Cluster: "dc-a", Name: "exited", AppRan: true, AppEnd: end, AppCode: 0, AppResult: 0},
		{Cluster: "dc-a", Name: "running", AppCode: -1, AppResult: -1},
		// killed while it waited for the agent to record the success
		{Cluster: "dc-a", Name: "reported", AppRan: true, AppEnd: end, AppCode: 137, AppResult: 0},
	}}
	runs, problems := o.Runs()
	if len(problems) > 0 || len(runs) != 4 {
		t.Fatalf("runs %v, problems %v", runs, problems)
	}
	want := map[string]bool{"killed": false, "exited": true, "running": true, "reported": true}
	for _, r := range runs {
		if r.Success() != want[r.Pod] {
			t.Errorf("%s: success %v, want %v", r, r.Success(), want[r.Pod])
		}
	}
}

// TestAWindowClaimedBeforeALaterWindowRanKeepsItsSmallerToken: in schedule
// mode a pod whose claim's reply was held up renews its own claim and runs
// its window after a later window's run elsewhere ended; its token was
// granted with the claim, before that run's, so it is smaller and breaks no
// promise, even when its Job's retry took the window over afterwards. The
// same order of runs is a violation when the claim was granted after the
// other run ended, within one window, or under a lease.
func TestAWindowClaimedBeforeALaterWindowRanKeepsItsSmallerToken(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// Window 1 ran in dc-b from 3500 to 4800 ms with token 31; dc-a's run of
	// window 0 (token 28) started at 7300.
	later := Run{Cluster: "dc-b", Pod: "w1-b", Window: 1, Index: -1, Token: 31, Start: at(3500), End: at(4800), Code: 0}
	cases := []struct {
		name      string
		mode      string
		window    int       // of dc-a's late run
		claimedAt time.Time // its row's last claim
		token     int64     // its row's token; 0: the late run's, 28
		violated  bool
	}{
		{name: "claimed before the later window's grant", mode: "schedule", claimedAt: at(500)},
		{name: "claimed, then taken over by its Job's retry", mode: "schedule", claimedAt: at(4000), token: 40},
		{name: "claimed after the later window's run ended", mode: "schedule", claimedAt: at(5000), violated: true},
		{name: "its window's row taken only after the later run ended", mode: "schedule", claimedAt: at(9000), token: 40, violated: true},
		{name: "the same window", mode: "schedule", window: 1, claimedAt: at(500), violated: true},
		{name: "under a lease", mode: "schedule,lease", claimedAt: at(500), violated: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			late := Run{Cluster: "dc-a", Pod: "w0-a", Window: c.window, Index: -1, Token: 28, Start: at(7300), End: at(8600), Code: 0}
			var ledger string
			for _, r := range []Run{later, late} {
				ledger += fmt.Sprintf("start %d cluster=%s job=j pod=%s w=%d i=-1 token=%d\n", r.Start.UnixNano(), r.Cluster, r.Pod, r.Window, r.Token)
				ledger += fmt.Sprintf("stop %d cluster=%s job=j pod=%s w=%d i=-1 token=%d code=0\n", r.End.UnixNano(), r.Cluster, r.Pod, r.Window, r.Token)
			}
			windows := []string{"w0", "w1"}
			o := &Outcome{Plan: Plan{Mode: c.mode}, End: at(20000), Ledger: ledger, Windows: windows,
				Pods: []PodRecord{
					{Cluster: "dc-b", Name: "w1-b", Window: 1, Index: -1, AppRan: true, AppEnd: later.End, AppResult: 0},
					{Cluster: "dc-a", Name: "w0-a", Window: c.window, Index: -1, AppRan: true, AppEnd: late.End, AppResult: 0},
				},
				WindowClaims: map[string]WindowClaim{
					windows[c.window]: {Owner: "dc-a/ns/j/uid/w0-a", Token: cmp.Or(c.token, 28), ClaimedAt: c.claimedAt},
					// The later window's own row: never r's.
					windows[1-c.window]: {Owner: "dc-b/ns/j/uid/w1-b", Token: 31, ClaimedAt: at(100)},
				},
			}
			var found []string
			for _, v := range Check(o) {
				if strings.HasPrefix(v.Kind, "c: ") {
					found = append(found, v.Kind)
				}
			}
			if got := slices.Contains(found, "c: tokens do not increase"); got != c.violated {
				t.Errorf("tokens do not increase reported: %t, want %t (token violations %v)", got, c.violated, found)
			}
		})
	}
}
