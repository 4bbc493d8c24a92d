package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dislock/dislock/lockagent/gateway/internal/wire"
	"github.com/dislock/dislock/lockagent/store"
)

// Credentials decide who a caller is.
type Credentials interface {
	// Check returns nil when secret is namespace's current credential.
	Check(ctx context.Context, namespace, secret string) error
}

// StaticCredentials are credentials by namespace, fixed for the server's
// life.
type StaticCredentials map[string]string

// Check implements Credentials in time independent of how much of secret
// matches. An empty credential matches nothing.
func (c StaticCredentials) Check(_ context.Context, namespace, secret string) error {
	want, ok := c[namespace]
	if !ok || want == "" {
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
	// MaxRunningPerNamespace is how many of a lane's connections one
	// namespace's calls may hold at once (0: all but one, and at least
	// one): a namespace whose calls wait on something of its own (a row
	// its old database role holds locked) keeps the others' calls going.
	MaxRunningPerNamespace int
	// MaxQueued bounds each lane's waiting calls (0: DefaultMaxQueued),
	// and MaxQueuedPerNamespace one namespace's among them (0: a quarter of
	// MaxQueued). Past either a call is refused at once as unavailable and
	// the pod retries later.
	MaxQueued, MaxQueuedPerNamespace int
	// CallTimeout bounds one call's run on the database once started
	// (DefaultCallTimeout when 0). The call runs to its end, or to this
	// bound, whether or not the pod still waits for it.
	CallTimeout time.Duration
	Credentials Credentials
	// Observe, when set, learns of every answered call: its name, its
	// answer ("ok", or the error's kind, "error" for none) and how long it
	// took, queueing included.
	Observe func(call, answer string, took time.Duration)
	Logger  *slog.Logger
}

// Defaults of Config.
const (
	// DefaultCallTimeout bounds a started call: far above any statement's
	// run, below the time after which nobody could use its answer.
	DefaultCallTimeout = time.Minute
	// DefaultMaxQueued is room for every pod of a cluster with 20 000
	// CronJobs firing at once; a queued call holds its body (at most
	// wire.MaxBody, usually under a kilobyte) and a connection.
	DefaultMaxQueued = 20000
)

// Server answers the lock calls of pods. It implements http.Handler.
type Server struct {
	cfg       Config
	decisions *lane
	renewals  *lane
	calls     map[string]call
	// lastRefusal paces the log lines of refused credentials.
	lastRefusal atomic.Int64
	// opened are the Stores Open opened, which Close closes.
	opened []*store.Store
	// waitsUncounted: the answers say no call waited (see
	// watchSchema); closed stops the watch.
	waitsUncounted atomic.Bool
	closed         chan struct{}
}

// call is one of the calls: its lane, and how to read and check its body
// into what runs on the database. Reading and checking happen before the
// call queues, so a queued call holds a checked request, not a body.
type call struct {
	lane    *lane
	prepare func(s *Server, ns string, body []byte) (run, error)
}

// run is a checked call, ready for a connection.
type run func(ctx context.Context, l store.Locks) (any, error)

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
	if cfg.MaxQueued < 0 || cfg.MaxQueuedPerNamespace < 0 || cfg.MaxRunningPerNamespace < 0 {
		problems = append(problems, fmt.Sprintf("MaxQueued %d, MaxQueuedPerNamespace %d and MaxRunningPerNamespace %d may not be negative",
			cfg.MaxQueued, cfg.MaxQueuedPerNamespace, cfg.MaxRunningPerNamespace))
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
	if cfg.MaxQueued == 0 {
		cfg.MaxQueued = DefaultMaxQueued
	}
	if cfg.MaxQueuedPerNamespace == 0 {
		cfg.MaxQueuedPerNamespace = max(1, cfg.MaxQueued/4)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{
		closed:    make(chan struct{}),
		cfg:       cfg,
		decisions: newLane("decisions", cfg.Decisions, cfg.DecisionConns, cfg.MaxRunningPerNamespace, cfg.MaxQueued, cfg.MaxQueuedPerNamespace),
		renewals:  newLane("renewals", cfg.Renewals, cfg.RenewalConns, cfg.MaxRunningPerNamespace, cfg.MaxQueued, cfg.MaxQueuedPerNamespace),
	}
	s.calls = map[string]call{
		wire.Now:      {s.decisions, prepareNow},
		wire.View:     {s.decisions, prepareView},
		wire.Claim:    {s.decisions, prepareClaim},
		wire.Window:   {s.decisions, prepareWindow},
		wire.Lease:    {s.decisions, prepareLease},
		wire.Decision: {s.decisions, prepareDecision},
		wire.Renew:    {s.renewals, prepareRenew},
		wire.Finish:   {s.renewals, prepareFinish},
		wire.Release:  {s.renewals, prepareRelease},
	}
	return s, nil
}

// Open is NewServer with each lane's Locks that cfg leaves nil opened on
// databaseURL, with the lane's connections: what a gateway process runs.
// Close closes what Open opened.
func Open(ctx context.Context, databaseURL string, cfg Config) (*Server, error) {
	var opened []*store.Store
	open := func(l *store.Locks, conns int) error {
		if *l != nil {
			return nil
		}
		st, err := store.Open(ctx, databaseURL, store.Options{MaxConns: int32(max(1, conns)), Logger: cfg.Logger})
		if err != nil {
			return err
		}
		opened = append(opened, st)
		*l = st
		return nil
	}
	err := errors.Join(open(&cfg.Decisions, cfg.DecisionConns), open(&cfg.Renewals, cfg.RenewalConns))
	var s *Server
	if err == nil {
		s, err = NewServer(cfg)
	}
	if err != nil {
		for _, st := range opened {
			st.Close()
		}
		return nil, err
	}
	s.opened = opened
	if st, ok := s.cfg.Decisions.(*store.Store); ok {
		s.watchSchema(ctx, st)
	}
	return s, nil
}

// Close closes the connections Open opened.
func (s *Server) Close() {
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	for _, st := range s.opened {
		st.Close()
	}
}

// NewHTTPServer serves handler (a Server) on addr with TLS, with the
// timeouts a service any pod can reach needs: a connection that sends
// nothing, or sends slowly, is closed, not kept.
func NewHTTPServer(addr string, handler http.Handler, tlsConfig *tls.Config) *http.Server {
	return &http.Server{
		Addr: addr, Handler: handler, TLSConfig: tlsConfig,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		// A call may queue and then run up to DefaultCallTimeout.
		WriteTimeout:   3 * DefaultCallTimeout,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 16 << 10,
		// HTTP/1.1 only: ServeTLS would offer h2 too, and one connection
		// would carry 250 calls at once for one handshake.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
}

// Lanes says what each lane ("decisions", "renewals") is doing.
func (s *Server) Lanes() map[string]LaneStats {
	return map[string]LaneStats{s.decisions.name: s.decisions.stats(), s.renewals.name: s.renewals.stats()}
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	name, ok := strings.CutPrefix(r.URL.Path, wire.PathPrefix)
	c, known := s.calls[name]
	if known && s.cfg.Observe != nil {
		start := time.Now()
		w = &observed{ResponseWriter: w, answer: "ok"}
		defer func() { s.cfg.Observe(name, w.(*observed).answer, time.Since(start)) }()
	}
	switch {
	case !ok || !known:
		answer(w, http.StatusNotFound, nil, &wire.Error{Message: fmt.Sprintf("no call %q (this gateway answers POST %s<call>)", r.URL.Path, wire.PathPrefix)})
		return
	case r.Method != http.MethodPost:
		answer(w, http.StatusMethodNotAllowed, nil, &wire.Error{Message: "calls are POSTs"})
		return
	}
	ns, secret, ok := r.BasicAuth()
	if !ok {
		answer(w, http.StatusUnauthorized, nil, &wire.Error{Kind: "forbidden", Message: "no credential: the URL must be https://<namespace>:<credential>@host:port"})
		return
	}
	if err := s.cfg.Credentials.Check(r.Context(), ns, secret); err != nil {
		s.refused(ns, name, r.RemoteAddr, err)
		answer(w, http.StatusUnauthorized, nil, &wire.Error{Kind: "forbidden", Message: err.Error() + ": the webhook writes it into the namespace's database Secret"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, wire.MaxBody))
	if err != nil {
		answer(w, http.StatusBadRequest, nil, &wire.Error{Message: "reading the request: " + err.Error()})
		return
	}
	var result any
	var waited time.Duration
	run, err := c.prepare(s, ns, body)
	if err == nil {
		result, err = c.lane.serve(r.Context(), ns, s.cfg.CallTimeout, func(ctx context.Context) (any, error) {
			waited = time.Since(arrived)
			return run(ctx, c.lane.locks)
		})
	}
	if err == nil {
		answerWaited(w, http.StatusOK, result, s.counted(waited), nil)
		return
	}
	kind := wire.KindOf(err)
	status := http.StatusConflict
	switch kind {
	case "":
		status = http.StatusBadRequest
	case "unavailable", "uncertain-commit", "tokens-held":
		status = http.StatusServiceUnavailable
	case "forbidden":
		status = http.StatusForbidden
	}
	answerWaited(w, status, result, s.counted(waited), &wire.Error{Kind: kind, Message: err.Error()})
}

// refused logs a refused credential, at most once a second: anyone who
// reaches the port can send them.
func (s *Server) refused(ns, name, remote string, err error) {
	now := time.Now().UnixNano()
	last := s.lastRefusal.Load()
	if now-last < int64(time.Second) || !s.lastRefusal.CompareAndSwap(last, now) {
		return
	}
	if len(ns) > 63 {
		ns = ns[:63] + "…"
	}
	s.cfg.Logger.Warn("refused a call with a bad credential (at most one such line a second)", "namespace", ns, "call", name, "remote", remote, "err", err)
}

// observed notes a call's answer for Config.Observe.
type observed struct {
	http.ResponseWriter
	answer string
}

func answer(w http.ResponseWriter, status int, result any, e *wire.Error) {
	answerWaited(w, status, result, 0, e)
}

// answerWaited is answer for a call that ran after waiting so long in the
// gateway.
func answerWaited(w http.ResponseWriter, status int, result any, waited time.Duration, e *wire.Error) {
	if o, ok := w.(*observed); ok && e != nil {
		o.answer = e.Kind
		if o.answer == "" {
			o.answer = "error"
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(wire.Reply{V: wire.Version, Result: result, Error: e, Waited: waited})
}

// counted is how long a call waited as the answer says it: nothing while
// the schema is older than migrate.ExpiriesNeverMoveBack.
func (s *Server) counted(waited time.Duration) time.Duration {
	if s.waitsUncounted.Load() {
		return 0
	}
	return waited
}

// prepare reads a call's body into a Req, checks it, and returns what runs
// it. Fields the call does not know are ignored, so that an agent newer
// than its gateway keeps working; the checks read the same fields the call
// runs with.
func prepare[Req any](body []byte, check func(*Req) error, do func(context.Context, store.Locks, Req) (any, error)) (run, error) {
	var r Req
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("decoding the request: %w", err)
	}
	if err := check(&r); err != nil {
		return nil, err
	}
	return func(ctx context.Context, l store.Locks) (any, error) { return do(ctx, l, r) }, nil
}

// The checks of what a namespace may name. The gateway's own login may
// write every namespace's rows, so these are the only thing that keeps a
// namespace to its own: each call checks every key, owner and cluster it
// carries before it is queued.

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

func prepareNow(_ *Server, _ string, body []byte) (run, error) {
	return prepare(body, func(*wire.Empty) error { return nil }, func(ctx context.Context, l store.Locks, _ wire.Empty) (any, error) {
		t, err := l.Now(ctx)
		return wire.NowReply{DBTime: t}, err
	})
}

func prepareView(s *Server, ns string, body []byte) (run, error) {
	return prepare(body, func(r *wire.ViewRequest) error {
		return errors.Join(checkKey(ns, "record the view of", r.Key), s.checkCluster(ns, "record a view", r.Cluster))
	}, func(ctx context.Context, l store.Locks, r wire.ViewRequest) (any, error) {
		others, err := l.RecordView(ctx, r.Key, r.Cluster, r.View, r.Recency)
		return wire.ViewReply{Others: others}, err
	})
}

func prepareClaim(s *Server, ns string, body []byte) (run, error) {
	return prepare(body, func(r *store.ClaimRequest) error {
		return errors.Join(checkKey(ns, "claim", r.Key), s.checkOwner(ns, "claim", r.Owner))
	}, func(ctx context.Context, l store.Locks, r store.ClaimRequest) (any, error) {
		return l.ClaimWindow(ctx, r)
	})
}

func prepareWindow(_ *Server, ns string, body []byte) (run, error) {
	return prepare(body, func(r *wire.WindowRequest) error {
		return checkKey(ns, "read", r.Key)
	}, func(ctx context.Context, l store.Locks, r wire.WindowRequest) (any, error) {
		w, t, err := l.WindowAt(ctx, r.Key, r.Window, r.Index)
		return wire.WindowReply{Window: w, DBTime: t}, err
	})
}

func prepareLease(s *Server, ns string, body []byte) (run, error) {
	return prepare(body, func(r *wire.LeaseRequest) error {
		return errors.Join(checkKey(ns, "take the lease", r.Key), s.checkOwner(ns, "take a lease", r.Owner))
	}, func(ctx context.Context, l store.Locks, r wire.LeaseRequest) (any, error) {
		return l.AcquireLease(ctx, r.Key, r.Owner, r.TTL)
	})
}

func prepareRenew(_ *Server, ns string, body []byte) (run, error) {
	return prepare(body, func(r *store.Renewal) error {
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
		return errors.Join(errs...)
	}, func(ctx context.Context, l store.Locks, r store.Renewal) (any, error) {
		return l.Renew(ctx, r)
	})
}

func prepareFinish(_ *Server, ns string, body []byte) (run, error) {
	return prepare(body, func(r *wire.FinishRequest) error {
		return checkKey(ns, "record the outcome of", r.Key)
	}, func(ctx context.Context, l store.Locks, r wire.FinishRequest) (any, error) {
		t, err := l.Finish(ctx, r.Key, r.Window, r.Index, r.Token, r.State, r.ExitCode)
		return wire.FinishReply{FinishedAt: t}, err
	})
}

func prepareRelease(_ *Server, ns string, body []byte) (run, error) {
	return prepare(body, func(r *wire.ReleaseRequest) error {
		return checkKey(ns, "release the lease", r.Key)
	}, func(ctx context.Context, l store.Locks, r wire.ReleaseRequest) (any, error) {
		ok, err := l.ReleaseLease(ctx, r.Key, r.Token)
		return wire.ReleaseReply{Released: ok}, err
	})
}

func prepareDecision(s *Server, ns string, body []byte) (run, error) {
	return prepare(body, func(r *wire.DecisionRequest) error {
		return errors.Join(checkKey(ns, "record a decision of", r.Decision.Key), s.checkCluster(ns, "record a decision", r.Decision.Cluster))
	}, func(ctx context.Context, l store.Locks, r wire.DecisionRequest) (any, error) {
		r.Decision.Duration = r.Duration
		return wire.Empty{}, l.RecordDecision(ctx, r.Decision)
	})
}
