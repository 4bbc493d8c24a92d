package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/images"
)

// A classic (non-native) mesh sidecar — istio-proxy as a regular container —
// never exits by itself, so without dislock's help a Job pod would never end:
// the Job never completes, and a run's lease is renewed for ever, so every
// cluster skips every later window. The webhook leaves the proxy unwrapped
// and tells the agent its quit endpoint; the agent asks it to quit once the
// app ended and the outcome is recorded. Shown on real
// kubelets for a pod that runs the window, one that fails it
// (restartPolicy Never) and one that skips it; the lease is free afterwards.
//
// The pods share the host's network (the test nodes run pods with
// hostNetwork), so the clusters' proxies, all on 127.0.0.1:15020, run one
// after the other.
func TestPodsWithAClassicMeshSidecarCompleteWhetherTheyRanFailedOrSkipped(t *testing.T) {
	e := Need(t)
	const name = "mesh"
	a, b := e.DCs[0], e.DCs[1]
	// The test pods use the node's network, where the webhook predicts no
	// mesh (no mesh injects such a pod), so the CronJob names the proxy's
	// quit URL itself.
	cjs := suspendedEverywhere(t, e, name, "schedule,lease", Ledger{Work: time.Second,
		Annotations: map[string]string{contract.AnnotationProxyQuit: "http://127.0.0.1:15020/quitquitquit"}})
	withProxy := func(j *batchv1.Job) {
		j.Spec.Template.Spec.Containers = append(j.Spec.Template.Spec.Containers, corev1.Container{
			Name: "istio-proxy", Image: images.MeshRef, ImagePullPolicy: corev1.PullNever,
		})
	}
	tick := time.Now().UTC().Truncate(time.Minute)
	w := tick.Format(time.RFC3339)

	// dc-a runs the window; its proxy is asked to quit, and the pod ends.
	job := createTickIn(t, a, cjs[a.Name], tick, withProxy).Name
	podA := completeJob(t, a, job)
	assertProxyQuit(t, a, &podA)
	if msg := AgentMessage(&podA); !strings.Contains(msg, "ran window "+w) || !strings.Contains(msg, "succeeded") {
		t.Errorf("%s: termination message %q, want the window %s recorded succeeded", a.Name, msg, w)
	}

	// dc-b's pod skips the window: nothing runs, and still the proxy quits.
	createTickIn(t, b, cjs[b.Name], tick, withProxy)
	podB := completeJob(t, b, job)
	assertProxyQuit(t, b, &podB)
	if msg := AgentMessage(&podB); !strings.HasPrefix(msg, "skip:") {
		t.Errorf("%s: termination message %q, want a skip", b.Name, msg)
	}

	// The next window fails in dc-b (restartPolicy Never, backoffLimit 0):
	// the failure is recorded at once and the proxy quits, so the Job fails
	// instead of hanging.
	next := tick.Add(time.Minute)
	failing := createTickIn(t, b, cjs[b.Name], next, func(j *batchv1.Job) {
		withProxy(j)
		setEnv(&j.Spec.Template, "LEDGER_EXIT", "3")
	}).Name
	failed, podF := finishJob(t, b, failing)
	if _, complete := Finished(failed); complete {
		t.Errorf("%s: Job %s completed; its app exited 3", b.Name, failing)
	}
	assertProxyQuit(t, b, &podF)
	if msg := AgentMessage(&podF); !strings.Contains(msg, "failed") {
		t.Errorf("%s: termination message %q, want the window recorded failed", b.Name, msg)
	}

	s, err := store.Open(context.Background(), e.dsn(), store.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, now, err := s.GetLease(context.Background(), Namespace+"/"+name)
	if err == nil && l.ExpireAt.After(now) {
		t.Errorf("the lease is still held after every pod ended: %+v (database time %s)", l, now)
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	runs := runsOf(t, e, name)
	if len(runs) != 2 || runs[0].Cluster != a.Name || runs[1].Cluster != b.Name {
		t.Fatalf("ledger %v: want dc-a's run of %s and dc-b's failed run of the next window", runs, w)
	}
	t.Logf("window %s: %s ran it and its proxy quit; %s skipped and its proxy quit; the next window failed in %s and its proxy quit; lease free",
		w, a.Name, b.Name, b.Name)
}

// assertProxyQuit checks that the pod's istio-proxy ended by the agent's
// quit request (exit 0), not by the pod's deletion or a deadline.
func assertProxyQuit(t *testing.T, dc *DC, pod *corev1.Pod) {
	t.Helper()
	for _, c := range pod.Status.ContainerStatuses {
		if c.Name != "istio-proxy" {
			continue
		}
		if c.State.Terminated == nil || c.State.Terminated.ExitCode != 0 {
			t.Errorf("%s: pod %s's istio-proxy is %+v, want terminated with exit code 0 (asked to quit)", dc.Name, pod.Name, c.State)
		}
		return
	}
	t.Errorf("%s: pod %s has no istio-proxy container status", dc.Name, pod.Name)
}
