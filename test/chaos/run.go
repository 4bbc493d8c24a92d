package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/test/gatewaytest"
	"github.com/dislock/dislock/test/pgtest"
)

// World is what the schedules of one run share: the agent binary and the
// one PostgreSQL.
type World struct {
	AgentBin string
	// AgentArgs are extra sidecar flags (--test-allow-short-ttl).
	AgentArgs []string
	PG        *pgtest.Server
	Settings  Settings
	// WindowBase is window 0's start in every schedule (keys differ, so
	// windows may repeat): a recent minute, because the agent skips windows
	// older than what retention keeps.
	WindowBase time.Time
	// Bouncers are every slot's, probed after a PostgreSQL restart: a
	// bouncer serves again only once its server login works, which may be
	// a server_login_retry after PostgreSQL is up.
	Bouncers []*pgtest.Bouncer

	// pgMu serialises PostgreSQL restarts; pgEvents records them for every
	// schedule's log, since they hit every schedule running then.
	pgMu      sync.Mutex
	lastPG    time.Time
	pgEvents  []Event
	pgOutages []Outage
	// pgBusy: a PostgreSQL restart is under way; pgHealed: when the last
	// one ended (every bouncer serving again).
	pgBusy     bool
	pgHealed   time.Time
	pgEventsMu sync.Mutex
}

// pgQuiet is when PostgreSQL restarts, any schedule's, last stopped
// hindering: now while one is under way.
func (w *World) pgQuiet() time.Time {
	w.pgEventsMu.Lock()
	defer w.pgEventsMu.Unlock()
	if w.pgBusy {
		return time.Now()
	}
	return w.pgHealed
}

// Outage is a time during which some pods could not reach the database
// whatever their sidecars did: a PostgreSQL restart (Cluster ""), a cluster
// cut or a bouncer restart (Pod ""), or one pod's sidecar paused.
type Outage struct {
	From, To     time.Time
	Cluster, Pod string
	What         string
	// Serving is, for a PostgreSQL restart, when each bouncer (by name)
	// served a query again; a cluster's outage lasts until its bouncer's.
	Serving map[string]time.Time
	seed    uint64 // of the schedule that restarted PostgreSQL
}

// hits reports whether o cuts pod of cluster off.
func (o Outage) hits(cluster, pod string) bool {
	return (o.Cluster == "" || o.Cluster == cluster) && (o.Pod == "" || o.Pod == pod)
}

// Slot is one worker's set of clusters: a PgBouncer per cluster, reused by
// the schedules the worker runs one after another (so a bouncer fault hits
// only its own schedule).
type Slot struct {
	Bouncers []*pgtest.Bouncer
	// Gateways are a lock gateway per cluster, in front of its bouncer:
	// plans with Gateway run through them.
	Gateways []*gatewaytest.Process
}

type cluster struct {
	idx     int
	name    string
	bouncer *pgtest.Bouncer
	// gateway, when the plan runs through gateways, is what the pods
	// reach instead of the bouncer.
	gateway *gatewaytest.Process
}

// databaseURL is what the cluster's pods of key take from their database
// Secret.
func (c *cluster) databaseURL(key string) string {
	if c.gateway != nil {
		ns, _, _ := strings.Cut(key, "/")
		return c.gateway.URL(ns)
	}
	return c.bouncer.DSN()
}

// run is one schedule being executed.
type run struct {
	w     *World
	plan  Plan
	index int
	key   string
	name  string
	dir   string
	start time.Time

	ledger   string
	clusters []*cluster

	mu     sync.Mutex
	events []Event
	jobs   []*job
	pods   []*pod
	faults int
	kinds  map[Kind]bool
	// cuts are the [from, to) times each cluster was cut from the database.
	cuts map[string][][2]time.Time
	// outages are this schedule's own (PostgreSQL's are the World's).
	outages []Outage
	// flips are the owner's pauses and resumes of the key, in order.
	flips []PauseFlip
}

func (r *run) outage(from time.Time, cluster, pod, what string) {
	r.mu.Lock()
	r.outages = append(r.outages, Outage{From: from, To: time.Now(), Cluster: cluster, Pod: pod, What: what})
	r.mu.Unlock()
}

