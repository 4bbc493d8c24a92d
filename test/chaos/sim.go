package chaos

// The Kubernetes simulator: a pod is real processes, each container in its
// own PID namespace; a small kubelet per pod and a Job controller per Job
// drive them the way Kubernetes does.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
)

// Event is one line of a schedule's log: what the simulated kubelet and Job
// controller did, and (Fault) what the nemesis injected.
type Event struct {
	At      time.Time
	Fault   bool
	Kind    string
	Cluster string
	Pod     string
	Detail  string
}

func (e Event) String() string {
	mark := " "
	if e.Fault {
		mark = "!"
	}
	return fmt.Sprintf("%s %s %-22s %-5s %-28s %s", e.At.Format("15:04:05.000"), mark, e.Kind, e.Cluster, e.Pod, e.Detail)
}

// container is one container's process: PID 1 of a fresh PID namespace, so
// that killing it kills everything it started, as the kernel does for a
// real container.
type container struct {
	name    string
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{}
	// Set before done is closed.
	exitedAt time.Time
	code     int // exit code, 128+signal when signalled
	// killedAt is when the nemesis or the kubelet sent SIGKILL (zero: never).
	mu       sync.Mutex
	killedAt time.Time
}

func startContainer(name, dir, logFile string, env []string, path string, args ...string) (*container, error) {
	out, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd := exec.Command(path, args...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID,
		Setpgid:    true,
		// Should the test binary die, no container outlives it.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting container %s: %w", name, err)
	}
	c := &container{name: name, cmd: cmd, started: time.Now(), done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		c.exitedAt = time.Now()
		c.code = exitCode(cmd.ProcessState)
		close(c.done)
	}()
	return c, nil
}

func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

func (c *container) signal(sig syscall.Signal) {
	if c == nil {
		return
	}
	if sig == syscall.SIGKILL {
		c.mu.Lock()
		if c.killedAt.IsZero() {
			c.killedAt = time.Now()
		}
		c.mu.Unlock()
	}
	_ = c.cmd.Process.Signal(sig)
}

// killed is when SIGKILL was sent, zero if never.
func (c *container) killed() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.killedAt
}

func (c *container) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop is the kubelet stopping a container: SIGTERM, SIGKILL after grace.
func (c *container) stop(grace time.Duration) {
	c.signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		c.signal(syscall.SIGKILL)
		<-c.done
	}
}

// end is when the container's processes were gone for the checker: the
// SIGKILL time if it was killed (it writes nothing after that), else its exit.
func (c *container) end() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.killedAt.IsZero() && (c.exitedAt.IsZero() || c.killedAt.Before(c.exitedAt)) {
		return c.killedAt
	}
	return c.exitedAt
}

// pod is one simulated pod: the dislock-agent native sidecar and one wrapped
// app container sharing a directory.
type pod struct {
	r                *run
	job              *job
	name             string
	attempt          int
	app              App
	dir              string // the shared emptyDir (DISLOCK_SHARED_DIR)
	env              []string
	appEnv           []string
	agentLog, appLog string
	created          time.Time

	mu          sync.Mutex
	agent       *container   // the current sidecar incarnation
	agents      []*container // every incarnation
	agentStart  time.Time
	agentStarts int
	appC        *container
	terminating bool
	// terminatingAt is when the kubelet began stopping the sidecar.
	terminatingAt time.Time
	deleteCh      chan struct{}
	deleteOnce    sync.Once
	deleteWhy     string
	stuck         bool
	// Set before ended is closed.
	ended   chan struct{}
	endedAt time.Time
}

// appScript is the ledger app: it appends a start line, sleeps, appends a
// stop line and exits with APP_EXIT; on SIGTERM it appends its stop line at
// once and exits 143. A SIGKILLed app writes no stop line: the checker then
// takes the kill (or container exit) time as the run's end.
const appScript = `now() { date +%s%N; }
trap 'echo "stop $(now) $RUN_ID token=${DISLOCK_FENCING_TOKEN:-none} code=143" >>"$LEDGER"; exit 143' TERM INT
echo "start $(now) $RUN_ID token=${DISLOCK_FENCING_TOKEN:-none} dwin=${DISLOCK_WINDOW:-none}" >>"$LEDGER"
sleep "$APP_SLEEP" &
wait $!
echo "stop $(now) $RUN_ID token=${DISLOCK_FENCING_TOKEN:-none} code=$APP_EXIT" >>"$LEDGER"
exit "$APP_EXIT"
`

func (p *pod) event(fault bool, kind, format string, args ...any) {
	p.r.event(Event{Fault: fault, Kind: kind, Cluster: p.job.cl.name, Pod: p.name, Detail: fmt.Sprintf(format, args...)})
}

// delete is the API server deleting the pod: the kubelet stops the app
// container, then the sidecar.
func (p *pod) delete(why string) {
	p.deleteOnce.Do(func() {
		p.mu.Lock()
		p.deleteWhy = why
		p.mu.Unlock()
		p.event(false, "pod-deleted", "%s", why)
		close(p.deleteCh)
	})
}

