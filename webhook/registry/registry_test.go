package registry

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"

	"github.com/dislock/dislock/webhook/internal/registrytest"
)

// loopbackOptions let a Resolver reach the test's in-process registry, which
// listens on 127.0.0.1 over plain HTTP: both must be allowed explicitly.
func loopbackOptions() Options {
	return Options{InsecureRegistries: []string{"127.0.0.1"}, PrivateRegistries: []string{"127.0.0.1"}}
}

// intercept serves the paths route answers and passes the rest to the
// in-process registry.
func intercept(route func(w http.ResponseWriter, r *http.Request) bool) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !route(w, r) {
				next.ServeHTTP(w, r)
			}
		})
	}
}

// serveManifest answers a HEAD or GET of a manifest with body.
func serveManifest(w http.ResponseWriter, r *http.Request, mediaType string, body []byte) {
	sum := sha256.Sum256(body)
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Docker-Content-Digest", "sha256:"+hex.EncodeToString(sum[:]))
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	if r.Method == http.MethodGet {
		_, _ = w.Write(body)
	}
}

// endless writes until the client goes away and counts what it wrote.
func endless(w http.ResponseWriter, r *http.Request, written *atomic.Int64) {
	chunk := make([]byte, 32<<10)
	for r.Context().Err() == nil {
		n, err := w.Write(chunk)
		written.Add(int64(n))
		if err != nil {
			return
		}
	}
}

