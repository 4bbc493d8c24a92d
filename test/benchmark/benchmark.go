// Package benchmark runs an operation from several concurrent clients and
// reports latency percentiles and throughput the same way in every
// benchmark of the repository, so numbers line up in docs/benchmarks.md.
package benchmark

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Run calls op b.N times in total from clients goroutines (op gets the
// 1-based call number) and returns every call's latency and the wall time.
// The benchmark timer covers exactly the calls.
func Run(b *testing.B, clients int, op func(i int64) error) ([]time.Duration, time.Duration) {
	b.Helper()
	var next atomic.Int64
	lat := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				t0 := time.Now()
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	return slices.Concat(lat...), elapsed
}

// Report records p50 and p99 of lat in unit (time.Microsecond → "p50-µs",
// time.Millisecond → "p50-ms") and, when rateName is not empty, the rate.
// ns/op is zeroed: wall time per operation over several clients misleads.
func Report(b *testing.B, lat []time.Duration, unit time.Duration, rateName string, rate float64) {
	b.Helper()
	if len(lat) == 0 {
		b.Fatal("no latencies to report")
	}
	slices.Sort(lat)
	suffix := map[time.Duration]string{time.Microsecond: "µs", time.Millisecond: "ms"}[unit]
	at := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / float64(unit)
	}
	b.ReportMetric(at(0.50), "p50-"+suffix)
	b.ReportMetric(at(0.99), "p99-"+suffix)
	if rateName != "" {
		b.ReportMetric(rate, rateName)
	}
	b.ReportMetric(0, "ns/op")
}
