package chaos

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
)

// Kind names one fault the nemesis injects.
type Kind string

// The fault kinds. Pod faults target the newest live pod of one cluster's Job
// for one window; cluster faults a cluster's PgBouncer; RestartPostgres the
// one database every cluster (and every concurrent schedule) shares.
const (
	// KillAgentEarly SIGKILLs the sidecar right after the pod starts, mostly
	// before it has published a decision; the kubelet restarts it.
	KillAgentEarly Kind = "kill-agent-early"
	// KillAgent SIGKILLs the sidecar later (usually after the decision);
	// the kubelet restarts it. Never while the pod terminates: the kubelet
	// does not restart a sidecar then (see the package doc).
	KillAgent Kind = "kill-agent"
	// KillApp SIGKILLs the app container (wrapper and app, as the kernel does
	// when a container's PID 1 dies): exit 137, the Job makes a new pod.
	KillApp Kind = "kill-app"
	// PauseAgent SIGSTOPs the sidecar for any length (up to 3 TTLs).
	PauseAgent Kind = "pause-agent"
	// PauseWrapper SIGSTOPs the wrapper (not the app) for less than half the
	// safety margin (TTL/3): the design promises safety only for pauses
	// under the margin.
	PauseWrapper Kind = "pause-wrapper"
	// EvictPod is a drain: the Job controller (podReplacementPolicy
	// TerminatingOrFailed) creates a replacement pod at once while the old
	// one terminates (SIGTERM, grace).
	EvictPod Kind = "evict-pod"
	// LostNode is a NotReady node whose pod still reaches the database: the
	// replacement starts while the old pod keeps running untouched.
	LostNode Kind = "lost-node"
	// NeverStart: the pod's app container never starts (ImagePullBackOff);
	// the sidecar runs until the Job's deadline deletes the pod.
	NeverStart Kind = "never-start"
	// AppExit: the pod's app exits 3.
	AppExit Kind = "app-exit"
	// RestartBouncer stops and starts one cluster's PgBouncer.
	RestartBouncer Kind = "restart-bouncer"
	// RestartPostgres is `pg_ctl stop -m immediate` (a crash: recovery runs)
	// and a start. It hits every concurrent schedule.
	RestartPostgres Kind = "restart-postgres"
	// CutCluster cuts one cluster from the database for longer than the TTL:
	// its PgBouncer is paused (SIGSTOP: queries hang) or stopped (refused).
	CutCluster Kind = "cut-cluster"
	// RestartGateway SIGKILLs one cluster's lock gateway and starts it
	// again (a gateway pod replaced): its pods' calls in flight get no
	// answer. Drawn only in plans whose pods reach the database through
	// gateways (Plan.Gateway).
	RestartGateway Kind = "restart-gateway"
	// Herd is the top of the hour: as a window's Jobs are created, HerdKeys
	// other CronJobs fire in every cluster of the schedule, their pods
	// deciding through the same PgBouncers (and so queueing with the
	// schedule's pods for the same few server connections), the winners
	// renewing for a while and then recording success.
	Herd Kind = "herd"
	// PauseKey: the owner pauses the schedule's key everywhere
	// (lockagent/store/pause) about as one of its windows starts, while
	// its pods, and a herd's when one fires with that window, are
	// deciding; it resumes the key later (Variant "resume") or lets the
	// pause end by itself at its until (Variant "for"), and may pause it
	// again while it is paused (Again). The runner records each flip's
	// bracket in database time (PauseFlip), which the checker holds the
	// key's grants to.
	PauseKey Kind = "pause-key"
)

// HerdKeys is how many other CronJobs a Herd fires in each cluster: each
// cluster's PgBouncer serves a schedule with 4 server connections, so its
// pods queue behind the herd's.
const HerdKeys = 40

// kindWeights is how often Draw picks each kind. PostgreSQL restarts are
// rarer because they hit every concurrent schedule.
var kindWeights = []struct {
	kind   Kind
	weight int
}{
	{KillAgentEarly, 3}, {KillAgent, 3}, {KillApp, 3}, {PauseAgent, 3}, {PauseWrapper, 2},
	{EvictPod, 3}, {LostNode, 3}, {NeverStart, 2}, {AppExit, 3},
	{RestartBouncer, 2}, {RestartPostgres, 1}, {CutCluster, 3},
}

