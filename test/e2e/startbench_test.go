package e2e

// What dislock adds to a pod's start on a real kubelet: the same Job (same
// node, same image, same pod shape) is created one at a time without dislock
// and with it, and each step from "Job created" to "app process started" is
// timed from what the components already write, all on this host's clock:
// the API server's watch (pod created, pod scheduled), containerd's log
// (sandbox ready, container started), the container logs' CRI times (the
// agent's "starting" and "decision" lines, the app's first line), the
// installed agent binary's mtime in the pod's emptyDir, PgBouncer's log
// (the agent's login) and the database's claimed_at.

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/test/images"
)

var startRuns = flag.Int("start.runs", 3,
	"how many Jobs TestStartOverhead creates without and with dislock each (docs/benchmarks.md: 20)")

// The steps of a pod's start, in the order they happen with dislock. The
// binary copy runs alongside the database connection (the agent overlaps
// them), so those two may swap.
const (
	stepCreated      = "Job created (admission done)"
	stepPod          = "pod created"
	stepScheduled    = "pod scheduled"
	stepSandbox      = "sandbox ready"
	stepSidecar      = "sidecar container started"
	stepAgent        = "agent process logs start"
	stepBinary       = "agent binary copied"
	stepConnected    = "database connected"
	stepClaimed      = "window claimed"
	stepDecision     = "decision written"
	stepAppContainer = "app container started"
	stepWrapper      = "wrapper starts the app"
	stepApp          = "app process started"
)

var startSteps = []string{stepCreated, stepPod, stepScheduled, stepSandbox, stepSidecar, stepAgent, stepBinary,
	stepConnected, stepClaimed, stepDecision, stepAppContainer, stepWrapper, stepApp}

// startMarker is the app's one line: its CRI log time is when the app
// process ran.
const startMarker = "startbench: app process started"

// startTimes are one run's steps, each as time since the Job's create call
// began.
type startTimes map[string]time.Duration

// A user relies on two things here: an injected pod's app never starts
// before the agent installed its binary and wrote a "run" decision, and the
// start overhead dislock adds is the number docs/benchmarks.md states.
// -start.runs=20 gives that number; the default 3 is the quick check.
func TestStartOverheadJobCreatedToAppStartedWithAndWithoutDislock(t *testing.T) {
	e := Need(t)
	dc := e.DCs[0]
	ctx := context.Background()
	const name = "startbench"

	// Without dislock: a namespace without the opt-in label, which the
	// webhooks never see.
	plainNS := "startbench-plain"
	if _, err := dc.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: plainNS}},
		metav1.CreateOptions{}); err != nil {
		t.Fatalf("%s: creating namespace %s: %v", dc.Name, plainNS, err)
	}
	t.Cleanup(func() { _ = dc.Client.CoreV1().Namespaces().Delete(ctx, plainNS, metav1.DeleteOptions{}) })
	awaitServiceAccount(t, dc, plainNS)

	plain := applyStartBench(t, dc, plainNS, name, nil)
	locked := applyStartBench(t, dc, Namespace, name, map[string]string{"dislock.io/mode": "schedule"})
	role := tenantRole(t, dc, Namespace)

	if off, rt, err := e.ClockOffset(ctx); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("database clock − host clock: %v (round trip %v)", off.Round(time.Microsecond), rt.Round(time.Microsecond))
	}

	runs := *startRuns
	base := time.Now().UTC().Truncate(time.Minute).Add(-time.Duration(runs+1) * time.Minute)
	var without, with []startTimes
	// Alternating keeps slow drifts of the machine out of the difference.
	for i := range runs {
		tick := base.Add(time.Duration(i) * time.Minute)
		without = append(without, measureStart(t, e, plain, tick, ""))
		with = append(with, measureStart(t, e, locked, tick, role))
	}
	reportStart(t, runs, without, with)
}

// applyStartBench creates a suspended CronJob whose pods run the busybox
// image's echo on the host network, and deletes it (and its Jobs) when the
// test ends. Only the Jobs the test creates run.
func applyStartBench(t *testing.T, dc *DC, namespace, name string, annotations map[string]string) *batchv1.CronJob {
	t.Helper()
	ctx := context.Background()
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: annotations},
		Spec: batchv1.CronJobSpec{
			Schedule: "* * * * *",
			TimeZone: ptr.To("UTC"),
			Suspend:  ptr.To(true),
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
				BackoffLimit: ptr.To(int32(0)),
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					HostNetwork:                   true,
					TerminationGracePeriodSeconds: ptr.To(int64(10)),
					Containers: []corev1.Container{{
						Name:            "app",
						Image:           images.BusyboxRef,
						ImagePullPolicy: corev1.PullNever,
						Command:         []string{"echo", startMarker},
					}},
				}},
			}},
		},
	}
	cj, err := dc.Client.BatchV1().CronJobs(namespace).Create(ctx, cj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("%s: creating CronJob %s/%s: %v", dc.Name, namespace, name, err)
	}
	t.Cleanup(func() {
		bg := metav1.DeletePropagationBackground
		_ = dc.Client.BatchV1().CronJobs(namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg})
	})
	return cj
}

