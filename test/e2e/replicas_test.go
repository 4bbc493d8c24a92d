package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dislock/dislock/test/node"
)

// leaseDuration is controller-runtime's default LeaseDuration, which the
// webhook keeps: how long a leader that vanished without a word holds the
// Lease. A replica that stops releases it first (main.go).
const leaseDuration = 15 * time.Second

// waitingForPort is what a replica logs while another process holds one of
// its ports (main.go).
const waitingForPort = "waiting for a port another process still holds"

// acquiredLease says whether a replica's log has the line it writes when
// it becomes the leader.
func acquiredLease(log string) bool {
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, "Successfully acquired lease") && strings.Contains(line, WebhookNamespace+"/dislock-webhook") {
			return true
		}
	}
	return false
}

// Two webhook replicas in one data centre, as the chart installs them by
// default, on two nodes (with the host's network two replicas never share
// one): `helm upgrade --set webhook.replicas=2`. Deleting the leader's pod
// hands the leader Lease on within the lease duration (measured): to the
// surviving replica, or to the replacement if it asks first. A drain of
// both nodes stops at the PodDisruptionBudget with one replica still
// serving admission.
func TestTheOtherWebhookReplicaTakesOverAndDrainsKeepOneServing(t *testing.T) {
	e := Need(t)
	dc := e.DCs[0]
	ctx := context.Background()
	second := spareNode(t, e, dc)
	first, chart := dc.Node.Name(), filepath.Join(e.root, "charts", "dislock")
	t.Cleanup(func() {
		// Back to one replica on the first node before the second goes.
		for _, args := range [][]string{{"uncordon", first}, {"cordon", second.Name()}} {
			if out, err := dc.Kubectl(ctx, args...); err != nil {
				t.Errorf("%v\n%s", err, out)
			}
		}
		if _, err := dc.helm(ctx, "upgrade", ReleaseName, chart, "--namespace", WebhookNamespace, "--reuse-values",
			"--set", "webhook.replicas=1", "--wait", "--timeout", installTimeout.String()); err != nil {
			t.Error(err)
		}
	})

	installed := webhookPods(t, dc)
	if out, err := dc.helm(ctx, "upgrade", ReleaseName, chart, "--namespace", WebhookNamespace, "--reuse-values",
		"--set", "webhook.replicas=2", "--wait", "--timeout", installTimeout.String()); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	pods := webhookPods(t, dc)
	if len(pods) != 2 || pods[0].Spec.NodeName == pods[1].Spec.NodeName {
		t.Fatalf("want two ready replicas on two nodes, got %s", describePods(pods))
	}
	nodeDirs := map[string]string{first: dc.Node.Dir(), second.Name(): second.Dir()}
	// Both serve: the nodes share this machine's network, so a replica that
	// listened on every address would wait for the other's ports.
	for _, p := range pods {
		if slices.ContainsFunc(installed, func(i corev1.Pod) bool { return i.Name == p.Name }) {
			continue // an earlier test's rollout may have made it wait, rightly
		}
		if log := nodeContainerLog(t, nodeDirs[p.Spec.NodeName], &p, "webhook"); strings.Contains(log, waitingForPort) {
			t.Fatalf("replica %s on %s waits for a port the other replica holds:\n%s", p.Name, p.Spec.NodeName, log)
		}
	}
	leader := awaitLeader(t, nodeDirs, pods, "")
	// From here on Jobs keep being created: deleting a replica and
	// draining its node refuse none of them.
	probes := probeAdmission(t, dc, suspendedCronJob(t, dc, "replica-probe"))

	// The leader's pod deleted, as a rolling update or an eviction does.
	holder := leaseHolder(t, dc)
	deleted := time.Now()
	if err := dc.Client.CoreV1().Pods(WebhookNamespace).Delete(ctx, leader.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, 2*leaseDuration, "another replica to hold the leader Lease", func() bool {
		h := leaseHolder(t, dc)
		return h != "" && h != holder
	})
	tookOver := time.Since(deleted)
	// The surviving replica, or the deleted one's replacement if its first
	// try came before the survivor's next (every 2 s).
	next := awaitLeader(t, nodeDirs, webhookPods(t, dc), leader.Name)
	t.Logf("leader %s deleted; replica %s holds the Lease %v later (lease duration %v)", leader.Name, next.Name, tookOver.Round(time.Millisecond), leaseDuration)
	if tookOver > leaseDuration {
		t.Errorf("the other replica took the Lease over %v after the leader's pod was deleted, want within the lease duration %v", tookOver, leaseDuration)
	}

	// The Deployment replaces the deleted pod at once, on the node the old
	// one is still leaving, where it waits for its ports. Then both nodes
	// are drained.
	await(t, installTimeout, "the deleted leader's pod to be gone", func() bool {
		_, err := dc.Client.CoreV1().Pods(WebhookNamespace).Get(ctx, leader.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	gone := time.Since(deleted)
	await(t, installTimeout, "two ready webhook replicas again", func() bool { return len(readyPods(webhookPods(t, dc))) == 2 })
	t.Logf("the old leader's pod was gone %v after its deletion; two replicas ready again %v after it", gone.Round(time.Millisecond), time.Since(deleted).Round(time.Millisecond))
	if out, err := dc.Kubectl(ctx, "drain", second.Name(), "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout", "60s"); err != nil {
		t.Fatalf("draining %s (one replica of two): %v\n%s", second.Name(), err, out)
	}
	// Its replica's replacement has nowhere to go: the first node's ports
	// are taken. The PodDisruptionBudget then refuses the last one's
	// eviction, and the drain gives up.
	out, err := dc.Kubectl(ctx, "drain", first, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout", "15s")
	if err == nil {
		t.Fatalf("draining %s as well succeeded: the PodDisruptionBudget let the last ready replica go\n%s", first, out)
	}
	if !strings.Contains(string(out), "disruption budget") {
		t.Errorf("the drain failed, but not on the PodDisruptionBudget:\n%s", out)
	}
	if ready := readyPods(webhookPods(t, dc)); len(ready) != 1 || ready[0].Spec.NodeName != first {
		t.Fatalf("after both drains want one ready replica on %s, got %s", first, describePods(ready))
	}
	if err := awaitReady(ctx, dc, Namespace); err != nil {
		t.Fatalf("with one replica left the webhook must still answer: %v", err)
	}
	n, refused := probes()
	t.Logf("%d dry-run Jobs admitted while a replica was deleted and the nodes drained", n)
	if len(refused) > 0 {
		t.Errorf("%d of %d Job creations were refused while a replica was deleted and the nodes drained, e.g. %s", len(refused), n, refused[0])
	}
}

// suspendedCronJob creates in dc an opted-in CronJob that never ticks, for
// probeAdmission to make its Jobs, and deletes it when the test ends.
func suspendedCronJob(t *testing.T, dc *DC, name string) *batchv1.CronJob {
	t.Helper()
	ctx := context.Background()
	cj, err := dc.Client.BatchV1().CronJobs(Namespace).Create(ctx, LedgerCronJob(dc.Name, name, "* * * * *", "schedule", Ledger{Suspend: true}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dc.Client.BatchV1().CronJobs(Namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	})
	return cj
}

// webhookPods lists dc's webhook pods that are not being deleted, oldest
// first.
func webhookPods(t *testing.T, dc *DC) []corev1.Pod {
	t.Helper()
	list, err := dc.Client.CoreV1().Pods(WebhookNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: webhookSelector})
	if err != nil {
		t.Fatal(err)
	}
	pods := slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	return pods
}

func readyPods(pods []corev1.Pod) []corev1.Pod {
	return slices.DeleteFunc(pods, func(p corev1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				return c.Status != corev1.ConditionTrue
			}
		}
		return true
	})
}

func describePods(pods []corev1.Pod) string {
	var s []string
	for _, p := range pods {
		s = append(s, fmt.Sprintf("%s on %q (%s)", p.Name, p.Spec.NodeName, p.Status.Phase))
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// leaseHolder is the leader Lease's holder identity. Host-network replicas
// share the host's name, so the identity (<hostname>_<uuid>) tells processes
// apart but not pods: awaitLeader reads that from their logs.
func leaseHolder(t *testing.T, dc *DC) string {
	t.Helper()
	l, err := dc.Client.CoordinationV1().Leases(WebhookNamespace).Get(context.Background(), "dislock-webhook", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// awaitLeader returns the one of pods whose log says it acquired the leader
// Lease, failing the test if none does within the lease duration and its
// retries; not is a pod that held it before, whose log says so too.
// nodeDirs are the nodes' directories by name, where their pods' logs are.
func awaitLeader(t *testing.T, nodeDirs map[string]string, pods []corev1.Pod, not string) corev1.Pod {
	t.Helper()
	var leader corev1.Pod
	await(t, 2*leaseDuration, "a webhook replica to log that it acquired the leader Lease", func() bool {
		for _, p := range pods {
			if p.Name == not {
				continue
			}
			if log, err := readContainerLog(nodeDirs[p.Spec.NodeName], &p, "webhook"); err == nil && acquiredLease(log) {
				leader = p
				return true
			}
		}
		return false
	})
	return leader
}

// spareNode starts a second node for dc, where a second host-network
// webhook replica can run. When the test ends, after its own cleanups, the
// node's pods are evicted (the webhook's replica goes back to dc's own
// node), it stops, and its Node object is deleted.
func spareNode(t *testing.T, e *Env, dc *DC) *node.Node {
	t.Helper()
	ctx := context.Background()
	n, err := node.Start(node.Options{Name: dc.Name + "-node-2", Cluster: dc.Cluster, Images: e.Images.Tarball,
		OwnAddress: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, err := dc.Kubectl(ctx, "uncordon", dc.Node.Name()); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
		if out, err := dc.Kubectl(ctx, "drain", n.Name(), "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout", "60s"); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
		if out, err := dc.Kubectl(ctx, "--namespace", WebhookNamespace, "rollout", "status", "deployment/dislock-webhook",
			"--timeout", installTimeout.String()); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
		if err := n.Close(); err != nil {
			t.Error(err)
		}
		if err := dc.Client.CoreV1().Nodes().Delete(ctx, n.Name(), metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
		if err := awaitReady(ctx, dc, Namespace); err != nil {
			t.Error(err)
		}
	})
	return n
}
