package gatewaycmd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/gatewaycmd"
	"github.com/dislock/dislock/lockagent/gateway/client"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/lockagent/store/tenant"
	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/test/tlstest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, pgtest.Options{Name: "gatewaycmd"})) }

// Flags that cannot run are refused together, each named with what it
// wants.
func TestBadFlagsAreRefusedNamingEachFlag(t *testing.T) {
	s, err := gatewaycmd.Parse([]string{"--cluster-name", "dc/a", "--database-url", "mysql://x", "--decision-conns", "0",
		"--renewal-conns", "5000", "--max-queued", "0", "--max-queued-per-namespace", "-1", "--bind-address", "9445"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Check()
	for _, flag := range []string{"--cluster-name", "--database-url", "--decision-conns", "--renewal-conns", "--max-queued ", "--max-queued-per-namespace", "--bind-address"} {
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("the error does not name %s: %v", flag, err)
		}
	}
	var out bytes.Buffer
	if _, err := gatewaycmd.Parse([]string{"--cluster-name", "dc-a", "extra"}, &out); err == nil || !strings.Contains(out.String(), "takes no arguments") {
		t.Errorf("a positional argument: %v, %q", err, out.String())
	}
	out.Reset()
	if _, err := gatewaycmd.Parse([]string{"-h"}, &out); !strings.Contains(out.String(), "--decision-conns") {
		t.Errorf("-h does not list --decision-conns: %q (%v)", out.String(), err)
	}
}

// `dislock gateway` serves a pod whose namespace the webhook gave a gateway
// credential, once its certificate is there (it waits for it, not ready):
// the pod claims through it, a foreign cluster is refused, the
// metrics count both, /readyz says the database answers, and a stop ends
// the command cleanly.
func TestTheGatewayCommandServesTheWebhooksCredentials(t *testing.T) {
	srv := pgtest.Need(t)
	ctx := context.Background()
	owner, err := store.Open(ctx, srv.BouncerDSN(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if _, err := migrate.Up(ctx, owner); err != nil {
		t.Fatal(err)
	}
	cred, err := tenant.ProvisionGateway(ctx, owner, "dc-a", "team-a")
	if err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	ports, err := harness.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var logs harness.Buffer
	code := make(chan int, 1)
	go func() {
		code <- gatewaycmd.Main(runCtx, []string{"--cluster-name", "dc-a", "--database-url", srv.BouncerDSN(), "--cert-dir", certDir,
			"--bind-address", fmt.Sprintf("127.0.0.1:%d", ports[0]), "--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", ports[1]),
			"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", ports[2])}, &logs)
	}()
	get := func(port int, path string) (int, string) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Started before its certificate exists (a first install with
	// self-signed certificates), it waits, not ready, and does not exit.
	deadline := time.Now().Add(30 * time.Second)
	for {
		status, body := get(ports[1], "/readyz")
		if status == http.StatusServiceUnavailable && strings.Contains(body, "waiting for the serving certificate") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz before the certificate: %d %s\n%s", status, body, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	ca := tlstest.ServingCert(t, certDir)
	url, err := tenant.GatewayURL(fmt.Sprintf("https://127.0.0.1:%d", ports[0]), ca, cred)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := store.ClaimRequest{Key: "team-a/report", Window: time.Now().UTC().Truncate(time.Minute), Index: store.NotIndexed, TTL: time.Minute,
		Owner: store.Owner{Cluster: "dc-a", Namespace: "team-a", Job: "report-1", JobUID: "uid", Pod: "p"}}
	deadline = time.Now().Add(30 * time.Second)
	var claim store.Claim
	for {
		if claim, err = c.ClaimWindow(ctx, req); !errors.Is(err, store.ErrUnavailable) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || claim.Outcome != store.Claimed {
		t.Fatalf("claim through the gateway: %+v, %v\n%s", claim, err, logs.String())
	}
	foreign := req
	foreign.Owner.Cluster = "dc-b"
	if _, err := c.ClaimWindow(ctx, foreign); !errors.Is(err, store.ErrForbidden) {
		t.Fatalf("a claim as another cluster: %v, want ErrForbidden", err)
	}
	if status, body := get(ports[1], "/readyz"); status != http.StatusOK {
		t.Errorf("/readyz: %d %s", status, body)
	}
	_, metrics := get(ports[2], "/metrics")
	for _, want := range []string{`dislock_gateway_calls_total{answer="ok",call="claim"} 1`, `dislock_gateway_calls_total{answer="forbidden",call="claim"} 1`,
		`dislock_gateway_queued_calls{lane="decisions"} 0`, `dislock_gateway_call_seconds_count{call="claim"} 2`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	stop()
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("the gateway exited %d after a stop:\n%s", c, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway did not stop within 30s")
	}
}