// awaitServiceAccount waits for a new namespace's default ServiceAccount,
// without which its pods are refused.
func awaitServiceAccount(t *testing.T, dc *DC, namespace string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := dc.Client.CoreV1().ServiceAccounts(namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=default"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := dc.Client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{}); err == nil {
		return
	}
	for ev := range w.ResultChan() {
		if ev.Type == watch.Added {
			return
		}
	}
	t.Fatalf("%s: namespace %s has no default ServiceAccount after a minute", dc.Name, namespace)
}

// tenantRole is the database role of the namespace's Secret: the one its
// agents log in to PgBouncer with.
func tenantRole(t *testing.T, dc *DC, namespace string) string {
	t.Helper()
	s, err := dc.Client.CoreV1().Secrets(namespace).Get(context.Background(), DBSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(string(s.Data["url"]))
	if err != nil {
		t.Fatalf("%s: the Secret of %s holds no URL: %v", dc.Name, namespace, err)
	}
	return u.User.Username()
}

// measureStart creates the CronJob's Job for tick, as the CronJob
// controller would, waits for its pod to succeed and returns its steps.
// role is the tenant role the agent logs in with; "" for a Job without
// dislock.
func measureStart(t *testing.T, e *Env, cj *batchv1.CronJob, tick time.Time, role string) startTimes {
	t.Helper()
	dc := e.DCs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	job := controllerJob(cj, tick)
	pods, err := dc.Client.CoreV1().Pods(cj.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job.Name})
	if err != nil {
		t.Fatal(err)
	}
	defer pods.Stop()

	at := map[string]time.Time{}
	begun := time.Now()
	if _, err := dc.Client.BatchV1().Jobs(cj.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatalf("%s: creating Job %s/%s: %v", dc.Name, cj.Namespace, job.Name, err)
	}
	at[stepCreated] = time.Now()

	// The emptyDir is torn down once the pod ends, so the binary's mtime
	// is read while it lives; the mtime, not the reading, is the time.
	binary := make(chan time.Time, 1)
	stopWatching := make(chan struct{})
	defer close(stopWatching)
	var pod *corev1.Pod
	for pod == nil || (pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed) {
		var ev watch.Event
		select {
		case ev = <-pods.ResultChan():
		case <-ctx.Done():
			t.Fatalf("%s: the pod of Job %s/%s did not finish in 90 s (last seen: %v)", dc.Name, cj.Namespace, job.Name, podPhase(pod))
		}
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			t.Fatalf("%s: watching the pods of Job %s/%s: %v", dc.Name, cj.Namespace, job.Name, ev.Object)
		}
		now := time.Now()
		if pod == nil {
			at[stepPod] = now
			if role != "" {
				go watchFile(filepath.Join(dc.Node.Dir(), "kubelet", "pods", string(p.UID), "volumes", "kubernetes.io~empty-dir",
					"dislock", protocol.BinPath), binary, stopWatching)
			}
		}
		if _, ok := at[stepScheduled]; !ok && p.Spec.NodeName != "" {
			at[stepScheduled] = now
		}
		pod = p
	}
	if pod.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("%s: pod %s/%s %s, want Succeeded", dc.Name, pod.Namespace, pod.Name, pod.Status.Phase)
	}

	// containerd's CRI log: the sandbox, then each container's start.
	cri, err := runtimeTimes(filepath.Join(dc.Node.Dir(), "containerd.log"), string(pod.UID))
	if err != nil {
		t.Fatalf("%s: pod %s/%s: %v", dc.Name, pod.Namespace, pod.Name, err)
	}
	at[stepSandbox] = cri.sandbox
	at[stepAppContainer] = cri.started["app"]
	appLog := podContainerLog(t, dc, pod, "app")
	if l, ok := findLine(appLog, startMarker); ok {
		at[stepApp] = l.At
	} else {
		t.Fatalf("pod %s/%s: the app's log has no %q: %v", pod.Namespace, pod.Name, startMarker, appLog)
	}
	if role == "" {
		return since(begun, at)
	}

	at[stepSidecar] = cri.started["dislock-agent"]
	agentLog := podContainerLog(t, dc, pod, "dislock-agent")
	for step, msg := range map[string]string{stepAgent: `"msg":"starting"`, stepDecision: `"msg":"decision"`} {
		l, ok := findLine(agentLog, msg)
		if !ok {
			t.Fatalf("pod %s/%s: the agent's log has no %s line: %v", pod.Namespace, pod.Name, msg, agentLog)
		}
		at[step] = l.At
	}
	if l, ok := findLine(appLog, "running the command"); ok {
		at[stepWrapper] = l.At
	}
	select {
	case at[stepBinary] = <-binary:
	default:
		t.Fatalf("pod %s/%s: the agent binary never appeared in the pod's emptyDir on the node", pod.Namespace, pod.Name)
	}
	if at[stepConnected], err = bouncerLogin(dc, role, at[stepAgent]); err != nil {
		t.Fatal(err)
	}
	var claimed time.Time
	if err := e.queryRow(ctx, `SELECT claimed_at FROM dislock.windows WHERE lock_key = $1 AND window_start = $2`,
		[]any{cj.Namespace + "/" + cj.Name, tick}, &claimed); err != nil {
		t.Fatalf("the window %s of %s/%s: %v", tick.Format(time.RFC3339), cj.Namespace, cj.Name, err)
	}
	at[stepClaimed] = claimed

	// What a user relies on: the app ran only once the wrapper's binary
	// was installed and the window was this pod's.
	for _, before := range []string{stepBinary, stepClaimed, stepDecision} {
		if !at[before].Before(at[stepApp]) {
			t.Errorf("pod %s/%s: the app process started at %s, not after %s (%s)", pod.Namespace, pod.Name,
				at[stepApp].Format(time.StampNano), before, at[before].Format(time.StampNano))
		}
	}
	if msg := AgentMessage(pod); !strings.HasPrefix(msg, "ran window") {
		t.Errorf("pod %s/%s: the agent's termination message is %q, want it to say it ran the window", pod.Namespace, pod.Name, msg)
	}
	return since(begun, at)
}

