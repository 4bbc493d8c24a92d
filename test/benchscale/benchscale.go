// Package benchscale measures what a herd of simulated pods costs the
// database they lock against: the CPU time of PostgreSQL's and PgBouncer's
// processes, the WAL written, PgBouncer's client wait time, what the
// backends were waiting for, and the statements pg_stat_statements saw. The
// herd itself (lockagent/agent's BenchmarkHerd) runs the agent's own code;
// this package only watches and reports, so that `make bench-scale` prints
// the numbers docs/benchmarks.md quotes.
package benchscale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
)

// RaiseFileLimit lifts this process's soft open-file limit to its hard
// limit, failing if that is below n. Every simulated pod holds a
// connection, in its process and in its cluster's PgBouncer, and a Go
// program that sets RLIMIT_NOFILE itself hands that value to its children
// (otherwise they get the limit it started with). The hard limit itself
// can only be raised with CAP_SYS_RESOURCE, which containers often lack.
func RaiseFileLimit(n uint64) error {
	var cur syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &cur); err != nil {
		return err
	}
	if cur.Max < n {
		return fmt.Errorf("the open-file limit is %d, and this load needs %d (one per simulated pod's connection): raise `ulimit -Hn`", cur.Max, n)
	}
	lim := syscall.Rlimit{Cur: cur.Max, Max: cur.Max}
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// userHZ is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, 100 on
// every architecture Linux supports today).
const userHZ = 100

// TreeCPU is the CPU time (user + system) of pid and of all its children,
// live or already reaped: PostgreSQL's postmaster forks a backend per
// connection, and a backend that exited is counted in its parent's
// cutime/cstime.
func TreeCPU(pid int) (time.Duration, error) {
	stat, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	ticks := stat.utime + stat.stime + stat.cutime + stat.cstime
	kids, err := children(pid)
	if err != nil {
		return 0, err
	}
	for _, k := range kids {
		if s, err := readStat(k); err == nil { // a child may exit meanwhile
			ticks += s.utime + s.stime
		}
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// SelfCPU is this process's CPU time: the load generator's own share of
// the machine.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	// The command name (field 2) may hold blanks; the fields after its
	// closing parenthesis are plain.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state): ppid is field 4, utime..cstime 14..17.
	num := func(k int) int64 { n, _ := strconv.ParseInt(f[k-3], 10, 64); return n }
	return procStat{ppid: int(num(4)), utime: num(14), stime: num(15), cutime: num(16), cstime: num(17)}, nil
}

func children(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var kids []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := readStat(p); err == nil && s.ppid == pid {
			kids = append(kids, p)
		}
	}
	return kids, nil
}

// Counters is a snapshot of what the database and the bouncers have done so
// far; Sub gives a phase's share.
type Counters struct {
	At         time.Time
	PostgreSQL time.Duration // CPU of the postmaster and its children
	Bouncers   time.Duration // CPU of every PgBouncer
	Gateways   time.Duration // CPU of every lock gateway
	Self       time.Duration // CPU of the load generator
	WALBytes   float64       // pg_current_wal_lsn() in bytes
	WALSyncs   int64         // pg_stat_wal.wal_sync
	WALFPI     int64         // pg_stat_wal.wal_fpi: full-page images
	Commits    int64         // pg_stat_database.xact_commit of the database
	Sessions   int64         // pg_stat_database.sessions: backends started
	WaitMicros int64         // PgBouncer SHOW STATS total_wait_time, summed
	XactCount  int64         // PgBouncer SHOW STATS total_xact_count, summed
}

// Sub is c minus an earlier snapshot.
func (c Counters) Sub(o Counters) Counters {
	return Counters{At: c.At, PostgreSQL: c.PostgreSQL - o.PostgreSQL, Bouncers: c.Bouncers - o.Bouncers, Gateways: c.Gateways - o.Gateways, Self: c.Self - o.Self,
		WALBytes: c.WALBytes - o.WALBytes, WALSyncs: c.WALSyncs - o.WALSyncs, WALFPI: c.WALFPI - o.WALFPI,
		Commits: c.Commits - o.Commits, Sessions: c.Sessions - o.Sessions, WaitMicros: c.WaitMicros - o.WaitMicros, XactCount: c.XactCount - o.XactCount}
}

