package agent_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/agent"
	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/gateway"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/gatewaytest"
	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/pgtest"
)

// agentBin is dislock-agent built once for the package's tests: every
// simulated pod runs it twice, as the sidecar and (from the copy the sidecar
// installs in the shared directory) as the wrapper.
var agentBin string

func TestMain(m *testing.M) {
	if code, ok := agent.HerdChild(); ok {
		os.Exit(code)
	}
	if code, ok := agent.HerdGatewayChild(); ok {
		os.Exit(code)
	}
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "dislock-agent-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		agentBin = filepath.Join(dir, "dislock-agent")
		if out, err := exec.Command("go", "build", "-ldflags=-s -w", "-o", agentBin, "../cmd/dislock-agent").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building dislock-agent: %v\n%s", err, out)
			return 1
		}
		code := pgtest.Main(m, pgtest.Options{Name: "agent"})
		// The sidecar's memory limit (webhook.DefaultAgentMemoryLimit) is
		// set against this figure (docs/benchmarks.md).
		if n, peak := agentPeak.get(); n > 0 {
			fmt.Fprintf(os.Stderr, "agent: peak RSS of %d agent processes: max %.1f MiB\n", n, float64(peak)/(1<<20))
		}
		return code
	}())
}

// agentPeak is the largest peak RSS of the agent processes the tests ran
// to their end.
var agentPeak peakRSS

type peakRSS struct {
	mu    sync.Mutex
	n     int
	bytes int64
}

func (p *peakRSS) note(ps *os.ProcessState) {
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	p.bytes = max(p.bytes, ru.Maxrss<<10) // Linux reports kilobytes
}

func (p *peakRSS) get() (int, int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n, p.bytes
}

var keySeq atomic.Int64

func uniqueKey(t *testing.T) string {
	return fmt.Sprintf("agent-%d/%s", keySeq.Add(1), strings.ToLower(strings.NewReplacer("/", "-", " ", "-", "_", "-").Replace(t.Name())))
}

// job describes what the CronJob of every simulated cluster looks like.
type job struct {
	dsn     string
	key     string
	mode    string
	ttl     time.Duration
	standby bool
	catchup string
	ledger  string // file the apps append start/stop lines to
	extra   []string
	// gateways, when set, are the lock gateways by cluster the pods reach
	// the database through, instead of dsn.
	gateways map[string]*gatewaytest.Gateway
}

// throughGateways has the job's pods reach the database through a lock
// gateway of their cluster's, one per cluster named, over j.dsn.
func (j job) throughGateways(t *testing.T, clusters ...string) job {
	j.gateways = map[string]*gatewaytest.Gateway{}
	for _, c := range clusters {
		j.gateways[c] = gatewaytest.Start(t, j.dsn, gateway.Config{Cluster: c})
	}
	return j
}

// databaseURL is what cluster's pods take as their database URL.
func (j job) databaseURL(cluster string) string {
	if gw, ok := j.gateways[cluster]; ok {
		ns, _, _ := strings.Cut(j.key, "/")
		return gw.URL(ns)
	}
	return j.dsn
}

// podSpec is one cluster's pod of one window.
type podSpec struct {
	cluster string
	window  time.Time // zero: manual run
	jobName string    // default <key name>-<minutes>
	podName string    // default jobName-pod
	// app is the shell script the wrapped container runs.
	app string
	// agentArgs are extra flags for the sidecar.
	agentArgs []string
	// clock shifts the agent's local wall clock (test-only flag).
	clock time.Duration
	// env is extra environment for this pod's sidecar and wrapper.
	env []string
}

// pod is a simulated Kubernetes pod: a sidecar process and one wrapped app
// container process sharing a directory, started in the kubelet's order.
type pod struct {
	t          *testing.T
	spec       podSpec
	dir        string
	termLog    string
	env        []string
	agent      *exec.Cmd
	agentDone  chan struct{}
	agentLog   *harness.Buffer
	wrapper    *exec.Cmd
	wrapperLog *harness.Buffer
	exit       int
}

func (j job) env(p podSpec, dir, termLog string) []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"DISLOCK_MODE=" + j.mode,
		"DISLOCK_KEY=" + j.key,
		"DISLOCK_LEASE_TTL=" + j.ttl.String(),
		"DISLOCK_STANDBY=" + strconv.FormatBool(j.standby),
		"DISLOCK_CATCHUP=" + j.catchup,
		"DISLOCK_CLUSTER=" + p.cluster,
		"DISLOCK_JOB_NAME=" + p.jobName,
		"DISLOCK_JOB_UID=uid-" + p.cluster + "-" + p.jobName,
		"DISLOCK_POD_NAME=" + p.podName,
		"DISLOCK_DATABASE_URL=" + j.databaseURL(p.cluster),
		"DISLOCK_SHARED_DIR=" + dir,
		"DISLOCK_TERMINATION_LOG=" + termLog,
		// As the webhook renders it: the pod's one app container is named.
		contract.EnvAppContainers + "=app",
		contract.EnvContainerName + "=app",
		"LEDGER=" + j.ledger,
		"CLUSTER=" + p.cluster,
	}
	if !p.window.IsZero() {
		env = append(env, "DISLOCK_WINDOW="+p.window.UTC().Format(time.RFC3339))
	}
	return append(append(env, j.extra...), p.env...)
}