func (p *pod) deleted() bool {
	select {
	case <-p.deleteCh:
		return true
	default:
		return false
	}
}

func (p *pod) isEnded() bool {
	select {
	case <-p.ended:
		return true
	default:
		return false
	}
}

func (p *pod) startAgentLocked() error {
	args := append([]string{"agent"}, p.r.w.AgentArgs...)
	c, err := startContainer("dislock-agent", p.dir, p.agentLog, p.env, p.r.w.AgentBin, args...)
	if err != nil {
		return err
	}
	p.agent, p.agentStart = c, time.Now()
	p.agents = append(p.agents, c)
	p.agentStarts++
	return nil
}

// kubelet runs the pod to its end.
func (p *pod) kubelet() {
	s := p.r.w.Settings
	defer func() {
		p.endedAt = time.Now()
		close(p.ended)
		p.event(false, "pod-ended", "app %s, sidecar started %d times", p.appOutcome(), p.agentStarts)
		p.job.podEnded(p)
	}()
	p.mu.Lock()
	err := p.startAgentLocked()
	p.mu.Unlock()
	if err != nil {
		p.event(false, "sidecar-failed", "%v", err)
		return
	}
	restarter := make(chan struct{})
	go p.restartSidecar(restarter)

	if p.awaitProbe() {
		if p.app.NeverStart {
			p.event(false, "app-never-starts", "ImagePullBackOff: only the Job's deadline ends this pod")
			<-p.deleteCh
		} else {
			p.runApp()
		}
	}

	p.mu.Lock()
	p.terminating, p.terminatingAt = true, time.Now()
	agent := p.agent
	p.mu.Unlock()
	agent.stop(s.Grace)
	if k := agent.killed(); !k.IsZero() && k.After(p.terminatingAt) {
		p.event(false, "sidecar-killed", "still running %s after SIGTERM: SIGKILL", s.Grace)
	}
	<-restarter
}

// awaitProbe polls `dislock-agent probe` like a startupProbe. It returns
// false if the pod was deleted first. A sidecar that does not pass it within
// ProbeBudget of its start is killed and restarted.
func (p *pod) awaitProbe() bool {
	s := p.r.w.Settings
	tick := time.NewTicker(s.ProbePeriod)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		probe := exec.CommandContext(ctx, p.r.w.AgentBin, "probe")
		probe.Env = []string{contract.EnvSharedDir + "=" + p.dir}
		err := probe.Run()
		cancel()
		if err == nil {
			p.event(false, "probe-passed", "")
			return true
		}
		p.mu.Lock()
		agent, started := p.agent, p.agentStart
		p.mu.Unlock()
		if time.Since(started) > s.ProbeBudget && !agent.exited() {
			p.event(false, "probe-budget", "startupProbe failed for %s: kubelet kills the sidecar", s.ProbeBudget)
			go agent.stop(s.Grace)
			p.mu.Lock()
			p.agentStart = time.Now() // the restarted one gets a full budget
			p.mu.Unlock()
		}
		select {
		case <-p.deleteCh:
			return false
		case <-tick.C:
		}
	}
}

// restartSidecar is the kubelet's restartPolicy Always for the native
// sidecar while the pod runs.
func (p *pod) restartSidecar(done chan<- struct{}) {
	defer close(done)
	backoff := 200 * time.Millisecond
	for {
		p.mu.Lock()
		c := p.agent
		p.mu.Unlock()
		<-c.done
		p.mu.Lock()
		if p.terminating {
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		p.event(false, "sidecar-exited", "code %d; kubelet restarts it in %s", c.code, backoff)
		time.Sleep(backoff)
		backoff = min(2*backoff, 2*time.Second)
		p.mu.Lock()
		if p.terminating {
			p.mu.Unlock()
			return
		}
		err := p.startAgentLocked()
		p.mu.Unlock()
		if err != nil {
			p.event(false, "sidecar-failed", "%v", err)
			return
		}
	}
}

// runApp starts the wrapped app container and waits for it to exit, or
// stops it when the pod is deleted.
func (p *pod) runApp() {
	bin := filepath.Join(p.dir, protocol.BinPath)
	c, err := startContainer(appContainer, p.dir, p.appLog, p.appEnv, bin, "exec", "--", "/bin/sh", "-c", appScript)
	if err != nil {
		p.event(false, "app-failed", "%v (CreateContainerError)", err)
		<-p.deleteCh
		return
	}
	p.mu.Lock()
	p.appC = c
	p.mu.Unlock()
	p.event(false, "app-started", "sleep %s, exit %d", p.app.Sleep.Round(time.Millisecond), p.app.Exit)
	select {
	case <-c.done:
	case <-p.deleteCh:
		c.stop(p.r.w.Settings.Grace)
	}
	p.event(false, "app-exited", "code %d", c.code)
}

// appOutcome describes how the app container ended, for the log.
func (p *pod) appOutcome() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.appC == nil && p.app.NeverStart:
		return "never started"
	case p.appC == nil:
		return "not started"
	default:
		return "exited " + strconv.Itoa(p.appC.code)
	}
}

