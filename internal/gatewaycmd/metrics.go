package gatewaycmd

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dislock/dislock/lockagent/gateway"
)

// metrics are the gateway's own: its calls by name and answer, how long
// they took, and what each lane is doing.
type metrics struct {
	calls   *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dislock_gateway_calls_total",
			Help: "Calls the lock gateway answered, by call (claim, renew, …) and answer (ok, or the error's kind: window-taken, unavailable, forbidden, …).",
		}, []string{"call", "answer"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dislock_gateway_call_seconds",
			Help:    "Time from a call's arrival to its answer, queueing included, by call.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, []string{"call"}),
	}
	reg.MustRegister(m.calls, m.seconds, prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observe(call, answer string, took time.Duration) {
	m.calls.WithLabelValues(call, answer).Inc()
	m.seconds.WithLabelValues(call).Observe(took.Seconds())
}

// lanes exports what each lane of srv is doing when scraped.
func (m *metrics) lanes(reg prometheus.Registerer, srv *gateway.Server) {
	for _, lane := range []string{"decisions", "renewals"} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dislock_gateway_queued_calls", Help: "Calls waiting for one of the lane's database connections.",
			ConstLabels: prometheus.Labels{"lane": lane},
		}, func() float64 { return float64(srv.Lanes()[lane].Queued) }))
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dislock_gateway_running_calls", Help: "Calls holding one of the lane's database connections.",
			ConstLabels: prometheus.Labels{"lane": lane},
		}, func() float64 { return float64(srv.Lanes()[lane].Running) }))
	}
}