func since(begun time.Time, at map[string]time.Time) startTimes {
	out := startTimes{}
	for step, t := range at {
		if !t.IsZero() {
			out[step] = t.Sub(begun)
		}
	}
	return out
}

func podPhase(p *corev1.Pod) string {
	if p == nil {
		return "no pod"
	}
	return string(p.Status.Phase)
}

// watchFile sends path's mtime once it exists, polling until stop.
func watchFile(path string, out chan<- time.Time, stop <-chan struct{}) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if fi, err := os.Stat(path); err == nil {
			out <- fi.ModTime()
			return
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// podContainerLog reads a container's log of a pod of any namespace from
// the node's pod-log directory.
func podContainerLog(t *testing.T, dc *DC, pod *corev1.Pod, container string) []LogLine {
	t.Helper()
	path := filepath.Join(dc.Node.Dir(), "pod-logs", pod.Namespace+"_"+pod.Name+"_"+string(pod.UID), container, "0.log")
	lines, err := readCRILog(path)
	if err != nil {
		t.Fatalf("pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return lines
}

// criTimes are what containerd logged of one pod: when its sandbox was
// ready and when each container started (runc has started its process).
type criTimes struct {
	sandbox time.Time
	started map[string]time.Time
}

var (
	criTime    = regexp.MustCompile(`^time="([^"]+)"`)
	criSandbox = regexp.MustCompile(`RunPodSandbox for .*Uid:([0-9a-f-]+),.* returns sandbox id \\"([0-9a-f]+)\\"`)
	criCreated = regexp.MustCompile(`CreateContainer within sandbox \\"([0-9a-f]+)\\" for .*Name:([^,]+),.* returns container id \\"([0-9a-f]+)\\"`)
	criStarted = regexp.MustCompile(`StartContainer for \\"([0-9a-f]+)\\" returns successfully`)
)

// runtimeTimes reads containerd's log for the pod of uid.
func runtimeTimes(logFile, uid string) (criTimes, error) {
	f, err := os.Open(logFile)
	if err != nil {
		return criTimes{}, err
	}
	defer f.Close()
	out := criTimes{started: map[string]time.Time{}}
	var sandbox string
	names := map[string]string{} // container id → name
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		m := criTime.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		if s := criSandbox.FindStringSubmatch(line); s != nil && s[1] == uid {
			sandbox, out.sandbox = s[2], at
		} else if c := criCreated.FindStringSubmatch(line); c != nil && sandbox != "" && c[1] == sandbox {
			names[c[3]] = c[2]
		} else if s := criStarted.FindStringSubmatch(line); s != nil && names[s[1]] != "" {
			out.started[names[s[1]]] = at
		}
	}
	if err := sc.Err(); err != nil {
		return out, err
	}
	if sandbox == "" || len(out.started) == 0 {
		return out, fmt.Errorf("containerd's log %s names no sandbox or started container of pod uid %s", logFile, uid)
	}
	return out, nil
}

// bouncerLogin is the first time PgBouncer logged a login of role at or
// after from, less a slack: the agent's connection (the runs are one at a
// time, seconds apart).
func bouncerLogin(dc *DC, role string, from time.Time) (time.Time, error) {
	// PgBouncer's log once stamped the agent's login 4 ms before the agent's
	// own "starting" line, which precedes the dial: the two clocks' reading
	// of one instant differ by that much.
	const loginSlack = 100 * time.Millisecond
	b, ok := dc.bouncer.(*bouncer)
	if !ok || b.p == nil {
		return time.Time{}, fmt.Errorf("%s: no PgBouncer log to read logins from", dc.Name)
	}
	f, err := os.Open(b.p.LogFile())
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "login attempt") || !strings.Contains(line, "user="+role+" ") {
			continue
		}
		// "2026-12-04 15:20:00.123 UTC [pid] LOG C-0x..: ... login attempt: db=... user=..."
		if len(line) < 27 {
			continue
		}
		at, err := time.Parse("2006-01-02 15:04:05.000 MST", line[:27])
		// The log has milliseconds; the agent's start line nanoseconds.
		if err == nil && !at.Before(from.Add(-loginSlack).Truncate(time.Millisecond)) {
			return at, nil
		}
	}
	return time.Time{}, fmt.Errorf("%s: PgBouncer logged no login of role %s after %s", dc.Name, role, from.Format(time.StampMilli))
}