func imageManifestJSON(t *testing.T, configSize int64, configDigest string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": configDigest, "size": configSize},
		"layers":        []any{},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// heapWatch samples the heap while a lookup runs; the numbers are logged,
// never asserted (a loaded machine makes them vary).
type heapWatch struct {
	before, peak uint64
	stop         chan struct{}
	done         chan struct{}
}

func watchHeap() *heapWatch {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	h := &heapWatch{before: ms.HeapAlloc, peak: ms.HeapAlloc, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			h.peak = max(h.peak, ms.HeapAlloc)
			select {
			case <-h.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return h
}

func (h *heapWatch) report(t *testing.T, what string, bytesRead int64, took time.Duration) {
	t.Helper()
	close(h.stop)
	<-h.done
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("%s: read %d bytes from the registry in %s; heap %.1f MiB before, peak %.1f MiB, %.1f MiB after",
		what, bytesRead, took.Round(time.Millisecond), mib(h.before), mib(h.peak), mib(ms.HeapAlloc))
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

func wantRegistryClass(t *testing.T, err error, class RegistryErrorClass, image string) {
	t.Helper()
	if err == nil {
		t.Fatalf("lookup of %s succeeded, want a %q error", image, class)
	}
	var re *RegistryError
	if !errors.As(err, &re) || re.Class != class {
		t.Fatalf("lookup of %s: error %q, want class %q", image, err, class)
	}
	for _, want := range []string{`image "` + image + `"`, "(" + string(class) + ": ", "dislock.io/entrypoint"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

// Not parallel: the heap numbers it logs are only meaningful alone.
func TestRegistryHostileSizesAreRefusedBeforeTheyAreRead(t *testing.T) {
	var blobWritten atomic.Int64
	hugeConfig := imageManifestJSON(t, 1<<30, "sha256:"+strings.Repeat("ab", 32))
	lyingConfig := imageManifestJSON(t, 100, "sha256:"+strings.Repeat("cd", 32))
	reg := registrytest.Start(t, intercept(func(w http.ResponseWriter, r *http.Request) bool {
		switch {
		case strings.HasPrefix(r.URL.Path, "/v2/huge-config/manifests/"):
			serveManifest(w, r, "application/vnd.oci.image.manifest.v1+json", hugeConfig)
		case strings.HasPrefix(r.URL.Path, "/v2/lying-config/manifests/"):
			serveManifest(w, r, "application/vnd.oci.image.manifest.v1+json", lyingConfig)
		case strings.HasPrefix(r.URL.Path, "/v2/huge-manifest/manifests/"):
			// Declares a 1 GiB manifest, on HEAD and GET alike.
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
			w.Header().Set("Docker-Content-Digest", "sha256:"+strings.Repeat("ef", 32))
			w.Header().Set("Content-Length", strconv.Itoa(1<<30))
			if r.Method == http.MethodGet {
				endless(w, r, &blobWritten)
			}
		case strings.HasPrefix(r.URL.Path, "/v2/endless-manifest/manifests/"):
			// No length at all: chunked, for ever.
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
			if r.Method == http.MethodHead {
				w.WriteHeader(http.StatusNotImplemented)
				return true
			}
			endless(w, r, &blobWritten)
		case strings.Contains(r.URL.Path, "/blobs/"):
			endless(w, r, &blobWritten)
		default:
			return false
		}
		return true
	}))

	tests := []struct {
		name     string
		repo     string
		maxRead  int64 // bytes the resolver may read from the registry
		wantBlob bool
		class    RegistryErrorClass
	}{
		{
			name: "a config declared as 1 GiB is refused without a blob request", repo: "huge-config",
			maxRead: 64 << 10, class: RegistryTooLarge,
		},
		{
			name: "a config longer than it declares is read only to its declared size", repo: "lying-config",
			maxRead: 64 << 10, wantBlob: true, class: RegistryInvalid,
		},
		{
			name: "a manifest declared as 1 GiB is refused before its body is read", repo: "huge-manifest",
			maxRead: 64 << 10, class: RegistryTooLarge,
		},
		{
			name: "a manifest that never ends is read only to the bound", repo: "endless-manifest",
			maxRead: DefaultMaxManifestBytes + 64<<10, class: RegistryTooLarge,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewResolver(loopbackOptions())
			image := reg.Host + "/" + tt.repo + ":1"
			reg.Take()
			w := watchHeap()
			start := time.Now()
			_, err := r.Entrypoints(context.Background(), epNamespace, []corev1.Container{epContainer(image)}, nil)
			took := time.Since(start)
			read := r.transport.bytesRead.Load()
			w.report(t, tt.repo, read, took)
			wantRegistryClass(t, err, tt.class, image)
			if read > tt.maxRead {
				t.Errorf("read %d bytes from the registry, want at most %d", read, tt.maxRead)
			}
			if got := slices.Contains(reg.Take(), "GET blob"); got != tt.wantBlob {
				t.Errorf("config blob requested: %v, want %v", got, tt.wantBlob)
			}
		})
	}
}

func TestRegistryIndexWithAThousandEntriesIsAnsweredWithinItsBound(t *testing.T) {
	var index []byte
	var indexDigest string
	reg := registrytest.Start(t, intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/v2/multi/manifests/1" || (indexDigest != "" && r.URL.Path == "/v2/multi/manifests/"+indexDigest) {
			serveManifest(w, r, "application/vnd.oci.image.index.v1+json", index)
			return true
		}
		return false
	}))
	amd64 := registrytest.PushImage(t, reg.Host+"/multi:amd64", v1.Config{Entrypoint: []string{"/amd64"}})
	_, amd64Digest, _ := strings.Cut(amd64, "@")
	amd64Size := func() int64 {
		d, err := remote.Head(mustParse(t, amd64))
		if err != nil {
			t.Fatal(err)
		}
		return d.Size
	}()
	// 999 other platforms first, so the scan has to go through them all.
	var entries []map[string]any
	for i := range 999 {
		entries = append(entries, map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json",
			"digest":    fmt.Sprintf("sha256:%064x", i),
			"size":      1 << 30, // never fetched: not our platform
			"platform":  map[string]string{"os": "linux", "architecture": fmt.Sprintf("arch%d", i)},
		})
	}
	entries = append(entries, map[string]any{
		"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": amd64Digest, "size": amd64Size,
		"platform": map[string]string{"os": "linux", "architecture": "amd64"},
	})
	var err error
	index, err = json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(index)
	indexDigest = "sha256:" + hex.EncodeToString(sum[:])

	r := NewResolver(loopbackOptions())
	reg.Take()
	w := watchHeap()
	start := time.Now()
	got, err := r.Entrypoints(context.Background(), epNamespace, []corev1.Container{epContainer(reg.Host + "/multi:1")}, nil)
	took := time.Since(start)
	read := r.transport.bytesRead.Load()
	w.report(t, fmt.Sprintf("index of %d entries (%d bytes)", len(entries), len(index)), read, took)
	if err != nil {
		t.Fatalf("Entrypoints: %v", err)
	}
	if !slices.Equal(got["app"], []string{"/amd64"}) {
		t.Errorf("entrypoint %q, want [/amd64]", got["app"])
	}
	if limit := int64(len(index)) + 64<<10; read > limit {
		t.Errorf("read %d bytes, want at most the index and a few KiB (%d)", read, limit)
	}
	var manifests int
	for _, req := range reg.Take() {
		if req == "GET manifest" {
			manifests++
		}
	}
	if manifests != 2 {
		t.Errorf("%d manifest GETs, want 2 (the index and the amd64 image)", manifests)
	}
}

func TestRegistrySlowLorisIsDeniedAsATimeoutInsideTheBudget(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	reg := registrytest.Start(t, intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasPrefix(r.URL.Path, "/v2/headers-only/") {
			// Headers at once, then a body that never comes.
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
			w.Header().Set("Content-Length", "500")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
		}
		if r.URL.Path != "/v2/" {
			select {
			case <-r.Context().Done():
			case <-release:
			}
			return true
		}
		return false
	}))
	t.Cleanup(func() { close(release) }) // runs before the server closes: frees the handlers

	opts := loopbackOptions()
	opts.Timeout, opts.ReviewBudget = 300*time.Millisecond, 400*time.Millisecond
	r := NewResolver(opts)
	containers := []corev1.Container{
		{Name: "a", Image: reg.Host + "/silent/a:1"},
		{Name: "b", Image: reg.Host + "/silent/b:1"},
		{Name: "c", Image: reg.Host + "/headers-only/c@sha256:" + strings.Repeat("ab", 32)},
	}
	start := time.Now()
	_, err := r.Entrypoints(context.Background(), epNamespace, containers, nil)
	took := time.Since(start)
	t.Logf("three lookups against a silent registry: denied after %s (budget %s)", took.Round(time.Millisecond), opts.ReviewBudget)
	if err == nil {
		t.Fatal("Entrypoints succeeded against a silent registry")
	}
	// Every container is named, each with the timeout class.
	for _, c := range containers {
		if want := fmt.Sprintf("container %q: cannot resolve the entrypoint of image %q (timeout: ", c.Name, c.Image); !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	// Generous against a loaded machine, and still the promise: the
	// denial comes before the API server's 5 s admission timeout.
	if took >= resolverMaxTimeout {
		t.Errorf("denied after %s, not inside the %s admission timeout", took, resolverMaxTimeout)
	}
}

