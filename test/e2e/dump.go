package e2e

// What a failing test prints: per data centre the pods (status and the
// agent's termination message), their container logs (read from the node's
// pod log directory, so that they survive a kubelet that no longer answers),
// the Events (the webhook's pods and log among them); then `dislock windows`, `dislock leases`
// and the ledger; last, so that the tail of a CI log shows it, every pod that
// did not succeed and why.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dislock/dislock/test/harness"
)

// Dump returns the state of every data centre and of the database.
func (e *Env) Dump() string {
	var b strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, dc := range e.DCs {
		if dc == nil || dc.Client == nil {
			continue
		}
		fmt.Fprintf(&b, "===== %s =====\n", dc.Name)
		for _, ns := range append([]string{WebhookNamespace}, Teams...) {
			dumpNamespace(ctx, &b, dc, ns)
		}
		if dc.Node != nil {
			b.WriteString(podLogs(filepath.Join(dc.Node.Dir(), "pod-logs")))
		}
		if dc.bouncer != nil {
			b.WriteString(dc.bouncer.LogTail() + "\n")
		}
	}
	if (e.PG != nil || e.HA != nil) && e.Images.Binaries != "" {
		for _, cmd := range []string{"windows", "leases"} {
			out, err := e.Dislock(cmd, "--limit", "200")
			if cmd == "leases" {
				out, err = e.Dislock(cmd)
			}
			fmt.Fprintf(&b, "===== dislock %s (%v) =====\n%s", cmd, err, out)
		}
		runs, err := e.Runs(ctx)
		fmt.Fprintf(&b, "===== ledger (%v) =====\n", err)
		for _, r := range runs {
			fmt.Fprintf(&b, "%s index=%s token=%d %s %s started=%s finished=%v exit=%v\n", r.Window, fmtInt(r.Index), r.Token, r.Cluster, r.Pod,
				r.Started.Format(time.StampMilli), fmtTime(r.Finished), fmtInt(r.ExitCode))
		}
	}
	b.WriteString("===== pods that did not succeed =====\n")
	for _, dc := range e.DCs {
		if dc != nil && dc.Client != nil {
			unsucceeded(ctx, &b, dc)
		}
	}
	return b.String()
}

// unsucceeded writes, for every pod of the test namespaces that is not
// Succeeded, its phase and each container's last state: exit code, reason
// and termination message (the agent's decision).
func unsucceeded(ctx context.Context, b *strings.Builder, dc *DC) {
	for _, ns := range Teams {
		pods, err := dc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			fmt.Fprintf(b, "%s: listing pods of %s: %v\n", dc.Name, ns, err)
			continue
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodSucceeded {
				continue
			}
			fmt.Fprintf(b, "%s %s/%s phase=%s reason=%q\n", dc.Name, ns, p.Name, p.Status.Phase, p.Status.Reason)
			for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
				if t := s.State.Terminated; t != nil {
					fmt.Fprintf(b, "  %s: exit %d %s %q\n", s.Name, t.ExitCode, t.Reason, strings.TrimSpace(t.Message))
				} else {
					fmt.Fprintf(b, "  %s: running=%v waiting=%v restarts=%d\n", s.Name, s.State.Running != nil, s.State.Waiting, s.RestartCount)
				}
			}
		}
	}
}

// podLogs returns the tail of every container log under a kubelet's
// podLogsDir (<ns>_<pod>_<uid>/<container>/<n>.log).
func podLogs(dir string) string {
	files, _ := filepath.Glob(filepath.Join(dir, "*", "*", "*.log"))
	sort.Strings(files)
	var b strings.Builder
	for _, f := range files {
		b.WriteString(harness.LogTail(f, 15, 3072) + "\n")
	}
	if len(files) == 0 {
		if _, err := os.Stat(dir); err != nil {
			fmt.Fprintf(&b, "(no pod logs: %v)\n", err)
		}
	}
	return b.String()
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.StampMilli)
}

func fmtInt(i *int) string {
	if i == nil {
		return "-"
	}
	return strconv.Itoa(*i)
}

// dumpNamespace writes a namespace's pods, with their agents' decisions, and
// its events.
func dumpNamespace(ctx context.Context, b *strings.Builder, dc *DC, ns string) {
	if pods, err := dc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil {
		fmt.Fprintf(b, "listing pods of %s: %v\n", ns, err)
	} else {
		for _, p := range pods.Items {
			fmt.Fprintf(b, "pod %s/%s phase=%s node=%s agent=%q\n", ns, p.Name, p.Status.Phase, p.Spec.NodeName, AgentMessage(&p))
		}
	}
	events, err := dc.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(b, "listing events of %s: %v\n", ns, err)
		return
	}
	sort.Slice(events.Items, func(i, j int) bool {
		return events.Items[i].LastTimestamp.Before(&events.Items[j].LastTimestamp)
	})
	for _, ev := range events.Items {
		fmt.Fprintf(b, "event %s %s %s/%s %s: %s\n", ev.LastTimestamp.Format(time.TimeOnly), ns, ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Reason, ev.Message)
	}
}