// Kinds lists every fault kind.
func Kinds() []Kind {
	var ks []Kind
	for _, kw := range kindWeights {
		ks = append(ks, kw.kind)
	}
	return append(ks, Herd, RestartGateway, PauseKey)
}

// Settings are the timings every schedule of a run shares. They are scaled
// down from production (TTL 30s, app-start timeout 10m) so that a schedule
// takes seconds.
type Settings struct {
	TTL             time.Duration
	AppStartTimeout time.Duration
	// MaxRun bounds how long an app sleeps.
	MaxRun time.Duration
	// Grace is the pod's terminationGracePeriodSeconds.
	Grace time.Duration
	// BackoffLimit is the Job's: a Job fails after BackoffLimit+1 failed pods.
	BackoffLimit int
	// ProbePeriod and ProbeBudget are the sidecar's startupProbe: polled every
	// ProbePeriod; a sidecar that has not passed it ProbeBudget after it
	// started is killed and restarted, as the kubelet does after
	// failureThreshold failures (the webhook's budget is ~65 min; scaled).
	ProbePeriod, ProbeBudget time.Duration
}

// Margin is the agent's safety margin (TTL/3, DESIGN.md).
func (s Settings) Margin() time.Duration { return s.TTL / 3 }

// StuckBound is how long after the later of its creation and the schedule's
// last healed fault a pod may live before the checker calls it stuck: the
// app-start timeout, the longest run, four TTLs (liveness lapse, a lease
// expiry, renewals) and slack for the agent's retry backoff (≤ 5 s) and a
// loaded machine.
func (s Settings) StuckBound() time.Duration {
	return s.AppStartTimeout + s.MaxRun + 4*s.TTL + 8*time.Second
}

// StuckBound is the Settings' bound for the plan's pods: a pod of a cluster
// the plan does not prefer first waits the grace, and up to a tenth of it
// more (the agent's spread), before it claims.
func (p Plan) StuckBound(s Settings) time.Duration {
	return s.StuckBound() + p.PreferGrace + p.PreferGrace/10
}

// Plan is one schedule, a pure function of its seed and Settings: the
// simulated CronJob's shape and the faults with their times and targets.
// What the faults then hit at run time depends on real process timing.
type Plan struct {
	Seed     uint64
	Mode     string // schedule | lease | schedule,lease
	Standby  bool
	Clusters int
	Windows  int
	// Period is the CronJob's (scaled) period: window w's Jobs are created
	// w*Period after the schedule starts, plus each cluster's Jitter.
	Period time.Duration
	// Completions > 1 makes every Job Indexed (modes with schedule): one pod
	// per completion index at once, each index claiming its own window (and,
	// with lease, holding a lease of its own).
	Completions int
	// PlainCluster, when ≥ 0 (Indexed plans only), is a cluster whose
	// CronJob is not Indexed while the others' are: a rollout of
	// completionMode one data centre at a time. A window is one unit whatever
	// the mode, so only the shape that claims it first may run it.
	PlainCluster int
	// Gateway: every cluster's pods reach the database through a lock
	// gateway of their cluster's (lockagent/gateway), a process in front
	// of the cluster's PgBouncer, instead of through the PgBouncer itself.
	Gateway bool
	// Prefer, when ≥ 0, is the cluster the CronJob prefers
	// (dislock.io/prefer-cluster), with PreferGrace: the other clusters'
	// pods claim a window only from its start + the grace.
	Prefer      int
	PreferGrace time.Duration
	Jitter      [][]time.Duration // [cluster][window]
	Faults      []Fault
}

// Fault is one planned fault.
type Fault struct {
	// At is the offset from the schedule's start.
	At   time.Duration
	Kind Kind
	// Cluster and Window select the target Job; -1 where the kind has no
	// such target.
	Cluster, Window int
	// Attempt selects the Job's pod (0: the first) for NeverStart and AppExit.
	Attempt int
	// For is how long a pause or a cut lasts.
	For time.Duration
	// Variant: "pause" or "stop" for CutCluster; "resume" or "for" for
	// PauseKey (see PauseVariant).
	Variant string
	// Again, for PauseKey when > 0, is when (after At) the owner pauses
	// the key again while it is paused.
	Again time.Duration
}

