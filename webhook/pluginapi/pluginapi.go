// Package pluginapi serves `kubectl dislock`: a cluster's users read their
// namespaces' windows, missed windows, leases and pauses, and pause and
// resume their CronJobs in every cluster, with their own Kubernetes
// credentials and RBAC, and no database credential. The plugin reaches this
// server through the API server's service proxy, which authorises the proxy
// call alone and strips the caller's Authorization header; the plugin
// sends the caller's bearer token in TokenHeader instead. The server
// authenticates it (TokenReview), authorises each request as the caller
// (SubjectAccessReview: get or list cronjobs to read, patch to pause), and
// answers with what `dislock <command>` prints, run on the webhook's own
// Store and confined to the namespace.
package pluginapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dislock/dislock/internal/cli"
	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
)

// TokenHeader carries the caller's bearer token: the API server's service
// proxy strips Authorization.
const TokenHeader = "X-Dislock-Token"

// PortName is the name of the API's port on the webhook's Service and
// container (the chart's): the service proxy addresses it by name.
const PortName = "plugin-api"

// PathPrefix is where the API lives on its server.
const PathPrefix = "/v1/"

// Bounds of what one caller can make the webhook do: the same process
// answers every admission of its cluster.
const (
	// MaxInFlight bounds the requests served at once: each costs the API
	// server two reviews and the database a query.
	MaxInFlight = 8
	// MaxInFlightPerUser bounds one caller's, so that nobody takes every
	// slot.
	MaxInFlightPerUser = 2
	// MaxLimit bounds a listing's --limit.
	MaxLimit = 1000
	// MaxReplyBytes bounds what a command prints into a reply; a larger
	// answer is refused, asking for a narrower listing.
	MaxReplyBytes = 4 << 20
	// requestTimeout bounds one request, reviews, query and the writing of
	// the reply together (a caller that stops reading holds its slot no
	// longer).
	requestTimeout = 30 * time.Second
)

// Reply is every answer's body: what the command printed and its exit code,
// or why the request was refused before it ran.
type Reply struct {
	ExitCode int    `json:"exitCode"`
	Stdout   string `json:"stdout,omitempty"`
	Stderr   string `json:"stderr,omitempty"`
	Error    string `json:"error,omitempty"`
}

// Handler serves the API.
type Handler struct {
	// Client creates the reviews; Reader reads CronJobs (the manager's
	// cache).
	Client client.Client
	Reader client.Reader
	// Store is the owner's: the commands run on it.
	Store *store.Store
	// Cluster names this cluster in the answers' errors.
	Cluster string

	once     sync.Once
	inFlight chan struct{}
	mu       sync.Mutex
	perUser  map[string]int
}

// Reads are the commands that read, and the query parameters each takes
// (besides cronjob), by their flag's name.
var Reads = map[string][]string{
	"windows": {"o", "limit", "since", "from", "to", "tz"},
	"missed":  {"o", "limit", "since", "from", "to", "tz", "fail-on-missed"},
	"leases":  {"o", "limit"},
	"paused":  {"o"},
}

// Writes are the commands that change a CronJob's key, and their
// parameters.
var Writes = map[string][]string{
	"pause":  {"o", "for", "until", "reason"},
	"resume": {"o"},
}

// request is one call, as the path and query say.
type request struct {
	command   string
	namespace string
	cronJob   string
	params    url.Values
}

