package wrapper

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
)

const window = "2024-05-01T12:00:00Z"

func runDecision(token int64) protocol.Decision {
	return protocol.Decision{
		Action: protocol.ActionRun, Reason: "claimed the window", Token: token, Window: window,
		Key: "ns/report", Owner: "dc-a/ns/report-28573200/uid-1",
	}
}

// markerScript is an app that leaves a marker, so a test can tell it ran.
const markerScript = `: > "$D/ran"`

func TestASkippedPodNeverRunsTheCommandAndSaysWhoOwnsTheWindow(t *testing.T) {
	t.Parallel()
	p := newPod(t)
	p.decide(protocol.Decision{
		Action: protocol.ActionSkip, Reason: "window already claimed", Window: window,
		Key: "ns/report", Owner: "dc-b/ns/report-28573200/uid-9",
	})
	w := p.runScript(nil, markerScript)

	if code := w.wait(); code != 0 {
		t.Fatalf("exit code %d, want 0 (the Job completes); log:\n%s", code, w.rawLog())
	}
	if p.exists("ran") {
		t.Error("the command ran on a skip")
	}
	w.onlyJSONLogged()
	lines := w.logLines()
	if len(lines) != 1 {
		t.Fatalf("got %d log lines, want exactly one:\n%s", len(lines), w.rawLog())
	}
	want := map[string]any{"key": "ns/report", "window": window, "cluster": "dc-b",
		"owner": "dc-b/ns/report-28573200/uid-9", "reason": "window already claimed", "container": "app"}
	for k, v := range want {
		if lines[0][k] != v {
			t.Errorf("log %s = %v, want %v", k, lines[0][k], v)
		}
	}
	if r := p.result("app"); r.Ran || r.ExitCode != 0 {
		t.Errorf("result %+v, want not ran, exit code 0", r)
	}
}

func TestAnUnusableDecisionFailsTheContainerWithoutRunningTheCommand(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		decision string
		wantLog  string
	}{
		{"the agent decided error", `{"action":"error","reason":"database unreachable","key":"ns/report"}`, "the agent decided error"},
		{"the decision is garbled", `{"action":`, "no usable decision"},
		{"the decision has an unknown action", `{"action":"maybe"}`, "no usable decision"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newPod(t)
			if err := os.WriteFile(p.shared.Path(protocol.DecisionFile), []byte(tc.decision), 0o644); err != nil {
				t.Fatal(err)
			}
			w := p.runScript(nil, markerScript)
			if code := w.wait(); code != ExitError {
				t.Fatalf("exit code %d, want %d; log:\n%s", code, ExitError, w.rawLog())
			}
			if p.exists("ran") {
				t.Error("the command ran")
			}
			w.mustLog(tc.wantLog)
			if r := p.result("app"); r.Ran || r.ExitCode != ExitError {
				t.Errorf("result %+v, want not ran, exit code %d", r, ExitError)
			}
		})
	}
}

func TestTheCommandSeesItsFencingTokenAndWindowAndOwnsStdout(t *testing.T) {
	t.Parallel()
	p := newPod(t)
	p.decide(runDecision(42))
	// A stale token in the container's own env must not leak through.
	w := p.runScript(nil, `echo "$DISLOCK_FENCING_TOKEN $DISLOCK_WINDOW $KEEP" > "$D/env"; echo hello`,
		contract.EnvFencingToken+"=1", "KEEP=kept")

	if code := w.wait(); code != 0 {
		t.Fatalf("exit code %d, want 0; log:\n%s", code, w.rawLog())
	}
	if got, want := p.read("env"), "42 "+window+" kept\n"; got != want {
		t.Errorf("the command saw %q, want %q", got, want)
	}
	if got := w.output(); got != "hello\n" {
		t.Errorf("stdout = %q, want only the command's output", got)
	}
	w.onlyJSONLogged()
	l := w.mustLog("running the command")
	if l["token"] != float64(42) || l["owner"] != "dc-a/ns/report-28573200/uid-1" {
		t.Errorf("run log line %v lacks token or owner", l)
	}
}