// start runs the sidecar, waits for its startupProbe to pass, then starts
// the wrapped app container, as the kubelet does.
//
// It returns once the agent has taken its first step against the database:
// decided, or begun to wait (a standby). The startup probe passes as soon
// as the agent installed its binary, which may be before that, and a story
// that starts dc-a, then dc-b, means dc-a to have claimed first, not
// whichever the machine's scheduler let through.
func (j job) start(t *testing.T, p podSpec) *pod {
	t.Helper()
	po := j.sidecar(t, p)
	po.startWrapper()
	// By the log line, not the decision file: the agent writes the
	// decision file, then the termination message, then logs; a test that
	// reads the termination message after start must find it written.
	await(t, "the agent's first step (a decision, or waiting)", 60*time.Second, func() bool {
		select {
		case <-po.agentDone:
			return true
		default:
		}
		log := po.agentLog.String()
		return strings.Contains(log, `"msg":"decision"`) || strings.Contains(log, `"msg":"waiting: `)
	})
	return po
}

// sidecar runs only the sidecar and waits for its startupProbe: a pod whose
// app container has not started (yet, or ever: an image that cannot be
// pulled).
func (j job) sidecar(t *testing.T, p podSpec) *pod {
	t.Helper()
	if p.jobName == "" {
		_, name, _ := strings.Cut(j.key, "/")
		minutes := p.window.Unix() / 60
		if p.window.IsZero() {
			minutes = time.Now().UnixNano()
		}
		p.jobName = fmt.Sprintf("%s-%d", name, minutes)
	}
	if p.podName == "" {
		p.podName = p.jobName + "-pod"
	}
	dir := t.TempDir()
	po := &pod{t: t, spec: p, dir: dir, termLog: filepath.Join(dir, "termination-log"), agentLog: &harness.Buffer{}, wrapperLog: &harness.Buffer{}}
	po.env = j.env(p, dir, po.termLog)
	po.startAgent()
	t.Cleanup(po.kill)
	po.awaitProbe()
	return po
}

// startWrapper starts the wrapped app container; called again after it
// exited, it is the kubelet restarting it in the same pod (restartPolicy
// OnFailure).
func (po *pod) startWrapper() {
	po.t.Helper()
	po.wrapper = exec.Command(filepath.Join(po.dir, protocol.BinPath), "exec", "--", "/bin/sh", "-c", po.spec.app)
	po.wrapper.Env = po.env
	po.wrapper.Stdout, po.wrapper.Stderr = po.wrapperLog, po.wrapperLog
	if err := po.wrapper.Start(); err != nil {
		po.t.Fatalf("starting the wrapper: %v", err)
	}
}

func (po *pod) startAgent() {
	// Short TTLs keep the tests quick; the bounds users get are tested in package contract.
	args := append([]string{"agent", "--test-allow-short-ttl"}, po.spec.agentArgs...)
	if po.spec.clock != 0 {
		args = append(args, "--test-wall-clock-offset="+po.spec.clock.String())
	}
	starts := strings.Count(po.agentLog.String(), `"msg":"starting"`)
	po.agent = exec.Command(agentBin, args...)
	po.agent.Env = po.env
	po.agent.Stdout, po.agent.Stderr = po.agentLog, po.agentLog
	if err := po.agent.Start(); err != nil {
		po.t.Fatalf("starting the agent: %v", err)
	}
	done := make(chan struct{})
	po.agentDone = done
	go func(cmd *exec.Cmd) {
		cmd.Wait()
		agentPeak.note(cmd.ProcessState)
		close(done)
	}(po.agent)
	// The agent logs "starting" after it installed its signal handler: a
	// SIGTERM before that would kill it, which a test must not mistake for
	// the agent's behaviour.
	await(po.t, "the agent to start", 30*time.Second, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		return strings.Count(po.agentLog.String(), `"msg":"starting"`) > starts
	})
}