// parse reads /v1/namespaces/<ns>/<read>[?cronjob=...] and
// /v1/namespaces/<ns>/cronjobs/<name>/<write>.
func parse(r *http.Request) (request, int, error) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, PathPrefix), "/")
	var q request
	q.params = r.URL.Query()
	switch {
	case len(parts) == 3 && parts[0] == "namespaces" && Reads[parts[2]] != nil:
		if r.Method != http.MethodGet {
			return q, http.StatusMethodNotAllowed, fmt.Errorf("%s reads: use GET", parts[2])
		}
		q.namespace, q.command, q.cronJob = parts[1], parts[2], q.params.Get("cronjob")
		q.params.Del("cronjob")
	case len(parts) == 5 && parts[0] == "namespaces" && parts[2] == "cronjobs" && Writes[parts[4]] != nil:
		if r.Method != http.MethodPost {
			return q, http.StatusMethodNotAllowed, fmt.Errorf("%s changes a CronJob's key: use POST", parts[4])
		}
		q.namespace, q.cronJob, q.command = parts[1], parts[3], parts[4]
	default:
		return q, http.StatusNotFound, fmt.Errorf("no such API path %q (want %snamespaces/<namespace>/{windows,missed,leases,paused} or %snamespaces/<namespace>/cronjobs/<name>/{pause,resume})",
			r.URL.Path, PathPrefix, PathPrefix)
	}
	var bad []string
	if errs := validation.IsDNS1123Label(q.namespace); len(errs) > 0 {
		bad = append(bad, fmt.Sprintf("namespace %q: %s", q.namespace, strings.Join(errs, "; ")))
	}
	if q.cronJob != "" {
		if errs := validation.IsDNS1123Subdomain(q.cronJob); len(errs) > 0 {
			bad = append(bad, fmt.Sprintf("cronjob %q: %s", q.cronJob, strings.Join(errs, "; ")))
		}
	}
	allowed := Reads[q.command]
	if allowed == nil {
		allowed = Writes[q.command]
	}
	for name, vs := range q.params {
		switch {
		case !slices.Contains(allowed, name):
			bad = append(bad, fmt.Sprintf("parameter %q is not one of %s's (%s)", name, q.command, strings.Join(allowed, ", ")))
		case len(vs) != 1:
			bad = append(bad, fmt.Sprintf("parameter %q is given %d times", name, len(vs)))
		case name == "limit":
			if n, err := strconv.Atoi(vs[0]); err != nil || n < 1 || n > MaxLimit {
				bad = append(bad, fmt.Sprintf("limit %q is not a number from 1 to %d", vs[0], MaxLimit))
			}
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return q, http.StatusBadRequest, errors.New(strings.Join(bad, "; "))
	}
	return q, 0, nil
}

// ServeHTTP authenticates, authorises, and runs the command.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.once.Do(func() { h.inFlight, h.perUser = make(chan struct{}, MaxInFlight), map[string]int{} })
	select {
	case h.inFlight <- struct{}{}:
		defer func() { <-h.inFlight }()
	default:
		reply(w, http.StatusTooManyRequests, Reply{Error: fmt.Sprintf("more than %d requests at once; try again", MaxInFlight)})
		return
	}
	deadline := time.Now().Add(requestTimeout)
	_ = http.NewResponseController(w).SetWriteDeadline(deadline) //nolint:errcheck // a server without deadlines is bounded by the context alone
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	q, status, err := parse(r)
	if err != nil {
		reply(w, status, Reply{Error: err.Error()})
		return
	}
	user, status, err := h.authenticate(ctx, r.Header.Get(TokenHeader))
	if err != nil {
		reply(w, status, Reply{Error: err.Error()})
		return
	}
	if !h.take(user.Username) {
		reply(w, http.StatusTooManyRequests, Reply{Error: fmt.Sprintf("%s has %d requests going; try again when they are answered", user.Username, MaxInFlightPerUser)})
		return
	}
	defer h.give(user.Username)
	if status, err := h.authorize(ctx, user, q, q.cronJob); err != nil {
		reply(w, status, Reply{Error: err.Error()})
		return
	}
	args, sharers, status, err := h.args(ctx, q, user)
	if err != nil {
		reply(w, status, Reply{Error: err.Error()})
		return
	}
	// Every other CronJob locking the same key (dislock.io/key) is asked
	// for too: its key is theirs as well.
	for _, name := range sharers {
		if status, err := h.authorize(ctx, user, q, name); err != nil {
			reply(w, status, Reply{Error: err.Error() + fmt.Sprintf(" (it locks the same key as %s)", q.cronJob)})
			return
		}
	}
	stdout, stderr := &cappedBuffer{max: MaxReplyBytes}, &cappedBuffer{max: MaxReplyBytes}
	code := cli.MainWithStore(ctx, h.Store, args, stdout, stderr)
	logger := log.FromContext(ctx).WithName("kubectl-dislock")
	if _, write := Writes[q.command]; write {
		logger.Info("kubectl dislock "+q.command, "user", user.Username, "namespace", q.namespace, "cronjob", q.cronJob, "exitCode", code, "stderr", stderr.String())
	} else {
		logger.V(1).Info("kubectl dislock "+q.command, "user", user.Username, "namespace", q.namespace, "cronjob", q.cronJob, "exitCode", code, "stderr", stderr.String())
	}
	switch {
	case stdout.over:
		reply(w, http.StatusRequestEntityTooLarge, Reply{Error: fmt.Sprintf("the answer is over %d bytes: narrow it (--limit, --since, a CronJob)", MaxReplyBytes)})
		return
	case code == exitError:
		// The database's address and role, and its driver's words, stay in
		// the webhook's log.
		stderr.Reset()
		fmt.Fprintf(stderr, "kubectl dislock %s: the webhook of cluster %s could not answer from the database; its log says why (kubectl logs -n <its namespace> -l app.kubernetes.io/component=webhook)\n", q.command, h.Cluster)
		if !stdout.over {
			logger.Error(nil, "kubectl dislock failed", "command", q.command, "user", user.Username, "namespace", q.namespace)
		}
	}
	reply(w, http.StatusOK, Reply{ExitCode: code, Stdout: stdout.String(), Stderr: stderr.String()})
}

