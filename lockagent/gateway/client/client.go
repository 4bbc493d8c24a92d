// Package client is what a pod's agent uses to reach its cluster's lock
// gateway (lockagent/gateway): store.Locks over HTTPS, the gateway's
// answers turned back into the store's errors. The sidecar links it; it
// links no server code.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/dislock/dislock/lockagent/gateway/internal/wire"
	"github.com/dislock/dislock/lockagent/store"
)

// IsURL tells a lock gateway's URL (https://…) from a database's
// (postgres://… or key=value): the agent takes either as its database URL.
func IsURL(s string) bool { return strings.HasPrefix(s, "https://") }

// Client sends a pod's lock calls to a lock gateway. It implements
// store.Locks.
type Client struct {
	base      string // https://host:port/v1/
	namespace string
	secret    string
	addr      string // host:port, for messages
	http      *http.Client
}

var _ store.Locks = (*Client)(nil)

// caParam is the URL's query parameter that carries the certificates (PEM,
// in base64) the gateway's serving certificate must chain to. Without it
// the system's roots decide.
const caParam = "ca"

// Dial prepares a Client for the gateway at rawURL,
// https://<namespace>:<credential>@host:port[/]?ca=<base64 PEM>. It does not
// connect: the first call does. Errors never contain the credential.
func Dial(rawURL string) (*Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error quotes the whole URL, credential and all: keep only
		// what is wrong with it.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("invalid lock gateway URL: %v", err)
	}
	shown := u.Redacted()
	var problems []string
	if u.Scheme != "https" {
		problems = append(problems, fmt.Sprintf("scheme %q is not https", u.Scheme))
	}
	if u.Host == "" || u.Port() == "" {
		problems = append(problems, "host:port is missing")
	}
	ns, secret := u.User.Username(), ""
	if p, ok := u.User.Password(); ok {
		secret = p
	}
	if ns == "" || secret == "" {
		problems = append(problems, "the namespace and its credential are missing (https://<namespace>:<credential>@host:port)")
	}
	if u.Path != "" && u.Path != "/" {
		problems = append(problems, fmt.Sprintf("path %q is not empty", u.Path))
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		problems = append(problems, "query: "+err.Error())
	}
	for k := range q {
		if k != caParam {
			problems = append(problems, fmt.Sprintf("parameter %q is unknown (only %q is)", k, caParam))
		}
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca := q.Get(caParam); ca != "" {
		pool, err := caPool(ca)
		if err != nil {
			problems = append(problems, err.Error())
		}
		cfg.RootCAs = pool
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("invalid lock gateway URL %s: %s", shown, strings.Join(problems, "; "))
	}
	transport := &http.Transport{
		TLSClientConfig:     cfg,
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
		// No bound of its own on the handshake: the call's context bounds
		// it. Under a herd a gateway's handshakes queue for its CPU, and a
		// pod that gave up on one and dialled again only added another
		// (a herd of 3 × 3 000 made 12 800–15 800 connections for 9 000
		// pods with a 10 s bound).
		TLSHandshakeTimeout: 0,
	}
	return &Client{
		base:      "https://" + u.Host + wire.PathPrefix,
		namespace: ns, secret: secret, addr: u.Host,
		// A redirect is not the gateway's answer: following one would send
		// the credential wherever it points, plain http included.
		http: &http.Client{Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
	}, nil
}

// caPool reads the ca parameter: base64 (standard or URL alphabet, padded
// or not) of one or more PEM certificates.
func caPool(param string) (*x509.CertPool, error) {
	param = strings.TrimRight(param, "=")
	var pem []byte
	var err error
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		if pem, err = enc.DecodeString(param); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("parameter %q is not base64: %v", caParam, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("parameter %q holds no PEM certificate", caParam)
	}
	return pool, nil
}

// Close drops the idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// call sends one call and decodes its result into result (which may be
// nil). An answered error comes back as the store's error of its kind,
// with the result still decoded (a refused claim's holder). A call that
// got no answer is ErrUnavailable: it may or may not have run, as a
// statement whose reply was lost.
func (c *Client) call(ctx context.Context, name string, req, result any) error {
	_, err := c.callWaited(ctx, name, req, result)
	return err
}

// callWaited is call, also returning how long the call waited in the
// gateway before it started on the database, never more than it took
// here: a gateway cannot have queued a call longer than its pod waited
// for the answer, so a larger figure is taken for the pod's own.
func (c *Client) callWaited(ctx context.Context, name string, req, result any) (time.Duration, error) {
	sent := time.Now()
	waited, err := c.exchange(ctx, name, req, result)
	return min(max(waited, 0), time.Since(sent)), err
}

func (c *Client) exchange(ctx context.Context, name string, req, result any) (time.Duration, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return 0, fmt.Errorf("lock gateway %s: encoding the request: %w", name, err)
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+name, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("lock gateway %s: %w", name, err)
	}
	hr.SetBasicAuth(c.namespace, c.secret)
	hr.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(hr)
	if err != nil {
		return 0, fmt.Errorf("lock gateway %s: %w at %s: %v", name, store.ErrUnavailable, c.addr, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, wire.MaxBody))
	if err != nil {
		return 0, fmt.Errorf("lock gateway %s: %w at %s: reading the answer: %v", name, store.ErrUnavailable, c.addr, err)
	}
	var r struct {
		V      int             `json:"v"`
		Result json.RawMessage `json:"result"`
		Error  *wire.Error     `json:"error"`
		Waited time.Duration   `json:"waited"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.V != wire.Version || (r.Error == nil && (resp.StatusCode != http.StatusOK || len(r.Result) == 0 || string(r.Result) == "null")) {
		// Not the gateway's answer: a proxy's page, another service, or
		// a gateway cut off mid-answer. Never a grant.
		return 0, fmt.Errorf("lock gateway %s: %w at %s: answered %s, not as a lock gateway of version %d does: %.200q", name, store.ErrUnavailable, c.addr, resp.Status, wire.Version, raw)
	}
	if result != nil && len(r.Result) > 0 && string(r.Result) != "null" {
		if err := json.Unmarshal(r.Result, result); err != nil {
			return 0, fmt.Errorf("lock gateway %s: %w at %s: decoding the answer: %v", name, store.ErrUnavailable, c.addr, err)
		}
	}
	if r.Error == nil {
		return r.Waited, nil
	}
	err = wire.Err(r.Error)
	if r.Error.Kind == "" && resp.StatusCode >= 500 {
		// The gateway failed without saying how the database answered:
		// as with no answer, the call may or may not have run.
		return 0, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return r.Waited, err
}

// Now implements store.Locks.
func (c *Client) Now(ctx context.Context) (time.Time, error) {
	var r wire.NowReply
	err := c.call(ctx, wire.Now, wire.Empty{}, &r)
	return r.DBTime, err
}

// RecordView implements store.Locks.
func (c *Client) RecordView(ctx context.Context, key, cluster string, v store.View, recency time.Duration) ([]store.ClusterView, error) {
	var r wire.ViewReply
	err := c.call(ctx, wire.View, wire.ViewRequest{Key: key, Cluster: cluster, View: v, Recency: recency}, &r)
	return r.Others, err
}

// ClaimWindow implements store.Locks. A grant without an outcome or a
// token is no grant: the pod must never run on it.
func (c *Client) ClaimWindow(ctx context.Context, req store.ClaimRequest) (store.Claim, error) {
	var r store.Claim
	var err error
	r.Waited, err = c.callWaited(ctx, wire.Claim, req, &r)
	if err == nil && (r.Outcome == "" || r.Window.Token <= 0) {
		return store.Claim{}, fmt.Errorf("lock gateway claim: %w at %s: a grant without an outcome or a token", store.ErrUnavailable, c.addr)
	}
	return r, err
}

// WindowAt implements store.Locks.
func (c *Client) WindowAt(ctx context.Context, key string, window time.Time, index int) (store.Window, time.Time, error) {
	var r wire.WindowReply
	err := c.call(ctx, wire.Window, wire.WindowRequest{Key: key, Window: window, Index: index}, &r)
	return r.Window, r.DBTime, err
}

// AcquireLease implements store.Locks.
func (c *Client) AcquireLease(ctx context.Context, key string, owner store.Owner, ttl time.Duration) (store.LeaseGrant, error) {
	var r store.LeaseGrant
	var err error
	r.Waited, err = c.callWaited(ctx, wire.Lease, wire.LeaseRequest{Key: key, Owner: owner, TTL: ttl}, &r)
	if err == nil && (r.Lease.Token <= 0 || r.Lease.ExpireAt.IsZero()) {
		return store.LeaseGrant{}, fmt.Errorf("lock gateway lease: %w at %s: a grant without a token or an expiry", store.ErrUnavailable, c.addr)
	}
	return r, err
}

// Heartbeat implements store.Locks, as store.Store does: a renewal of the
// window alone.
func (c *Client) Heartbeat(ctx context.Context, key string, window time.Time, index int, token int64, ttl time.Duration) (time.Time, time.Time, error) {
	r, err := c.Renew(ctx, store.Renewal{Key: key, Window: window, Index: index, WindowToken: token, TTL: ttl})
	return r.WindowUntil, r.DBTime, err
}

// Renew implements store.Locks.
func (c *Client) Renew(ctx context.Context, req store.Renewal) (store.Renewed, error) {
	var r store.Renewed
	var err error
	r.Waited, err = c.callWaited(ctx, wire.Renew, req, &r)
	// What was asked is what has a token, as store.Renew reads it: the
	// agent names its lease's key even when its mode takes no lease.
	if err == nil && (r.DBTime.IsZero() || (req.WindowToken != 0 && r.WindowUntil.IsZero()) || (req.LeaseToken != 0 && r.LeaseUntil.IsZero())) {
		return store.Renewed{}, fmt.Errorf("lock gateway renew: %w at %s: a renewal without the expiries asked for", store.ErrUnavailable, c.addr)
	}
	return r, err
}

// Finish implements store.Locks.
func (c *Client) Finish(ctx context.Context, key string, window time.Time, index int, token int64, state store.State, exitCode *int) (time.Time, error) {
	var r wire.FinishReply
	err := c.call(ctx, wire.Finish, wire.FinishRequest{Key: key, Window: window, Index: index, Token: token, State: state, ExitCode: exitCode}, &r)
	return r.FinishedAt, err
}

// ReleaseLease implements store.Locks.
func (c *Client) ReleaseLease(ctx context.Context, key string, token int64) (bool, error) {
	var r wire.ReleaseReply
	err := c.call(ctx, wire.Release, wire.ReleaseRequest{Key: key, Token: token}, &r)
	return r.Released, err
}

// RecordDecision implements store.Locks.
func (c *Client) RecordDecision(ctx context.Context, d store.Decision) error {
	return c.call(ctx, wire.Decision, wire.DecisionRequest{Decision: d, Duration: d.Duration}, nil)
}