// appCode is the app container's exit code, or -1 if it never ran.
func (p *pod) appCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.appC == nil {
		return -1
	}
	return p.appC.code
}

// killAll is the last resort when a schedule overruns: everything dies.
func (p *pod) killAll() {
	p.mu.Lock()
	p.terminating = true
	cs := []*container{p.agent, p.appC}
	p.mu.Unlock()
	for _, c := range cs {
		if c != nil && !c.exited() {
			c.signal(syscall.SIGCONT)
			c.signal(syscall.SIGKILL)
		}
	}
}

// job is one cluster's Job for one window, with the Job controller's rules:
// restartPolicy Never, a new pod after a failed one until BackoffLimit,
// complete after the first pod whose app succeeded (the others are
// deleted), and the deadline the runner enforces.
type job struct {
	r      *run
	cl     *cluster
	window int
	// index is the completion index of an Indexed Job, -1 otherwise. An
	// Indexed Job is simulated as one job value per index (each with its
	// own pods and backoff), sharing name and UID.
	index   int
	name    string
	uid     string
	created time.Time

	mu       sync.Mutex
	pods     []*pod
	active   int
	failures int
	done     bool
	result   string
	doneCh   chan struct{}
}

// newPodLocked creates the Job's next pod and starts its kubelet.
func (j *job) newPodLocked(why string) *pod {
	attempt := len(j.pods)
	p := &pod{
		r: j.r, job: j, attempt: attempt,
		name:     fmt.Sprintf("%s-%s%s-p%d", j.name, j.cl.name[len(j.cl.name)-1:], j.indexLabel(), attempt),
		app:      j.r.plan.AppOf(j.r.w.Settings, j.cl.idx, j.window, max(j.index, 0), attempt),
		created:  time.Now(),
		deleteCh: make(chan struct{}),
		ended:    make(chan struct{}),
	}
	p.dir = filepath.Join(j.r.dir, "pods", p.name)
	p.agentLog = filepath.Join(j.r.dir, "logs", p.name+".agent.log")
	p.appLog = filepath.Join(j.r.dir, "logs", p.name+".app.log")
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		j.r.event(Event{Kind: "error", Detail: err.Error()})
	}
	var err error
	if p.env, p.appEnv, err = j.r.podEnv(j, p); err != nil {
		j.r.event(Event{Kind: "error", Detail: err.Error()})
	}
	j.pods = append(j.pods, p)
	j.active++
	j.r.addPod(p)
	p.event(false, "pod-created", "%s", why)
	go p.kubelet()
	return p
}

// indexLabel is "" or "-i<index>", for pod names.
func (j *job) indexLabel() string {
	if j.index < 0 {
		return ""
	}
	return fmt.Sprintf("-i%d", j.index)
}

func (j *job) podEnded(p *pod) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.active--
	code := p.appCode()
	p.mu.Lock()
	deletedByJob := p.deleteWhy == "job complete" || p.deleteWhy == "job deadline"
	p.mu.Unlock()
	switch {
	case j.done:
	case code == 0:
		j.finishLocked("succeeded")
		for _, o := range j.pods {
			if o != p && !o.isEnded() {
				go o.delete("job complete")
			}
		}
	case deletedByJob:
	default:
		j.failures++
		if j.failures > j.r.w.Settings.BackoffLimit {
			j.finishLocked("failed: backoffLimit")
		} else if j.active == 0 {
			j.newPodLocked(fmt.Sprintf("pod %s failed (%s)", p.name, p.appOutcome()))
		}
	}
	if j.done && j.active == 0 {
		close(j.doneCh)
	}
}

func (j *job) finishLocked(result string) {
	j.done, j.result = true, result
	j.r.event(Event{Kind: "job-" + result, Cluster: j.cl.name, Pod: j.name})
}

// newestPod is the Job's newest pod that has not ended, or nil.
func (j *job) newestPod() *pod {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i := len(j.pods) - 1; i >= 0; i-- {
		if !j.pods[i].isEnded() {
			return j.pods[i]
		}
	}
	return nil
}

// replace is the Job controller creating a replacement while p still lives
// (podReplacementPolicy TerminatingOrFailed). With evict, p is being
// deleted (drain); else its node is lost and p runs on.
func (j *job) replace(p *pod, evict bool) bool {
	j.mu.Lock()
	if j.done || p.isEnded() {
		j.mu.Unlock()
		return false
	}
	j.newPodLocked("replacement for " + p.name)
	j.mu.Unlock()
	if evict {
		p.delete("evicted")
	}
	return true
}

// deadline ends the Job (activeDeadlineSeconds): every live pod is deleted.
func (j *job) deadline() []*pod {
	j.mu.Lock()
	if !j.done {
		j.finishLocked("failed: deadline")
		if j.active == 0 {
			close(j.doneCh)
		}
	}
	var live []*pod
	for _, p := range j.pods {
		if !p.isEnded() {
			live = append(live, p)
		}
	}
	j.mu.Unlock()
	for _, p := range live {
		p.delete("job deadline")
	}
	return live
}
