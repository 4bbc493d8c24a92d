package webhook

import (
	"fmt"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/dislock/dislock/test/benchmark"
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
				lat, elapsed := benchmark.Run(b, clients, func(int64) error {
					if resp, _ := ts.review(b, path, body); resp == nil || !resp.Allowed {
						return fmt.Errorf("response %+v", resp)
					}
					return nil
				})
				benchmark.Report(b, lat, time.Microsecond, "reviews/s", float64(len(lat))/elapsed.Seconds())
			})
		}
	}
}
