package pluginapi

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Whatever path and query a caller sends, a request is either refused with
// a status, or names a served command, a namespace and CronJob Kubernetes
// could hold, and only the command's own parameters, each once: what
// becomes the command line is never the caller's text beyond those.
func FuzzParse(f *testing.F) {
	for _, seed := range []struct{ method, path, query string }{
		{"GET", "/v1/namespaces/team-a/windows", "cronjob=report&o=json&limit=5"},
		{"GET", "/v1/namespaces/team-a/missed", "fail-on-missed=true&since=2h"},
		{"POST", "/v1/namespaces/team-a/cronjobs/report/pause", "for=2h&reason=bad+release"},
		{"POST", "/v1/namespaces/team-a/cronjobs/report/resume", ""},
		{"GET", "/v1/namespaces/team-a/windows", "key=team-b/x"},
		{"GET", "/v1/namespaces/../windows", ""},
		{"GET", "/v1/namespaces/team-a/windows", "o=json&o=yaml"},
		{"POST", "/v1/namespaces/team-a/cronjobs/a%2Fb/pause", "by=x"},
		{"GET", "/v1/namespaces/team-a/windows", "since=--database-url=x"},
	} {
		f.Add(seed.method, seed.path, seed.query)
	}
	f.Fuzz(func(t *testing.T, method, path, query string) {
		r := &http.Request{Method: method, URL: &url.URL{Path: path, RawQuery: query}}
		q, status, err := parse(r)
		if err != nil {
			if status < 400 {
				t.Fatalf("refused with status %d: %v", status, err)
			}
			return
		}
		allowed, read := Reads[q.command]
		if !read {
			allowed = Writes[q.command]
		}
		switch {
		case allowed == nil:
			t.Fatalf("command %q accepted", q.command)
		case len(validation.IsDNS1123Label(q.namespace)) > 0:
			t.Fatalf("namespace %q accepted", q.namespace)
		case q.cronJob != "" && len(validation.IsDNS1123Subdomain(q.cronJob)) > 0:
			t.Fatalf("cronjob %q accepted", q.cronJob)
		case !read && q.cronJob == "":
			t.Fatalf("%s without a CronJob accepted", q.command)
		case read && r.Method != http.MethodGet, !read && r.Method != http.MethodPost:
			t.Fatalf("%s by %s accepted", q.command, r.Method)
		}
		for name, vs := range q.params {
			if !slices.Contains(allowed, name) || len(vs) != 1 {
				t.Fatalf("parameter %q = %q accepted for %s", name, vs, q.command)
			}
			if strings.HasPrefix(name, "-") {
				t.Fatalf("a flag-like parameter %q accepted", name)
			}
		}
	})
}