func TestRegistryLookupsOfOneReviewRunInParallel(t *testing.T) {
	t.Parallel()
	// The registry answers no manifest until three are asked at once: in
	// series, the first lookup would wait out its timeout.
	var mu sync.Mutex
	var armed atomic.Bool // after the pushes, which HEAD manifests too
	waiting := 0
	all := make(chan struct{})
	reg := registrytest.Start(t, intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if armed.Load() && r.Method == http.MethodHead && strings.Contains(r.URL.Path, "/manifests/") {
			mu.Lock()
			if waiting++; waiting == 3 {
				close(all)
			}
			mu.Unlock()
			select {
			case <-all:
			case <-r.Context().Done():
			}
		}
		return false
	}))
	var containers []corev1.Container
	for _, n := range []string{"a", "b", "c"} {
		registrytest.PushImage(t, reg.Host+"/par/"+n+":1", v1.Config{Entrypoint: []string{"/" + n}})
		containers = append(containers, corev1.Container{Name: n, Image: reg.Host + "/par/" + n + ":1"})
	}
	opts := loopbackOptions()
	opts.Timeout, opts.ReviewBudget = 4*time.Second, 4500*time.Millisecond
	armed.Store(true)
	got, err := NewResolver(opts).Entrypoints(context.Background(), epNamespace, containers, nil)
	if err != nil {
		t.Fatalf("Entrypoints: %v", err)
	}
	for _, n := range []string{"a", "b", "c"} {
		if !slices.Equal(got[n], []string{"/" + n}) {
			t.Errorf("container %s: %q, want [/%s]", n, got[n], n)
		}
	}
}

