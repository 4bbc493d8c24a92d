package e2e

// What a failing test prints: per data centre the pods (status and the
// agent's termination message), their container logs (read from the node's
// pod log directory, so that they survive a kubelet that no longer answers),
// the Events and the webhook's log; then `dislock windows`, `dislock leases`
// and the ledger.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

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
		if pods, err := dc.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{}); err != nil {
			fmt.Fprintf(&b, "listing pods: %v\n", err)
		} else {
			for _, p := range pods.Items {
				fmt.Fprintf(&b, "pod %s phase=%s node=%s agent=%q\n", p.Name, p.Status.Phase, p.Spec.NodeName, AgentMessage(&p))
			}
		}
		if events, err := dc.Client.CoreV1().Events(Namespace).List(ctx, metav1.ListOptions{}); err != nil {
			fmt.Fprintf(&b, "listing events: %v\n", err)
		} else {
			sort.Slice(events.Items, func(i, j int) bool {
				return events.Items[i].LastTimestamp.Before(&events.Items[j].LastTimestamp)
			})
			for _, ev := range events.Items {
				fmt.Fprintf(&b, "event %s %s/%s %s: %s\n", ev.LastTimestamp.Format(time.TimeOnly), ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Reason, ev.Message)
			}
		}
		if dc.Node != nil {
			b.WriteString(podLogs(filepath.Join(dc.Node.Dir(), "pod-logs")))
		}
		if dc.webhook != nil {
			b.WriteString(harness.LogTail(dc.webhook.p.LogFile(), 30, 6144) + "\n")
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
	return b.String()
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
