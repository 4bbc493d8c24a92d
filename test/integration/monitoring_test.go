package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/monitoring"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/test/promtest"
	"github.com/dislock/dislock/test/tlstest"
)

// A window that ran nowhere pages someone. Real agent processes of two
// clusters decide windows of two keys through PgBouncer; one window of one
// key fails in dc-a while dc-b skips it. A real Prometheus scrapes `dislock
// webhook` (its elected leader computes the metrics from the database) and
// evaluates the shipped alerts: DislockWindowMissed fires for that key and
// for no other, and every query of the shipped dashboard returns data.
func TestAWindowThatRanNowherePagesForItsKeyOnly(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	namespace(t, cs, webhookNamespace, false)
	srv, err := pgtest.Start(pgtest.Options{Name: "monitoring", Logf: t.Logf})
	if err != nil {
		pgtest.Missing(t, err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	ctx := context.Background()

	ns := "monitoring"
	namespace(t, cs, ns, true)
	// The CronJobs exist (Events and `looks` name them) but are suspended:
	// the test is the CronJob controller, and there is no kubelet.
	for _, name := range []string{"nowhere", "fine"} {
		cj := withAnnotations(cronJob(ns, name, "* * * * *"), map[string]string{contract.AnnotationMode: "schedule"})
		cj.Spec.Suspend = ptr.To(true)
		if _, err := cs.BatchV1().CronJobs(ns).Create(ctx, cj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	certDir := t.TempDir()
	ca := tlstest.ServingCert(t, certDir)
	w := startBinary(t, c, "--cert-dir="+certDir, "--database-url="+srv.DirectDSN(), "--ledger-interval=5s", "--alerting-candidate")
	w.awaitReady(t)
	registerWebhooks(t, cs, fmt.Sprintf("https://127.0.0.1:%d", w.port), ca)
	// One admission, so that the admission panels have data.
	cj, err := cs.BatchV1().CronJobs(ns).Get(ctx, "fine", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	createJob(t, cs, jobFor(cj, time.Now().Truncate(time.Minute)))

	prom := promtest.New(t, promtest.Options{
		Targets:   []string{fmt.Sprintf("127.0.0.1:%d", w.metricsPort)},
		RuleFiles: []string{shippedRules(t)},
	})

	owner, err := store.Open(ctx, srv.DirectDSN(), store.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	agent := buildAgent(t)
	pods := podRunner{t: t, bin: agent, dsn: srv.BouncerDSN(), ns: ns}

	// Window w0: both keys run in dc-a and skip in dc-b. It is their first
	// decision, so it is not judged: judging starts after a key is first seen.
	now, err := owner.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w0 := now.Truncate(time.Minute)
	for _, key := range []string{"nowhere", "fine"} {
		pods.window(key, w0, "exit 0")
	}
	awaitDBPast(t, owner, w0.Add(time.Minute))
	// Window w1: the run of "nowhere" fails in dc-a, and dc-b skips it (no
	// standby): it ran nowhere. "fine" runs.
	w1 := w0.Add(time.Minute)
	pods.window("nowhere", w1, "exit 1")
	pods.window("fine", w1, "exit 0")

	// Once w1's grace (one period: a minute) ended, the leader finds it
	// missed and the alert fires, for that key only.
	firing := prom.Await(t, "DislockWindowMissed firing", `ALERTS{alertname="DislockWindowMissed", alertstate="firing"}`, 3*time.Minute,
		func(s []promtest.Sample) bool { return len(s) > 0 })
	for _, s := range firing {
		if s.Labels["namespace"] != ns || s.Labels["cronjob"] != "nowhere" {
			t.Errorf("DislockWindowMissed fired for %v; want only %s/nowhere", s.Labels, ns)
		}
	}
	if got := sampleOf(t, prom, `dislock_missed_windows_total{namespace="`+ns+`", cronjob="fine"}`); got != 0 {
		t.Errorf("the key that ran every window counts %v missed windows", got)
	}
	if got := sampleOf(t, prom, `dislock_last_missed_window_timestamp_seconds{cronjob="nowhere"}`); got != float64(w1.Unix()) {
		t.Errorf("last missed window %v, want %d (%s)", got, w1.Unix(), w1)
	}
	// What each cluster decided is counted per cluster.
	for _, q := range []string{
		`dislock_decisions_total{cronjob="nowhere", cluster="dc-a", action="failed"}`,
		`dislock_decisions_total{cronjob="nowhere", cluster="dc-b", action="skip"}`,
		`dislock_decisions_total{cronjob="fine", cluster="dc-a", action="succeeded"}`,
	} {
		if got := sampleOf(t, prom, q); got < 1 {
			t.Errorf("%s = %v, want at least 1", q, got)
		}
	}

	// No dead panels: every query of the shipped dashboard returns data.
	queries, err := monitoring.DashboardQueries(filepath.Join("..", "..", "charts", "dislock", "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queries {
		prom.Await(t, "dashboard query to return data", q, 30*time.Second, func(s []promtest.Sample) bool { return len(s) > 0 })
	}
}

// One missed window pages once across clusters, and the page moves when the
// cluster that raised it stops. Two clusters' webhooks (dc-a, dc-b) share
// the database, each scraped by its own Prometheus evaluating the shipped
// rules. The webhooks elect one alerting cluster; a window of one key runs
// nowhere, and both Prometheus servers see it missed, but DislockWindowMissed
// fires in the alerting cluster's alone. Then that cluster's webhook stops:
// once its claim lapsed and the settle time passed, the other cluster is the
// alerting one and its Prometheus fires for the same window (still within
// its hour), never while the first still did.
func TestAMissedWindowPagesFromOneClusterAndTheOtherTakesOverWhenItStops(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	srv, err := pgtest.Start(pgtest.Options{Name: "alerting", Logf: t.Logf})
	if err != nil {
		pgtest.Missing(t, err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	ctx := context.Background()

	// Each cluster's webhook in a namespace of its own (its token record is
	// a ConfigMap there); --ledger-interval=5s makes the role's claim last
	// 45 s (AlertingTTL), renewed every 15 s.
	type cluster struct {
		name string
		w    *binaryWebhook
		prom *promtest.Server
	}
	// dc-c's webhook is scraped too, but is no candidate (its Prometheus
	// does not evaluate the rules, say): it never takes the role.
	var clusters []*cluster
	var bystander *cluster
	for _, name := range []string{"dc-a", "dc-b", "dc-c"} {
		ns := webhookNamespace + "-" + name
		namespace(t, cs, ns, false)
		certDir := t.TempDir()
		tlstest.ServingCert(t, certDir)
		// No database roles: the webhooks watch the one API server, where
		// they would take turns on the same namespaces' Secrets.
		args := []string{"--cert-dir=" + certDir, "--database-url=" + srv.DirectDSN(), "--ledger-interval=5s",
			"--cluster-name=" + name, "--namespace=" + ns, "--tenant-roles=false"}
		if name != "dc-c" {
			args = append(args, "--alerting-candidate")
		}
		w := startBinary(t, c, args...)
		w.awaitReady(t)
		cl := &cluster{name: name, w: w, prom: promtest.New(t, promtest.Options{
			Targets:   []string{fmt.Sprintf("127.0.0.1:%d", w.metricsPort)},
			RuleFiles: []string{shippedRules(t)},
		})}
		if name == "dc-c" {
			bystander = cl
			continue
		}
		clusters = append(clusters, cl)
	}
	// alerting returns the cluster whose Prometheus sees its webhook say it
	// is the alerting cluster, failing if both do; nil if none does.
	alerting := func() *cluster {
		t.Helper()
		var found *cluster
		for _, cl := range clusters {
			if sampleOf(t, cl.prom, `max(dislock_alerting_cluster)`) == 1 {
				if found != nil {
					t.Fatalf("both %s and %s say they are the alerting cluster", found.name, cl.name)
				}
				found = cl
			}
		}
		return found
	}
	var first *cluster
	clusters[0].prom.Await(t, "one cluster to be the alerting cluster", `max(dislock_alerting_cluster)`, 90*time.Second,
		func([]promtest.Sample) bool {
			first = alerting()
			return first != nil
		})
	second := clusters[0]
	if second == first {
		second = clusters[1]
	}
	t.Logf("%s is the alerting cluster", first.name)

	// One window of "nowhere" runs nowhere (its pods' clusters are the
	// agents' own names: which webhook alerts has nothing to do with them).
	owner, err := store.Open(ctx, srv.DirectDSN(), store.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	ns := "alerting"
	pods := podRunner{t: t, bin: buildAgent(t), dsn: srv.BouncerDSN(), ns: ns}
	now, err := owner.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w0 := now.Truncate(time.Minute)
	pods.window("nowhere", w0, "exit 0")
	awaitDBPast(t, owner, w0.Add(time.Minute))
	pods.window("nowhere", w0.Add(time.Minute), "exit 1")

	missed := `ALERTS{alertname="DislockWindowMissed", alertstate="firing", cronjob="nowhere"}`
	firing := func(cl *cluster) bool {
		t.Helper()
		s, err := cl.prom.Query(ctx, missed)
		if err != nil {
			t.Fatal(err)
		}
		return len(s) > 0
	}
	first.prom.Await(t, "DislockWindowMissed firing in the alerting cluster "+first.name, missed, 3*time.Minute,
		func(s []promtest.Sample) bool { return len(s) > 0 })
	// The other cluster's Prometheus sees the same miss (its leader
	// computes the same metrics, at its own pace) and, five evaluations
	// later, has never raised the alert, not even as pending.
	second.prom.Await(t, second.name+"'s Prometheus to see the missed window for 5 s",
		`min_over_time(dislock_missed_windows_total{namespace="`+ns+`", cronjob="nowhere"}[5s]) == 1 and count_over_time(dislock_missed_windows_total{namespace="`+ns+`", cronjob="nowhere"}[5s]) >= 4`,
		time.Minute, func(s []promtest.Sample) bool { return len(s) > 0 })
	if got := sampleOf(t, second.prom, `max(max_over_time(ALERTS{alertname="DislockWindowMissed"}[15m]))`); got != -1 {
		t.Errorf("%s, not the alerting cluster, raised DislockWindowMissed too", second.name)
	}

	// The alerting cluster's webhook stops. The other takes the role over
	// once the claim lapsed and the settle time passed, and its Prometheus
	// fires for the same window, never while the first one's still did.
	first.w.stop(t)
	second.prom.Await(t, "DislockWindowMissed firing in "+second.name+" once it took the role over", missed, 4*time.Minute,
		func(s []promtest.Sample) bool {
			if len(s) > 0 && firing(first) {
				t.Errorf("DislockWindowMissed fires in %s and %s at once", first.name, second.name)
			}
			return len(s) > 0
		})
	if got := sampleOf(t, second.prom, `max(dislock_alerting_cluster)`); got != 1 {
		t.Errorf("%s fires, yet its webhook says dislock_alerting_cluster %v", second.name, got)
	}
	if got := sampleOf(t, bystander.prom, `max(max_over_time(dislock_alerting_cluster[15m]))`); got != 0 {
		t.Errorf("%s, scraped but no candidate, said dislock_alerting_cluster %v at some point (-1: never scraped)", bystander.name, got)
	}
}

// sampleOf returns the value of the one series expr selects, or -1 when it
// selects none.
func sampleOf(t *testing.T, prom *promtest.Server, expr string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := prom.Query(ctx, expr)
	if err != nil {
		t.Fatal(err)
	}
	switch len(s) {
	case 0:
		return -1
	case 1:
		return s[0].Value
	}
	t.Fatalf("%s selects %d series, want one: %v", expr, len(s), s)
	return 0
}

// shippedRules writes the rule groups of the shipped PrometheusRule (as
// rendered with the chart's defaults, config/prometheus/rules) to a rule file.
func shippedRules(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "prometheus", "rules", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "alerts.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// awaitDBPast waits until the database clock is past ts, at most a minute
// and a half.
func awaitDBPast(t *testing.T, s *store.Store, ts time.Time) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		now, err := s.Now(context.Background())
		switch {
		case err != nil:
			t.Fatal(err)
		case now.After(ts):
			return
		case time.Now().After(deadline):
			t.Fatalf("the database clock is at %s, not past %s", now, ts)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var (
	agentBuild     sync.Once
	agentBin       string
	agentBuildErrs string
)

// buildAgent builds dislock-agent once for the package.
func buildAgent(t *testing.T) string {
	t.Helper()
	agentBuild.Do(func() {
		dir, err := os.MkdirTemp("", "dislock-agent-")
		if err != nil {
			agentBuildErrs = err.Error()
			return
		}
		agentBin = filepath.Join(dir, "dislock-agent")
		if out, err := exec.Command("go", "build", "-o", agentBin, "github.com/dislock/dislock/lockagent/cmd/dislock-agent").CombinedOutput(); err != nil {
			agentBuildErrs = fmt.Sprintf("go build dislock-agent: %v\n%s", err, out)
		}
	})
	if agentBuildErrs != "" {
		t.Fatal(agentBuildErrs)
	}
	return agentBin
}

// podRunner runs the pods of a window the way a kubelet runs an injected pod:
// the dislock-agent sidecar, then (once its startup probe passes) the
// wrapped app container, then SIGTERM to the sidecar once the app exited.
type podRunner struct {
	t       *testing.T
	bin     string
	dsn, ns string
}

// window runs the pods of key's window w: dc-a's, whose app is the shell
// command app, then dc-b's, which finds the window taken and skips.
func (r podRunner) window(name string, w time.Time, app string) {
	r.t.Helper()
	msg := r.pod("dc-a", name, w, app)
	if !strings.HasPrefix(msg, "ran window") {
		r.t.Fatalf("dc-a's pod of %s/%s at %s: %q, want a run", r.ns, name, w, msg)
	}
	if msg := r.pod("dc-b", name, w, app); !strings.HasPrefix(msg, "skip:") {
		r.t.Fatalf("dc-b's pod of %s/%s at %s: %q, want a skip", r.ns, name, w, msg)
	}
}

// pod runs one pod to its end and returns the sidecar's termination message.
func (r podRunner) pod(cluster, name string, w time.Time, app string) string {
	r.t.Helper()
	dir := r.t.TempDir()
	job := fmt.Sprintf("%s-%d", name, w.Unix()/60)
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		contract.EnvMode + "=schedule", contract.EnvKey + "=" + r.ns + "/" + name, contract.EnvSchedule + "=* * * * *",
		contract.EnvWindow + "=" + w.UTC().Format(time.RFC3339), contract.EnvCluster + "=" + cluster,
		contract.EnvJobName + "=" + job, contract.EnvJobUID + "=uid-" + cluster + "-" + job, contract.EnvPodName + "=" + job + "-" + cluster,
		contract.EnvDatabaseURL + "=" + r.dsn, contract.EnvSharedDir + "=" + dir,
		contract.EnvTerminationLog + "=" + filepath.Join(dir, "termination-log"),
		contract.EnvAppContainers + "=app", contract.EnvContainerName + "=app",
	}
	logs := &harness.Buffer{}
	sidecar := exec.Command(r.bin, "agent")
	sidecar.Env, sidecar.Stdout, sidecar.Stderr = env, logs, logs
	sidecar.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := sidecar.Start(); err != nil {
		r.t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sidecar.Wait() }()
	await(r.t, "the sidecar's startup probe", func() (bool, error) {
		probe := exec.Command(r.bin, "probe")
		probe.Env = env
		return probe.Run() == nil, nil
	})
	app1 := exec.Command(filepath.Join(dir, protocol.BinPath), "exec", "--", "/bin/sh", "-c", app)
	app1.Env = env
	appLogs := &harness.Buffer{}
	app1.Stdout, app1.Stderr = appLogs, appLogs
	_ = app1.Run() // its exit code is the app's; the agent records it
	_ = sidecar.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(time.Minute):
		_ = sidecar.Process.Kill()
		r.t.Fatalf("the sidecar did not stop within a minute of SIGTERM:\n%s", logs.String())
	}
	msg, err := os.ReadFile(filepath.Join(dir, "termination-log"))
	if err != nil {
		r.t.Fatalf("%v\nsidecar:\n%s\napp:\n%s", err, logs.String(), appLogs.String())
	}
	return strings.TrimSpace(string(msg))
}
