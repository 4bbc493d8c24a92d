package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

// Credentials decide who a caller is.
type Credentials interface {
	// Check returns nil when secret is namespace's current credential.
	Check(namespace, secret string) error
}

// StaticCredentials are credentials by namespace, fixed for the server's
// life.
type StaticCredentials map[string]string

// Check implements Credentials in time independent of how much of secret
// matches.
func (c StaticCredentials) Check(namespace, secret string) error {
	want, ok := c[namespace]
	if !ok {
		return fmt.Errorf("namespace %q has no credential here", namespace)
	}
	w, g := sha256.Sum256([]byte(want)), sha256.Sum256([]byte(secret))
	if subtle.ConstantTimeCompare(w[:], g[:]) != 1 {
		return fmt.Errorf("the credential of namespace %q is not the current one", namespace)
	}
	return nil
}

// Config is what a Server needs.
type Config struct {
	// Cluster is the cluster the gateway serves: every owner, view and
	// decision a pod sends must name it.
	Cluster string
	// Decisions runs the calls of a pod's decision (the clock, the view,
	// the claim, the lease, the owner's row, the ledger); Renewals the
	// calls of a holder (renewals, outcomes, releases). Each should have
	// connections of its own, so that renewals never wait behind the
	// herd's decisions.
	Decisions, Renewals store.Locks
	// DecisionConns and RenewalConns are how many calls of each lane run
	// at once: the connections of its Locks.
	DecisionConns, RenewalConns int
	// MaxQueued bounds each lane's waiting calls; past it a call is
	// refused at once as unavailable and the pod retries later.
	MaxQueued int
	// CallTimeout bounds one call's run on the database once started
	// (DefaultCallTimeout when 0). The call runs to its end, or to this
	// bound, whether or not the pod still waits for it.
	CallTimeout time.Duration
	Credentials Credentials
	Logger      *slog.Logger
}

// DefaultCallTimeout bounds a started call: far above any statement's run,
// below the time after which nobody could use its answer.
const DefaultCallTimeout = time.Minute

// Server answers the lock calls of pods. It implements http.Handler.
type Server struct {
	cfg       Config
	decisions *lane
	renewals  *lane
	calls     map[string]handler
}

// lane is one queue of calls and the connections that serve it.
type lane struct {
	name   string
	locks  store.Locks
	slots  chan struct{}
	queued atomic.Int64
	max    int64
}

// handler runs one call for namespace ns, from its JSON body.
type handler struct {
	lane *lane
	run  func(ctx context.Context, l store.Locks, ns string, body []byte) (any, error)
}