// The variants of PauseKey: For after At the owner resumes the key, or
// the pause, set for For, ends by itself.
const (
	PauseResumed = "resume"
	PauseFor     = "for"
)

// ClusterName names cluster i: dc-a, dc-b, ...
func ClusterName(i int) string { return "dc-" + string(rune('a'+i)) }

func (f Fault) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "+%-6s %s", f.At.Round(time.Millisecond), f.Kind)
	if f.Cluster >= 0 {
		fmt.Fprintf(&b, " %s", ClusterName(f.Cluster))
	}
	if f.Window >= 0 {
		fmt.Fprintf(&b, " window %d", f.Window)
	}
	if f.Kind == NeverStart || f.Kind == AppExit {
		fmt.Fprintf(&b, " pod #%d", f.Attempt)
	}
	if f.Kind == Herd {
		fmt.Fprintf(&b, " of %d CronJobs per cluster", HerdKeys)
	}
	if f.For > 0 {
		fmt.Fprintf(&b, " for %s", f.For.Round(time.Millisecond))
	}
	if f.Again > 0 {
		fmt.Fprintf(&b, ", paused again at +%s", (f.At + f.Again).Round(time.Millisecond))
	}
	if f.Variant != "" {
		fmt.Fprintf(&b, " (%s)", f.Variant)
	}
	return b.String()
}

// JobAt is when cluster c's CronJob creates window w's Job.
func (p Plan) JobAt(c, w int) time.Duration { return time.Duration(w)*p.Period + p.Jitter[c][w] }

// Quiet is when the last planned fault is over.
func (p Plan) Quiet() time.Duration {
	var q time.Duration
	for _, f := range p.Faults {
		q = max(q, f.At+f.For)
	}
	return q
}

// HasSchedule and HasLease report what the mode locks.
func (p Plan) HasSchedule() bool { return strings.Contains(p.Mode, "schedule") }
func (p Plan) HasLease() bool    { return strings.Contains(p.Mode, "lease") }

func (p Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: mode %s, standby %t, %d clusters, %d windows every %s",
		p.Seed, p.Mode, p.Standby, p.Clusters, p.Windows, p.Period.Round(time.Millisecond))
	if p.Completions > 1 {
		fmt.Fprintf(&b, ", Indexed Jobs of %d completions", p.Completions)
	}
	if p.PlainCluster >= 0 {
		fmt.Fprintf(&b, " except in %s, whose Jobs are not Indexed", ClusterName(p.PlainCluster))
	}
	if p.Gateway {
		b.WriteString(", through lock gateways")
	}
	if p.Prefer >= 0 {
		fmt.Fprintf(&b, ", preferring %s for %s", ClusterName(p.Prefer), p.PreferGrace.Round(time.Millisecond))
	}
	b.WriteString("\n")
	for _, f := range p.Faults {
		fmt.Fprintf(&b, "  planned %s\n", f)
	}
	return b.String()
}