func (r *run) event(e Event) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *run) fault(k Kind, cl, pod, format string, args ...any) {
	r.mu.Lock()
	r.faults++
	r.kinds[k] = true
	r.mu.Unlock()
	r.event(Event{Fault: true, Kind: string(k), Cluster: cl, Pod: pod, Detail: fmt.Sprintf(format, args...)})
}

func (r *run) missed(f Fault, why string) {
	r.event(Event{Kind: "missed " + string(f.Kind), Detail: f.String() + ": " + why})
}

func (r *run) addPod(p *pod) {
	r.mu.Lock()
	r.pods = append(r.pods, p)
	r.mu.Unlock()
}

// windowStart is window w's instant: WindowBase plus w minutes.
func (r *run) windowStart(w int) time.Time {
	return r.w.WindowBase.Add(time.Duration(w) * time.Minute).UTC()
}

// appContainer is the name of every simulated pod's one app container.
const appContainer = "app"

// podEnv is the sidecar's environment and the app container's, as the
// webhook renders them: the sidecar's from contract.AgentEnv.Render (so the
// simulator sets exactly the variables the webhook does, DISLOCK_APP_CONTAINERS
// included), with the references the kubelet resolves (downward API, the
// database Secret) resolved here; the app container's wrapper gets
// DISLOCK_CONTAINER_NAME.
func (r *run) podEnv(j *job, p *pod) (agent, app []string, err error) {
	s := r.w.Settings
	mode, err := contract.ParseMode(r.plan.Mode)
	if err != nil {
		return nil, nil, err
	}
	e := contract.AgentEnv{
		Mode:            mode,
		Key:             r.key,
		Window:          r.windowStart(j.window),
		Schedule:        "* * * * *",
		TimeZone:        "UTC",
		LeaseTTL:        s.TTL,
		Standby:         r.plan.Standby,
		AppStartTimeout: s.AppStartTimeout,
		PreferGrace:     r.plan.PreferGrace,
		Indexed:         j.index >= 0,
		JobIndex:        max(j.index, 0),
		Completions:     r.plan.Completions,
		AppContainers:   []string{appContainer},
		// The simulated Jobs run restartPolicy Never pods, and the
		// webhook says so.
		RestartPolicy:  contract.RestartNever,
		Cluster:        j.cl.name,
		JobName:        j.name,
		JobUID:         j.uid,
		PodName:        p.name,
		SharedDir:      p.dir,
		TerminationLog: filepath.Join(p.dir, "termination-log"),
	}
	if r.plan.Prefer >= 0 {
		e.PreferCluster = ClusterName(r.plan.Prefer)
	}
	path := "PATH=" + os.Getenv("PATH")
	agent = []string{path}
	for _, v := range e.Render() {
		val := v.Value
		switch {
		case v.FromDatabaseSecret:
			val = j.cl.databaseURL(r.key)
		case v.FieldPath == contract.FieldPodName:
			val = p.name
		case v.FieldPath == contract.FieldJobUID:
			val = j.uid
		case v.FieldPath == contract.FieldJobName:
			val = j.name
		case v.FieldPath == contract.FieldJobCompletionIndex:
			val = strconv.Itoa(j.index)
		case v.FieldPath != "":
			return nil, nil, fmt.Errorf("the simulator cannot resolve %s from field %s", v.Name, v.FieldPath)
		}
		agent = append(agent, v.Name+"="+val)
	}
	app = []string{
		path,
		contract.EnvSharedDir + "=" + p.dir,
		contract.EnvContainerName + "=" + appContainer,
		"LEDGER=" + r.ledger,
		fmt.Sprintf("RUN_ID=cluster=%s job=%s pod=%s w=%d i=%d", j.cl.name, j.name, p.name, j.window, j.index),
		fmt.Sprintf("APP_SLEEP=%.3f", p.app.Sleep.Seconds()),
		"APP_EXIT=" + strconv.Itoa(p.app.Exit),
	}
	return agent, app, nil
}

// createJob is cluster c's CronJob controller at window w's tick. An
// Indexed Job starts a pod for every completion index at once.
func (r *run) createJob(c, w int) {
	cl := r.clusters[c]
	minutes := r.windowStart(w).Unix() / 60
	indexes := r.plan.Indexes(c)
	r.event(Event{Kind: "job-created", Cluster: cl.name, Pod: fmt.Sprintf("%s-%d", r.name, minutes),
		Detail: "window " + strconv.Itoa(w) + " " + r.windowStart(w).Format(time.RFC3339)})
	for _, i := range indexes {
		j := &job{r: r, cl: cl, window: w, index: i, created: time.Now(), doneCh: make(chan struct{})}
		j.name = fmt.Sprintf("%s-%d", r.name, minutes)
		j.uid = fmt.Sprintf("uid-%s-%s-%d", cl.name, r.name, minutes)
		r.mu.Lock()
		r.jobs = append(r.jobs, j)
		r.mu.Unlock()
		j.mu.Lock()
		j.newPodLocked("new Job")
		j.mu.Unlock()
	}
}