// reportStart logs p50 and p99 of each step since the Job's create call,
// without and with dislock, and what dislock adds to the app's start.
func reportStart(t *testing.T, runs int, without, with []startTimes) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "Job created → app process started, %d runs each, one at a time, same node and image; ms since the Job's create call, p50 / p99 (nearest rank: with %d runs p99 is the largest):\n",
		runs, runs)
	fmt.Fprintf(&b, "%-46s %17s   %17s\n", "step", "without dislock", "with dislock")
	for _, step := range startSteps {
		fmt.Fprintf(&b, "%-46s %s   %s\n", step, quantiles(gaps(without, "", step)), quantiles(gaps(with, "", step)))
	}
	// The parts of a start that are dislock's, per run.
	for _, g := range []struct{ name, from, to string }{
		{"sandbox ready → app container started", stepSandbox, stepAppContainer},
		{"sidecar started → binary copied", stepSidecar, stepBinary},
		{"agent start → database connected", stepAgent, stepConnected},
		{"database connected → window claimed", stepConnected, stepClaimed},
		{"window claimed → decision written", stepClaimed, stepDecision},
		{"binary copied → app container started (gate)", stepBinary, stepAppContainer},
		{"app container started → app process started", stepAppContainer, stepApp},
	} {
		fmt.Fprintf(&b, "%-46s %s   %s\n", g.name, quantiles(gaps(without, g.from, g.to)), quantiles(gaps(with, g.from, g.to)))
	}
	t.Log(b.String())
	plain, locked := gaps(without, "", stepApp), gaps(with, "", stepApp)
	t.Logf("dislock adds %d ms at p50 and %d ms at p99 to Job created → app process started (%s without, %s with)",
		(quantile(locked, 0.50) - quantile(plain, 0.50)).Milliseconds(), (quantile(locked, 0.99) - quantile(plain, 0.99)).Milliseconds(),
		strings.TrimSpace(quantiles(plain)), strings.TrimSpace(quantiles(locked)))
}

// gaps is, for each run that has both steps, the time from one to the
// other; from "" is the Job's create call.
func gaps(rs []startTimes, from, to string) []time.Duration {
	var out []time.Duration
	for _, r := range rs {
		end, ok := r[to]
		begin, ok2 := r[from]
		if ok && (from == "" || ok2) {
			out = append(out, end-begin)
		}
	}
	return out
}

// quantile is the nearest-rank p-quantile of d (sorted in place).
func quantile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(p*float64(len(d))))]
}

func quantiles(d []time.Duration) string {
	if len(d) == 0 {
		return fmt.Sprintf("%17s", "–")
	}
	return fmt.Sprintf("%7d / %7d", quantile(d, 0.50).Milliseconds(), quantile(d, 0.99).Milliseconds())
}