// NewServer checks cfg and returns its Server.
func NewServer(cfg Config) (*Server, error) {
	var problems []string
	if cfg.Cluster == "" {
		problems = append(problems, "Cluster is empty")
	}
	if cfg.Decisions == nil || cfg.Renewals == nil {
		problems = append(problems, "Decisions and Renewals must both be set")
	}
	if cfg.DecisionConns < 1 || cfg.RenewalConns < 1 {
		problems = append(problems, fmt.Sprintf("DecisionConns %d and RenewalConns %d must be at least 1", cfg.DecisionConns, cfg.RenewalConns))
	}
	if cfg.MaxQueued < 0 {
		problems = append(problems, fmt.Sprintf("MaxQueued %d is negative", cfg.MaxQueued))
	}
	if cfg.Credentials == nil {
		problems = append(problems, "Credentials is nil")
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("lock gateway: %s", strings.Join(problems, "; "))
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{
		cfg:       cfg,
		decisions: newLane("decisions", cfg.Decisions, cfg.DecisionConns, cfg.MaxQueued),
		renewals:  newLane("renewals", cfg.Renewals, cfg.RenewalConns, cfg.MaxQueued),
	}
	s.calls = map[string]handler{
		callNow:      {s.decisions, s.now},
		callView:     {s.decisions, s.view},
		callClaim:    {s.decisions, s.claim},
		callWindow:   {s.decisions, s.window},
		callLease:    {s.decisions, s.lease},
		callDecision: {s.decisions, s.decision},
		callRenew:    {s.renewals, s.renew},
		callFinish:   {s.renewals, s.finish},
		callRelease:  {s.renewals, s.release},
	}
	return s, nil
}

func newLane(name string, l store.Locks, conns, maxQueued int) *lane {
	return &lane{name: name, locks: l, slots: make(chan struct{}, conns), max: int64(maxQueued)}
}

// LaneStats is what one lane is doing.
type LaneStats struct {
	// Queued calls wait for a connection; Running calls have one.
	Queued, Running int
}

// Lanes says what each lane ("decisions", "renewals") is doing.
func (s *Server) Lanes() map[string]LaneStats {
	m := map[string]LaneStats{}
	for _, l := range []*lane{s.decisions, s.renewals} {
		m[l.name] = LaneStats{Queued: int(l.queued.Load()), Running: len(l.slots)}
	}
	return m
}

// errBusy refuses a call past its lane's queue.
var errBusy = fmt.Errorf("%w: the lock gateway's queue is full", store.ErrUnavailable)

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutPrefix(r.URL.Path, pathPrefix)
	h, known := s.calls[name]
	switch {
	case !ok || !known:
		answer(w, http.StatusNotFound, reply{Error: &wireError{Message: fmt.Sprintf("no call %q (this gateway answers POST %s<call>)", r.URL.Path, pathPrefix)}})
		return
	case r.Method != http.MethodPost:
		answer(w, http.StatusMethodNotAllowed, reply{Error: &wireError{Message: "calls are POSTs"}})
		return
	}
	ns, secret, ok := r.BasicAuth()
	if !ok {
		answer(w, http.StatusUnauthorized, reply{Error: &wireError{Kind: "forbidden", Message: "no credential: the URL must be https://<namespace>:<credential>@host:port"}})
		return
	}
	if err := s.cfg.Credentials.Check(ns, secret); err != nil {
		s.cfg.Logger.Warn("refused a call with a bad credential", "namespace", ns, "call", name, "remote", r.RemoteAddr, "err", err)
		answer(w, http.StatusUnauthorized, reply{Error: &wireError{Kind: "forbidden", Message: err.Error() + ": the webhook writes it into the namespace's database Secret"}})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		answer(w, http.StatusBadRequest, reply{Error: &wireError{Message: "reading the request: " + err.Error()}})
		return
	}
	result, err := h.lane.serve(r.Context(), s.cfg.CallTimeout, func(ctx context.Context) (any, error) {
		return h.run(ctx, h.lane.locks, ns, body)
	})
	if err == nil {
		answer(w, http.StatusOK, reply{Result: result})
		return
	}
	kind := kindOf(err)
	status := http.StatusConflict
	switch kind {
	case "":
		status = http.StatusBadRequest
	case "unavailable", "uncertain-commit", "tokens-held":
		status = http.StatusServiceUnavailable
	case "forbidden":
		status = http.StatusForbidden
	}
	answer(w, status, reply{Result: result, Error: &wireError{Kind: kind, Message: err.Error()}})
}

// serve runs call once one of the lane's connections is free, unless the
// queue is full or the caller left while it waited. Once started, call
// runs to its end (or timeout) whether or not the caller still waits.
func (l *lane) serve(ctx context.Context, timeout time.Duration, call func(context.Context) (any, error)) (any, error) {
	if n := l.queued.Add(1); l.max > 0 && n > l.max {
		l.queued.Add(-1)
		return nil, fmt.Errorf("%s lane: %w (%d calls waiting)", l.name, errBusy, n-1)
	}
	select {
	case l.slots <- struct{}{}:
		l.queued.Add(-1)
	case <-ctx.Done():
		l.queued.Add(-1)
		return nil, fmt.Errorf("%w: the caller left before its call started", store.ErrUnavailable)
	}
	defer func() { <-l.slots }()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%w: the caller left before its call started", store.ErrUnavailable)
	}
	runCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return call(runCtx)
}

func answer(w http.ResponseWriter, status int, r reply) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(r)
}

// decode reads a call's body into v, refusing fields the call does not
// have.
func decode(body []byte, v any) error {
	d := json.NewDecoder(strings.NewReader(string(body)))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("decoding the request: %w", err)
	}
	return nil
}

// The checks of what a namespace may name. The gateway's own login may
// write every namespace's rows, so these are the only thing that keeps a
// namespace to its own: each call checks every key, owner and cluster it
// carries before it reaches the database.

// checkKey refuses a key outside namespace ns.
func checkKey(ns, what, key string) error {
	name, ok := strings.CutPrefix(key, ns+"/")
	if !ok || name == "" {
		return fmt.Errorf("%w: namespace %s may not %s %q: its keys are %s/<name>", store.ErrForbidden, ns, what, key, ns)
	}
	return nil
}

