package chaos

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/gatewaytest"
	"github.com/dislock/dislock/test/pgtest"
)

var (
	flagSchedules = flag.Int("chaos.schedules", 100, "how many fault schedules to run")
	flagSeed      = flag.Uint64("chaos.seed", 0, "seed of the first schedule (schedule i uses seed+i); 0 = random")
	flagParallel  = flag.Int("chaos.parallel", 3, "schedules run at once, on distinct keys")
	flagTTL       = flag.Duration("chaos.ttl", 2*time.Second, "DISLOCK_LEASE_TTL of every simulated CronJob")
	flagDumps     = flag.Int("chaos.dumps", 3, "how many violating schedules to print in full (all are written to files)")
	flagKeep      = flag.Bool("chaos.keep", false, "keep every schedule's files (pods, logs, ledger), not only the violating ones'")
)

// scheduleMargin is more than one schedule can take (its hard deadline
// included).
const scheduleMargin = 4 * time.Minute

// agentBin is dislock-agent, built once; gatewayBin the lock gateway.
var agentBin, gatewayBin string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "dislock-chaos-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		agentBin = filepath.Join(dir, "dislock-agent")
		if out, err := exec.Command("go", "build", "-ldflags=-s -w", "-o", agentBin,
			"github.com/dislock/dislock/lockagent/cmd/dislock-agent").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building dislock-agent: %v\n%s", err, out)
			return 1
		}
		if gatewayBin, err = gatewaytest.Build(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return pgtest.Main(m, pgtest.Options{Name: "chaos"})
	}())
}

// shortTTLArgs returns the hidden flag that lets the agent accept a TTL and
// an app-start timeout under the production minimums, if this agent has it
// (an unknown flag fails to parse; a known one with -h prints the usage).
func shortTTLArgs(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command(agentBin, "agent", "--test-allow-short-ttl", "-h").CombinedOutput()
	if err == nil && !strings.Contains(string(out), "not defined") {
		return []string{"--test-allow-short-ttl"}
	}
	t.Logf("dislock-agent has no --test-allow-short-ttl flag; passing DISLOCK_LEASE_TTL=%s as is", *flagTTL)
	return nil
}

