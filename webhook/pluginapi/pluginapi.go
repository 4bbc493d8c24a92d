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
	"strings"
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

// MaxInFlight bounds the requests served at once: each costs the API
// server two reviews and the database a query.
const MaxInFlight = 8

// requestTimeout bounds one request, reviews and query together.
const requestTimeout = 30 * time.Second

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

	inFlight chan struct{}
}

// Reads are the commands that read, and the query parameters each takes
// (besides cronjob), by their flag's name.
var Reads = map[string][]string{
	"windows": {"o", "limit", "since", "from", "to", "tz"},
	"missed":  {"o", "limit", "since", "from", "to", "tz", "fail-on-missed"},
	"leases":  {"o"},
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
		if !slices.Contains(allowed, name) {
			bad = append(bad, fmt.Sprintf("parameter %q is not one of %s's (%s)", name, q.command, strings.Join(allowed, ", ")))
		} else if len(vs) != 1 {
			bad = append(bad, fmt.Sprintf("parameter %q is given %d times", name, len(vs)))
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
	select {
	case h.slots() <- struct{}{}:
		defer func() { <-h.slots() }()
	default:
		reply(w, http.StatusTooManyRequests, Reply{Error: fmt.Sprintf("more than %d requests at once; try again", MaxInFlight)})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
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
	if status, err := h.authorize(ctx, user, q); err != nil {
		reply(w, status, Reply{Error: err.Error()})
		return
	}
	args, status, err := h.args(ctx, q, user)
	if err != nil {
		reply(w, status, Reply{Error: err.Error()})
		return
	}
	var stdout, stderr bytes.Buffer
	code := cli.MainWithStore(ctx, h.Store, args, &stdout, &stderr)
	logger := log.FromContext(ctx).WithName("kubectl-dislock")
	if _, write := Writes[q.command]; write {
		logger.Info("kubectl dislock "+q.command, "user", user.Username, "namespace", q.namespace, "cronjob", q.cronJob, "exitCode", code, "stderr", stderr.String())
	} else {
		logger.V(1).Info("kubectl dislock "+q.command, "user", user.Username, "namespace", q.namespace, "cronjob", q.cronJob, "exitCode", code)
	}
	reply(w, http.StatusOK, Reply{ExitCode: code, Stdout: stdout.String(), Stderr: stderr.String()})
}

func (h *Handler) slots() chan struct{} {
	if h.inFlight == nil {
		h.inFlight = make(chan struct{}, MaxInFlight)
	}
	return h.inFlight
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

// authorize asks the API server whether user may do to the namespace's
// CronJobs what q does: get (list without a CronJob) to read, patch to
// pause or resume.
func (h *Handler) authorize(ctx context.Context, user authnv1.UserInfo, q request) (int, error) {
	attrs := &authzv1.ResourceAttributes{Namespace: q.namespace, Group: "batch", Resource: "cronjobs", Name: q.cronJob}
	switch {
	case Writes[q.command] != nil:
		attrs.Verb = "patch"
	case q.cronJob != "":
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
		if q.cronJob != "" {
			target = "cronjob " + q.cronJob
		}
		return http.StatusForbidden, fmt.Errorf("%s may not %s %s in namespace %s of cluster %s, which kubectl dislock %s needs", user.Username, attrs.Verb, target, q.namespace, h.Cluster, q.command)
	}
	return 0, nil
}

// args are the command line q runs: confined to its namespace, its
// CronJob's key, and, for a pause, the caller's name.
func (h *Handler) args(ctx context.Context, q request, user authnv1.UserInfo) ([]string, int, error) {
	args := []string{q.command}
	_, write := Writes[q.command]
	if q.cronJob != "" {
		key, err := h.keyOf(ctx, q.namespace, q.cronJob)
		switch {
		case apierrors.IsNotFound(err) && !write:
			// A CronJob deleted since: its windows are still there, under
			// its name.
			key = q.namespace + "/" + q.cronJob
		case apierrors.IsNotFound(err):
			return nil, http.StatusNotFound, fmt.Errorf("no CronJob %s in namespace %s of cluster %s", q.cronJob, q.namespace, h.Cluster)
		case err != nil:
			return nil, http.StatusBadRequest, err
		}
		args = append(args, "--key", key)
	}
	if !write {
		args = append(args, "--namespace", q.namespace)
	}
	if q.command == "pause" || q.command == "resume" {
		args = append(args, "--by", user.Username)
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
	return args, 0, nil
}

// keyOf is the lock key of CronJob namespace/name in this cluster.
func (h *Handler) keyOf(ctx context.Context, namespace, name string) (string, error) {
	var cj batchv1.CronJob
	if err := h.Reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &cj); err != nil {
		return "", err
	}
	annotations := contract.Merge(cj.Annotations, cj.Spec.JobTemplate.Annotations)
	if !contract.Enabled(annotations) {
		return "", fmt.Errorf("CronJob %s/%s of cluster %s does not use dislock (no %s annotation)", namespace, name, h.Cluster, contract.AnnotationMode)
	}
	spec, err := contract.FromAnnotations(annotations, namespace, name)
	if err != nil {
		return "", fmt.Errorf("CronJob %s/%s of cluster %s: %w", namespace, name, h.Cluster, err)
	}
	return spec.Key(), nil
}

func reply(w http.ResponseWriter, status int, r Reply) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(r)
}