// Draw makes the plan of seed.
func Draw(seed uint64, s Settings) Plan {
	r := rand.New(rand.NewPCG(seed, 0x5eed_d15_10c4))
	p := Plan{
		Seed:     seed,
		Mode:     []string{"schedule", "lease", "schedule,lease"}[r.IntN(3)],
		Standby:  r.IntN(3) > 0,
		Clusters: 2 + r.IntN(2),
		Windows:  2 + r.IntN(2),
		Period:   between(r, 2500*time.Millisecond, 4*time.Second),
	}
	// standby needs schedule mode (DESIGN.md: it is about windows).
	p.Standby = p.Standby && p.HasSchedule()
	p.Completions = 1
	if p.HasSchedule() && r.IntN(3) == 0 {
		p.Completions = 2 + r.IntN(2)
	}
	p.Jitter = make([][]time.Duration, p.Clusters)
	for c := range p.Jitter {
		for range p.Windows {
			p.Jitter[c] = append(p.Jitter[c], between(r, 0, 300*time.Millisecond))
		}
	}
	total := 0
	for _, kw := range kindWeights {
		total += kw.weight
	}
	n := 2 + r.IntN(6)
	postgres := false
	for len(p.Faults) < n {
		pick := r.IntN(total)
		var kind Kind
		for _, kw := range kindWeights {
			if pick -= kw.weight; pick < 0 {
				kind = kw.kind
				break
			}
		}
		f := Fault{Kind: kind, Cluster: r.IntN(p.Clusters), Window: r.IntN(p.Windows)}
		jobAt := p.JobAt(f.Cluster, f.Window)
		switch kind {
		case KillAgentEarly:
			f.At = jobAt + between(r, 0, 150*time.Millisecond)
		case KillAgent, KillApp, EvictPod, LostNode:
			f.At = jobAt + between(r, 100*time.Millisecond, 1800*time.Millisecond)
		case PauseAgent:
			f.At = jobAt + between(r, 0, 2500*time.Millisecond)
			f.For = between(r, s.TTL/5, 3*s.TTL)
		case PauseWrapper:
			f.At = jobAt + between(r, 300*time.Millisecond, 2500*time.Millisecond)
			f.For = between(r, s.Margin()/10, s.Margin()/2)
		case NeverStart, AppExit:
			f.At = jobAt
			if r.IntN(4) == 0 {
				f.Attempt = 1
			}
		case RestartBouncer:
			f.Window = -1
			f.At = jobAt + between(r, 0, 2500*time.Millisecond)
		case CutCluster:
			f.Window = -1
			f.At = jobAt + between(r, 0, 2*time.Second)
			f.For = between(r, s.TTL+s.TTL/5, 3*s.TTL)
			f.Variant = []string{"pause", "stop"}[r.IntN(2)]
		case RestartPostgres:
			if postgres {
				continue // one per schedule: it hits every concurrent schedule
			}
			postgres = true
			f.Cluster, f.Window = -1, -1
			f.At = between(r, 0, time.Duration(p.Windows)*p.Period)
		}
		p.Faults = append(p.Faults, f)
	}
	// Drawn apart, as the two below, so that every other part of a seed's
	// plan stays what it was before herds: a third of the schedules fire
	// one, with one of their windows, while the other faults land.
	if herd := rand.New(rand.NewPCG(seed, 0x4e7d_f1e5)); herd.IntN(3) == 0 {
		f := Fault{Kind: Herd, Cluster: -1, Window: herd.IntN(p.Windows)}
		first := p.JobAt(0, f.Window)
		for c := range p.Clusters {
			first = min(first, p.JobAt(c, f.Window))
		}
		f.At = max(0, first-between(herd, 0, 200*time.Millisecond))
		f.For = between(herd, s.TTL, 3*s.TTL)
		p.Faults = append(p.Faults, f)
	}
	// Drawn apart, so that every other part of a seed's plan stays what it
	// was before gateways: half of the schedules run through them, with up
	// to two gateway restarts.
	if gw := rand.New(rand.NewPCG(seed, 0x6a7e_3a75)); gw.IntN(2) == 0 {
		p.Gateway = true
		for range gw.IntN(3) {
			f := Fault{Kind: RestartGateway, Cluster: gw.IntN(p.Clusters), Window: -1}
			f.At = p.JobAt(f.Cluster, gw.IntN(p.Windows)) + between(gw, 0, 2500*time.Millisecond)
			p.Faults = append(p.Faults, f)
		}
	}
	// Drawn apart, so that every other part of a seed's plan stays what it
	// was before preferred clusters: a third of the schedules with windows
	// (lease mode refuses a preference) prefer one, and half of those cut
	// it off as one of its windows starts, so that the others take that
	// window over once the grace has passed.
	p.Prefer = -1
	if pr := rand.New(rand.NewPCG(seed, 0x9e_fe_2c1a)); p.HasSchedule() && pr.IntN(3) == 0 {
		p.Prefer = pr.IntN(p.Clusters)
		p.PreferGrace = between(pr, contract.MinPreferGrace, 2*contract.MinPreferGrace)
		if pr.IntN(2) == 0 {
			f := Fault{Kind: CutCluster, Cluster: p.Prefer, Window: -1, Variant: []string{"pause", "stop"}[pr.IntN(2)]}
			f.At = max(0, p.JobAt(p.Prefer, pr.IntN(p.Windows))-between(pr, 0, 200*time.Millisecond))
			f.For = between(pr, s.TTL+s.TTL/5, 3*s.TTL)
			p.Faults = append(p.Faults, f)
		}
	}
	// Drawn apart, so that every other part of a seed's plan stays what it
	// was before pauses: a quarter of the schedules have the owner pause
	// their key as one of their windows starts, at the herd's window in
	// half of those that fire one.
	if pz := rand.New(rand.NewPCG(seed, 0x9a_05e_4e7)); pz.IntN(4) == 0 {
		p.Faults = append(p.Faults, drawPause(pz, p))
	}
	slices.SortStableFunc(p.Faults, func(a, b Fault) int { return int(a.At - b.At) })
	// Drawn apart, so that every other part of a seed's plan stays what it
	// was before plans could mix completion modes.
	p.PlainCluster = -1
	if mixed := rand.New(rand.NewPCG(seed, 0xc0_3713_d1ff)); p.Completions > 1 && mixed.IntN(3) == 0 {
		p.PlainCluster = mixed.IntN(p.Clusters)
	}
	return p
}

