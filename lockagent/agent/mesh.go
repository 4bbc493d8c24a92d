package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/dislock/dislock/lockagent/protocol"
)

// A classic (non-native) mesh sidecar — istio-proxy or linkerd-proxy as a
// regular container — never exits by itself, so the kubelet never stops the
// native sidecars and the pod never ends: the Job never completes, and
// without the early record in supervise a run's lease would be renewed for
// ever. The webhook tells the agent the proxies' quit endpoints
// (Config.ProxyQuit); once every app container ended for good the agent
// records what is left to record and then asks each proxy to quit. Recording
// comes first because the agent's own database traffic may pass through the
// proxy.

// Pacing of the quit requests: a proxy may not listen yet when a skip ends
// the app containers within a second of the pod's start.
const (
	quitCallTimeout = 2 * time.Second
	quitRetryEvery  = time.Second
	// quitFor bounds the tries per endpoint: a proxy that never answers is
	// logged, and the pod then ends with its activeDeadlineSeconds, or by
	// hand, as it would without dislock.
	quitFor = 5 * time.Minute
)

// idle is the rest of the sidecar's life once nothing is left to keep alive:
// it waits for SIGTERM. With classic mesh sidecars in the pod it first waits
// until every app container ended for good, finishes a run that is still
// open (a revoked one: its outcome and the lease), and asks the proxies to
// quit, so that the pod can end.
func (a *agent) idle(ctx context.Context) {
	if len(a.cfg.ProxyQuit) == 0 {
		<-ctx.Done()
		return
	}
	for !a.allEnded() {
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return
		}
	}
	if a.decision.Action == protocol.ActionRun && !a.finished && a.gaveUp == "" && (a.windowToken != 0 || a.leaseToken != 0) {
		recordCtx, cancel := a.recordContext()
		a.finishRun(recordCtx)
		cancel()
	}
	a.quitProxies(ctx)
	<-ctx.Done()
}

// quitProxies POSTs to every quit endpoint until it answers (any HTTP
// status below 500), for up to quitFor each, or until ctx ends.
func (a *agent) quitProxies(ctx context.Context) {
	client := &http.Client{Timeout: quitCallTimeout, Transport: loopbackOnly(), CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse // a quit endpoint has no business redirecting
	}}
	for _, u := range a.cfg.ProxyQuit {
		start := time.Now()
		for tries := 1; ; tries++ {
			status, err := postQuit(ctx, client, u)
			if err == nil && status < 500 {
				level := a.log.Info
				if status >= 300 {
					level = a.log.Warn // e.g. Linkerd without its admin shutdown endpoint: 404
				}
				level("asked the mesh sidecar to quit: the app containers ended", "url", u, "status", status, "tries", tries)
				break
			}
			if err == nil {
				err = fmt.Errorf("HTTP status %d", status)
			}
			if time.Since(start) >= quitFor {
				a.log.Error("the mesh sidecar did not take the quit request; the pod ends only when it exits", "url", u, "tries", tries, "err", err)
				break
			}
			if tries == 1 {
				a.log.Info("the mesh sidecar does not take the quit request yet; retrying every second", "url", u, "err", err)
			}
			if sleep(ctx, quitRetryEvery) != nil {
				return
			}
		}
	}
}

func postQuit(ctx context.Context, client *http.Client, u string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	return resp.StatusCode, nil
}

// loopbackOnly is a transport that connects only to loopback addresses, and
// never through a proxy: "localhost" in a quit URL resolves through the
// pod's /etc/hosts, which a hostAliases entry can point elsewhere.
func loopbackOnly() *http.Transport {
	dialer := &net.Dialer{Control: func(_, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return err
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			return fmt.Errorf("%s is not a loopback address: a quit URL reaches only the pod's own loopback", host)
		}
		return nil
	}}
	return &http.Transport{Proxy: nil, DialContext: dialer.DialContext, DisableKeepAlives: true}
}
