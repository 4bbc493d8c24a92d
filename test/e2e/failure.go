package e2e

// Harness for the failure stories: a spare node a test may kill (its data
// centre's own node goes on serving the other tests), the full rows of
// dislock.windows and dislock.leases, the database clock, and container logs
// with the times the runtime received each line.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/test/node"
)

// SpareNode starts a second node in the data centre, for a test that kills
// it (node.Kill) while it runs a pod, so that the data centre's own node
// goes on serving the other tests. It is cordoned: only pods pinned to it
// (spec.nodeName) run there. When the test ends its pods are force-deleted
// (no kubelet is left to confirm their end), the node is closed and its Node
// object deleted.
func SpareNode(t *testing.T, e *Env, dc *DC, name string) *node.Node {
	t.Helper()
	ctx := context.Background()
	n, err := node.Start(node.Options{Name: name, Cluster: dc.Cluster, Images: e.Images.Tarball, Logf: e.opts.Logf})
	if err != nil {
		t.Fatalf("%s: starting node %s: %v", dc.Name, name, err)
	}
	t.Cleanup(func() {
		t.Helper() // a failure here is the test's, in the summary of a long run
		if t.Failed() {
			t.Logf("%s: logs of node %s's pods:\n%s", dc.Name, name, podLogs(filepath.Join(n.Dir(), "pod-logs")))
		}
		if err := n.Close(); err != nil {
			t.Errorf("%s: closing node %s: %v", dc.Name, name, err)
		}
		pods, err := dc.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
		if err == nil {
			for _, p := range pods.Items {
				_ = dc.Client.CoreV1().Pods(Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
			}
		}
		_ = dc.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	})
	Cordon(t, dc, name, true)
	return n
}

// Cordon marks a node unschedulable (kubectl cordon), or schedulable again
// (kubectl uncordon) when cordon is false.
func Cordon(t *testing.T, dc *DC, node string, cordon bool) {
	t.Helper()
	patch := []byte(fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, cordon))
	if _, err := dc.Client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("%s: setting node %s unschedulable=%t: %v", dc.Name, node, cordon, err)
	}
}

// WindowRow is a row of dislock.windows, with the database times that tell
// when its owner last proved alive and when it was claimed.
type WindowRow struct {
	Owner, Cluster, State string
	Token                 int64
	ClaimedAt, AliveUntil time.Time
	FinishedAt            *time.Time
	ExitCode              *int
}

// WindowRow reads the row of a key's window; ok is false when there is none.
func (e *Env) WindowRow(ctx context.Context, key string, window time.Time) (w WindowRow, ok bool, err error) {
	err = e.queryRow(ctx, `SELECT owner, cluster, state, token, claimed_at, alive_until, finished_at, exit_code
FROM dislock.windows WHERE lock_key = $1 AND window_start = $2`, []any{key, window},
		&w.Owner, &w.Cluster, &w.State, &w.Token, &w.ClaimedAt, &w.AliveUntil, &w.FinishedAt, &w.ExitCode)
	if errors.Is(err, pgx.ErrNoRows) {
		return w, false, nil
	}
	return w, err == nil, err
}

// LeaseRow is the row of dislock.leases of a key: its last holder.
type LeaseRow struct {
	Owner                string
	Token                int64
	AcquiredAt, ExpireAt time.Time
}

// LeaseRow reads the lease of a key; ok is false when it was never taken.
func (e *Env) LeaseRow(ctx context.Context, key string) (l LeaseRow, ok bool, err error) {
	err = e.queryRow(ctx, `SELECT owner, token, acquired_at, expire_at FROM dislock.leases WHERE lock_key = $1`,
		[]any{key}, &l.Owner, &l.Token, &l.AcquiredAt, &l.ExpireAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, false, nil
	}
	return l, err == nil, err
}

// DBNow is the database clock, the one every lock decision uses.
func (e *Env) DBNow(ctx context.Context) (now time.Time, err error) {
	err = e.queryRow(ctx, `SELECT now()`, nil, &now)
	return now, err
}

// ClockOffset is the database clock minus this host's clock, read halfway
// through one round trip, and the round trip, which bounds its error. Both
// run on this machine, so it should be (close to) zero: then times read
// from the host clock (container logs, the kubelet's) compare with
// database times.
func (e *Env) ClockOffset(ctx context.Context) (offset, roundTrip time.Duration, err error) {
	c, err := pgx.Connect(ctx, e.dsn())
	if err != nil {
		return 0, 0, err
	}
	defer c.Close(ctx)
	var db time.Time
	before := time.Now()
	if err := c.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&db); err != nil {
		return 0, 0, err
	}
	rt := time.Since(before)
	return db.Sub(before.Add(rt / 2)), rt, nil
}

// queryRow runs one query on the shared database directly (not through a
// data centre's PgBouncer, which a test may have stopped).
func (e *Env) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	c, err := pgx.Connect(ctx, e.dsn())
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.QueryRow(ctx, sql, args...).Scan(dest...)
}

// LogLine is a line of a container's log and when the container runtime
// received it, by the host clock.
type LogLine struct {
	At   time.Time
	Text string
}

// ContainerLog reads a container's log from the node's pod-log directory
// (<ns>_<pod>_<uid>/<container>/<restart>.log, CRI format: "<RFC 3339 nano
// time> <stream> <P|F> <text>"). It is there as long as the node's directory
// is, whether or not the kubelet still answers.
func ContainerLog(n *node.Node, pod, container string) ([]LogLine, error) {
	files, err := filepath.Glob(filepath.Join(n.Dir(), "pod-logs", Namespace+"_"+pod+"_*", container, "*.log"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no log of container %s of pod %s on node %s", container, pod, n.Name())
	}
	var out []LogLine
	for _, f := range files {
		lines, err := readCRILog(f)
		if err != nil {
			return nil, err
		}
		out = append(out, lines...)
	}
	return out, nil
}

func readCRILog(path string) ([]LogLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []LogLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		ts, rest, _ := strings.Cut(sc.Text(), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			continue
		}
		if f := strings.SplitN(rest, " ", 3); len(f) == 3 {
			out = append(out, LogLine{At: at, Text: f[2]})
		}
	}
	return out, sc.Err()
}

// findLine returns the first line containing s.
func findLine(lines []LogLine, s string) (LogLine, bool) {
	for _, l := range lines {
		if strings.Contains(l.Text, s) {
			return l, true
		}
	}
	return LogLine{}, false
}