// Watch reads the Counters of one PostgreSQL and its bouncers.
type Watch struct {
	Postmaster int
	Bouncers   []int
	// Gateways are lock gateways' processes (lockagent/gateway), each
	// between a cluster's pods and its PgBouncer.
	Gateways []int
	// DB is a superuser connection straight to PostgreSQL (not through a
	// bouncer, which would count it).
	DB *pgx.Conn
	// Admin are connections to each bouncer's admin console (database
	// "pgbouncer", simple protocol).
	Admin []*pgx.Conn
}

// Read takes a snapshot.
func (w *Watch) Read(ctx context.Context) (Counters, error) {
	c := Counters{At: time.Now(), Self: SelfCPU()}
	var err error
	if c.PostgreSQL, err = TreeCPU(w.Postmaster); err != nil {
		return c, fmt.Errorf("postgres CPU: %w", err)
	}
	for _, pid := range w.Bouncers {
		d, err := TreeCPU(pid)
		if err != nil {
			return c, fmt.Errorf("pgbouncer CPU: %w", err)
		}
		c.Bouncers += d
	}
	for _, pid := range w.Gateways {
		d, err := TreeCPU(pid)
		if err != nil {
			return c, fmt.Errorf("lock gateway CPU: %w", err)
		}
		c.Gateways += d
	}
	err = w.DB.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8,
		(SELECT wal_sync FROM pg_stat_wal), (SELECT wal_fpi FROM pg_stat_wal),
		(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
		(SELECT sum(sessions)::int8 FROM pg_stat_database)`).
		Scan(&c.WALBytes, &c.WALSyncs, &c.WALFPI, &c.Commits, &c.Sessions)
	if err != nil {
		return c, fmt.Errorf("WAL and commits: %w", err)
	}
	for _, a := range w.Admin {
		wait, xacts, err := bouncerStats(ctx, a)
		if err != nil {
			return c, err
		}
		c.WaitMicros += wait
		c.XactCount += xacts
	}
	return c, nil
}

// bouncerStats sums SHOW STATS' total_wait_time (µs clients spent waiting
// for a server connection) and total_xact_count over the bouncer's
// databases. Its columns differ between PgBouncer versions, so they are
// found by name.
func bouncerStats(ctx context.Context, a *pgx.Conn) (wait, xacts int64, err error) {
	rows, err := a.Query(ctx, "SHOW STATS")
	if err != nil {
		return 0, 0, fmt.Errorf("pgbouncer SHOW STATS: %w", err)
	}
	defer rows.Close()
	cols := rows.FieldDescriptions()
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return 0, 0, err
		}
		for i, c := range cols {
			switch c.Name {
			case "total_wait_time":
				wait += toInt(vals[i])
			case "total_xact_count":
				xacts += toInt(vals[i])
			}
		}
	}
	return wait, xacts, rows.Err()
}

func toInt(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case int32:
		return int64(n)
	case string:
		i, _ := strconv.ParseInt(n, 10, 64)
		return i
	}
	// PgBouncer's console answers in text; whatever type pgx made of it
	// prints as the number.
	i, _ := strconv.ParseInt(fmt.Sprint(v), 10, 64)
	return i
}

// Waits samples, every interval until Stop, what PostgreSQL's client
// backends of one database are doing (pg_stat_activity): "CPU" for an active
// backend waiting on nothing, else wait_event_type:wait_event. The shares
// show what a herd queues on (WAL flushes, row locks, CPU).
type Waits struct {
	mu     sync.Mutex
	counts map[string]int
	total  int
	stop   chan struct{}
	done   chan struct{}
}

// SampleWaits starts sampling through db (its own connection).
func SampleWaits(db *pgx.Conn, interval time.Duration) *Waits {
	w := &Waits{counts: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			rows, err := db.Query(context.Background(), `SELECT CASE WHEN wait_event IS NULL THEN 'CPU' ELSE wait_event_type || ':' || wait_event END
				FROM pg_stat_activity WHERE backend_type = 'client backend' AND state = 'active' AND pid <> pg_backend_pid()`)
			if err == nil {
				for rows.Next() {
					var s string
					if rows.Scan(&s) == nil {
						w.mu.Lock()
						w.counts[s]++
						w.total++
						w.mu.Unlock()
					}
				}
				rows.Close()
			}
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// Stop ends the sampling and returns the shares, largest first, as
// "CPU 61%, IO:WALSync 30%, …" (at most five), and the number of samples
// of active backends.
func (w *Waits) Stop() (string, int) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	type kv struct {
		k string
		n int
	}
	var all []kv
	for k, n := range w.counts {
		all = append(all, kv{k, n})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n || all[i].n == all[j].n && all[i].k < all[j].k })
	var parts []string
	for i, e := range all {
		if i == 5 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.0f%%", e.k, 100*float64(e.n)/float64(w.total)))
	}
	if len(parts) == 0 {
		return "no active backend seen", 0
	}
	return strings.Join(parts, ", "), w.total
}

// TopStatements returns pg_stat_statements' statements with the most
// planning and execution time since the last ResetStatements, as lines of
// calls, mean planning and execution time, total time and the statement's
// first words. Planning is only counted with
// pg_stat_statements.track_planning on.
func TopStatements(ctx context.Context, db *pgx.Conn, n int) ([]string, error) {
	// One line per statement, whichever role ran it: every tenant role has
	// entries of its own.
	rows, err := db.Query(ctx, `SELECT sum(calls)::int8, sum(total_exec_time) / NULLIF(sum(calls), 0), sum(total_plan_time) / NULLIF(sum(calls), 0),
		sum(total_exec_time + total_plan_time), regexp_replace(query, '\s+', ' ', 'g')
		FROM pg_stat_statements GROUP BY query ORDER BY 4 DESC LIMIT $1`, n)
	if err != nil {
		return nil, fmt.Errorf("pg_stat_statements (is it in shared_preload_libraries?): %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var calls int64
		var mean, plan, total *float64
		var q string
		if err := rows.Scan(&calls, &mean, &plan, &total, &q); err != nil {
			return nil, err
		}
		if mean == nil || plan == nil {
			continue // planned, never executed
		}
		if len(q) > 70 {
			q = q[:70] + "…"
		}
		out = append(out, fmt.Sprintf("%8d calls  planning %6.3f ms  execution %7.3f ms  total %8.1f ms  %s", calls, *plan, *mean, *total, q))
	}
	return out, rows.Err()
}

// Calls is how many times PostgreSQL ran the statements whose text starts
// with prefix (blanks collapsed, whichever role ran them) since the last
// ResetStatements. A prefix, not the whole text: pg_stat_statements keeps
// a statement's text with its constants replaced by $n, so the text a
// client sent is not what it keeps.
func Calls(ctx context.Context, db *pgx.Conn, prefix string) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements
		WHERE starts_with(btrim(regexp_replace(query, '\s+', ' ', 'g')), btrim(regexp_replace($1, '\s+', ' ', 'g')))`, prefix).Scan(&n)
	return n, err
}

