package monitoring

import (
	"bytes"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// Exposition gathers c through a pedantic registry, which checks every
// metric against the collector's descriptions, and returns the text format
// a scrape would read, without the help lines.
func Exposition(c prometheus.Collector) (string, error) {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		return "", err
	}
	families, err := reg.Gather()
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			return "", err
		}
	}
	var out []string
	for line := range strings.Lines(b.String()) {
		if !strings.HasPrefix(line, "# HELP ") {
			out = append(out, line)
		}
	}
	return strings.Join(out, ""), nil
}
