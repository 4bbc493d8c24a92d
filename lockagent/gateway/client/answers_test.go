package client_test

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/gateway/client"
	"github.com/dislock/dislock/lockagent/store"
)

// answering is a client of a TLS server that answers every call with h.
func answering(t *testing.T, h http.HandlerFunc) *client.Client {
	t.Helper()
	ts := httptest.NewTLSServer(h)
	t.Cleanup(ts.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})
	u := url.URL{Scheme: "https", User: url.UserPassword("ns", "credential"), Host: strings.TrimPrefix(ts.URL, "https://"),
		RawQuery: "ca=" + base64.RawURLEncoding.EncodeToString(ca)}
	c, err := client.Dial(u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

var (
	tick  = time.Date(2026, 12, 6, 6, 0, 0, 0, time.UTC)
	owner = store.Owner{Cluster: "dc-a", Namespace: "ns", Job: "report-1", JobUID: "uid", Pod: "p"}
)

// grants are the calls whose success lets a pod run or keep running.
func grants(ctx context.Context, c *client.Client) map[string]error {
	_, claim := c.ClaimWindow(ctx, store.ClaimRequest{Key: "ns/report", Window: tick, Index: store.NotIndexed, Owner: owner, TTL: time.Minute})
	_, lease := c.AcquireLease(ctx, "ns/report", owner, time.Minute)
	_, renew := c.Renew(ctx, store.Renewal{Key: "ns/report", Window: tick, Index: store.NotIndexed, WindowToken: 7, LeaseKey: "ns/report", LeaseToken: 8, TTL: time.Minute})
	_, _, heartbeat := c.Heartbeat(ctx, "ns/report", tick, store.NotIndexed, 7, time.Minute)
	return map[string]error{"claim": claim, "lease": lease, "renew": renew, "heartbeat": heartbeat}
}

// Whatever answers in the gateway's place — a proxy, another service, a
// gateway cut off mid-answer — never grants a claim, a lease or a renewal:
// an answer that is not a lock gateway's is no answer (ErrUnavailable).
func TestAnAnswerThatIsNotTheGatewaysGrantsNothing(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
	}{
		{200, `{}`},
		{200, `null`},
		{200, `{"result":null}`},
		{200, `{"status":"ok"}`},
		{200, `{"v":1}`},
		{200, `{"v":1,"result":null}`},
		{200, `{"v":1,"result":{}}`},
		{200, `{"v":2,"result":{"Outcome":"claimed","Window":{"token":5}}}`},
		{200, `{"v":1,"result":{"Outcome":"claimed","Window":{"tok`},
		{200, `<html>ok</html>`},
		{502, `{"v":1,"error":{"message":"upstream reset"}}`},
		{503, `{"error":{"kind":"window-taken","message":"x"}}`},
	} {
		c := answering(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			io.WriteString(w, tc.body)
		})
		for call, err := range grants(context.Background(), c) {
			if !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("%d %s: %s: %v, want ErrUnavailable", tc.status, tc.body, call, err)
			}
		}
	}
}

// A redirect is not followed: the credential goes nowhere but the gateway,
// and the call counts as unanswered.
func TestARedirectIsNotFollowed(t *testing.T) {
	var reached atomic.Bool
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Store(true)
		io.WriteString(w, `{"v":1,"result":{"Outcome":"claimed","Window":{"token":5}}}`)
	}))
	t.Cleanup(elsewhere.Close)
	c := answering(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusTemporaryRedirect)
	})
	for call, err := range grants(context.Background(), c) {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s redirected: %v, want ErrUnavailable", call, err)
		}
	}
	if reached.Load() {
		t.Fatal("the redirect was followed, credential and all")
	}
}

// A gateway's word on how long a call queued moves the pod's safety
// deadline, so it is taken only up to the time the pod itself waited for
// the answer: a gateway cannot have queued a call longer than that, and a
// figure past it (a bug, a clock gone wrong) would let the pod trust its
// grant past the database's expiry.
func TestAGatewaysQueueTimeIsNeverTakenPastThePodsOwnWait(t *testing.T) {
	c := answering(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"v":1,"waited":3600000000000,"result":{"Outcome":"claimed","Window":{"token":5},"Lease":{"token":6,"expireAt":"2026-12-06T06:01:00Z"},"WindowUntil":"2026-12-06T06:01:00Z","LeaseUntil":"2026-12-06T06:01:00Z","DBTime":"2026-12-06T06:00:00Z"}}`)
	})
	ctx := context.Background()
	for _, tc := range []struct {
		call string
		do   func() (time.Duration, error)
	}{
		{"claim", func() (time.Duration, error) {
			r, err := c.ClaimWindow(ctx, store.ClaimRequest{Key: "ns/report", Window: tick, Index: store.NotIndexed, Owner: owner, TTL: time.Minute})
			return r.Waited, err
		}},
		{"lease", func() (time.Duration, error) {
			r, err := c.AcquireLease(ctx, "ns/report", owner, time.Minute)
			return r.Waited, err
		}},
		{"renew", func() (time.Duration, error) {
			r, err := c.Renew(ctx, store.Renewal{Key: "ns/report", Window: tick, Index: store.NotIndexed, WindowToken: 5, LeaseKey: "ns/report", LeaseToken: 6, TTL: time.Minute})
			return r.Waited, err
		}},
	} {
		start := time.Now()
		waited, err := tc.do()
		took := time.Since(start)
		if err != nil {
			t.Fatalf("%s: %v", tc.call, err)
		}
		if waited <= 0 || waited > took {
			t.Errorf("%s: the gateway said it queued the call for an hour; taken as %s, for a call answered in %s", tc.call, waited, took)
		}
	}
}