// ResetStatements clears pg_stat_statements, so TopStatements covers one
// phase.
func ResetStatements(ctx context.Context, db *pgx.Conn) error {
	_, err := db.Exec(ctx, "SELECT pg_stat_statements_reset()")
	return err
}

// Percentile is the p-quantile (0..1) of sorted durations, nearest rank.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

// Sorted returns a sorted copy.
func Sorted(d []time.Duration) []time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s
}

// Table writes aligned rows, the first being the header.
func Table(w io.Writer, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, r := range rows {
		if _, err := fmt.Fprintln(tw, strings.Join(r, "\t")+"\t"); err != nil {
			return err
		}
	}
	return tw.Flush()
}

// Share is cpu as a percentage of all of the machine's CPUs over wall.
func Share(cpu, wall time.Duration, cpus int) float64 {
	if wall <= 0 || cpus <= 0 {
		return 0
	}
	return 100 * cpu.Seconds() / (wall.Seconds() * float64(cpus))
}

// PgbenchScript is a pgbench script running query with each $n replaced
// by args[n-1] (pgbench expressions or literals), after prelude (its \set
// lines). It refuses args that do not match the query's parameters one for
// one: a statement that gained or lost a parameter must not run a baseline
// that binds the wrong values, or none.
func PgbenchScript(query, prelude string, args []string) (string, error) {
	highest := 0
	for _, m := range regexp.MustCompile(`\$([0-9]+)`).FindAllStringSubmatch(query, -1) {
		n, _ := strconv.Atoi(m[1])
		highest = max(highest, n)
	}
	if highest != len(args) {
		return "", fmt.Errorf("pgbench script: the statement has %d parameters and the script binds %d", highest, len(args))
	}
	for i := len(args); i >= 1; i-- { // $10 before $1
		query = strings.ReplaceAll(query, "$"+strconv.Itoa(i), "("+args[i-1]+")")
	}
	return prelude + strings.TrimSpace(query) + ";\n", nil
}