func TestRegistryDestinationsAreBounded(t *testing.T) {
	t.Parallel()
	// Stands for an internal service (cloud metadata, an admin API) that a
	// hostile registry would like the webhook to read for it.
	var internalHits atomic.Int64
	internal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		internalHits.Add(1)
		fmt.Fprint(w, `{"secret":"internal"}`)
	}))
	t.Cleanup(internal.Close)
	internalPort := strings.TrimPrefix(internal.URL, "http://127.0.0.1:")

	redirects := map[string]string{
		"to-localhost":  "http://localhost:" + internalPort + "/latest/meta-data",
		"to-metadata":   "http://169.254.169.254/latest/meta-data/",
		"to-private-ip": "http://10.1.2.3:" + internalPort + "/admin",
		"to-plain-http": "http://registry.example.com/blob",
	}
	reg := registrytest.Start(t, intercept(func(w http.ResponseWriter, r *http.Request) bool {
		for repo, to := range redirects {
			if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v2/"+repo+"/blobs/") {
				http.Redirect(w, r, to, http.StatusTemporaryRedirect)
				return true
			}
		}
		return false
	}))
	for repo := range redirects {
		registrytest.PushImage(t, reg.Host+"/"+repo+":1", v1.Config{Entrypoint: []string{"/bin/app"}})
	}
	registrytest.PushImage(t, reg.Host+"/plain:1", v1.Config{Entrypoint: []string{"/bin/app"}})

	with := func(change func(*Options)) Options {
		o := loopbackOptions()
		// localhost may be plain HTTP, so that only its address is what
		// refuses the redirect to it.
		o.InsecureRegistries = append(o.InsecureRegistries, "localhost", "169.254.169.254", "10.1.2.3")
		if change != nil {
			change(&o)
		}
		return o
	}
	tests := []struct {
		name      string
		opts      Options
		repo      string
		wantCause string
		noRequest bool // refused before the registry is asked anything
	}{
		{
			name: "a redirect to a name that resolves to loopback is refused", opts: with(nil), repo: "to-localhost",
			wantCause: "loopback or private address",
		},
		{
			name: "a redirect to the metadata address is refused even when listed as private",
			opts: with(func(o *Options) { o.PrivateRegistries = append(o.PrivateRegistries, "169.254.169.254") }),
			repo: "to-metadata", wantCause: "never contacts (link-local",
		},
		{
			name: "a redirect to a private address is refused", opts: with(nil), repo: "to-private-ip",
			wantCause: "loopback or private address",
		},
		{
			name: "a redirect to plain HTTP on a host not listed as insecure is refused", opts: with(nil), repo: "to-plain-http",
			wantCause: "plain HTTP",
		},
		{
			name: "a registry on loopback is refused unless listed as private",
			opts: with(func(o *Options) { o.PrivateRegistries = nil }), repo: "plain",
			wantCause: "loopback or private address", noRequest: true,
		},
		{
			name: "a plain-HTTP registry is refused unless listed as insecure",
			opts: Options{PrivateRegistries: []string{"127.0.0.1"}}, repo: "plain",
			wantCause: "plain HTTP", noRequest: true,
		},
		{
			name: "a denied registry is never asked", opts: with(func(o *Options) { o.DeniedRegistries = []string{"127.0.0.*"} }),
			repo: "plain", wantCause: "deny list", noRequest: true,
		},
		{
			name: "a registry off the allow list is never asked", opts: with(func(o *Options) { o.AllowedRegistries = []string{"*.example.com"} }),
			repo: "plain", wantCause: "not on the webhook's allow list", noRequest: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Not parallel: noRequest reads the registry's shared log.
			image := reg.Host + "/" + tt.repo + ":1"
			reg.Take()
			_, err := NewResolver(tt.opts).Entrypoints(context.Background(), epNamespace, []corev1.Container{epContainer(image)}, nil)
			wantRegistryClass(t, err, RegistryNotAllowed, image)
			if !strings.Contains(err.Error(), tt.wantCause) {
				t.Errorf("error %q does not contain %q", err, tt.wantCause)
			}
			if reqs := reg.Take(); tt.noRequest && len(reqs) > 0 {
				t.Errorf("the registry was asked %q, want nothing", reqs)
			}
			if strings.Contains(err.Error(), internalPort) || strings.Contains(err.Error(), "meta-data") {
				t.Errorf("error %q names the redirect's target", err)
			}
		})
	}
	if n := internalHits.Load(); n != 0 {
		t.Errorf("the internal service was asked %d times, want never", n)
	}

	t.Run("allowed, private and insecure hosts resolve", func(t *testing.T) {
		o := with(func(o *Options) { o.AllowedRegistries = []string{"127.0.0.1:*"} })
		if _, err := NewResolver(o).Entrypoints(context.Background(), epNamespace, []corev1.Container{epContainer(reg.Host + "/plain:1")}, nil); err != nil {
			t.Errorf("Entrypoints: %v", err)
		}
	})
}

