package webhook

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

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

// BenchmarkAdmissionSteps times the JSON steps of the same Job's admission
// without the server around them, each next to the way the webhook first did
// it: decoding the request's Job through the API machinery's codec or
// directly, and answering with a patch diffed from the marshalled injected
// Job (the fallback) or built from the injection. Both patch ways include
// encoding the patch, as the server does before writing the response.
func BenchmarkAdmissionSteps(b *testing.B) {
	raw, decoded, injected := injectedRequest(b, "")
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	codec := admission.NewDecoder(scheme)
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Object: runtime.RawExtension{Raw: raw}}}
	steps := []struct {
		name string
		run  func() error
	}{
		{"decode/codec", func() error { return codec.Decode(req, &batchv1.Job{}) }},
		{"decode/direct", func() error { _, err := decodeJob(raw); return err }},
		{"patch/diffed", func() error {
			b, err := json.Marshal(injected)
			if err != nil {
				return err
			}
			resp := admission.PatchResponseFromRaw(raw, b)
			return resp.Complete(req)
		}},
		{"patch/built", func() error {
			resp, err := patchResponse(raw, decoded, injected)
			if err != nil {
				return err
			}
			return resp.Complete(req)
		}},
	}
	for _, s := range steps {
		b.Run(s.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := s.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
