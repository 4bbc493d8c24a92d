package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/pause"
	"github.com/dislock/dislock/webhook/pluginapi"
)

// userToken is the token of ServiceAccount name in ns, bound to ClusterRole
// role in ns (view, edit: Kubernetes' own) when role is set.
func userToken(t *testing.T, cs kubernetes.Interface, ns, name, role string) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if role != "" {
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-" + role},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: name}}}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

func ptrTo[T any](v T) *T { return &v }

// What kubectl dislock asks through the service proxy, asked of the API's
// handler directly (test/e2e goes through the proxy): each user sees and
// changes only what Kubernetes RBAC lets it, whatever it puts in the
// request, and what it sees is what dislock prints.
func TestThePluginAPIAnswersEachUserWithItsOwnRBACAndNothingMore(t *testing.T) {
	owner, c, cs := tenantCluster(t)
	ctx := context.Background()
	s, err := store.Open(ctx, owner, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cl, err := client.New(c.RESTConfig(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(&pluginapi.Handler{Client: cl, Reader: cl, Store: s, Cluster: "dc-a"})
	defer srv.Close()

	namespace(t, cs, "plug-a", true)
	namespace(t, cs, "plug-b", true)
	report := withAnnotations(cronJob("plug-a", "report", "0 * * * *"), map[string]string{contract.AnnotationMode: "schedule"})
	renamed := withAnnotations(cronJob("plug-a", "renamed", "0 * * * *"), map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationKey: "shared"})
	plain := cronJob("plug-a", "plain", "0 * * * *")
	for _, cj := range []client.Object{report, renamed, plain} {
		if err := cl.Create(ctx, cj); err != nil {
			t.Fatal(err)
		}
	}
	// A window of each namespace, run in dc-b.
	tick := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	for _, key := range []string{"plug-a/report", "plug-b/secret-report"} {
		ns, _, _ := strings.Cut(key, "/")
		o := store.Owner{Cluster: "dc-b", Namespace: ns, Job: "j-1", JobUID: "u", Pod: "j-1-x"}
		c, err := s.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: tick, Index: store.NotIndexed, Owner: o, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Finish(ctx, key, tick, store.NotIndexed, c.Window.Token, store.StateSucceeded, ptrTo(0)); err != nil {
			t.Fatal(err)
		}
	}
	viewer := userToken(t, cs, "plug-a", "viewer", "view")
	editor := userToken(t, cs, "plug-a", "editor", "edit")
	nobody := userToken(t, cs, "plug-a", "nobody", "")

	askAt := func(base, method, path string, q url.Values, token string) (int, pluginapi.Reply) {
		t.Helper()
		u := base + path
		if len(q) > 0 {
			u += "?" + q.Encode()
		}
		req, err := http.NewRequestWithContext(ctx, method, u, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set(pluginapi.TokenHeader, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r pluginapi.Reply
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		return resp.StatusCode, r
	}
	ask := func(method, path string, q url.Values, token string) (int, pluginapi.Reply) {
		t.Helper()
		return askAt(srv.URL, method, path, q, token)
	}
	mustRefuse := func(what string, status, wantStatus int, r pluginapi.Reply, want string) {
		t.Helper()
		if status != wantStatus || !strings.Contains(r.Error, want) {
			t.Errorf("%s: %d %+v; want %d saying %q", what, status, r, wantStatus, want)
		}
	}

	t.Run("a viewer reads its namespace's windows as dislock prints them, and only them", func(t *testing.T) {
		status, r := ask("GET", "/v1/namespaces/plug-a/windows", nil, viewer)
		if status != 200 || r.ExitCode != 0 || !strings.Contains(r.Stdout, "plug-a/report") || !strings.Contains(r.Stdout, "dc-b") ||
			strings.Contains(r.Stdout, "plug-b") {
			t.Fatalf("windows: %d %+v", status, r)
		}
		status, r = ask("GET", "/v1/namespaces/plug-a/windows", url.Values{"cronjob": {"report"}, "o": {"json"}}, viewer)
		var rows []store.Window
		if status != 200 || json.Unmarshal([]byte(r.Stdout), &rows) != nil || len(rows) != 1 || rows[0].Key != "plug-a/report" {
			t.Fatalf("windows report -o json: %d %+v", status, r)
		}
		for _, cmd := range []string{"missed", "leases", "paused"} {
			if status, r := ask("GET", "/v1/namespaces/plug-a/"+cmd, nil, viewer); status != 200 || r.ExitCode != 0 {
				t.Errorf("%s: %d %+v", cmd, status, r)
			}
		}
	})
	t.Run("another namespace is refused, whatever the request says", func(t *testing.T) {
		status, r := ask("GET", "/v1/namespaces/plug-b/windows", nil, viewer)
		mustRefuse("windows of plug-b", status, http.StatusForbidden, r, "system:serviceaccount:plug-a:viewer may not list cronjobs in namespace plug-b of cluster dc-a")
		for _, q := range []url.Values{{"key": {"plug-b/secret-report"}}, {"namespace": {"plug-b"}}, {"o": {"json"}, "by": {"someone"}}} {
			status, r := ask("GET", "/v1/namespaces/plug-a/windows", q, viewer)
			mustRefuse("windows with "+q.Encode(), status, http.StatusBadRequest, r, "is not one of windows's")
		}
		status, r = ask("GET", "/v1/namespaces/plug-a/windows", url.Values{"o": {"json", "yaml"}}, viewer)
		mustRefuse("-o twice", status, http.StatusBadRequest, r, `parameter "o" is given 2 times`)
		status, r = ask("GET", "/v1/namespaces/plug-a/windows", url.Values{"cronjob": {"../plug-b"}}, viewer)
		mustRefuse("a CronJob name that is a path", status, http.StatusBadRequest, r, "cronjob")
		status, r = ask("GET", "/v1/namespaces/plug-a/../plug-b/windows", nil, viewer)
		if status == 200 {
			t.Errorf("a path with ..: %d %+v", status, r)
		}
	})
	t.Run("who is not authenticated, or may not read CronJobs, is refused", func(t *testing.T) {
		status, r := ask("GET", "/v1/namespaces/plug-a/windows", nil, "")
		mustRefuse("no token", status, http.StatusUnauthorized, r, "no bearer token")
		status, r = ask("GET", "/v1/namespaces/plug-a/windows", nil, "not-a-token")
		mustRefuse("a bad token", status, http.StatusUnauthorized, r, "the token is not valid in cluster dc-a")
		status, r = ask("GET", "/v1/namespaces/plug-a/windows", nil, nobody)
		mustRefuse("no role", status, http.StatusForbidden, r, "may not list cronjobs")
	})
	t.Run("a viewer may not pause; an editor pauses and resumes the CronJob's key in its own name", func(t *testing.T) {
		status, r := ask("POST", "/v1/namespaces/plug-a/cronjobs/report/pause", nil, viewer)
		mustRefuse("a viewer's pause", status, http.StatusForbidden, r, "may not patch cronjob report")
		status, r = ask("GET", "/v1/namespaces/plug-a/cronjobs/report/pause", nil, editor)
		mustRefuse("a pause by GET", status, http.StatusMethodNotAllowed, r, "use POST")
		status, r = ask("POST", "/v1/namespaces/plug-a/cronjobs/report/pause", url.Values{"by": {"someone-else"}}, editor)
		mustRefuse("a pause in another's name", status, http.StatusBadRequest, r, `parameter "by" is not one of pause's`)

		status, r = ask("POST", "/v1/namespaces/plug-a/cronjobs/renamed/pause", url.Values{"for": {"2h"}, "reason": {"bad release"}}, editor)
		if status != 200 || r.ExitCode != 0 || !strings.Contains(r.Stdout, "plug-a/shared is paused by system:serviceaccount:plug-a:editor until") {
			t.Fatalf("pause: %d %+v", status, r)
		}
		o := store.Owner{Cluster: "dc-a", Namespace: "plug-a", Job: "renamed-1", JobUID: "u", Pod: "renamed-1-x"}
		_, err := s.ClaimWindow(ctx, store.ClaimRequest{Key: "plug-a/shared", Window: tick, Index: store.NotIndexed, Owner: o, TTL: time.Minute})
		if !errors.Is(err, store.ErrKeyPaused) || !strings.Contains(err.Error(), `("bad release")`) {
			t.Fatalf("a claim of the paused key: %v", err)
		}
		status, r = ask("GET", "/v1/namespaces/plug-a/paused", url.Values{"cronjob": {"renamed"}}, viewer)
		if status != 200 || !strings.Contains(r.Stdout, "plug-a/shared") || !strings.Contains(r.Stdout, "bad release") {
			t.Fatalf("paused: %d %+v", status, r)
		}
		status, r = ask("POST", "/v1/namespaces/plug-a/cronjobs/renamed/resume", nil, editor)
		if status != 200 || r.ExitCode != 0 || !strings.Contains(r.Stdout, "resumed plug-a/shared") {
			t.Fatalf("resume: %d %+v", status, r)
		}
		if ps, _, err := pause.Active(ctx, s, "plug-a/"); err != nil || len(ps) != 0 {
			t.Fatalf("pauses after the resume: %+v, %v", ps, err)
		}
	})
	t.Run("a CronJob locking another's key is paused only by who may patch both", func(t *testing.T) {
		borrower := withAnnotations(cronJob("plug-a", "borrower", "0 * * * *"), map[string]string{contract.AnnotationMode: "schedule", contract.AnnotationKey: "report"})
		if err := cl.Create(ctx, borrower); err != nil {
			t.Fatal(err)
		}
		// patch on borrower alone, as a Role with resourceNames grants.
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "plug-a", Name: "borrower-only"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"batch"}, Resources: []string{"cronjobs"}, ResourceNames: []string{"borrower"}, Verbs: []string{"get", "patch"}}}}
		if err := cl.Create(ctx, role); err != nil {
			t.Fatal(err)
		}
		narrow := userToken(t, cs, "plug-a", "narrow", "")
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "plug-a", Name: "narrow"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "borrower-only"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "plug-a", Name: "narrow"}}}
		if err := cl.Create(ctx, rb); err != nil {
			t.Fatal(err)
		}
		await(t, "the narrow role to apply", func() (bool, error) {
			sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: "system:serviceaccount:plug-a:narrow",
				ResourceAttributes: &authzv1.ResourceAttributes{Namespace: "plug-a", Group: "batch", Resource: "cronjobs", Name: "borrower", Verb: "patch"}}}
			err := cl.Create(ctx, sar)
			return err == nil && sar.Status.Allowed, err
		})
		status, r := ask("POST", "/v1/namespaces/plug-a/cronjobs/borrower/pause", nil, narrow)
		mustRefuse("pausing report's key through borrower", status, http.StatusForbidden, r, "may not patch cronjob report in namespace plug-a of cluster dc-a, which kubectl dislock pause needs (it locks the same key as borrower)")
		if ps, _, err := pause.Active(ctx, s, "plug-a/"); err != nil || len(ps) != 0 {
			t.Fatalf("pauses: %+v, %v", ps, err)
		}
	})
	t.Run("a listing is bounded, and a database failure is told without the database's address", func(t *testing.T) {
		status, r := ask("GET", "/v1/namespaces/plug-a/leases", url.Values{"limit": {"1001"}}, viewer)
		mustRefuse("limit over the bound", status, http.StatusBadRequest, r, `limit "1001" is not a number from 1 to 1000`)
		down, err := store.Open(ctx, "postgres://secret-role:pw@127.0.0.1:1/secret-db?connect_timeout=1", store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer down.Close()
		downSrv := httptest.NewServer(&pluginapi.Handler{Client: cl, Reader: cl, Store: down, Cluster: "dc-a"})
		defer downSrv.Close()
		_, got := askAt(downSrv.URL, "GET", "/v1/namespaces/plug-a/leases", nil, viewer)
		if got.ExitCode != 1 || !strings.Contains(got.Stderr, "could not answer from the database") ||
			strings.Contains(got.Stderr, "secret-role") || strings.Contains(got.Stderr, "127.0.0.1:1") || strings.Contains(got.Stderr, "secret-db") {
			t.Fatalf("a failure's reply: %+v", got)
		}
	})
	t.Run("a CronJob not using dislock, or not there, cannot be paused", func(t *testing.T) {
		status, r := ask("POST", "/v1/namespaces/plug-a/cronjobs/plain/pause", nil, editor)
		mustRefuse("pausing a CronJob without dislock", status, http.StatusBadRequest, r, "does not use dislock")
		status, r = ask("POST", "/v1/namespaces/plug-a/cronjobs/gone/pause", nil, editor)
		mustRefuse("pausing a CronJob not there", status, http.StatusNotFound, r, "no CronJob gone in namespace plug-a of cluster dc-a")
	})
}