func TestRegistryCacheNeverAnswersAnotherTenantsCredential(t *testing.T) {
	t.Parallel()
	const user, pass = "team-a", "s3cret"
	reg := registrytest.Start(t, basicAuth(user, pass))
	private := registrytest.PushImage(t, reg.Host+"/team-a/private:1", v1.Config{Entrypoint: []string{"/bin/secret-job", "--token-file=/x"}},
		remote.WithAuth(&authn.Basic{Username: user, Password: pass}))
	secret := func(u, p string) authn.Keychain {
		auth := base64.StdEncoding.EncodeToString([]byte(u + ":" + p))
		return keychainFor(t, private, `{"auths":{"`+reg.Host+`":{"auth":"`+auth+`"}}}`)
	}
	r := NewResolver(loopbackOptions())
	ctx := context.Background()
	lookup := func(secrets authn.Keychain) ([]string, error, []string) {
		reg.Take()
		got, err := r.Entrypoints(ctx, epNamespace, []corev1.Container{epContainer(private)}, secrets)
		return got["app"], err, reg.Take()
	}

	// Team A's lookup fills the cache.
	if got, err, _ := lookup(secret(user, pass)); err != nil || !slices.Equal(got, []string{"/bin/secret-job", "--token-file=/x"}) {
		t.Fatalf("team A: %q, %v", got, err)
	}
	if _, err, reqs := lookup(secret(user, pass)); err != nil || len(reqs) != 0 {
		t.Fatalf("team A again: %v, requests %q; want an answer from the cache", err, reqs)
	}
	for name, secrets := range map[string]authn.Keychain{
		"without a pull secret":         nil,
		"with a wrong password":         secret(user, "guess"),
		"with another user's name only": secret(user, ""),
	} {
		got, err, reqs := lookup(secrets)
		if err == nil {
			t.Errorf("team B %s learnt the entrypoint %q", name, got)
			continue
		}
		wantRegistryClass(t, err, RegistryUnauthorized, private)
		if len(reqs) == 0 {
			t.Errorf("team B %s was refused without asking the registry", name)
		}
	}
}

func TestRegistryOptionsAreValidatedNamingTheFlag(t *testing.T) {
	t.Parallel()
	err := Options{
		Timeout: 4 * time.Second, ReviewBudget: 3 * time.Second,
		MaxManifestBytes: 1 << 40, MaxConfigBytes: -1, MaxConcurrentLookups: -2,
		AllowedRegistries:  []string{"https://registry.example.com/team"},
		DeniedRegistries:   []string{""},
		InsecureRegistries: []string{"reg.local:http"},
		PrivateRegistries:  []string{"ok.example.com", "10.0.0.*:5000"},
	}.Validate()
	if err == nil {
		t.Fatal("Validate accepted bad options")
	}
	for _, want := range []string{
		"--registry-timeout, --registry-review-budget",
		"--registry-max-manifest-bytes", "--registry-max-config-bytes", "--registry-max-concurrent-lookups",
		`--registry-allow: "https://registry.example.com/team"`,
		`--registry-deny: ""`,
		`--registry-insecure: "reg.local:http" has a bad port`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "--registry-private") {
		t.Errorf("error %q refuses good private patterns", err)
	}
	if err := loopbackOptions().Validate(); err != nil {
		t.Errorf("Validate(loopback options): %v", err)
	}
}

func TestRegistryHostPatterns(t *testing.T) {
	t.Parallel()
	tests := []struct {
		patterns []string
		host     string
		want     bool
	}{
		{[]string{"registry.example.com"}, "registry.example.com:443", true},
		{[]string{"registry.example.com"}, "registry.example.com:5000", true},
		{[]string{"Registry.Example.com"}, "registry.example.COM:443", true},
		{[]string{"registry.example.com:5000"}, "registry.example.com:443", false},
		{[]string{"registry.example.com:5000"}, "registry.example.com:5000", true},
		{[]string{"*.example.com"}, "a.example.com:443", true},
		{[]string{"*.example.com"}, "a.b.example.com:443", false},
		{[]string{"*.example.com"}, "example.com:443", false},
		{[]string{"10.0.0.*"}, "10.0.0.7:5000", true},
		{[]string{"127.0.0.1:*"}, "127.0.0.1:39999", true},
		{[]string{"::1"}, "[::1]:5000", true},
		// A trailing dot and a mapped IPv4 address reach the same place as
		// the plain forms, so a deny entry holds for them too.
		{[]string{"registry.blocked.example"}, "registry.blocked.example.:443", true},
		{[]string{"*.blocked.example"}, "Registry.Blocked.Example.:443", true},
		{[]string{"127.0.0.1"}, "[::ffff:127.0.0.1]:5000", true},
		{nil, "registry.example.com:443", false},
	}
	for _, tt := range tests {
		if got := hostPatterns(tt.patterns).match(tt.host); got != tt.want {
			t.Errorf("%q matching %s = %v, want %v", tt.patterns, tt.host, got, tt.want)
		}
	}
}