// checkCluster refuses a cluster other than the gateway's.
func (s *Server) checkCluster(ns, what, cluster string) error {
	if cluster != s.cfg.Cluster {
		return fmt.Errorf("%w: namespace %s may not %s as cluster %q: this gateway serves cluster %q", store.ErrForbidden, ns, what, cluster, s.cfg.Cluster)
	}
	return nil
}

// checkOwner refuses an owner of another namespace or cluster.
func (s *Server) checkOwner(ns, what string, o store.Owner) error {
	if o.Namespace != ns {
		return fmt.Errorf("%w: namespace %s may not %s for an owner in namespace %q", store.ErrForbidden, ns, what, o.Namespace)
	}
	return s.checkCluster(ns, what, o.Cluster)
}

func (s *Server) now(ctx context.Context, l store.Locks, _ string, body []byte) (any, error) {
	if err := decode(body, &emptyReply{}); err != nil {
		return nil, err
	}
	t, err := l.Now(ctx)
	return nowReply{DBTime: t}, err
}

func (s *Server) view(ctx context.Context, l store.Locks, ns string, body []byte) (any, error) {
	var r viewRequest
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	if err := errors.Join(checkKey(ns, "record the view of", r.Key), s.checkCluster(ns, "record a view", r.Cluster)); err != nil {
		return nil, err
	}
	return l.RecordView(ctx, r.Key, r.Cluster, r.View, r.Recency)
}

func (s *Server) claim(ctx context.Context, l store.Locks, ns string, body []byte) (any, error) {
	var r store.ClaimRequest
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	if err := errors.Join(checkKey(ns, "claim", r.Key), s.checkOwner(ns, "claim", r.Owner)); err != nil {
		return nil, err
	}
	return l.ClaimWindow(ctx, r)
}

func (s *Server) window(ctx context.Context, l store.Locks, ns string, body []byte) (any, error) {
	var r windowRequest
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	if err := checkKey(ns, "read", r.Key); err != nil {
		return nil, err
	}
	w, t, err := l.WindowAt(ctx, r.Key, r.Window, r.Index)
	return windowReply{Window: w, DBTime: t}, err
}

func (s *Server) lease(ctx context.Context, l store.Locks, ns string, body []byte) (any, error) {
	var r leaseRequest
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	if err := errors.Join(checkKey(ns, "take the lease", r.Key), s.checkOwner(ns, "take a lease", r.Owner)); err != nil {
		return nil, err
	}
	return l.AcquireLease(ctx, r.Key, r.Owner, r.TTL)
}

func (s *Server) renew(ctx context.Context, l store.Locks, ns string, body []byte) (any, error) {
	var r store.Renewal
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	var errs []error
	if r.Key == "" && r.LeaseKey == "" {
		errs = append(errs, errors.New("a renewal names a window's key, a lease's, or both"))
	}
	if r.Key != "" {
		errs = append(errs, checkKey(ns, "renew", r.Key))
	}
	if r.LeaseKey != "" {
		errs = append(errs, checkKey(ns, "renew the lease", r.LeaseKey))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return l.Renew(ctx, r)
}

func (s *Server) finish(ctx context.Context, l store.Locks, ns string, body []byte) (any, error) {
	var r finishRequest
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	if err := checkKey(ns, "record the outcome of", r.Key); err != nil {
		return nil, err
	}
	t, err := l.Finish(ctx, r.Key, r.Window, r.Index, r.Token, r.State, r.ExitCode)
	return finishReply{FinishedAt: t}, err
}

func (s *Server) release(ctx context.Context, l store.Locks, ns string, body []byte) (any, error) {
	var r releaseRequest
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	if err := checkKey(ns, "release the lease", r.Key); err != nil {
		return nil, err
	}
	ok, err := l.ReleaseLease(ctx, r.Key, r.Token)
	return releaseReply{Released: ok}, err
}

func (s *Server) decision(ctx context.Context, l store.Locks, ns string, body []byte) (any, error) {
	var r decisionRequest
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	if err := errors.Join(checkKey(ns, "record a decision of", r.Decision.Key), s.checkCluster(ns, "record a decision", r.Decision.Cluster)); err != nil {
		return nil, err
	}
	r.Decision.Duration = r.Duration
	return emptyReply{}, l.RecordDecision(ctx, r.Decision)
}