// exitError is the CLI's exit code of a failure (not of a bad request,
// whose message names the flag, nor of problems found).
const exitError = 1

// take holds one of user's request slots, if one is free.
func (h *Handler) take(user string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.perUser[user] >= MaxInFlightPerUser {
		return false
	}
	h.perUser[user]++
	return true
}

func (h *Handler) give(user string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.perUser[user]--; h.perUser[user] <= 0 {
		delete(h.perUser, user)
	}
}

// cappedBuffer keeps at most max bytes and notes what it dropped.
type cappedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		b.over = true
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// authenticate asks the API server who token belongs to.
func (h *Handler) authenticate(ctx context.Context, token string) (authnv1.UserInfo, int, error) {
	if token == "" {
		return authnv1.UserInfo{}, http.StatusUnauthorized, fmt.Errorf("no bearer token in header %s: kubectl dislock sends the token of your kubeconfig's user (a user that signs in with a client certificate has none; use a token, e.g. from your OIDC login or kubectl create token)", TokenHeader)
	}
	tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}
	if err := h.Client.Create(ctx, tr); err != nil {
		return authnv1.UserInfo{}, http.StatusBadGateway, fmt.Errorf("cluster %s: asking the API server who the token belongs to (TokenReview): %v", h.Cluster, err)
	}
	if !tr.Status.Authenticated {
		why := tr.Status.Error
		if why == "" {
			why = "the API server does not know it"
		}
		return authnv1.UserInfo{}, http.StatusUnauthorized, fmt.Errorf("the token is not valid in cluster %s: %s", h.Cluster, why)
	}
	return tr.Status.User, 0, nil
}

// authorize asks the API server whether user may do to CronJob name of the
// namespace (all of them: "") what q does: get (list for all) to read,
// patch to pause or resume.
func (h *Handler) authorize(ctx context.Context, user authnv1.UserInfo, q request, name string) (int, error) {
	attrs := &authzv1.ResourceAttributes{Namespace: q.namespace, Group: "batch", Resource: "cronjobs", Name: name}
	switch {
	case Writes[q.command] != nil:
		attrs.Verb = "patch"
	case name != "":
		attrs.Verb = "get"
	default:
		attrs.Verb = "list"
	}
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		ResourceAttributes: attrs, User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra}}
	if err := h.Client.Create(ctx, sar); err != nil {
		return http.StatusBadGateway, fmt.Errorf("cluster %s: asking the API server what %s may do (SubjectAccessReview): %v", h.Cluster, user.Username, err)
	}
	if !sar.Status.Allowed {
		target := "cronjobs"
		if name != "" {
			target = "cronjob " + name
		}
		return http.StatusForbidden, fmt.Errorf("%s may not %s %s in namespace %s of cluster %s, which kubectl dislock %s needs", user.Username, attrs.Verb, target, q.namespace, h.Cluster, q.command)
	}
	return 0, nil
}