// ErrNoTransactions: pgbench's clients completed no transaction in the time
// given (their server connections never came).
var ErrNoTransactions = errors.New("pgbench completed no transaction")

// Pgbench runs script under pgbench for d with clients connections to the
// database of dsn (a postgres:// URL) and returns the transactions per
// second it reports, excluding connection time.
func Pgbench(ctx context.Context, bin, dsn, script string, clients int, d time.Duration) (float64, error) {
	r, err := PgbenchRun(ctx, bin, dsn, script, clients, d)
	return r.TPS, err
}

// PgbenchTransactions is Pgbench running script n times from each client
// instead of for a while: for a test that the script does what it should,
// which must not depend on how loaded the machine is.
func PgbenchTransactions(ctx context.Context, bin, dsn, script string, clients, n int) (float64, error) {
	r, err := pgbench(ctx, bin, dsn, script, clients, "-t", strconv.Itoa(n))
	return r.TPS, err
}

// PgbenchResult is what one pgbench run reports, and what it cost its own
// process.
type PgbenchResult struct {
	TPS          float64       // transactions per second, excluding connection time
	Transactions int64         // transactions processed
	CPU          time.Duration // pgbench's own CPU time, user and system
}

// PgbenchRun is Pgbench with everything it reports.
func PgbenchRun(ctx context.Context, bin, dsn, script string, clients int, d time.Duration) (PgbenchResult, error) {
	return pgbench(ctx, bin, dsn, script, clients, "-T", strconv.Itoa(int(d.Seconds())))
}

func pgbench(ctx context.Context, bin, dsn, script string, clients int, run ...string) (PgbenchResult, error) {
	var r PgbenchResult
	u, err := url.Parse(dsn)
	if err != nil {
		return r, fmt.Errorf("pgbench: parsing the URL: %w", err)
	}
	dir, err := os.MkdirTemp("", "benchscale-pgbench-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "script.sql")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		return r, err
	}
	pw, _ := u.User.Password()
	args := append([]string{"-n", "-M", "extended", "-f", file, "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, runtime.GOMAXPROCS(0)))}, run...)
	args = append(args, "-h", u.Hostname(), "-p", u.Port(), "-U", u.User.Username(), strings.TrimPrefix(u.Path, "/"))
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+pw, "PGSSLMODE=disable")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return r, fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	r.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	m := regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`).FindSubmatch(out)
	if m == nil && regexp.MustCompile(`number of transactions actually processed: 0\n`).Match(out) {
		return r, fmt.Errorf("%w:\n%s", ErrNoTransactions, out)
	}
	if m == nil {
		return r, fmt.Errorf("pgbench printed no tps:\n%s", out)
	}
	if f := regexp.MustCompile(`number of failed transactions: ([1-9][0-9]*)`).FindSubmatch(out); f != nil {
		return r, fmt.Errorf("pgbench: %s transactions failed:\n%s", f[1], out)
	}
	if n := regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`).FindSubmatch(out); n != nil {
		r.Transactions, _ = strconv.ParseInt(string(n[1]), 10, 64)
	}
	r.TPS, err = strconv.ParseFloat(string(m[1]), 64)
	return r, err
}
