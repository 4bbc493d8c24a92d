// Package promtest starts a real Prometheus server (Debian's prometheus
// package) for one test: it scrapes the targets the test names and evaluates
// the rule files it is given, and the test asks it questions through its
// HTTP query API, as a user's dashboards and alerts do.
package promtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/test/harness"
)

// ErrMissing is returned when the prometheus binary is not installed.
var ErrMissing = errors.New("promtest: prometheus is not installed (run hack/install-deps.sh: it installs Debian's prometheus package)")

// Options configure the server.
type Options struct {
	// Targets are host:port addresses scraped at /metrics, as job "dislock".
	Targets []string
	// RuleFiles are Prometheus rule files, evaluated every Interval.
	RuleFiles []string
	// Interval is the scrape and rule evaluation interval (default 1s).
	Interval time.Duration
}

// Server is a running Prometheus.
type Server struct {
	// URL is the server's base URL, e.g. http://127.0.0.1:41234.
	URL  string
	dir  string
	proc *harness.Proc
}

// Binary is the prometheus executable, or ErrMissing.
func Binary() (string, error) {
	for _, p := range []string{"prometheus", "/usr/bin/prometheus"} {
		if path, err := exec.LookPath(p); err == nil {
			return path, nil
		}
	}
	return "", ErrMissing
}

// New starts a Prometheus for t and stops it when t ends. A missing binary
// fails the test under CI and skips it elsewhere (harness.Missing).
func New(t testing.TB, opts Options) *Server {
	t.Helper()
	return harness.New(t, func() (*Server, error) { return start(t.TempDir(), opts) }, ErrMissing, (*Server).logTail)
}

func start(dir string, opts Options) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	port, err := harness.FreePort()
	if err != nil {
		return nil, err
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: %s\n  evaluation_interval: %s\n", opts.Interval, opts.Interval)
	if len(opts.RuleFiles) > 0 {
		cfg.WriteString("rule_files:\n")
		for _, f := range opts.RuleFiles {
			fmt.Fprintf(&cfg, "  - %q\n", f)
		}
	}
	cfg.WriteString("scrape_configs:\n  - job_name: dislock\n    static_configs:\n      - targets:\n")
	for _, tg := range opts.Targets {
		fmt.Fprintf(&cfg, "          - %q\n", tg)
	}
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg.String()), 0o644); err != nil {
		return nil, err
	}
	addr := harness.Addr(port)
	cmd := exec.Command(bin, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Dir = dir
	proc, err := harness.StartProc("promtest", dir, "prometheus", "# "+strings.Join(cmd.Args, " "), cmd)
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + addr, dir: dir, proc: proc}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.URL + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if !proc.Running() || time.Now().After(deadline) {
			return nil, errors.Join(fmt.Errorf("promtest: prometheus did not become ready:\n%s", s.logTail()), s.Close())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close stops the server.
func (s *Server) Close() error { return s.proc.Stop(syscall.SIGTERM, 10*time.Second) }

func (s *Server) logTail() string {
	return "--- last lines of prometheus.log ---\n" + harness.LogTail(filepath.Join(s.dir, "prometheus.log"), 40, 8000)
}

// Sample is one series of an instant query's result.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Query evaluates expr at the current time.
func (s *Server) Query(ctx context.Context, expr string) ([]Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/api/v1/query?query="+url.QueryEscape(expr), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string            `json:"resultType"`
			Result     []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %q: %s", expr, body.Error)
	}
	var out []Sample
	for _, raw := range body.Data.Result {
		var r struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("query %q: %s result: %w", expr, body.Data.ResultType, err)
		}
		v, _ := r.Value[1].(string)
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("query %q: value %q: %w", expr, v, err)
		}
		out = append(out, Sample{Labels: r.Metric, Value: f})
	}
	return out, nil
}

// Await queries expr until cond holds for its result, and returns that
// result; it fails t after timeout.
func (s *Server) Await(t testing.TB, what, expr string, timeout time.Duration, cond func([]Sample) bool) []Sample {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last []Sample
	var lastErr error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		last, lastErr = s.Query(ctx, expr)
		cancel()
		if lastErr == nil && cond(last) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s did not hold within %s; last result %v, error %v", what, expr, timeout, last, lastErr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
