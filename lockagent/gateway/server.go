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
	// MaxQueued bounds each lane's waiting calls, and
	// MaxQueuedPerNamespace (MaxQueued when 0) one namespace's among
	// them; past either a call is refused at once as unavailable and the
	// pod retries later. 0: no bound.
	MaxQueued, MaxQueuedPerNamespace int
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
	if cfg.MaxQueued < 0 || cfg.MaxQueuedPerNamespace < 0 {
		problems = append(problems, fmt.Sprintf("MaxQueued %d and MaxQueuedPerNamespace %d may not be negative", cfg.MaxQueued, cfg.MaxQueuedPerNamespace))
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
		decisions: newLane("decisions", cfg.Decisions, cfg.DecisionConns, cfg.MaxQueued, cfg.MaxQueuedPerNamespace),
		renewals:  newLane("renewals", cfg.Renewals, cfg.RenewalConns, cfg.MaxQueued, cfg.MaxQueuedPerNamespace),
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

// Lanes says what each lane ("decisions", "renewals") is doing.
func (s *Server) Lanes() map[string]LaneStats {
	return map[string]LaneStats{s.decisions.name: s.decisions.stats(), s.renewals.name: s.renewals.stats()}
}

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
	result, err := h.lane.serve(r.Context(), ns, s.cfg.CallTimeout, func(ctx context.Context) (any, error) {
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
