package skew_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/test/harness"
)

// lockKey is the story's CronJob: <namespace>/<name>.
const lockKey = "skew/report"

// app appends "<cluster> <window> <token>" to $LEDGER: what ran, as the
// app itself saw it.
const app = `echo "$CLUSTER $DISLOCK_WINDOW $DISLOCK_FENCING_TOKEN" >> "$LEDGER"`

// pod is one cluster's pod of one window, as the kubelet runs it: the
// sidecar (`dislock-agent agent`) until its startup probe passes, then the
// app container wrapped by `dislock-agent exec` from the copy the sidecar
// installed, then SIGTERM to the sidecar once the app exited. The
// environment is what the webhook renders.
type pod struct {
	cluster string
	agent   string // the dislock-agent binary of the cluster's release
	window  time.Time
	dsn     string
	ledger  string
	dir     string
	log     harness.Buffer
}

func (p *pod) env() []string {
	job := fmt.Sprintf("report-%d", p.window.Unix()/60)
	return []string{
		"PATH=" + os.Getenv("PATH"),
		contract.EnvMode + "=schedule",
		contract.EnvKey + "=" + lockKey,
		contract.EnvWindow + "=" + p.window.UTC().Format(time.RFC3339),
		contract.EnvLeaseTTL + "=30s",
		contract.EnvStandby + "=false",
		contract.EnvCluster + "=" + p.cluster,
		contract.EnvJobName + "=" + job,
		contract.EnvJobUID + "=uid-" + p.cluster + "-" + job,
		contract.EnvPodName + "=" + job + "-pod",
		contract.EnvDatabaseURL + "=" + p.dsn,
		contract.EnvSharedDir + "=" + p.dir,
		contract.EnvTerminationLog + "=" + filepath.Join(p.dir, "termination-log"),
		contract.EnvAppContainers + "=app",
		contract.EnvContainerName + "=app",
		"LEDGER=" + p.ledger,
		"CLUSTER=" + p.cluster,
	}
}

// run runs the pod to its end and returns the sidecar's decision.
func (p *pod) run(ctx context.Context) (protocol.Decision, error) {
	agent := exec.CommandContext(ctx, p.agent, "agent")
	agent.Env, agent.Stdout, agent.Stderr = p.env(), &p.log, &p.log
	if err := agent.Start(); err != nil {
		return protocol.Decision{}, err
	}
	var wait sync.Once
	var waitErr error
	waitAgent := func() error {
		wait.Do(func() { waitErr = agent.Wait() })
		return waitErr
	}
	defer func() {
		agent.Process.Kill()
		waitAgent()
	}()
	// The startup probe, polled as the kubelet does.
	for {
		probe := exec.CommandContext(ctx, p.agent, "probe")
		probe.Env = p.env()
		if probe.Run() == nil {
			break
		}
		if ctx.Err() != nil {
			return protocol.Decision{}, fmt.Errorf("the startup probe never passed: %w", ctx.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
	wrapper := exec.CommandContext(ctx, filepath.Join(p.dir, protocol.BinPath), "exec", "--", "/bin/sh", "-c", app)
	wrapper.Env, wrapper.Stdout, wrapper.Stderr = p.env(), &p.log, &p.log
	if err := wrapper.Run(); err != nil {
		return protocol.Decision{}, fmt.Errorf("the wrapped app: %w", err)
	}
	if err := agent.Process.Signal(syscall.SIGTERM); err != nil {
		return protocol.Decision{}, err
	}
	if err := waitAgent(); err != nil {
		return protocol.Decision{}, fmt.Errorf("the sidecar after SIGTERM: %w", err)
	}
	d, ok, err := protocol.Dir(p.dir).ReadDecision()
	if err == nil && !ok {
		err = errors.New("no decision")
	}
	return d, err
}

// race runs one window's pods of every cluster at once, each cluster with
// its own release's agent, and returns their decisions by cluster. A
// cluster named first runs its pod to the end before the others start, so
// that a story can say which release claims.
func race(t *testing.T, dsn, ledger string, window time.Time, agents map[string]string, first string) map[string]protocol.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[string]protocol.Decision{}
	start := func(cluster string, async bool) {
		bin := agents[cluster]
		p := &pod{cluster: cluster, agent: bin, window: window, dsn: dsn, ledger: ledger, dir: t.TempDir()}
		wg.Add(1)
		run := func() {
			defer wg.Done()
			d, err := p.run(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("window %s, cluster %s (%s): %v\n%s", window.Format(time.RFC3339), cluster, bin, err, &p.log)
				return
			}
			out[cluster] = d
		}
		if !async {
			run()
			return
		}
		go run()
	}
	if first != "" {
		start(first, false)
	}
	for cluster := range agents {
		if cluster != first {
			start(cluster, true)
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return out
}