// args are the command line q runs: confined to its namespace, its
// CronJob's key, and, for a pause, the caller's name; and the other
// CronJobs of the namespace that lock the same key.
func (h *Handler) args(ctx context.Context, q request, user authnv1.UserInfo) (args, sharers []string, status int, err error) {
	args = []string{q.command}
	_, write := Writes[q.command]
	if q.cronJob != "" {
		key, err := h.keyOf(ctx, q.namespace, q.cronJob)
		switch {
		case apierrors.IsNotFound(err) && !write:
			// A CronJob deleted since: its windows are still there, under
			// its name.
			key = q.namespace + "/" + q.cronJob
		case apierrors.IsNotFound(err):
			return nil, nil, http.StatusNotFound, fmt.Errorf("no CronJob %s in namespace %s of cluster %s", q.cronJob, q.namespace, h.Cluster)
		case err != nil:
			return nil, nil, http.StatusBadRequest, err
		}
		if sharers, err = h.sharers(ctx, q.namespace, q.cronJob, key); err != nil {
			return nil, nil, http.StatusBadGateway, err
		}
		args = append(args, "--key", key)
	}
	if !write {
		args = append(args, "--namespace", q.namespace)
	}
	if q.command == "pause" || q.command == "resume" {
		args = append(args, "--by", user.Username)
	}
	if slices.Contains(Reads[q.command], "limit") && !q.params.Has("limit") {
		args = append(args, fmt.Sprintf("--limit=%d", min(MaxLimit, defaultLimit(q.command))))
	}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range q.params {
			if !yield(k) {
				return
			}
		}
	}) {
		// name=value, one argument: a value is never read as a flag.
		prefix := "--"
		if name == "o" {
			prefix = "-"
		}
		args = append(args, prefix+name+"="+q.params.Get(name))
	}
	return args, sharers, 0, nil
}

// defaultLimit is the listing's own default bound (MaxLimit where it has
// none).
func defaultLimit(command string) int {
	if command == "windows" {
		return cli.DefaultWindowsLimit
	}
	return MaxLimit
}

// sharers are the other CronJobs of namespace whose key is key.
func (h *Handler) sharers(ctx context.Context, namespace, name, key string) ([]string, error) {
	var list batchv1.CronJobList
	if err := h.Reader.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("cluster %s: listing the CronJobs of namespace %s: %v", h.Cluster, namespace, err)
	}
	var out []string
	for _, cj := range list.Items {
		if cj.Name == name {
			continue
		}
		if k, err := keyOfCronJob(&cj); err == nil && k == key {
			out = append(out, cj.Name)
		}
	}
	return out, nil
}

// keyOf is the lock key of CronJob namespace/name in this cluster.
func (h *Handler) keyOf(ctx context.Context, namespace, name string) (string, error) {
	var cj batchv1.CronJob
	if err := h.Reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &cj); err != nil {
		return "", err
	}
	key, err := keyOfCronJob(&cj)
	if err != nil {
		return "", fmt.Errorf("CronJob %s/%s of cluster %s %w", namespace, name, h.Cluster, err)
	}
	return key, nil
}

// keyOfCronJob is the lock key a CronJob's annotations name.
func keyOfCronJob(cj *batchv1.CronJob) (string, error) {
	annotations := contract.Merge(cj.Annotations, cj.Spec.JobTemplate.Annotations)
	if !contract.Enabled(annotations) {
		return "", fmt.Errorf("does not use dislock (no %s annotation)", contract.AnnotationMode)
	}
	spec, err := contract.FromAnnotations(annotations, cj.Namespace, cj.Name)
	if err != nil {
		return "", fmt.Errorf("has bad annotations: %w", err)
	}
	return spec.Key(), nil
}

func reply(w http.ResponseWriter, status int, r Reply) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(r)
}
