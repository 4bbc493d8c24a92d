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
		logTaken  *time.Time    // a claim of the row by a third pod, in the grant log only
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
		// The row's last claim is the standby's; another pod took it
		// before, waited for the lease and lost it in turn.
		{name: "taken first by a claim only the grant log kept", take: nil, rowTaken: ptr(at(6000)), logTaken: ptr(at(3500)),
			outages:   []Outage{{From: at(500), To: at(3600), Cluster: "dc-a", What: "restart-postgres"}},
			sidecars:  []Incarnation{{From: at(-500), To: at(3700), Code: 0}},
			exception: true, says: "grant log"},
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
			if c.logTaken != nil {
				o.Grants = []Grant{{Key: "ns/j", Window: "w0", Owner: "dc-c/ns/j/uid/third", Token: 8, GrantedAt: *c.logTaken}}
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

// TestNoRunIsGrantedWhileTheKeyIsPaused: a window claim or lease grant
// whose check the flips' brackets prove came after a pause committed and
// before it ended is a violation; one that may have been checked before
// the pause committed, or after it was resumed or ran out, is not, nor is
// a re-entry, which keeps its grant from before.
func TestNoRunIsGrantedWhileTheKeyIsPaused(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ptr := func(t time.Time) *time.Time { return &t }
	// Paused from 1100 (read once Set returned), resumed after 5000 (read,
	// with the token high water 20, before Resume was sent).
	resumed := []PauseFlip{
		{Sent: at(1000), Before: at(1000), BeforeHighWater: 10, Done: true, After: at(1100)},
		{Resume: true, Sent: at(5000), Before: at(5000), BeforeHighWater: 20, Done: true},
	}
	// Paused from 1100 until 3000 by itself.
	ranOut := []PauseFlip{{For: 1900 * time.Millisecond, Sent: at(1000), Before: at(1000), BeforeHighWater: 10, Done: true, After: at(1100), Until: ptr(at(3000))}}
	// Paused from 1100, set again for a while: read 2000 (high water 14)
	// before, 2100 after, until 2600.
	again := []PauseFlip{
		{Sent: at(1000), Before: at(1000), BeforeHighWater: 10, Done: true, After: at(1100)},
		{For: 500 * time.Millisecond, Sent: at(2000), Before: at(2000), BeforeHighWater: 14, Done: true, After: at(2100), Until: ptr(at(2600))},
	}
	claim := func(ms int, token int64) Grant {
		return Grant{Key: "chaos/j0", Window: "w0", Owner: "dc-b/chaos/j0-1/uid/j0-1-b-p0", Token: token, GrantedAt: at(ms)}
	}
	lease := func(ms int, token int64) Grant {
		return Grant{Lease: true, Key: "chaos/j0", Owner: "dc-b/chaos/j0-1/uid/j0-1-b-p0", Token: token, GrantedAt: at(ms)}
	}
	cases := []struct {
		name     string
		flips    []PauseFlip
		grant    Grant
		violated bool
	}{
		{"a claim checked while the key was paused", resumed, claim(2000, 15), true},
		{"a lease granted while the key was paused", resumed, lease(3000, 16), true},
		{"a claim begun before the pause was read committed", resumed, claim(1050, 12), false},
		{"a re-entry keeps its claim from before the pause", resumed, claim(900, 9), false},
		{"a claim after the resume", resumed, claim(5200, 21), false},
		// Begun before the resume's bracket, its token drawn after it: its
		// check may have come after the resume committed.
		{"a claim begun before the resume whose token came after it", resumed, claim(4900, 21), false},
		{"a claim while a pause for a while held", ranOut, claim(2500, 15), true},
		{"a claim once a pause for a while ran out", ranOut, claim(3000, 15), false},
		{"a claim while the pause set again held", again, claim(2300, 15), true},
		{"a claim while the pause was being set again", again, claim(2050, 14), false},
		{"a claim once the pause set again ran out", again, claim(2700, 16), false},
		{"a claim before the first span's end, under the first flip's bracket", again, claim(1500, 13), true},
		// A Resume whose bracket was never read ends the span at an
		// unknown time: nothing after the Set is proven paused.
		{"a resume whose bracket is unknown", []PauseFlip{resumed[0], {Resume: true, Sent: at(5000), Done: true}}, claim(2000, 15), false},
		// A failed try of the Set may commit later, ending the pause at
		// its own start + For, no earlier than 1000 + 1900.
		{"a claim while a pause for a while held, one of its tries failed", []PauseFlip{{For: 1900 * time.Millisecond, Sent: at(1000), Before: at(1000),
			BeforeHighWater: 10, Done: true, FailedTries: 1, After: at(1300), Until: ptr(at(3200))}}, claim(2800, 15), true},
		{"a claim after a failed try of the pause could have ended it", []PauseFlip{{For: 1900 * time.Millisecond, Sent: at(1000), Before: at(1000),
			BeforeHighWater: 10, Done: true, FailedTries: 1, After: at(1300), Until: ptr(at(3200))}}, claim(3000, 15), false},
		{"a pause whose Set failed", []PauseFlip{{Sent: at(1000), Before: at(1000), BeforeHighWater: 10, FailedTries: 3, Err: "database unavailable"}}, claim(2000, 15), false},
		{"no pause", nil, claim(2000, 15), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := &Outcome{End: at(20000), Pauses: c.flips, Grants: []Grant{c.grant}, Windows: []string{"w0"}}
			var kinds []string
			for _, v := range Check(o) {
				kinds = append(kinds, v.Kind)
			}
			if got := slices.Contains(kinds, "f: a run was granted while the key was paused"); got != c.violated {
				t.Errorf("%s: reported %t, want %t (violations %v)", c.grant, got, c.violated, kinds)
			}
		})
	}
}