func TestTheWrapperExitsWithTheCommandsCode(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, script string
		code         int
		signal       string
	}{
		{"success", "exit 0", 0, ""},
		{"failure", "exit 1", 1, ""},
		{"another code", "exit 3", 3, ""},
		{"killed by SIGKILL", "kill -KILL $$", 137, "SIGKILL"},
		{"killed by SIGTERM", "kill -TERM $$", 143, "SIGTERM"},
	}
	for _, mode := range []struct {
		name string
		env  []string
	}{
		{"waiting for the command", nil},
		{"reaping every child as PID 1 does", []string{envTestReapAll + "=1"}},
	} {
		for _, tc := range cases {
			t.Run(mode.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				p := newPod(t)
				p.decide(runDecision(7))
				w := p.runScript(nil, tc.script, mode.env...)
				if code := w.wait(); code != tc.code {
					t.Fatalf("exit code %d, want %d; log:\n%s", code, tc.code, w.rawLog())
				}
				if r := p.result("app"); !r.Ran || r.ExitCode != tc.code || r.Signal != tc.signal || r.Revoked {
					t.Errorf("result %+v, want ran, exit code %d, signal %q", r, tc.code, tc.signal)
				}
			})
		}
	}
}

func TestTheResultOfANormalRun(t *testing.T) {
	t.Parallel()
	p := newPod(t)
	p.decide(runDecision(7))
	before := time.Now()
	w := p.start([]string{"--name", "report", "--", "/bin/sh", "-c", "sleep 0.1; exit 3"})
	if code := w.wait(); code != 3 {
		t.Fatalf("exit code %d, want 3", code)
	}
	after := time.Now()

	r := p.result("report") // the last --name wins
	if !r.Ran || r.ExitCode != 3 || r.Signal != "" || r.Revoked {
		t.Errorf("result %+v, want ran with exit code 3", r)
	}
	if r.Started.Before(before) || r.Finished.After(after) || r.Finished.Sub(r.Started) < 100*time.Millisecond {
		t.Errorf("started %v, finished %v: want within [%v, %v] and at least 100ms apart", r.Started, r.Finished, before, after)
	}
	if r.Started.Location() != time.UTC {
		t.Errorf("times are in %v, want UTC", r.Started.Location())
	}
}

// signalScript traps sig, records each delivery, and ends when released.
func signalScript(sig string) string {
	return `trap 'echo got ` + sig + ` >> "$D/got"' ` + sig + `
: > "$D/ready"
while [ ! -f "$D/release" ]; do sleep 0.02; done`
}

func TestSignalsToTheWrapperReachTheCommandOnce(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		name := strings.TrimPrefix(status{signal: sig}.signalName(), "SIG")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := newPod(t)
			p.decide(runDecision(7))
			w := p.runScript(nil, signalScript(name))
			eventually(t, "the command to start", func() bool { return p.exists("ready") || w.exited() })

			w.signal(sig)
			eventually(t, "the command to get the signal", func() bool { return p.exists("got") || w.exited() })
			if err := os.WriteFile(p.path("release"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if code := w.wait(); code != 0 {
				t.Fatalf("exit code %d, want 0 (the command handled %s); log:\n%s", code, name, w.rawLog())
			}
			if got, want := p.read("got"), "got "+name+"\n"; got != want {
				t.Errorf("the command recorded %q, want %q (exactly once)", got, want)
			}
		})
	}
}

func TestTheWrapperWaitsForALateDecision(t *testing.T) {
	t.Parallel()
	p := newPod(t)
	w := p.runScript(nil, markerScript)
	eventually(t, "the wrapper to say it waits", func() bool {
		_, ok := w.logged("waiting for the agent's decision")
		return ok || w.exited()
	})
	if p.exists("ran") || w.exited() {
		t.Fatalf("the command ran or the wrapper exited before any decision; log:\n%s", w.rawLog())
	}
	p.decide(runDecision(7))
	if code := w.wait(); code != 0 {
		t.Fatalf("exit code %d, want 0; log:\n%s", code, w.rawLog())
	}
	if !p.exists("ran") {
		t.Error("the command did not run once the decision came")
	}
}