// drawPause draws p's PauseKey: in two thirds of the plans from 600 ms
// before its window's first Job to 300 ms after it, as the pods start and
// claim (or queue behind a herd), else up to 1.5 s after it, as retries,
// replacements and standbys claim; for 200 ms to two periods. A third of
// the pauses end by themselves, and a third are set again while they hold.
func drawPause(r *rand.Rand, p Plan) Fault {
	f := Fault{Kind: PauseKey, Cluster: -1, Window: r.IntN(p.Windows), Variant: PauseResumed}
	if i := slices.IndexFunc(p.Faults, func(h Fault) bool { return h.Kind == Herd }); i >= 0 && r.IntN(2) == 0 {
		f.Window = p.Faults[i].Window
	}
	first := p.JobAt(0, f.Window)
	for c := range p.Clusters {
		first = min(first, p.JobAt(c, f.Window))
	}
	from, to := -600*time.Millisecond, 300*time.Millisecond
	if r.IntN(3) == 0 {
		from, to = to, 1500*time.Millisecond
	}
	f.At = max(0, first+between(r, from, to))
	f.For = between(r, 200*time.Millisecond, 2*p.Period)
	if r.IntN(3) == 0 {
		f.Variant = PauseFor
	}
	if r.IntN(3) == 0 {
		f.Again = between(r, f.For/4, 3*f.For/4)
	}
	return f
}

// Indexes are the completion indexes of cluster c's Jobs: -1 alone for a
// Job that is not Indexed.
func (p Plan) Indexes(c int) []int {
	if p.Completions <= 1 || c == p.PlainCluster {
		return []int{-1}
	}
	out := make([]int, p.Completions)
	for i := range out {
		out[i] = i
	}
	return out
}

// JobCount is how many Jobs (one per completion index) the plan creates.
func (p Plan) JobCount() int {
	n := 0
	for c := range p.Clusters {
		n += len(p.Indexes(c))
	}
	return n * p.Windows
}

// App is what one pod's app does: sleep, then exit with Exit.
type App struct {
	Sleep      time.Duration
	Exit       int
	NeverStart bool
}

// AppOf is the app of cluster c's Job for window w, completion index (0 when
// not Indexed), pod number attempt (per index). It depends only on the plan,
// not on the order in which pods happen to be created. Planned app faults
// hit index 0.
func (p Plan) AppOf(s Settings, c, w, index, attempt int) App {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d/%d/%d", c, w, index, attempt)
	r := rand.New(rand.NewPCG(p.Seed, h.Sum64()))
	a := App{Sleep: between(r, 200*time.Millisecond, s.MaxRun)}
	for _, f := range p.Faults {
		if f.Cluster == c && f.Window == w && f.Attempt == attempt && index == 0 {
			switch f.Kind {
			case AppExit:
				a.Exit = 3
			case NeverStart:
				a.NeverStart = true
			}
		}
	}
	return a
}

func between(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)))
}
