package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/pgtest"
)

// quitSeen is what a classic mesh sidecar's quit endpoint saw when the agent
// asked it to quit: the pod's window and lease in the database at that
// moment, and whether the agent was still running (the kubelet never stops
// it while the proxy runs).
type quitSeen struct {
	window     store.Window
	windowErr  error
	leaseFree  bool
	agentAlive bool
}

// fakeProxy serves a quit endpoint on the loopback, as istio-proxy serves
// /quitquitquit: every POST is reported on quits.
type fakeProxy struct {
	url   string
	quits chan quitSeen
	lis   net.Listener
	// pod is the pod the proxy sits in, set once it started.
	pod atomic.Pointer[pod]
}

// newFakeProxy listens on a free loopback port; with listen false the port is
// reserved but nothing answers until serve (a proxy not up yet).
func newFakeProxy(t *testing.T, j job, listen bool) *fakeProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fp := &fakeProxy{url: fmt.Sprintf("http://%s/quitquitquit", lis.Addr()), quits: make(chan quitSeen, 8), lis: lis}
	s := openStore(t, j.dsn)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/quitquitquit" {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		var seen quitSeen
		ctx := context.Background()
		seen.window, seen.windowErr = s.GetWindow(ctx, j.key, tick0, store.NotIndexed)
		l, now, err := s.GetLease(ctx, j.key)
		seen.leaseFree = errors.Is(err, store.ErrNotFound) || err == nil && !l.ExpireAt.After(now)
		if po := fp.pod.Load(); po != nil {
			select {
			case <-po.agentDone:
			default:
				seen.agentAlive = true
			}
		}
		fp.quits <- seen
		w.WriteHeader(http.StatusOK)
	})}
	t.Cleanup(func() { srv.Close() })
	if !listen {
		lis.Close() // refused until serve
		return fp
	}
	go srv.Serve(lis)
	return fp
}

// serve starts answering on the reserved port.
func (fp *fakeProxy) serve(t *testing.T, handler http.Handler) {
	t.Helper()
	lis, err := net.Listen("tcp", fp.lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler}
	t.Cleanup(func() { srv.Close() })
	go srv.Serve(lis)
}

func (fp *fakeProxy) await(t *testing.T, po *pod) quitSeen {
	t.Helper()
	select {
	case q := <-fp.quits:
		return q
	case <-time.After(30 * time.Second):
		t.Fatalf("the agent never asked the mesh sidecar to quit:\n%s", po.agentLog)
		return quitSeen{}
	}
}

// A classic mesh sidecar (istio-proxy as a regular container) never exits by
// itself, so the kubelet never stops the agent: the pod ends only if the
// agent asks the proxy to quit once the app containers ended for good. It
// does so after the outcome is in the database and the lease is free (its
// own database traffic may pass through the proxy), in run and skip alike,
// and under restartPolicy Never also after a failure; under OnFailure a
// failed container is restarted, so the proxy must stay.
func TestTheAgentAsksAClassicMeshSidecarToQuitOnceTheAppsEnded(t *testing.T) {
	dsn := pgtest.Need(t).BouncerDSN()
	// meshJob is a job whose pods in dc-a have a classic mesh sidecar.
	meshJob := func(t *testing.T, mode, policy string, listen bool) (job, *fakeProxy) {
		j := newJob(t, dsn, mode, 6*time.Second)
		fp := newFakeProxy(t, j, listen)
		j.extra = append(j.extra, contract.EnvRestartPolicy+"="+policy, contract.EnvProxyQuit+"="+fp.url)
		return j, fp
	}
	// startIn starts the pod the proxy sits in.
	startIn := func(t *testing.T, j job, fp *fakeProxy, p podSpec) *pod {
		po := j.start(t, p)
		fp.pod.Store(po)
		return po
	}
	// runElsewhere has another cluster's pod, without a mesh, run the window.
	runElsewhere := func(t *testing.T, j job) {
		j.extra = nil
		if b := j.start(t, podSpec{cluster: "dc-b", window: tick0, app: app(0.1, 0)}); b.finish() != 0 {
			t.Fatal("dc-b failed")
		}
	}
	for _, tc := range []struct {
		name, policy string
		exit         int
		state        store.State
	}{
		{"the app succeeds", contract.RestartNever, 0, store.StateSucceeded},
		{"the app fails under restartPolicy Never", contract.RestartNever, 3, store.StateFailed},
		{"the app succeeds under restartPolicy OnFailure", contract.RestartOnFailure, 0, store.StateSucceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j, fp := meshJob(t, "schedule,lease", tc.policy, true)
			a := startIn(t, j, fp, podSpec{cluster: "dc-a", window: tick0, app: app(0.3, tc.exit)})
			a.waitWrapper()
			q := fp.await(t, a)
			if !q.agentAlive || q.windowErr != nil || q.window.State != tc.state || !q.leaseFree {
				t.Fatalf("asked to quit with window %+v (%v), lease free %v, agent alive %v; want the window %s and the lease free first\n%s",
					q.window, q.windowErr, q.leaseFree, q.agentAlive, tc.state, a.agentLog)
			}
			a.stopAgent() // the proxy quit: the kubelet stops the sidecar
			if len(fp.quits) != 0 {
				t.Fatalf("asked the proxy to quit more than once")
			}
		})
	}

	t.Run("another cluster's pod skips", func(t *testing.T) {
		j, fp := meshJob(t, "schedule,lease", contract.RestartNever, true)
		runElsewhere(t, j)
		a := startIn(t, j, fp, podSpec{cluster: "dc-a", window: tick0, app: app(0, 0)})
		a.waitWrapper()
		if a.decision().Action != protocol.ActionSkip {
			t.Fatalf("dc-a decided %+v, want skip", a.decision())
		}
		if q := fp.await(t, a); !q.agentAlive {
			t.Fatal("the proxy was asked to quit by a stopped agent")
		}
		a.stopAgent()
	})

	t.Run("the app fails under restartPolicy OnFailure: the proxy stays for the restart", func(t *testing.T) {
		j, fp := meshJob(t, "schedule,lease", contract.RestartOnFailure, true)
		a := startIn(t, j, fp, podSpec{cluster: "dc-a", window: tick0, app: app(0.2, 3)})
		a.waitWrapper()
		a.spec.app = app(0.2, 0)
		a.startWrapper() // the kubelet restarts the failed container in the pod
		a.waitWrapper()
		q := fp.await(t, a)
		if q.window.State != store.StateSucceeded || !q.leaseFree {
			t.Fatalf("asked to quit with window %+v, lease free %v; want the retry's success recorded first", q.window, q.leaseFree)
		}
		a.stopAgent()
		if runs := readLedger(t, j.ledger); len(runs) != 2 {
			t.Fatalf("ledger: %+v; want the failed run and its retry in the same pod", runs)
		}
	})

	t.Run("the proxy is not up yet when the pod skips", func(t *testing.T) {
		j, fp := meshJob(t, "schedule", contract.RestartNever, false)
		runElsewhere(t, j)
		a := startIn(t, j, fp, podSpec{cluster: "dc-a", window: tick0, app: app(0, 0)})
		a.waitWrapper()
		await(t, "the agent to find the proxy not listening", 20*time.Second, func() bool {
			return strings.Contains(a.agentLog.String(), "does not take the quit request yet")
		})
		got := make(chan struct{}, 1)
		fp.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- struct{}{} }))
		select {
		case <-got:
		case <-time.After(30 * time.Second):
			t.Fatalf("no quit request once the proxy listened:\n%s", a.agentLog)
		}
		a.stopAgent()
	})
}