func TestNoDecisionWithinTheTimeoutFailsTheContainer(t *testing.T) {
	t.Parallel()
	p := newPod(t)
	w := p.runScript([]string{"--decision-timeout", "200ms"}, markerScript)
	if code := w.wait(); code != ExitError {
		t.Fatalf("exit code %d, want %d", code, ExitError)
	}
	if p.exists("ran") {
		t.Error("the command ran")
	}
	l := w.mustLog("no usable decision")
	if err, _ := l["err"].(string); !strings.Contains(err, "is the dislock-agent sidecar running?") {
		t.Errorf("err %q does not point at the sidecar", err)
	}
}

func TestSIGTERMWhileWaitingEndsTheWrapperWithoutRunning(t *testing.T) {
	t.Parallel()
	p := newPod(t)
	w := p.runScript(nil, markerScript)
	eventually(t, "the wrapper to wait", func() bool { _, ok := w.logged("waiting for"); return ok || w.exited() })
	w.signal(syscall.SIGTERM)
	if code := w.wait(); code != 143 {
		t.Fatalf("exit code %d, want 143; log:\n%s", code, w.rawLog())
	}
	if r := p.result("app"); r.Ran || r.ExitCode != 143 {
		t.Errorf("result %+v, want not ran, exit code 143", r)
	}
}

func TestARevokedLeaseStopsTheCommand(t *testing.T) {
	t.Parallel()
	const grace = 300 * time.Millisecond
	for _, tc := range []struct {
		name, script string
		code         int
		signal       string
		killed       bool
	}{
		{
			name: "a command that exits on SIGTERM",
			script: `trap 'echo got TERM >> "$D/got"; exit 1' TERM
: > "$D/ready"
while :; do sleep 0.02; done`,
			code: 1,
		},
		{
			name: "a command that ignores SIGTERM is killed after the grace",
			script: `trap 'echo got TERM >> "$D/got"' TERM
: > "$D/ready"
while :; do sleep 0.02; done`,
			code: 137, signal: "SIGKILL", killed: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newPod(t)
			dec := runDecision(7)
			dec.KillGrace = protocol.Duration(grace)
			p.decide(dec)
			w := p.runScript(nil, tc.script)
			eventually(t, "the command to start", func() bool { return p.exists("ready") || w.exited() })

			revokedAt := time.Now()
			if err := p.shared.Revoke("renewal failed: lease taken by dc-b"); err != nil {
				t.Fatal(err)
			}
			code := w.wait()
			stoppedAfter := time.Since(revokedAt)
			if code != tc.code {
				t.Fatalf("exit code %d, want %d; log:\n%s", code, tc.code, w.rawLog())
			}
			if got := p.read("got"); got != "got TERM\n" {
				t.Errorf("the command recorded %q, want one SIGTERM first", got)
			}
			if tc.killed && stoppedAfter < grace {
				t.Errorf("SIGKILLed %v after the revocation, before the %v grace", stoppedAfter, grace)
			}
			w.mustLog("lease lost: renewal failed: lease taken by dc-b")
			if r := p.result("app"); !r.Ran || !r.Revoked || r.ExitCode != tc.code || r.Signal != tc.signal {
				t.Errorf("result %+v, want revoked, exit code %d, signal %q", r, tc.code, tc.signal)
			}
		})
	}
}