// TestChaos runs -chaos.schedules fault schedules, -chaos.parallel at a
// time, and checks each against the invariants. On a violation it prints
// the seed and everything needed to understand it.
func TestChaos(t *testing.T) {
	pg := pgtest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := store.Open(ctx, pg.DirectDSN(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(ctx, db); err != nil {
		t.Fatalf("migrating: %v", err)
	}
	db.Close()
	if err := InstallGrantLog(ctx, pg.DirectDSN()); err != nil {
		t.Fatal(err)
	}

	schedules, parallel := *flagSchedules, max(1, *flagParallel)
	if testing.Short() {
		schedules = min(schedules, 10)
	}
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano()) % 1_000_000_000
	}
	ttl := *flagTTL
	w := &World{AgentBin: agentBin, AgentArgs: shortTTLArgs(t), PG: pg,
		WindowBase: time.Now().UTC().Truncate(time.Minute).Add(-30 * time.Minute), Settings: Settings{
			TTL:             ttl,
			AppStartTimeout: 2 * ttl,
			MaxRun:          1500 * time.Millisecond,
			Grace:           30 * time.Second,
			BackoffLimit:    4,
			ProbePeriod:     250 * time.Millisecond,
			ProbeBudget:     5 * ttl,
		}}
	dir, err := os.MkdirTemp("", fmt.Sprintf("dislock-chaos-%d-", seed))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("chaos: %d schedules from seed %d, %d at a time, TTL %s; files in %s", schedules, seed, parallel, ttl, dir)

	type result struct {
		o  *Outcome
		vs []Violation
		// pausedSkips is read before the schedule's files are removed.
		pausedSkips int
	}
	var (
		mu      sync.Mutex
		results []result
		dumped  int
	)
	// No schedule starts within scheduleMargin of the test's -timeout, so
	// that a long run ends with its summary rather than a panic.
	next := make(chan int)
	var handedOut atomic.Int64
	deadline, hasDeadline := t.Deadline()
	go func() {
		defer close(next)
		for i := range schedules {
			if hasDeadline && time.Until(deadline) < scheduleMargin {
				return
			}
			next <- i
			handedOut.Add(1)
		}
	}()
	begun := time.Now()
	var slots []*Slot
	for worker := range parallel {
		slot := &Slot{}
		for c := range 3 {
			b, err := pg.AddBouncer(fmt.Sprintf("w%d-%s", worker, ClusterName(c)))
			if err != nil {
				t.Fatal(err)
			}
			slot.Bouncers = append(slot.Bouncers, b)
			w.Bouncers = append(w.Bouncers, b)
			g, err := gatewaytest.NewProcess(gatewayBin, b.DSN(), ClusterName(c), filepath.Join(dir, fmt.Sprintf("gateway-w%d-%s", worker, ClusterName(c))))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(g.Kill)
			slot.Gateways = append(slot.Gateways, g)
		}
		slots = append(slots, slot)
	}
	var wg sync.WaitGroup
	for _, slot := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				plan := Draw(seed+uint64(i), w.Settings)
				start := time.Now()
				o, err := w.Run(plan, i, slot, dir)
				if err != nil {
					t.Errorf("schedule seed %d: %v", plan.Seed, err)
					continue
				}
				vs := Check(o)
				pausedSkips := o.PausedSkips()
				prefer := "-"
				if plan.Prefer >= 0 {
					prefer = ClusterName(plan.Prefer)
				}
				line := fmt.Sprintf("schedule %d seed %d: %s standby=%t gateway=%t prefer=%s %d clusters × %d windows × %d completions, %d fault kinds %v, %s",
					i, plan.Seed, plan.Mode, plan.Standby, plan.Gateway, prefer, plan.Clusters, plan.Windows, plan.Completions, len(o.Kinds), o.Kinds,
					time.Since(start).Round(100*time.Millisecond))
				if len(o.Pauses) > 0 {
					line += fmt.Sprintf(", %d pause flips, %d pods skipped because of a pause", len(o.Pauses), pausedSkips)
				}
				exceptions, violations := Exceptions(vs)
				mu.Lock()
				results = append(results, result{o, vs, pausedSkips})
				full := len(violations) > 0 && dumped < *flagDumps
				if full {
					dumped++
				}
				mu.Unlock()
				if len(vs) == 0 {
					t.Log(line + ": ok")
					if !*flagKeep {
						os.RemoveAll(o.Dir)
					}
					continue
				}
				report := o.Report(vs)
				name := "violation"
				if len(violations) == 0 {
					name = "exception"
				}
				file := filepath.Join(dir, fmt.Sprintf("%s-seed-%d.txt", name, plan.Seed))
				_ = os.WriteFile(file, []byte(report), 0o644)
				if len(violations) == 0 {
					// The design's documented exception: brief, not a failure.
					t.Logf("%s: ok but for %s (report: %s)", line, strings.Join(kindsOf(exceptions), "; "), file)
					if !*flagKeep {
						os.RemoveAll(o.Dir)
					}
					continue
				}
				kinds := kindsOf(violations)
				if full {
					t.Errorf("%s: VIOLATED %s\n%s", line, strings.Join(kinds, "; "), report)
				} else {
					t.Errorf("%s: VIOLATED %s (report: %s)", line, strings.Join(kinds, "; "), file)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begun)

	// The tally.
	byKind := map[string][]uint64{}    // violations
	excByKind := map[string][]uint64{} // documented exceptions
	minK, maxK, sumK, bad, excepted := len(Kinds()), 0, 0, 0, 0
	used := map[Kind]bool{}
	gateways := 0
	var pausing, pausingHerds, flips, flipsFailed, pausedSkips, grants int
	for _, r := range results {
		if r.o.Plan.Gateway {
			gateways++
		}
		if i := slices.IndexFunc(r.o.Plan.Faults, func(f Fault) bool { return f.Kind == PauseKey }); i >= 0 {
			pausing++
			pause := r.o.Plan.Faults[i]
			if slices.ContainsFunc(r.o.Plan.Faults, func(f Fault) bool { return f.Kind == Herd && f.Window == pause.Window }) {
				pausingHerds++
			}
			grants += len(r.o.DistinctGrants())
		}
		for _, f := range r.o.Pauses {
			flips++
			if !f.Done {
				flipsFailed++
			}
		}
		pausedSkips += r.pausedSkips
		n := len(r.o.Kinds)
		minK, maxK, sumK = min(minK, n), max(maxK, n), sumK+n
		for _, k := range r.o.Kinds {
			used[k] = true
		}
		switch exceptions, violations := Exceptions(r.vs); {
		case len(violations) > 0:
			bad++
		case len(exceptions) > 0:
			excepted++
		}
		seen := map[string]bool{}
		for _, v := range r.vs {
			m := byKind
			if v.Exception {
				m = excByKind
			}
			if !seen[v.Kind] {
				seen[v.Kind] = true
				m[v.Kind] = append(m[v.Kind], r.o.Plan.Seed)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "chaos summary: %d schedules from seed %d in %s (%s per 100, %d at a time); %d with violations, %d more with documented exceptions only\n",
		len(results), seed, elapsed.Round(time.Second), (elapsed * 100 / time.Duration(max(1, len(results)))).Round(time.Second), parallel, bad, excepted)
	if n := int(handedOut.Load()); n < schedules {
		fmt.Fprintf(&b, "stopped after %d of %d schedules: the test's -timeout was less than %s away\n", n, schedules, scheduleMargin)
	}
	if len(results) > 0 {
		fmt.Fprintf(&b, "distinct fault kinds per schedule: min %d, mean %.1f, max %d; %d of %d kinds used overall; %d schedules through lock gateways\n",
			minK, float64(sumK)/float64(len(results)), maxK, len(used), len(Kinds()), gateways)
		fmt.Fprintf(&b, "pauses: %d schedules paused their key (%d at a herd's window), %d flips (%d failed), %d pods skipped because of a pause, %d grants of those keys held to their pauses\n",
			pausing, pausingHerds, flips, flipsFailed, pausedSkips, grants)
	}
	tally := func(title string, m map[string][]uint64) {
		if len(m) == 0 {
			return
		}
		b.WriteString(title + "\n")
		kinds := make([]string, 0, len(m))
		for k := range m {
			kinds = append(kinds, k)
		}
		slices.Sort(kinds)
		for _, k := range kinds {
			seeds := m[k]
			slices.Sort(seeds)
			shown := seeds[:min(len(seeds), 10)]
			fmt.Fprintf(&b, "  %-48s %4d schedule(s), seeds %v\n", k, len(seeds), shown)
		}
	}
	tally("violations:", byKind)
	tally("documented exceptions (DESIGN.md \"Invariants\": the owner's pod could not reach the database until its claim lapsed):", excByKind)
	if bad > 0 {
		// The first violation of each violating schedule, whole, so that a
		// run whose files are gone (a CI machine) still says what happened.
		b.WriteString("first violation of each violating schedule:\n")
		shown := 0
		for _, r := range results {
			for _, v := range r.vs {
				if v.Exception || shown == *flagDumps {
					continue
				}
				shown++
				fmt.Fprintf(&b, "  seed %d: %s\n    %s\n", r.o.Plan.Seed, v.Kind, strings.ReplaceAll(v.Text, "\n", "\n    "))
				break
			}
		}
		fmt.Fprintf(&b, "reports of violating schedules: %s/violation-seed-*.txt\n", dir)
	}
	if excepted > 0 {
		fmt.Fprintf(&b, "reports of schedules with documented exceptions only: %s/exception-seed-*.txt\n", dir)
	}
	if bad == 0 && excepted == 0 && !*flagKeep {
		os.RemoveAll(dir)
	}
	t.Log(b.String())
	fmt.Print(b.String())
}

// kindsOf lists the distinct kinds of vs, sorted.
func kindsOf(vs []Violation) []string {
	var kinds []string
	for _, v := range vs {
		kinds = append(kinds, v.Kind)
	}
	slices.Sort(kinds)
	return slices.Compact(kinds)
}

// TestDrawIsAFunctionOfTheSeed: a printed seed replays the same plan, and
// different seeds give different plans.
func TestDrawIsAFunctionOfTheSeed(t *testing.T) {
	t.Parallel()
	s := Settings{TTL: 2 * time.Second, MaxRun: time.Second}
	for seed := uint64(1); seed <= 50; seed++ {
		a, b := Draw(seed, s), Draw(seed, s)
		if a.String() != b.String() {
			t.Fatalf("seed %d drew two plans:\n%s\n%s", seed, a, b)
		}
		if a.String() == Draw(seed+1, s).String() {
			t.Errorf("seeds %d and %d drew the same plan:\n%s", seed, seed+1, a)
		}
		for c := range a.Clusters {
			for w := range a.Windows {
				if a.AppOf(s, c, w, 0, 0) != b.AppOf(s, c, w, 0, 0) {
					t.Errorf("seed %d: the app of cluster %d window %d differs between draws", seed, c, w)
				}
			}
		}
	}
}

// TestSomeSchedulesFireAHerdWithTheirWindow: about a third of the plans
// fire a herd, never more than one, starting by the time the first Job of
// its window is created and lasting one to three TTLs, so that the
// schedule's pods decide and renew queued behind it.
func TestSomeSchedulesFireAHerdWithTheirWindow(t *testing.T) {
	t.Parallel()
	s := Settings{TTL: 2 * time.Second, MaxRun: time.Second}
	const seeds = 300
	herds := 0
	for seed := uint64(1); seed <= seeds; seed++ {
		p := Draw(seed, s)
		n := 0
		for _, f := range p.Faults {
			if f.Kind != Herd {
				continue
			}
			n++
			for c := range p.Clusters {
				if f.At > p.JobAt(c, f.Window) {
					t.Fatalf("seed %d: the herd fires at %s, after %s's Job of window %d (%s)", seed, f.At, ClusterName(c), f.Window, p.JobAt(c, f.Window))
				}
			}
			if f.For < s.TTL || f.For > 3*s.TTL {
				t.Fatalf("seed %d: the herd's winners run for %s, want one to three TTLs", seed, f.For)
			}
		}
		if n > 1 {
			t.Fatalf("seed %d plans %d herds:\n%s", seed, n, p)
		}
		herds += n
	}
	if herds < seeds/5 || herds > seeds/2 {
		t.Fatalf("%d of %d plans fire a herd, want about a third", herds, seeds)
	}
}

// TestSomeSchedulesPreferAClusterAndSomeCutItOffAsAWindowStarts: about a
// third of the plans with windows prefer a cluster, in a mode and with a
// grace the agent accepts, and
// about half of those cut that cluster off from the database just before
// one of its windows' Jobs, so that another cluster must take that window
// once the grace has passed.
func TestSomeSchedulesPreferAClusterAndSomeCutItOffAsAWindowStarts(t *testing.T) {
	t.Parallel()
	s := Settings{TTL: 2 * time.Second, MaxRun: time.Second}
	const seeds = 300
	preferring, cut := 0, 0
	for seed := uint64(1); seed <= seeds; seed++ {
		p := Draw(seed, s)
		if p.Prefer < 0 {
			continue
		}
		preferring++
		if p.PreferGrace < contract.MinPreferGrace || p.PreferGrace > contract.MaxPreferGrace || !p.HasSchedule() {
			t.Fatalf("seed %d: mode %s, prefer grace %s, which the agent refuses", seed, p.Mode, p.PreferGrace)
		}
		for _, f := range p.Faults {
			if f.Kind != CutCluster || f.Cluster != p.Prefer {
				continue
			}
			for w := range p.Windows {
				if at := p.JobAt(p.Prefer, w); f.At <= at && at-f.At <= 200*time.Millisecond {
					cut++
					break
				}
			}
		}
	}
	if preferring < seeds/8 || preferring > seeds/3 {
		t.Fatalf("%d of %d plans prefer a cluster, want about a third of the two thirds with windows", preferring, seeds)
	}
	if cut < preferring/4 {
		t.Fatalf("%d of %d plans that prefer a cluster cut it off as a window starts, want about half", cut, preferring)
	}
}

// TestSomeSchedulesPauseTheirKeyAsAWindowStarts: about a quarter of the
// plans have the owner pause their key, once, from just before one of its
// windows' first Job to 1.5 s after it (while its pods, and a herd's where
// one fires with that window, decide), mostly by 300 ms after it, for
// 200 ms to two periods; some
// pauses are resumed, some end by themselves, some are set again while
// they hold, and some fall in a herd's window.
func TestSomeSchedulesPauseTheirKeyAsAWindowStarts(t *testing.T) {
	t.Parallel()
	s := Settings{TTL: 2 * time.Second, MaxRun: time.Second}
	const seeds = 400
	pausing, resumed, ending, again, herds, early := 0, 0, 0, 0, 0, 0
	for seed := uint64(1); seed <= seeds; seed++ {
		p := Draw(seed, s)
		n := 0
		for _, f := range p.Faults {
			if f.Kind != PauseKey {
				continue
			}
			n++
			first := p.JobAt(0, f.Window)
			for c := range p.Clusters {
				first = min(first, p.JobAt(c, f.Window))
			}
			if f.At < first-600*time.Millisecond || f.At > first+1500*time.Millisecond {
				t.Fatalf("seed %d: the pause is set at %s, not near window %d's first Job (%s):\n%s", seed, f.At, f.Window, first, p)
			}
			if f.At <= first+300*time.Millisecond {
				early++
			}
			if f.For < 200*time.Millisecond || f.For > 2*p.Period {
				t.Fatalf("seed %d: the pause holds for %s, want 200 ms to two periods (%s)", seed, f.For, 2*p.Period)
			}
			if f.Again < 0 || f.Again >= f.For {
				t.Fatalf("seed %d: the pause is set again at +%s, not while it holds (for %s)", seed, f.Again, f.For)
			}
			switch f.Variant {
			case PauseResumed:
				resumed++
			case PauseFor:
				ending++
			default:
				t.Fatalf("seed %d: pause variant %q", seed, f.Variant)
			}
			if f.Again > 0 {
				again++
			}
			if slices.ContainsFunc(p.Faults, func(h Fault) bool { return h.Kind == Herd && h.Window == f.Window }) {
				herds++
			}
		}
		if n > 1 {
			t.Fatalf("seed %d plans %d pauses:\n%s", seed, n, p)
		}
		pausing += n
	}
	if pausing < seeds/6 || pausing > seeds/3 {
		t.Fatalf("%d of %d plans pause their key, want about a quarter", pausing, seeds)
	}
	if early < pausing/2 {
		t.Errorf("%d of %d pauses are set by 300 ms after their window's first Job, want most", early, pausing)
	}
	for what, n := range map[string]int{"are resumed": resumed, "end by themselves": ending, "are set again": again, "fall in a herd's window": herds} {
		if n < pausing/10 {
			t.Errorf("%d of %d pauses %s, want some", n, pausing, what)
		}
	}
}