// faultTargets are the Jobs a pod fault may hit, best first: the planned
// one, the same window's in the other clusters, then the others, newest
// window first.
func (r *run) faultTargets(f Fault) []*job {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ts []*job
	rank := func(j *job) int {
		switch {
		case j.cl.idx == f.Cluster && j.window == f.Window && j.index <= 0:
			return 0
		case j.window == f.Window:
			return 1
		default:
			return 2
		}
	}
	for _, j := range r.jobs {
		ts = append(ts, j)
	}
	slices.SortStableFunc(ts, func(a, b *job) int {
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		return b.window - a.window
	})
	return ts
}

// Outcome is everything a finished schedule left for the checker.
type Outcome struct {
	Plan     Plan
	Settings Settings
	Key      string
	Dir      string
	Start    time.Time
	// Quiet is when the last injected fault was healed, or the last PostgreSQL
	// restart (another schedule's too) ended, whichever is later.
	Quiet time.Time
	End   time.Time
	// Faults counts injected faults; Kinds lists the distinct kinds.
	Faults int
	Kinds  []Kind
	Events []Event
	Ledger string
	Pods   []PodRecord
	Jobs   []JobRecord
	// Cuts are the intervals each cluster was cut from the database.
	Cuts map[string][][2]time.Time
	// Outages are the times pods could not reach the database whatever
	// their sidecars did (cuts, bouncer and PostgreSQL restarts, paused
	// sidecars); a sidecar's own absence is in PodRecord.Sidecars.
	Outages []Outage
	// Rows are the database rows of the key, one JSON object a line per table.
	Rows string
	// Windows are the windows' starts, RFC 3339.
	Windows []string
	// WindowStates maps a window's RFC 3339 start (and "/<index>" for an
	// Indexed Job's) to its row's state.
	WindowStates map[string]string
	// WindowClaims maps the same keys to the row's last claim: its owner
	// and when it claimed, by the database's clock.
	WindowClaims map[string]WindowClaim
	// Overran: the schedule had to be killed at its hard deadline.
	Overran bool
	// Pauses are the owner's pauses and resumes of the key, in order, with
	// their brackets in database time (PauseKey).
	Pauses []PauseFlip
	// Grants are every grant of the key's windows and leases (the grant
	// log's, and the rows' last ones), by the database's clock.
	Grants []Grant
}

// WindowClaim is a window row's owner (dislock's owner string, ending in
// its pod's name), its token, and when that owner claimed it.
type WindowClaim struct {
	Owner     string
	Token     int64
	ClaimedAt time.Time
}

// PodRecord is what the checker knows about one pod.
type PodRecord struct {
	Cluster, Job, Name string
	Window, Attempt    int
	Index              int // -1: not Indexed
	App                App
	Created, Ended     time.Time
	DeletedWhy         string
	// Stuck: still alive StuckBound after the later of its creation and the
	// last healed fault; deleted by its Job's deadline.
	Stuck   bool
	AppRan  bool
	AppEnd  time.Time
	AppCode int
	// AppResult is the exit code in the wrapper's result file (what the
	// agent records), -1 when the wrapper wrote none.
	AppResult     int
	AgentLog      string
	SidecarStarts int
	// Sidecars are the sidecar's incarnations.
	Sidecars []Incarnation
}

// Incarnation is one run of a sidecar, from its start to its exit or
// SIGKILL (To zero: still running at the end).
type Incarnation struct {
	From, To time.Time
	// Killed: ended by SIGKILL (the nemesis, or the kubelet after the
	// grace period), not by exiting.
	Killed bool
	Code   int
}

// Span is an interval of time.
type Span struct{ From, To time.Time }

// JobRecord is one Job's end.
type JobRecord struct {
	Cluster, Name string
	Window        int
	Index         int
	Result        string
	Pods          int
}