// pausedSkipLine is an agent log's decision to skip because of a pause,
// as the agent words it.
func pausedSkipLine(at time.Time) string {
	return fmt.Sprintf(`{"time":%q,"level":"INFO","msg":"decision","action":"skip","key":"chaos/j0","token":0,"reason":%q}`,
		at.Format(time.RFC3339Nano), `skipped: window w0 of chaos/j0: paused by chaos-owner until resumed ("fault schedule, set 1"); no run of this key starts in any cluster until it is resumed (kubectl dislock resume)`)
}

// TestAPodThatSkippedBecauseOfAPauseExitsAsASkip: its app never runs and
// its app container exits 0, so that its Job succeeds; it skips only once
// a pause was sent; and a pod whose app container acted on an earlier
// error, or was deleted, is not held to it.
func TestAPodThatSkippedBecauseOfAPauseExitsAsASkip(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	errorLine := fmt.Sprintf(`{"time":%q,"level":"INFO","msg":"decision","action":"error","reason":"could not decide: database unavailable"}`, at(1200).Format(time.RFC3339Nano))
	flips := []PauseFlip{{Sent: at(1000), Before: at(1000), BeforeHighWater: 10, Done: true, After: at(1100)}}
	cases := []struct {
		name  string
		log   []string
		pod   PodRecord
		ran   bool // the ledger has a run of the pod
		flips []PauseFlip
		want  string
	}{
		{name: "skipped and exited 0", log: []string{pausedSkipLine(at(1500))}, pod: PodRecord{AppRan: true, AppCode: 0}},
		{name: "skipped, yet its app ran", log: []string{pausedSkipLine(at(1500))}, pod: PodRecord{AppRan: true, AppCode: 0}, ran: true,
			want: "f: the app ran in a pod that skipped because of a pause"},
		{name: "skipped, yet its app container failed", log: []string{pausedSkipLine(at(1500))}, pod: PodRecord{AppRan: true, AppCode: 75},
			want: "f: a pod that skipped because of a pause did not exit as a skip"},
		{name: "skipped, and deleted before its container exited", log: []string{pausedSkipLine(at(1500))}, pod: PodRecord{AppRan: true, AppCode: 143, DeletedWhy: "evicted"}},
		{name: "an error first, which its container acted on", log: []string{errorLine, pausedSkipLine(at(6500))}, pod: PodRecord{AppRan: true, AppCode: 75}},
		{name: "skipped before the pause was sent", log: []string{pausedSkipLine(at(900))}, pod: PodRecord{AppRan: true, AppCode: 0},
			want: "f: a pod skipped because of a pause never set"},
		{name: "skipped with no pause at all", log: []string{pausedSkipLine(at(1500))}, pod: PodRecord{AppRan: true, AppCode: 0}, flips: []PauseFlip{},
			want: "f: a pod skipped because of a pause never set"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			pod := c.pod
			pod.Cluster, pod.Name, pod.Window, pod.Index, pod.Ended = "dc-a", "j0-1-a-p0", 0, -1, at(2000)
			pod.AgentLog = filepath.Join(dir, "agent.log")
			if err := os.WriteFile(pod.AgentLog, []byte(strings.Join(c.log, "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			var ledger string
			if c.ran {
				ledger = fmt.Sprintf("start %d cluster=dc-a job=j0-1 pod=j0-1-a-p0 w=0 i=-1 token=11\n", at(1600).UnixNano())
			}
			o := &Outcome{End: at(20000), Pauses: flips, Pods: []PodRecord{pod}, Ledger: ledger, Windows: []string{"w0"}}
			if c.flips != nil {
				o.Pauses = c.flips
			}
			var kinds []string
			for _, v := range Check(o) {
				if strings.HasPrefix(v.Kind, "f: ") {
					kinds = append(kinds, v.Kind)
				}
			}
			if c.want == "" && len(kinds) > 0 || c.want != "" && !slices.Contains(kinds, c.want) {
				t.Errorf("pause violations %v, want %q", kinds, c.want)
			}
		})
	}
}

// TestARunGoingIsNotStoppedByAPause: a pod of the owner's Job that skips
// because of a pause while the owner's pod still runs (its node lost)
// completes the Job, whose controller deletes the running pod: a run
// stopped by a pause. A skip after the owner's run succeeded stops
// nothing.
func TestARunGoingIsNotStoppedByAPause(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, c := range []struct {
		name     string
		code     string // the owner's stop line's
		end      int    // and its time, in ms
		violated bool
	}{
		{"the owner's run was deleted with its Job", "143", 3000, true},
		{"the owner's run had succeeded", "0", 3000, false},
		// Its sidecar paused, its safety deadline ended it.
		{"the owner's run had been stopped before", "143", 1800, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			logOf := func(name string, lines ...string) string {
				f := filepath.Join(dir, name+".agent.log")
				if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return f
			}
			owner := PodRecord{Cluster: "dc-a", Job: "j0-1", Name: "j0-1-a-p0", Window: 0, Index: -1, AppRan: true, AppEnd: at(c.end), AppCode: 143,
				Ended: at(3100), DeletedWhy: "job complete",
				AgentLog: logOf("owner", fmt.Sprintf(`{"time":%q,"msg":"decision","action":"run","token":11}`, at(500).Format(time.RFC3339Nano)))}
			if c.code == "0" {
				owner.AppCode, owner.DeletedWhy = 0, ""
			}
			replacement := PodRecord{Cluster: "dc-a", Job: "j0-1", Name: "j0-1-a-p1", Window: 0, Index: -1, Attempt: 1, AppRan: true, AppCode: 0,
				Ended: at(2900), AgentLog: logOf("replacement", pausedSkipLine(at(2500)))}
			ledger := fmt.Sprintf("start %d cluster=dc-a job=j0-1 pod=j0-1-a-p0 w=0 i=-1 token=11\nstop %d cluster=dc-a job=j0-1 pod=j0-1-a-p0 w=0 i=-1 token=11 code=%s\n",
				at(600).UnixNano(), at(c.end).UnixNano(), c.code)
			o := &Outcome{End: at(20000), Windows: []string{"w0"}, Ledger: ledger, Pods: []PodRecord{owner, replacement},
				Pauses: []PauseFlip{{Sent: at(2000), Before: at(2000), BeforeHighWater: 11, Done: true, After: at(2100)}},
				Jobs:   []JobRecord{{Cluster: "dc-a", Name: "j0-1", Window: 0, Index: -1, Result: "succeeded", Pods: 2}}}
			var kinds []string
			for _, v := range Check(o) {
				kinds = append(kinds, v.Kind)
			}
			if got := slices.Contains(kinds, "f: a run was stopped by a pause"); got != c.violated {
				t.Errorf("reported %t, want %t (violations %v)", got, c.violated, kinds)
			}
		})
	}
}

// TestAWindowAPauseKeptFromRunningIsNotLost: with standby, a window none
// of whose clean clusters ran is lost, unless a pod of it skipped because
// of a pause.
func TestAWindowAPauseKeptFromRunningIsNotLost(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, paused := range []bool{true, false} {
		t.Run(fmt.Sprintf("paused %t", paused), func(t *testing.T) {
			line := fmt.Sprintf(`{"time":%q,"msg":"decision","action":"skip","reason":"window w0 already claimed by cluster dc-b"}`, at(500).Format(time.RFC3339Nano))
			if paused {
				line = pausedSkipLine(at(500))
			}
			log := filepath.Join(t.TempDir(), "agent.log")
			if err := os.WriteFile(log, []byte(line+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			o := &Outcome{Plan: Plan{Mode: "schedule", Standby: true, Clusters: 1, Windows: 1, Completions: 1, PlainCluster: -1}, End: at(20000),
				Windows: []string{"w0"}, WindowStates: map[string]string{},
				Pods: []PodRecord{{Cluster: "dc-a", Job: "j0-1", Name: "j0-1-a-p0", Window: 0, Index: -1, AppRan: true, AppCode: 0,
					Created: at(0), Ended: at(1000), AgentLog: log}},
				Pauses: []PauseFlip{{Sent: at(200), Before: at(200), BeforeHighWater: 3, Done: true, After: at(300)}}}
			lost := slices.ContainsFunc(Check(o), func(v Violation) bool { return v.Kind == "b: window lost although a cluster was healthy" })
			if lost == paused {
				t.Errorf("window reported lost: %t, want %t", lost, !paused)
			}
		})
	}
}