// awaitProbe polls `dislock-agent probe` like the startupProbe does.
func (po *pod) awaitProbe() {
	po.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		probe := exec.Command(agentBin, "probe")
		probe.Env = po.env
		if probe.Run() == nil {
			return
		}
		select {
		case <-po.agentDone:
			po.t.Fatalf("agent exited before deciding:\n%s", po.agentLog)
		default:
		}
		if time.Now().After(deadline) {
			po.t.Fatalf("no decision after 60s:\n%s", po.agentLog)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// finish waits for the app container to exit, then stops the sidecar the way
// the kubelet stops native sidecars (SIGTERM) and waits for it.
func (po *pod) finish() int {
	po.t.Helper()
	po.waitWrapper()
	po.stopAgent()
	return po.exit
}

func (po *pod) waitWrapper() {
	po.t.Helper()
	err := po.wrapper.Wait()
	po.exit = po.wrapper.ProcessState.ExitCode()
	if po.exit < 0 {
		po.t.Fatalf("wrapper: %v\n%s", err, po.wrapperLog)
	}
}

func (po *pod) stopAgent() {
	po.t.Helper()
	if err := po.agent.Process.Signal(syscall.SIGTERM); err == nil {
		select {
		case <-po.agentDone:
		case <-time.After(30 * time.Second):
			po.t.Fatalf("agent did not stop after SIGTERM:\n%s", po.agentLog)
		}
	}
	if code := po.agent.ProcessState.ExitCode(); code != 0 {
		po.t.Fatalf("agent exited %d:\n%s", code, po.agentLog)
	}
}

func (po *pod) kill() {
	for _, c := range []*exec.Cmd{po.wrapper, po.agent} {
		if c != nil && c.Process != nil && c.ProcessState == nil {
			c.Process.Kill()
		}
	}
	if po.t.Failed() {
		po.t.Logf("pod %s/%s agent log:\n%s\nwrapper log:\n%s", po.spec.cluster, po.spec.podName, po.agentLog, po.wrapperLog)
	}
}

func (po *pod) decision() protocol.Decision {
	po.t.Helper()
	d, ok, err := protocol.Dir(po.dir).ReadDecision()
	if !ok || err != nil {
		po.t.Fatalf("no decision: %v", err)
	}
	return d
}

func (po *pod) terminationMessage() string {
	b, _ := os.ReadFile(po.termLog)
	return strings.TrimSpace(string(b))
}

// app scripts. Each appends "start" and "stop" lines with the cluster, the
// window, the fencing token and a nanosecond timestamp to the ledger, and
// stops promptly (recording it) on SIGTERM.
func app(seconds float64, exitCode int) string {
	return fmt.Sprintf(`line() { echo "$1 $CLUSTER ${DISLOCK_WINDOW:-manual} ${DISLOCK_FENCING_TOKEN:-0} $(date +%%s%%N)" >> "$LEDGER"; }
line start
trap 'line stop; exit 143' TERM
sleep %g & wait $!
line stop
exit %d`, seconds, exitCode)
}

type run struct {
	cluster, window string
	token           int64
	start, stop     int64
}

// readLedger pairs start and stop lines per cluster and window.
func readLedger(t *testing.T, path string) []run {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var runs []run
	open := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev, cluster, window string
		var token, ts int64
		if _, err := fmt.Sscan(sc.Text(), &ev, &cluster, &window, &token, &ts); err != nil {
			t.Fatalf("ledger line %q: %v", sc.Text(), err)
		}
		id := cluster + " " + window
		switch ev {
		case "start":
			open[id] = len(runs)
			runs = append(runs, run{cluster: cluster, window: window, token: token, start: ts})
		case "stop":
			runs[open[id]].stop = ts
		}
	}
	return runs
}

// assertNoOverlap fails if two runs were ever active at the same time, and
// if a later start carries an older fencing token.
func assertNoOverlap(t *testing.T, runs []run) {
	t.Helper()
	sorted := slices.Clone(runs)
	slices.SortFunc(sorted, func(a, b run) int { return int(a.start - b.start) })
	for i, r := range sorted {
		if r.stop == 0 {
			t.Fatalf("run %+v never recorded its stop", r)
		}
		if i > 0 {
			prev := sorted[i-1]
			if r.start < prev.stop {
				t.Fatalf("runs overlap: %+v started %s before %+v stopped", r, time.Duration(prev.stop-r.start), prev)
			}
			if r.token <= prev.token {
				t.Fatalf("run %+v has token %d after a run with token %d", r, r.token, prev.token)
			}
		}
	}
}

func openStore(t testing.TB, dsn string) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), dsn, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := migrate.Up(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return s
}

// await waits for a condition on the shared files or the ledger.
func await(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitRuns waits until the ledger holds n runs.
func (j job) awaitRuns(t *testing.T, what string, n int) {
	t.Helper()
	await(t, what, 10*time.Second, func() bool { return len(readLedger(t, j.ledger)) == n })
}

// ownBouncer starts a PgBouncer of the test's own, to cut one simulated
// cluster off from the database (Stop, Pause) while the others keep theirs.
func ownBouncer(t *testing.T, name string) *pgtest.Bouncer {
	t.Helper()
	bn, err := pgtest.Need(t).AddBouncer(fmt.Sprintf("%s-%d", name, time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bn.Stop() })
	return bn
}