func mustParse(t *testing.T, ref string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A hostile index cannot make the webhook decode it all at once: its
// entries are read one at a time, and past maxIndexEntries the index is
// refused. A review found that 4 MiB of empty entries ({},{},...), decoded
// whole, took one lookup to half a gigabyte of heap.
func TestRegistryIndexEntriesAreReadOneAtATimeAndBounded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries string // the JSON of the index's manifests, inside [ ]
		class   RegistryErrorClass
	}{
		{"more entries than the bound", strings.Repeat(`{"platform":{"os":"windows","architecture":"amd64"}},`, maxIndexEntries) +
			`{"platform":{"os":"linux","architecture":"amd64"}}`, RegistryTooLarge},
		{"4 MiB of empty entries", strings.TrimSuffix(strings.Repeat("{},", (DefaultMaxManifestBytes-100)/3), ","), RegistryInvalid},
		{"an entry that is not an object", `{"platform":{"os":"windows"}},"x"`, RegistryInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			index := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[` + tc.entries + `]}`)
			reg := registrytest.Start(t, intercept(func(w http.ResponseWriter, r *http.Request) bool {
				if strings.HasPrefix(r.URL.Path, "/v2/hostile/manifests/") {
					serveManifest(w, r, "application/vnd.oci.image.index.v1+json", index)
					return true
				}
				return false
			}))
			r := NewResolver(loopbackOptions())
			w := watchHeap()
			start := time.Now()
			_, err := r.Entrypoints(context.Background(), epNamespace, []corev1.Container{epContainer(reg.Host + "/hostile:1")}, nil)
			w.report(t, fmt.Sprintf("index of %d bytes", len(index)), r.transport.bytesRead.Load(), time.Since(start))
			wantRegistryClass(t, err, tc.class, reg.Host+"/hostile:1")
		})
	}
}

// Addresses no registry lives at are refused whatever the lists say, and an
// IPv6 address carrying an IPv4 one (NAT64, 6to4) is judged by that one too:
// a NAT64 gateway forwards 64:ff9b::a00:1 to 10.0.0.1.
func TestRegistryAddressesAreJudgedByWhereTheyLead(t *testing.T) {
	t.Parallel()
	plain := &destinationPolicy{}
	private := &destinationPolicy{private: hostPatterns{"registry.internal"}}
	for _, tc := range []struct {
		addr    string
		policy  *destinationPolicy
		allowed bool
	}{
		{"203.0.113.7", plain, true},
		{"2001:db8::7", plain, true},
		{"10.0.0.1", plain, false},
		{"10.0.0.1", private, true},
		{"64:ff9b::a00:1", plain, false},       // NAT64 to 10.0.0.1
		{"64:ff9b::a00:1", private, true},      // ... which the lists allow for that host
		{"64:ff9b::a9fe:a9fe", private, false}, // NAT64 to 169.254.169.254, never
		{"64:ff9b:1::a00:1", plain, false},
		{"2002:a00:1::", plain, false},    // 6to4 of 10.0.0.1
		{"2002:cb00:7107::", plain, true}, // 6to4 of 203.0.113.7
		{"fec0::1", plain, false},         // site-local
		{"192.0.0.8", private, false},
		{"198.18.0.1", private, false},
		{"240.0.0.1", private, false},
		{"255.255.255.255", private, false},
		{"::ffff:127.0.0.1", plain, false},
	} {
		err := tc.policy.checkAddress("registry.internal:443", netip.MustParseAddr(tc.addr))
		if (err == nil) != tc.allowed {
			t.Errorf("%s (private list %v): %v, want allowed %v", tc.addr, tc.policy.private, err, tc.allowed)
		}
	}
}
