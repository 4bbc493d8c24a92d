package webhook

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
)

// BenchmarkAdmission measures a CronJob-owned Job's admission review over
// HTTPS (decode, owner lookup, injection, JSON patch) next to a no-op handler
// on the same server stack, at 1 and 8 concurrent clients.
func BenchmarkAdmission(b *testing.B) {
	cj, job := cronJobAndJob(map[string]string{"dislock.io/mode": "schedule,lease"})
	ts := startTestServer(b, cj)
	body := reviewBody(b, "Job", admissionv1.Create, job)
	for _, path := range []string{"/noop", MutateJobPath} {
		for _, clients := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/clients=%d", path, clients), func(b *testing.B) {
				var next atomic.Int64
				lat := make([][]time.Duration, clients)
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for c := range clients {
					wg.Go(func() {
						for next.Add(1) <= int64(b.N) {
							t0 := time.Now()
							resp, _ := ts.review(b, path, body)
							if resp == nil || !resp.Allowed {
								b.Errorf("response %+v", resp)
								return
							}
							lat[c] = append(lat[c], time.Since(t0))
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				all := slices.Concat(lat...)
				slices.Sort(all)
				b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(all[min(len(all)-1, len(all)*99/100)].Microseconds()), "p99-µs")
				b.ReportMetric(float64(len(all))/elapsed.Seconds(), "reviews/s")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
