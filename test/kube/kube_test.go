package kube

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestMain(m *testing.M) {
	os.Exit(Main(m, Options{Name: "kube-test", ControllerManager: true}))
}

// scheduledTimestampAnnotation is set by the CronJob controller on every Job
// it creates (Kubernetes >= 1.32): the schedule time the Job runs for.
const scheduledTimestampAnnotation = "batch.kubernetes.io/cronjob-scheduled-timestamp"

func clientset(t *testing.T, c *Cluster) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatalf("client for %s: %v", c.URL(), err)
	}
	return cs
}

func createNamespace(t *testing.T, cs *kubernetes.Clientset, prefix string) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

func TestAConfigMapWrittenThroughClientGoReadsBack(t *testing.T) {
	t.Parallel()
	c := Need(t)
	cs := clientset(t, c)
	ctx := context.Background()
	ns := createNamespace(t, cs, "configmap")

	want := map[string]string{"window": "2026-01-01T00:00:00Z", "owner": "dc-1"}
	_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx,
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "lock"}, Data: want}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating ConfigMap: %v", err)
	}
	got, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "lock", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading ConfigMap back: %v", err)
	}
	if len(got.Data) != len(want) || got.Data["window"] != want["window"] || got.Data["owner"] != want["owner"] {
		t.Errorf("ConfigMap data = %v, want %v", got.Data, want)
	}
}

func TestTheKubeconfigFileReachesTheClusterAsAdmin(t *testing.T) {
	t.Parallel()
	c := Need(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		t.Fatalf("loading %s: %v", c.Kubeconfig(), err)
	}
	if cfg.Insecure {
		t.Errorf("kubeconfig skips TLS verification")
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("client from kubeconfig: %v", err)
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("GET /version through the kubeconfig: %v", err)
	}
	if !strings.HasPrefix(v.GitVersion, "v1.") || strings.Contains(v.GitVersion, "master") {
		t.Errorf("apiserver version %q: want a stamped v1.x release (test/tools/build.sh ldflags)", v.GitVersion)
	}
	t.Logf("apiserver %s", v.GitVersion)
}

func TestTheCronJobControllerCreatesAJobForAnEveryMinuteCronJob(t *testing.T) {
	t.Parallel()
	c := Need(t)
	cs := clientset(t, c)
	ctx := context.Background()
	ns := createNamespace(t, cs, "cronjob")

	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "tick"},
		Spec: batchv1.CronJobSpec{
			Schedule: "* * * * *",
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "tick", Image: "busybox", Command: []string{"true"}}},
			}}}},
		},
	}
	cj, err := cs.BatchV1().CronJobs(ns).Create(ctx, cj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating CronJob: %v", err)
	}
	created := time.Now()

	// The next minute boundary is at most 60 s away; the controller wakes up
	// for it and creates the Job within a second or two.
	const deadline = 75 * time.Second
	var job batchv1.Job
	for {
		jobs, err := cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("listing Jobs: %v", err)
		}
		if len(jobs.Items) > 0 {
			job = jobs.Items[0]
			break
		}
		if time.Since(created) > deadline {
			t.Fatalf("kube-controller-manager created no Job for CronJob %s/%s within %v", ns, cj.Name, deadline)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("Job %s created %v after the CronJob", job.Name, time.Since(created).Round(time.Millisecond))

	owner := metav1.GetControllerOf(&job)
	if owner == nil || owner.Kind != "CronJob" || owner.Name != cj.Name || owner.UID != cj.UID {
		t.Errorf("Job %s controller ownerReference = %+v, want CronJob %s (uid %s)", job.Name, owner, cj.Name, cj.UID)
	}
	ts, ok := job.Annotations[scheduledTimestampAnnotation]
	if !ok {
		t.Fatalf("Job %s has no %s annotation; annotations: %v", job.Name, scheduledTimestampAnnotation, job.Annotations)
	}
	scheduled, err := time.Parse(time.RFC3339, ts)
	if err != nil {
		t.Fatalf("annotation %s = %q is not RFC 3339: %v", scheduledTimestampAnnotation, ts, err)
	}
	if scheduled.Second() != 0 || scheduled.Before(created.Add(-time.Minute)) {
		t.Errorf("annotation %s = %s: want a minute boundary after the CronJob was created (%s)",
			scheduledTimestampAnnotation, ts, created.Format(time.RFC3339))
	}
	logRSS(t, c)
}

func TestCloseStopsEveryComponentAndRemovesItsDirectory(t *testing.T) {
	t.Parallel()
	// A cluster of its own: the shared one must outlive this test.
	c := New(t, Options{Name: "close", ControllerManager: true})
	pids := c.pids()
	for _, name := range []string{etcdBin, apiserverBin, kcmBin} {
		if _, ok := pids[name]; !ok {
			t.Fatalf("%s is not running after Start; running: %v", name, pids)
		}
	}
	watchdogPid := c.wd.Pid()

	begun := time.Now()
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	t.Logf("Close took %v", time.Since(begun).Round(time.Millisecond))
	for name, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) still exists after Close (kill -0: %v)", name, pid, err)
		}
	}
	if err := syscall.Kill(watchdogPid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("watchdog (pid %d) still exists after Close (kill -0: %v)", watchdogPid, err)
	}
	if _, err := os.Stat(c.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir %s still there after Close (stat: %v)", c.Dir(), err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestStartWithoutBinariesSaysToRunMakeTools(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		opts        Options
		wantMissing []string
	}{
		{
			name:        "an empty bin dir names etcd and kube-apiserver",
			opts:        Options{},
			wantMissing: []string{etcdBin, apiserverBin},
		},
		{
			name:        "with the controller manager it is named too",
			opts:        Options{ControllerManager: true},
			wantMissing: []string{etcdBin, apiserverBin, kcmBin},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.opts.BinDir = t.TempDir()
			c, err := Start(tt.opts)
			if err == nil {
				c.Close()
				t.Fatalf("Start with empty BinDir succeeded")
			}
			if !errors.Is(err, ErrMissingBinary) {
				t.Errorf("error %v does not wrap ErrMissingBinary", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "make tools") {
				t.Errorf("error %q does not say to run `make tools`", msg)
			}
			for _, name := range tt.wantMissing {
				if !strings.Contains(msg, name) {
					t.Errorf("error %q does not name %s", msg, name)
				}
			}
		})
	}
}

func TestTheDefaultBinDirIsTheRepoRootsBin(t *testing.T) {
	t.Parallel()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// This package is <root>/test/kube.
	wd, _ := os.Getwd()
	if want := filepath.Dir(filepath.Dir(wd)); root != want {
		t.Errorf("repoRoot() = %s, want %s", root, want)
	}
}

// logRSS logs each component's resident memory, to keep an eye on what a
// test run costs.
func logRSS(t *testing.T, c *Cluster) {
	t.Helper()
	for name, pid := range c.pids() {
		status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(line, "VmRSS:") {
				t.Logf("%s RSS %s", name, strings.TrimSpace(strings.TrimPrefix(line, "VmRSS:")))
			}
		}
	}
}