// Run executes one schedule of plan on slot's clusters, with key
// chaos/j<index>, in a fresh directory under dir.
func (w *World) Run(plan Plan, index int, slot *Slot, dir string) (*Outcome, error) {
	r := &run{w: w, plan: plan, index: index, name: fmt.Sprintf("j%d", index), kinds: map[Kind]bool{},
		cuts: map[string][][2]time.Time{}}
	r.key = "chaos/" + r.name
	r.dir = filepath.Join(dir, fmt.Sprintf("schedule-%d-seed-%d", index, plan.Seed))
	if err := os.MkdirAll(filepath.Join(r.dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	r.ledger = filepath.Join(r.dir, "ledger")
	if err := os.WriteFile(r.ledger, nil, 0o666); err != nil {
		return nil, err
	}
	for i := range plan.Clusters {
		b := slot.Bouncers[i]
		// A previous schedule's fault may have left it paused or stopped.
		if err := b.Start(); err != nil {
			return nil, fmt.Errorf("resetting bouncer %s: %w", b.Name(), err)
		}
		cl := &cluster{idx: i, name: ClusterName(i), bouncer: b}
		if plan.Gateway {
			cl.gateway = slot.Gateways[i]
			if err := cl.gateway.Start(); err != nil {
				return nil, fmt.Errorf("starting the gateway of %s: %w", cl.name, err)
			}
		}
		r.clusters = append(r.clusters, cl)
	}
	r.start = time.Now()

	// The CronJob controllers.
	var timers []*time.Timer
	lastJob := time.Duration(0)
	for c := range plan.Clusters {
		for win := range plan.Windows {
			at := plan.JobAt(c, win)
			lastJob = max(lastJob, at)
			timers = append(timers, time.AfterFunc(at, func() { r.createJob(c, win) }))
		}
	}
	// The nemesis. A herd is load, not a fault that keeps a pod from the
	// database: the schedule's faults are healed, and its pods' time to
	// finish counts, without waiting for the herd's last winner; the herd
	// is waited for before the outcome only so that nothing of it outlives
	// the schedule.
	var faults, herds sync.WaitGroup
	for _, f := range plan.Faults {
		if f.Kind == NeverStart || f.Kind == AppExit {
			continue // part of the pods' apps (AppOf)
		}
		wg := &faults
		if f.Kind == Herd {
			wg = &herds
		}
		wg.Add(1)
		timers = append(timers, time.AfterFunc(f.At, func() {
			defer wg.Done()
			r.inject(f)
		}))
	}
	time.Sleep(lastJob)
	for r.jobCount() < plan.JobCount() {
		time.Sleep(10 * time.Millisecond)
	}
	faults.Wait()
	quiet := time.Now()
	quiet, overran := r.drain(quiet)
	herds.Wait()
	for _, t := range timers {
		t.Stop()
	}
	for _, cl := range r.clusters {
		if err := cl.bouncer.Start(); err != nil {
			r.event(Event{Kind: "error", Cluster: cl.name, Detail: "restoring the bouncer: " + err.Error()})
		}
	}
	w.awaitPostgresRestart(time.Minute)
	return r.outcome(quiet, overran), nil
}

// awaitPostgresRestart waits, for at most limit, until no PostgreSQL
// restart is under way. Another schedule's restart is in the outages only
// once it is over (every bouncer serving again, which a bouncer another
// cut holds paused may take the probe's whole limit): a schedule whose
// outcome were read before would miss an outage that hit its pods.
func (w *World) awaitPostgresRestart(limit time.Duration) {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		w.pgEventsMu.Lock()
		busy := w.pgBusy
		w.pgEventsMu.Unlock()
		if !busy {
			return
		}
	}
}

func (r *run) jobCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.jobs)
}

