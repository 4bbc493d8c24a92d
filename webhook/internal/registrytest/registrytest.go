// Package registrytest serves an image registry in process for the tests of
// the registry lookups (webhook/registry) and of the admission that makes
// them (webhook): go-containerregistry's registry behind a real HTTP server,
// which records every request it is sent.
package registrytest

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry is a registry serving on loopback over plain HTTP.
type Registry struct {
	Host string // 127.0.0.1:port

	mu       sync.Mutex
	requests []string // "GET ping", "HEAD manifest", "GET blob", ...
}

// Start serves a fresh registry until the test ends; guard, when set, wraps
// it (for authentication).
func Start(t *testing.T, guard func(http.Handler) http.Handler) *Registry {
	t.Helper()
	reg := &Registry{}
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if guard != nil {
		h = guard(h)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reg.record(r)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	reg.Host = strings.TrimPrefix(srv.URL, "http://")
	return reg
}

func (reg *Registry) record(r *http.Request) {
	kind := "other"
	switch {
	case r.URL.Path == "/v2/" || r.URL.Path == "/v2":
		kind = "ping"
	case strings.Contains(r.URL.Path, "/manifests/"):
		kind = "manifest"
	case strings.Contains(r.URL.Path, "/blobs/"):
		kind = "blob"
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	reg.requests = append(reg.requests, r.Method+" "+kind)
}

// Take returns the requests recorded since the last call and forgets them.
func (reg *Registry) Take() []string {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	out := reg.requests
	reg.requests = nil
	return out
}

// PushImage writes an image with the given config to ref and returns its
// digest reference.
func PushImage(t *testing.T, ref string, cfg v1.Config, opts ...remote.Option) string {
	t.Helper()
	img, err := mutate.Config(empty.Image, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, opts...); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return r.Context().Name() + "@" + d.String()
}