func TestThePassedDeadlineStopsTheCommandEvenWithoutAnAgent(t *testing.T) {
	t.Parallel()
	p := newPod(t)
	p.decide(runDecision(7))
	// The app records, on CLOCK_MONOTONIC, when SIGTERM reached it.
	// (env(1) sets the mode for the app only: the wrapper is the same binary.)
	w := p.start([]string{"--", "env", envTestChild + "=" + childMonoTrapMode, os.Args[0], p.path("ready"), p.path("term")})
	eventually(t, "the command to start", func() bool { return p.exists("ready") || w.exited() })

	// The agent's last renewal, then nothing: no agent runs in this test.
	deadline := protocol.MonotonicNow() + int64(500*time.Millisecond)
	if err := p.shared.WriteDeadline(deadline); err != nil {
		t.Fatal(err)
	}
	if code := w.wait(); code != 143 {
		t.Fatalf("exit code %d, want 143 (stopped by SIGTERM); log:\n%s", code, w.rawLog())
	}
	termAt, err := strconv.ParseInt(p.read("term"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if late := time.Duration(termAt - deadline); late < 0 || late > 5*time.Second {
		t.Errorf("SIGTERM came %v after the deadline, want after it and within a few seconds", late)
	}
	w.mustLog("safety deadline passed: the agent stopped renewing the lease")
	if r := p.result("app"); !r.Revoked || r.Signal != "SIGTERM" {
		t.Errorf("result %+v, want revoked by SIGTERM", r)
	}
}

func TestAKeptUpDeadlineLetsTheCommandRun(t *testing.T) {
	t.Parallel()
	p := newPod(t)
	p.decide(runDecision(7))
	extend := func() {
		t.Helper()
		if err := p.shared.WriteDeadline(protocol.MonotonicNow() + int64(500*time.Millisecond)); err != nil {
			t.Error(err)
		}
	}
	extend()
	w := p.runScript(nil, `trap 'echo got TERM >> "$D/got"; exit 1' TERM
while [ ! -f "$D/release" ]; do sleep 0.02; done`)

	// Renew like a healthy agent for three times the deadline's reach.
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end) && !w.exited(); {
		time.Sleep(100 * time.Millisecond)
		extend()
	}
	if err := os.WriteFile(p.path("release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := w.wait(); code != 0 {
		t.Fatalf("exit code %d, want 0; log:\n%s", code, w.rawLog())
	}
	if p.exists("got") {
		t.Error("the command got SIGTERM although the deadline was kept up")
	}
	if r := p.result("app"); r.Revoked {
		t.Errorf("result %+v, want not revoked", r)
	}
}

func TestALeaseLostBeforeTheStartNeverRunsTheCommand(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		lose    func(p *pod) error
		wantLog string
	}{
		{"revoked", func(p *pod) error { return p.shared.Revoke("lease expired") }, "not running the command: lease lost: lease expired"},
		{"deadline passed", func(p *pod) error { return p.shared.WriteDeadline(protocol.MonotonicNow() - 1) }, "not running the command: safety deadline passed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newPod(t)
			p.decide(runDecision(7))
			if err := tc.lose(p); err != nil {
				t.Fatal(err)
			}
			w := p.runScript(nil, markerScript)
			if code := w.wait(); code != ExitError {
				t.Fatalf("exit code %d, want %d", code, ExitError)
			}
			if p.exists("ran") {
				t.Error("the command ran without a lease")
			}
			w.mustLog(tc.wantLog)
			if r := p.result("app"); r.Ran || !r.Revoked {
				t.Errorf("result %+v, want not ran, revoked", r)
			}
		})
	}
}

func TestACommandThatCannotStartExitsLikeAShell(t *testing.T) {
	t.Parallel()
	notExec := t.TempDir() + "/script.sh"
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		command string
		code    int
	}{
		{"no such command", "dislock-no-such-command", ExitNotFound},
		{"no such path", "/nonexistent/app", ExitNotFound},
		{"not executable", notExec, ExitCannotExecute},
		{"a directory", t.TempDir(), ExitCannotExecute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newPod(t)
			p.decide(runDecision(7))
			w := p.start([]string{"--", tc.command})
			if code := w.wait(); code != tc.code {
				t.Fatalf("exit code %d, want %d; log:\n%s", code, tc.code, w.rawLog())
			}
			w.mustLog("cannot start the command")
			if r := p.result("app"); r.Ran || r.ExitCode != tc.code {
				t.Errorf("result %+v, want not ran, exit code %d", r, tc.code)
			}
		})
	}
}

