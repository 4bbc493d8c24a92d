package agent_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/test/benchmark"
	"github.com/dislock/dislock/test/pgtest"
)

// BenchmarkDecision measures what a pod pays before its app may start:
// agent process start → decision file written, through PgBouncer on
// loopback, one fresh window per run. BenchmarkProcessStart is the baseline
// in the same run: starting the same binary and having it exit.
func BenchmarkDecision(b *testing.B) {
	srv := pgtest.Need(b)
	key := fmt.Sprintf("bench-%d/decision", time.Now().UnixNano())
	env := []string{"DISLOCK_MODE=schedule", "DISLOCK_KEY=" + key, "DISLOCK_LEASE_TTL=30s", "DISLOCK_CLUSTER=dc-a",
		"DISLOCK_JOB_UID=uid", "DISLOCK_POD_NAME=pod", "DISLOCK_DATABASE_URL=" + srv.BouncerDSN()}
	openStore(b, srv.BouncerDSN())
	var lat []time.Duration
	var rss []float64
	b.ResetTimer()
	for i := range b.N {
		dir := b.TempDir()
		cmd := exec.Command(agentBin, "agent")
		cmd.Env = append(slices.Clone(env), "DISLOCK_SHARED_DIR="+dir, "DISLOCK_TERMINATION_LOG="+filepath.Join(dir, "tl"),
			"DISLOCK_JOB_NAME=job-"+strconv.Itoa(i), "DISLOCK_WINDOW="+tick0.Add(time.Duration(i)*time.Minute).Format(time.RFC3339))
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		decision := filepath.Join(dir, protocol.DecisionFile)
		for {
			if _, err := os.Stat(decision); err == nil {
				break
			}
			if time.Since(t0) > 30*time.Second {
				b.Fatal("no decision in 30s")
			}
			time.Sleep(time.Millisecond)
		}
		lat = append(lat, time.Since(t0))
		rss = append(rss, vmRSSMiB(b, cmd.Process.Pid))
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	benchmark.Report(b, lat, time.Millisecond, "", 0)
	slices.Sort(rss)
	b.ReportMetric(rss[len(rss)/2], "idle-RSS-MiB")
}

func BenchmarkProcessStart(b *testing.B) {
	var lat []time.Duration
	for range b.N {
		t0 := time.Now()
		if err := exec.Command(agentBin, "version").Run(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	benchmark.Report(b, lat, time.Millisecond, "", 0)
}

// vmRSSMiB is the resident set of a process, from /proc.
func vmRSSMiB(b *testing.B, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
