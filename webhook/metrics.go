package webhook

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/dislock/dislock/internal/version"
)

// Admission results, the values of the "result" label.
const (
	resultInjected      = "injected"
	resultNotApplicable = "not_applicable"
	resultAllowed       = "allowed"
	resultDenied        = "denied"
	resultError         = "error"
)

var (
	admissionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dislock_webhook_admissions_total",
		Help: "Admission reviews answered, by webhook and result (injected, not_applicable, allowed, denied, error).",
	}, []string{"webhook", "result"})
	admissionDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "dislock_webhook_admission_duration_seconds",
		Help:    "Time to answer one admission review, including registry lookups.",
		Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
	}, []string{"webhook"})
	// buildInfo says which build answers, as the ecosystem's *_build_info
	// gauges do: during a rollout, or across clusters upgraded one by one,
	// a query joins on it to tell replicas and clusters apart by version.
	buildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "dislock_build_info",
		Help: "1, labelled with the version and commit this webhook was built from and the Go version that built it.",
	}, []string{"version", "commit", "goversion"})
)

func init() {
	buildInfo.WithLabelValues(version.Version, version.Commit, runtime.Version()).Set(1)
	metrics.Registry.MustRegister(admissionsTotal, admissionDuration, buildInfo)
}