// drain lets the schedule finish once every fault is healed. Quiet is the
// later of quiet (its own faults healed) and the end of the last PostgreSQL
// restart, another schedule's too: the database was down for everyone. A pod
// still alive StuckBound after the later of its creation and Quiet is stuck: its
// Job's deadline deletes it (and the checker reports it). Pods whose app
// never starts live on, like a pod in ImagePullBackOff, until no other pod
// is left that could be waiting for them; then their Jobs' deadline deletes
// them too. drain returns Quiet and whether the schedule overran its hard
// deadline and had to be killed.
func (r *run) drain(quiet time.Time) (time.Time, bool) {
	s := r.w.Settings
	for {
		quiet = maxTime(quiet, r.w.pgQuiet())
		hard := quiet.Add(r.plan.StuckBound(s) + s.Grace + 15*time.Second)
		r.mu.Lock()
		pods := slices.Clone(r.pods)
		r.mu.Unlock()
		var live, waiting []*pod
		for _, p := range pods {
			if p.isEnded() {
				continue
			}
			live = append(live, p)
			if !p.app.NeverStart {
				waiting = append(waiting, p)
			}
		}
		if len(live) == 0 {
			break
		}
		now := time.Now()
		if now.After(hard) {
			for _, p := range live {
				p.event(false, "overran", "killing everything")
				p.killAll()
			}
			r.awaitJobs(10 * time.Second)
			return quiet, true
		}
		for _, p := range waiting {
			// A pod whose app has ended waits for nothing: the kubelet
			// stops its sidecar, with SIGKILL after the grace period (a
			// sidecar restarted just then may miss the SIGTERM, as PID 1
			// without a handler yet).
			p.mu.Lock()
			terminatingAt := p.terminatingAt
			p.mu.Unlock()
			if !terminatingAt.IsZero() {
				continue
			}
			if !p.deleted() && now.After(maxTime(p.created, quiet).Add(r.plan.StuckBound(s))) {
				p.mu.Lock()
				p.stuck = true
				p.mu.Unlock()
				p.event(false, "stuck", "alive %s after the later of its creation and the last healed fault", r.plan.StuckBound(s))
				p.job.deadline()
			}
		}
		if len(waiting) == 0 {
			for _, p := range live {
				if !p.deleted() {
					p.job.deadline()
				}
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	r.awaitJobs(s.Grace + 10*time.Second)
	return quiet, false
}

// awaitJobs waits up to d for every Job to be done.
func (r *run) awaitJobs(d time.Duration) {
	r.mu.Lock()
	jobs := slices.Clone(r.jobs)
	r.mu.Unlock()
	limit := time.After(d)
	for _, j := range jobs {
		select {
		case <-j.doneCh:
		case <-limit:
			return
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// inject carries out one planned fault.
func (r *run) inject(f Fault) {
	s := r.w.Settings
	switch f.Kind {
	case RestartPostgres:
		r.restartPostgres(f)
		return
	case Herd:
		r.herd(f)
		return
	case PauseKey:
		r.pauseKey(f)
		return
	case RestartBouncer:
		cl := r.clusters[f.Cluster]
		from := time.Now()
		r.fault(f.Kind, cl.name, "", "stop and start PgBouncer")
		if err := cl.bouncer.Restart(); err != nil {
			r.event(Event{Kind: "error", Cluster: cl.name, Detail: err.Error()})
		}
		r.outage(from, cl.name, "", string(f.Kind))
		r.event(Event{Kind: "bouncer-up", Cluster: cl.name})
		return
	case RestartGateway:
		cl := r.clusters[f.Cluster]
		from := time.Now()
		r.fault(f.Kind, cl.name, "", "kill and start the lock gateway")
		if err := cl.gateway.Restart(); err != nil {
			r.event(Event{Kind: "error", Cluster: cl.name, Detail: err.Error()})
		}
		r.outage(from, cl.name, "", string(f.Kind))
		r.event(Event{Kind: "gateway-up", Cluster: cl.name})
		return
	case CutCluster:
		cl := r.clusters[f.Cluster]
		from := time.Now()
		var err error
		if f.Variant == "pause" {
			err = cl.bouncer.Pause()
		} else {
			err = cl.bouncer.Stop()
		}
		r.fault(f.Kind, cl.name, "", "%s PgBouncer for %s", f.Variant, f.For.Round(time.Millisecond))
		if err != nil {
			r.event(Event{Kind: "error", Cluster: cl.name, Detail: err.Error()})
		}
		time.Sleep(f.For - time.Since(from))
		if err := cl.bouncer.Start(); err != nil {
			r.event(Event{Kind: "error", Cluster: cl.name, Detail: "healing the cut: " + err.Error()})
		}
		r.mu.Lock()
		r.cuts[cl.name] = append(r.cuts[cl.name], [2]time.Time{from, time.Now()})
		r.mu.Unlock()
		r.outage(from, cl.name, "", string(f.Kind)+" ("+f.Variant+")")
		r.event(Event{Kind: "cut-healed", Cluster: cl.name})
		return
	}

	// Pod faults: the newest live pod of the target Job, waiting briefly
	// for the part the fault needs (the app container) to exist. Should that
	// Job have no such pod (it skipped and ended quickly), the fault goes to
	// the same window's Job in another cluster, then to any live Job, so that
	// planned faults land: the plan stays the seed's, the hit is timing's.
	var j *job
	var p *pod
	var agent, app *container
	for try := 0; ; try++ {
		for _, cand := range r.faultTargets(f) {
			p = cand.newestPod()
			if p == nil {
				continue
			}
			p.mu.Lock()
			agent, app = p.agent, p.appC
			terminating := p.terminating
			p.mu.Unlock()
			ready := !terminating && !p.deleted()
			if f.Kind == KillApp || f.Kind == PauseWrapper {
				ready = ready && app != nil && !app.exited()
			} else {
				// Between a sidecar's death and the kubelet's restart the
				// pod has none to hit.
				ready = ready && agent != nil
			}
			if ready {
				j = cand
				break
			}
		}
		if j != nil {
			break
		}
		if try == 10 {
			r.missed(f, "no live target")
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	switch f.Kind {
	case KillAgentEarly, KillAgent:
		_, err := os.Stat(filepath.Join(p.dir, protocol.DecisionFile))
		agent.signal(syscall.SIGKILL)
		r.fault(f.Kind, j.cl.name, p.name, "SIGKILL sidecar (decision published: %t)", err == nil)
	case KillApp:
		app.signal(syscall.SIGKILL)
		r.fault(f.Kind, j.cl.name, p.name, "SIGKILL app container")
	case PauseAgent, PauseWrapper:
		c := agent
		if f.Kind == PauseWrapper {
			c = app
		}
		from := time.Now()
		c.signal(syscall.SIGSTOP)
		r.fault(f.Kind, j.cl.name, p.name, "SIGSTOP %s for %s", c.name, f.For.Round(time.Millisecond))
		time.Sleep(f.For)
		c.signal(syscall.SIGCONT)
		if f.Kind == PauseAgent {
			r.outage(from, j.cl.name, p.name, string(f.Kind))
		}
		r.event(Event{Kind: "resumed", Cluster: j.cl.name, Pod: p.name, Detail: "SIGCONT " + c.name})
	case EvictPod, LostNode:
		if j.replace(p, f.Kind == EvictPod) {
			r.fault(f.Kind, j.cl.name, p.name, "replacement pod created while this one lives")
		} else {
			r.missed(f, "Job done")
		}
	default:
		r.missed(f, fmt.Sprintf("unknown kind (margin %s)", s.Margin()))
	}
}

// minPostgresGap spaces PostgreSQL restarts across concurrent schedules, so
// that the database is up most of the time.
const minPostgresGap = 8 * time.Second

func (r *run) restartPostgres(f Fault) {
	w := r.w
	w.pgMu.Lock()
	defer w.pgMu.Unlock()
	if since := time.Since(w.lastPG); since < minPostgresGap {
		r.missed(f, fmt.Sprintf("another schedule restarted PostgreSQL %s ago", since.Round(time.Millisecond)))
		return
	}
	from := time.Now()
	w.pgEventsMu.Lock()
	w.pgBusy = true
	w.pgEventsMu.Unlock()
	r.fault(f.Kind, "", "", "pg_ctl stop -m immediate; start")
	err := w.PG.StopPostgres("immediate")
	if err == nil {
		err = w.PG.StartPostgres()
	}
	if err != nil {
		r.event(Event{Kind: "error", Detail: err.Error()})
	}
	w.lastPG = time.Now()
	r.event(Event{Kind: "postgres-up", Detail: "down for " + time.Since(from).Round(time.Millisecond).String()})
	serving := w.probeBouncers(from, 15*time.Second)
	w.pgEventsMu.Lock()
	w.pgEvents = append(w.pgEvents, Event{At: from, Kind: "restart-postgres", Detail: fmt.Sprintf("by schedule seed %d, until %s", r.plan.Seed, w.lastPG.Format("15:04:05.000"))})
	w.pgOutages = append(w.pgOutages, Outage{From: from, To: w.lastPG, What: "restart-postgres", Serving: serving, seed: r.plan.Seed})
	w.pgBusy, w.pgHealed = false, w.lastPG
	for _, t := range serving {
		w.pgHealed = maxTime(w.pgHealed, t)
	}
	w.pgEventsMu.Unlock()
}

// probeBouncers queries through every bouncer until each answers, for at
// most limit, and returns when each did (a bouncer that never did within
// limit, because a cut paused or stopped it, counts as serving at the end:
// the cut covers the rest).
func (w *World) probeBouncers(from time.Time, limit time.Duration) map[string]time.Time {
	var mu sync.Mutex
	serving := map[string]time.Time{}
	deadline := time.Now().Add(limit)
	var wg sync.WaitGroup
	for _, b := range w.Bouncers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				err := func() error {
					conn, err := pgx.Connect(ctx, b.DSN())
					if err != nil {
						return err
					}
					defer conn.Close(context.Background())
					_, err = conn.Exec(ctx, "SELECT 1")
					return err
				}()
				cancel()
				if err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			mu.Lock()
			serving[b.Name()] = minTime(time.Now(), deadline)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return serving
}

func (r *run) outcome(quiet time.Time, overran bool) *Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := &Outcome{Plan: r.plan, Settings: r.w.Settings, Key: r.key, Dir: r.dir, Start: r.start, Quiet: quiet,
		End: time.Now(), Faults: r.faults, Events: slices.Clone(r.events), Cuts: r.cuts, Overran: overran,
		Pauses: slices.Clone(r.flips)}
	for w := range r.plan.Windows {
		o.Windows = append(o.Windows, r.windowStart(w).Format(time.RFC3339))
	}
	for k := range r.kinds {
		o.Kinds = append(o.Kinds, k)
	}
	// A pod fault planned into the app counts once a pod with it ran.
	for _, p := range r.pods {
		if p.app.NeverStart {
			o.addKind(NeverStart)
		}
		if p.app.Exit != 0 && p.appCode() >= 0 {
			o.addKind(AppExit)
		}
	}
	o.Faults += len(o.Kinds) - len(r.kinds)
	slices.Sort(o.Kinds)
	// Other schedules' PostgreSQL restarts hit this one too.
	r.w.pgEventsMu.Lock()
	for _, e := range r.w.pgEvents {
		if e.At.After(r.start) && e.At.Before(o.End) && !strings.Contains(e.Detail, fmt.Sprintf("seed %d,", r.plan.Seed)) {
			e.Kind = "restart-postgres (other)"
			o.Events = append(o.Events, e)
		}
	}
	for _, x := range r.w.pgOutages {
		if !x.From.Before(o.End) {
			continue
		}
		what := x.What
		if x.seed != r.plan.Seed {
			what += " (other)"
		}
		// Each cluster is cut off until its bouncer serves again.
		for _, cl := range r.clusters {
			to := maxTime(x.To, x.Serving[cl.bouncer.Name()])
			if to.After(r.start) {
				o.Outages = append(o.Outages, Outage{From: x.From, To: to, Cluster: cl.name, What: what})
				if t, ok := x.Serving[cl.bouncer.Name()]; ok && x.From.After(r.start) {
					o.Events = append(o.Events, Event{At: t, Kind: "bouncer-serving", Cluster: cl.name,
						Detail: fmt.Sprintf("again after the PostgreSQL restart (up at %s)", x.To.Format("15:04:05.000"))})
				}
			}
		}
	}
	r.w.pgEventsMu.Unlock()
	o.Outages = append(o.Outages, r.outages...)
	slices.SortStableFunc(o.Events, func(a, b Event) int { return a.At.Compare(b.At) })

	for _, j := range r.jobs {
		j.mu.Lock()
		o.Jobs = append(o.Jobs, JobRecord{Cluster: j.cl.name, Name: j.name, Window: j.window, Index: j.index, Result: j.result, Pods: len(j.pods)})
		j.mu.Unlock()
	}
	for _, p := range r.pods {
		p.mu.Lock()
		pr := PodRecord{Cluster: p.job.cl.name, Job: p.job.name, Name: p.name, Window: p.job.window, Index: p.job.index, Attempt: p.attempt,
			App: p.app, Created: p.created, DeletedWhy: p.deleteWhy, Stuck: p.stuck, AgentLog: p.agentLog, SidecarStarts: p.agentStarts,
			AppCode: -1, AppResult: -1}
		for _, c := range p.agents {
			in := Incarnation{From: c.started, To: c.killed(), Killed: !c.killed().IsZero(), Code: -1}
			if c.exited() {
				in.To, in.Code = c.end(), c.code
			}
			pr.Sidecars = append(pr.Sidecars, in)
		}
		if p.appC != nil {
			pr.AppRan, pr.AppEnd, pr.AppCode = true, p.appC.end(), p.appC.code
		}
		if results, err := protocol.Dir(p.dir).ReadResults(); err == nil {
			if res, ok := results[appContainer]; ok && res.Ran {
				pr.AppResult = res.ExitCode
			}
		}
		p.mu.Unlock()
		if p.isEnded() {
			pr.Ended = p.endedAt
		}
		o.Pods = append(o.Pods, pr)
	}
	if b, err := os.ReadFile(r.ledger); err == nil {
		o.Ledger = string(b)
	}
	o.Rows, o.WindowStates, o.WindowClaims, o.Grants = r.dumpRows()
	return o
}

// unitKey names what runs at most once: a window, or a window's completion
// index.
func unitKey(window string, index int) string {
	if index < 0 {
		return window
	}
	return fmt.Sprintf("%s/%d", window, index)
}

func (o *Outcome) addKind(k Kind) {
	if !slices.Contains(o.Kinds, k) {
		o.Kinds = append(o.Kinds, k)
	}
}

// dumpRows reads every row of the key from every table of schema dislock
// that has a lock_key column (whatever the schema version), and the key's
// grants from the grant log, straight from PostgreSQL, retrying while
// another schedule restarts it.
func (r *run) dumpRows() (string, map[string]string, map[string]WindowClaim, []Grant) {
	var rows strings.Builder
	states, claims := map[string]string{}, map[string]WindowClaim{}
	var grants []Grant
	for attempt := 0; attempt < 20; attempt++ {
		rows.Reset()
		clear(states)
		clear(claims)
		grants = nil
		err := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, r.w.PG.DirectDSN())
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			var tables []string
			rs, err := conn.Query(ctx, `SELECT table_name FROM information_schema.columns
				WHERE table_schema = 'dislock' AND column_name = 'lock_key' ORDER BY table_name`)
			if err != nil {
				return err
			}
			if tables, err = pgx.CollectRows(rs, pgx.RowTo[string]); err != nil {
				return err
			}
			for _, t := range tables {
				rs, err := conn.Query(ctx, fmt.Sprintf(`SELECT to_jsonb(t)::text FROM dislock.%s t WHERE lock_key = $1 OR starts_with(lock_key, $1 || '#')`,
					pgx.Identifier{t}.Sanitize()), r.key)
				if err != nil {
					return err
				}
				lines, err := pgx.CollectRows(rs, pgx.RowTo[string])
				if err != nil {
					return err
				}
				for _, l := range lines {
					fmt.Fprintf(&rows, "%s: %s\n", t, l)
					if g, ok := leaseGrant(l); ok && t == "leases" {
						grants = append(grants, g)
					}
					if t == "windows" {
						w := struct {
							WindowStart time.Time `json:"window_start"`
							State       string    `json:"state"`
							JobIndex    int       `json:"job_index"`
							Owner       string    `json:"owner"`
							Token       int64     `json:"token"`
							ClaimedAt   time.Time `json:"claimed_at"`
						}{JobIndex: -1}
						if json.Unmarshal([]byte(l), &w) == nil {
							k := unitKey(w.WindowStart.UTC().Format(time.RFC3339), w.JobIndex)
							states[k], claims[k] = w.State, WindowClaim{Owner: w.Owner, Token: w.Token, ClaimedAt: w.ClaimedAt}
							grants = append(grants, Grant{Key: r.key, Window: k, Owner: w.Owner, Token: w.Token, GrantedAt: w.ClaimedAt})
						}
					}
				}
			}
			logged, err := readGrants(ctx, conn, r.key)
			if err != nil {
				return fmt.Errorf("reading the grant log: %w", err)
			}
			for _, g := range logged {
				fmt.Fprintf(&rows, "grant log: %s\n", g)
			}
			grants = append(grants, logged...)
			return nil
		}()
		if err == nil {
			return rows.String(), states, claims, grants
		}
		if attempt == 19 {
			return "reading rows: " + err.Error(), nil, nil, nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return "", nil, nil, nil
}