func TestMisuseExits64(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no arguments", nil, "usage"},
		{"no command after --", []string{"--"}, "usage"},
		{"flags but no command", []string{"--poll", "1s"}, "usage"},
		{"an unknown flag", []string{"--bogus", "--", "true"}, "flag provided but not defined: -bogus"},
		{"a bad duration", []string{"--poll", "soon", "--", "true"}, `invalid value "soon"`},
		{"a zero poll", []string{"--poll", "0s", "--", "true"}, "--poll 0s is not positive"},
		{"a result name with a slash", []string{"--name", "../x", "--", "true"}, `--name "../x" is not a plain file name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			dir := t.TempDir()
			env := func(k string) string {
				if k == contract.EnvSharedDir {
					return dir
				}
				return ""
			}
			if code := Main(tc.args, env, &stdout, &stderr); code != ExitUsage {
				t.Fatalf("exit code %d, want %d", code, ExitUsage)
			}
			var line map[string]any
			if err := json.Unmarshal(stderr.Bytes(), &line); err != nil {
				t.Fatalf("stderr %q is not one JSON line: %v", stderr.String(), err)
			}
			if msg, _ := line["msg"].(string); !strings.Contains(msg, tc.want) || !strings.HasPrefix(line["usage"].(string), "dislock-agent exec") {
				t.Errorf("log %v lacks %q or the usage line", line, tc.want)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("misuse wrote %v into the shared directory", entries)
			}
		})
	}
}

func TestFlagsDefaultToTheEnvironment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want Options
	}{
		{
			name: "the env names the directory and the container",
			env:  map[string]string{contract.EnvSharedDir: "/shared", contract.EnvContainerName: "worker"},
			args: []string{"--", "app", "-x"},
			want: Options{SharedDir: "/shared", Name: "worker", Poll: DefaultPoll, Command: []string{"app", "-x"}},
		},
		{
			name: "flags win over the env",
			env:  map[string]string{contract.EnvSharedDir: "/shared", contract.EnvContainerName: "worker"},
			args: []string{"--shared-dir", "/x", "--name", "y", "--poll", "1s", "--decision-timeout", "1m", "--", "app"},
			want: Options{SharedDir: "/x", Name: "y", Poll: time.Second, DecisionTimeout: time.Minute, Command: []string{"app"}},
		},
		{
			name: "without env the directory is /dislock",
			args: []string{"--name", "a", "--", "app"},
			want: Options{SharedDir: "/dislock", Name: "a", Poll: DefaultPoll, Command: []string{"app"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseArgs(tc.args, func(k string) string { return tc.env[k] }, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if got.SharedDir != tc.want.SharedDir || got.Name != tc.want.Name || got.Poll != tc.want.Poll ||
				got.DecisionTimeout != tc.want.DecisionTimeout || strings.Join(got.Command, " ") != strings.Join(tc.want.Command, " ") {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}

	t.Run("without a name the result file gets a random one", func(t *testing.T) {
		t.Parallel()
		a, errA := parseArgs([]string{"--", "app"}, func(string) string { return "" }, &bytes.Buffer{})
		b, errB := parseArgs([]string{"--", "app"}, func(string) string { return "" }, &bytes.Buffer{})
		if errA != nil || errB != nil {
			t.Fatal(errA, errB)
		}
		re := regexp.MustCompile(`^app-[0-9a-f]{8}$`)
		if !re.MatchString(a.Name) || !re.MatchString(b.Name) || a.Name == b.Name {
			t.Errorf("names %q and %q, want two different app-<8 hex>", a.Name, b.Name)
		}
	})
}

func TestTheLeaseWatch(t *testing.T) {
	t.Parallel()
	const now = int64(1_000_000_000)
	deadline := func(v string) func(p *pod) {
		return func(p *pod) {
			if err := os.WriteFile(p.shared.Path(protocol.DeadlineFile), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	gone := func(p *pod) { os.Remove(p.shared.Path(protocol.DeadlineFile)) }
	future, past := strconv.FormatInt(now+1, 10), strconv.FormatInt(now-1, 10)
	const ttl = int64(30 * time.Second)
	for _, tc := range []struct {
		name  string
		steps []func(p *pod) // each followed by a check; the last check's verdict counts
		lost  string         // "" when the lease still holds
	}{
		{"with no deadline and no revocation the command runs on", []func(*pod){func(*pod) {}}, ""},
		{"a deadline ahead holds", []func(*pod){deadline(future)}, ""},
		{"a deadline behind is lost", []func(*pod){deadline(past)}, "safety deadline passed"},
		{"a deadline exactly now still holds", []func(*pod){deadline(strconv.FormatInt(now, 10))}, ""},
		{"a revocation wins over a deadline ahead", []func(*pod){deadline(future), func(p *pod) { p.shared.Revoke("taken") }}, "lease lost: taken"},
		{"a revocation without a reason still says so", []func(*pod){func(p *pod) { p.shared.Revoke("") }}, "lease lost: the agent revoked it"},
		{"a garbled first deadline fails closed", []func(*pod){deadline("soon")}, "safety deadline unreadable"},
		{"a garbled later deadline keeps the last good one", []func(*pod){deadline(past), deadline("soon")}, "safety deadline passed"},
		{"a garbled later deadline does not lose a good one", []func(*pod){deadline(future), deadline("soon")}, ""},
		{"a vanished deadline keeps the last one in force", []func(*pod){deadline(past), gone}, "safety deadline passed"},
		{"a deadline further ahead than the TTL is of another boot", []func(*pod){deadline(strconv.FormatInt(now+2*ttl, 10))}, "safety deadline passed"},
		{"a deadline one TTL ahead holds", []func(*pod){deadline(strconv.FormatInt(now+ttl, 10))}, ""},
		{"a deadline of another boot by its id", []func(*pod){deadline(future + " 00000000-0000-0000-0000-000000000000")}, "safety deadline passed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newPod(t)
			lw := &leaseWatch{dir: p.shared, now: func() int64 { return now }, ttl: ttl}
			var why string
			var lost bool
			for _, step := range tc.steps {
				step(p)
				why, lost = lw.check()
			}
			if lost != (tc.lost != "") || !strings.HasPrefix(why, tc.lost) {
				t.Errorf("check() = %q, %v; want lost=%v with %q", why, lost, tc.lost != "", tc.lost)
			}
		})
	}
}

func TestNothingTheCommandStartedOutlivesALostLease(t *testing.T) {
	t.Parallel()
	p := newPod(t)
	p.decide(runDecision(7))
	// The app exits on SIGTERM at once, but leaves a background worker in
	// its process group that ignores SIGTERM.
	w := p.runScript(nil, `(trap '' TERM; while :; do sleep 0.02; done) &
echo $! > "$D/worker.pid"
trap 'exit 1' TERM
: > "$D/ready"
while :; do sleep 0.02; done`)
	eventually(t, "the command to start", func() bool { return p.exists("ready") || w.exited() })
	worker, err := strconv.Atoi(strings.TrimSpace(p.read("worker.pid")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(worker, syscall.SIGKILL) }) // should the test fail

	if err := p.shared.Revoke("lease expired"); err != nil {
		t.Fatal(err)
	}
	if code := w.wait(); code != 1 {
		t.Fatalf("exit code %d, want the command's 1; log:\n%s", code, w.rawLog())
	}
	eventually(t, "the background worker to be killed", func() bool {
		state, _, alive := procState(worker)
		return !alive || state == 'Z'
	})
}
