package registry

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	kauth "github.com/google/go-containerregistry/pkg/authn/kubernetes"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/webhook/internal/registrytest"
)

// pushEPIndex writes a multi-arch index to ref: one image per platform whose
// entrypoint is "/<arch>".
func pushEPIndex(t *testing.T, ref string, platforms ...v1.Platform) {
	t.Helper()
	var adds []mutate.IndexAddendum
	for _, p := range platforms {
		img, err := mutate.Config(empty.Image, v1.Config{Entrypoint: []string{"/" + p.Architecture}})
		if err != nil {
			t.Fatal(err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, mutate.AppendManifests(empty.Index, adds...)); err != nil {
		t.Fatalf("pushing index %s: %v", ref, err)
	}
}

// epNamespace is the namespace of the tests' lookups, where one will do.
const epNamespace = "team"

func epContainer(image string, args ...string) corev1.Container {
	return corev1.Container{Name: "app", Image: image, Args: args}
}

func TestEntrypointFromImageConfig(t *testing.T) {
	t.Parallel()
	reg := registrytest.Start(t, nil)
	both := registrytest.PushImage(t, reg.Host+"/both:1", v1.Config{Entrypoint: []string{"/bin/app", "-v"}, Cmd: []string{"serve", "--port=80"}})
	registrytest.PushImage(t, reg.Host+"/cmd-only:1", v1.Config{Cmd: []string{"/bin/sh", "-c", "run"}})
	registrytest.PushImage(t, reg.Host+"/ep-only:1", v1.Config{Entrypoint: []string{"/bin/app"}})
	amd64, arm64 := v1.Platform{OS: "linux", Architecture: "amd64"}, v1.Platform{OS: "linux", Architecture: "arm64"}
	pushEPIndex(t, reg.Host+"/multi:1", arm64, amd64)

	tests := []struct {
		name      string
		container corev1.Container
		platform  *v1.Platform
		want      []string
	}{
		{
			name:      "entrypoint and cmd with no args wrap both, as Kubernetes runs both",
			container: epContainer(reg.Host + "/both:1"),
			want:      []string{"/bin/app", "-v", "serve", "--port=80"},
		},
		{
			name:      "args replace the image cmd, so only the entrypoint is wrapped",
			container: epContainer(reg.Host+"/both:1", "once"),
			want:      []string{"/bin/app", "-v"},
		},
		{
			name:      "an image with only a cmd and no args wraps the cmd",
			container: epContainer(reg.Host + "/cmd-only:1"),
			want:      []string{"/bin/sh", "-c", "run"},
		},
		{
			name:      "an image with only a cmd and args wraps nothing: Kubernetes runs the args as the program",
			container: epContainer(reg.Host+"/cmd-only:1", "/bin/job"),
			want:      []string{},
		},
		{
			name:      "an image with only an entrypoint wraps it with or without args",
			container: epContainer(reg.Host+"/ep-only:1", "--flag"),
			want:      []string{"/bin/app"},
		},
		{
			name:      "a reference by digest resolves",
			container: epContainer(both),
			want:      []string{"/bin/app", "-v", "serve", "--port=80"},
		},
		{
			name:      "a multi-arch index resolves to linux/amd64 by default",
			container: epContainer(reg.Host + "/multi:1"),
			want:      []string{"/amd64"},
		},
		{
			name:      "a multi-arch index resolves to the configured platform",
			container: epContainer(reg.Host + "/multi:1"),
			platform:  &arm64,
			want:      []string{"/arm64"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := NewResolver(Options{Insecure: true, Platform: tt.platform})
			got, err := r.Entrypoint(context.Background(), epNamespace, tt.container, nil)
			if err != nil {
				t.Fatalf("Entrypoint: %v", err)
			}
			if got == nil || !slices.Equal(got, tt.want) {
				t.Errorf("Entrypoint = %#v, want %#v", got, tt.want)
			}
		})
	}
}

func TestEntrypointErrorsNameContainerImageAndFix(t *testing.T) {
	t.Parallel()
	reg := registrytest.Start(t, nil)
	registrytest.PushImage(t, reg.Host+"/bare:1", v1.Config{Env: []string{"A=b"}})
	registrytest.PushImage(t, reg.Host+"/exists:1", v1.Config{Entrypoint: []string{"/bin/app"}})
	pushEPIndex(t, reg.Host+"/arm-only:1", v1.Platform{OS: "linux", Architecture: "arm64"})

	tests := []struct {
		name      string
		container corev1.Container
		wantIs    error
		wantCause string
	}{
		{
			name:      "an unknown repository is reported as missing from the registry",
			container: epContainer(reg.Host + "/nope/missing:1"),
			wantCause: "the image is not in the registry",
		},
		{
			name:      "an unknown tag of a known repository is reported as missing from the registry",
			container: epContainer(reg.Host + "/exists:2"),
			wantCause: "the image is not in the registry",
		},
		{
			name:      "an unknown digest is reported as missing from the registry",
			container: epContainer(reg.Host + "/exists@sha256:" + strings.Repeat("ab", 32)),
			wantCause: "the image is not in the registry",
		},
		{
			name:      "an image with neither entrypoint nor cmd has nothing to wrap",
			container: epContainer(reg.Host + "/bare:1"),
			wantIs:    ErrNoImageEntrypoint,
			wantCause: "neither Entrypoint nor Cmd",
		},
		{
			name:      "an image with neither entrypoint nor cmd has nothing to wrap even when args are set",
			container: epContainer(reg.Host+"/bare:1", "/bin/job"),
			wantIs:    ErrNoImageEntrypoint,
			wantCause: "neither Entrypoint nor Cmd",
		},
		{
			name:      "an index without the platform is an error",
			container: epContainer(reg.Host + "/arm-only:1"),
			wantCause: "linux/amd64",
		},
		{
			name:      "a malformed reference is an error before any request",
			container: epContainer(reg.Host + "/Not A Valid:ref"),
			wantCause: "parsing the image reference",
		},
		{
			name:      "a container without an image is an error",
			container: epContainer(""),
			wantCause: "the container has no image",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := NewResolver(Options{Insecure: true})
			got, err := r.Entrypoint(context.Background(), epNamespace, tt.container, nil)
			if err == nil {
				t.Fatalf("Entrypoint = %q, want an error", got)
			}
			msg := err.Error()
			for _, want := range []string{
				`container "app": cannot resolve the entrypoint of image "` + tt.container.Image + `" (`,
				tt.wantCause,
				"); set the container's command or the annotation dislock.io/entrypoint",
			} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not contain %q", msg, want)
				}
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error %q is not %v", msg, tt.wantIs)
			}
		})
	}
}

func TestEntrypointCachesConfigsByDigestAndNeverTags(t *testing.T) {
	t.Parallel()
	reg := registrytest.Start(t, nil)
	tag := reg.Host + "/cached/app:1"
	byDigest := registrytest.PushImage(t, tag, v1.Config{Entrypoint: []string{"/v1"}})
	ctx := context.Background()

	lookup := func(t *testing.T, r *Resolver, image string, want ...string) []string {
		t.Helper()
		reg.Take()
		got, err := r.Entrypoint(ctx, epNamespace, epContainer(image), nil)
		if err != nil {
			t.Fatalf("Entrypoint(%s): %v", image, err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("Entrypoint(%s) = %q, want %q", image, got, want)
		}
		return reg.Take()
	}

	t.Run("a second lookup by digest makes no request", func(t *testing.T) {
		r := NewResolver(Options{Insecure: true})
		if reqs := lookup(t, r, byDigest, "/v1"); !slices.Contains(reqs, "GET blob") {
			t.Fatalf("first lookup by digest made requests %q, want a config blob fetch among them", reqs)
		}
		if reqs := lookup(t, r, byDigest, "/v1"); len(reqs) != 0 {
			t.Errorf("second lookup by digest made requests %q, want none", reqs)
		}
	})

	t.Run("a second lookup by tag only asks the registry for the tag's digest", func(t *testing.T) {
		r := NewResolver(Options{Insecure: true})
		if reqs := lookup(t, r, tag, "/v1"); !slices.Contains(reqs, "GET blob") {
			t.Fatalf("first lookup by tag made requests %q, want a config blob fetch among them", reqs)
		}
		reqs := lookup(t, r, tag, "/v1")
		if !slices.Contains(reqs, "HEAD manifest") {
			t.Errorf("second lookup by tag made requests %q, want a HEAD of the manifest", reqs)
		}
		for _, req := range reqs {
			if req != "HEAD manifest" && req != "GET ping" {
				t.Errorf("second lookup by tag made request %q (all: %q), want only the ping and the manifest HEAD", req, reqs)
			}
		}
	})

	t.Run("a lookup by digest after one by tag is served from the cache", func(t *testing.T) {
		r := NewResolver(Options{Insecure: true})
		lookup(t, r, tag, "/v1")
		if reqs := lookup(t, r, byDigest, "/v1"); len(reqs) != 0 {
			t.Errorf("lookup by digest after the tag made requests %q, want none", reqs)
		}
	})

	t.Run("a moved tag resolves to its new image", func(t *testing.T) {
		moving := reg.Host + "/cached/moving:latest"
		registrytest.PushImage(t, moving, v1.Config{Entrypoint: []string{"/old"}})
		r := NewResolver(Options{Insecure: true})
		lookup(t, r, moving, "/old")
		registrytest.PushImage(t, moving, v1.Config{Entrypoint: []string{"/new"}})
		lookup(t, r, moving, "/new")
	})

	t.Run("changing a returned command does not change the cache", func(t *testing.T) {
		r := NewResolver(Options{Insecure: true})
		got, err := r.Entrypoint(ctx, epNamespace, epContainer(byDigest), nil)
		if err != nil {
			t.Fatal(err)
		}
		got[0] = "/tampered"
		_ = append(got[:0], "/appended")
		lookup(t, r, byDigest, "/v1")
	})

	t.Run("the cache is bounded", func(t *testing.T) {
		r := NewResolver(Options{Insecure: true, CacheSize: 1})
		other := registrytest.PushImage(t, reg.Host+"/cached/other:1", v1.Config{Entrypoint: []string{"/other"}})
		lookup(t, r, byDigest, "/v1")
		lookup(t, r, other, "/other")
		if n := r.cache.len(); n != 1 {
			t.Errorf("cache holds %d entries, want 1", n)
		}
		if reqs := lookup(t, r, byDigest, "/v1"); len(reqs) == 0 {
			t.Error("evicted digest was answered without a request")
		}
	})
}

func TestEntrypointConcurrentLookupsAgree(t *testing.T) {
	t.Parallel()
	reg := registrytest.Start(t, nil)
	byDigest := registrytest.PushImage(t, reg.Host+"/busy:1", v1.Config{Entrypoint: []string{"/bin/app"}, Cmd: []string{"run"}})
	r := NewResolver(Options{Insecure: true, CacheSize: 2})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		image := reg.Host + "/busy:1"
		if i%2 == 0 {
			image = byDigest
		}
		wg.Go(func() {
			got, err := r.Entrypoint(context.Background(), epNamespace, epContainer(image), nil)
			if err == nil && !slices.Equal(got, []string{"/bin/app", "run"}) {
				err = fmt.Errorf("Entrypoint(%s) = %q", image, got)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func TestEntrypointUsesPullSecrets(t *testing.T) {
	t.Parallel()
	const user, pass = "ci", "s3cret"
	reg := registrytest.Start(t, basicAuth(user, pass))
	image := reg.Host + "/private/app:1"
	registrytest.PushImage(t, image, v1.Config{Entrypoint: []string{"/bin/private"}}, remote.WithAuth(&authn.Basic{Username: user, Password: pass}))

	basic := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	wrong := base64.StdEncoding.EncodeToString([]byte(user + ":wrong"))
	tests := []struct {
		name    string
		secrets []string
		wantErr string
	}{
		{
			name:    "without a pull secret the registry refuses and the error says to check the pull secrets",
			wantErr: "the registry refused access; check the pod's imagePullSecrets",
		},
		{
			name:    "a .dockerconfigjson with an auth field is used",
			secrets: []string{`{"auths":{"` + reg.Host + `":{"auth":"` + basic + `"}}}`},
		},
		{
			name:    "a .dockerconfigjson with username, password and an https:// key is used",
			secrets: []string{`{"auths":{"https://` + reg.Host + `/":{"username":"` + user + `","password":"` + pass + `"}}}`},
		},
		{
			name:    "a legacy .dockercfg is used",
			secrets: []string{`{"` + reg.Host + `":{"auth":"` + basic + `","email":"ci@example.com"}}`},
		},
		{
			name: "the matching secret is found among unrelated and malformed ones",
			secrets: []string{
				`{"auths":{"other.example.com":{"auth":"` + wrong + `"}}}`,
				`not json`,
				`{"auths":{"` + reg.Host + `":{"auth":"%%%not base64"}}}`,
				`{"auths":{"` + reg.Host + `":{"auth":"` + basic + `"}}}`,
			},
		},
		{
			name:    "a secret for another registry is not sent",
			secrets: []string{`{"auths":{"other.example.com":{"auth":"` + basic + `"}}}`},
			wantErr: "the registry refused access",
		},
		{
			name:    "a wrong password is refused",
			secrets: []string{`{"auths":{"` + reg.Host + `":{"auth":"` + wrong + `"}}}`},
			wantErr: "the registry refused access",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := NewResolver(Options{Insecure: true})
			got, err := r.Entrypoint(context.Background(), epNamespace, epContainer(image), keychainFor(t, image, tt.secrets...))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Entrypoint: %v", err)
				}
				if !slices.Equal(got, []string{"/bin/private"}) {
					t.Errorf("Entrypoint = %q, want [/bin/private]", got)
				}
				return
			}
			if err == nil {
				t.Fatalf("Entrypoint = %q, want an error", got)
			}
			for _, want := range []string{`container "app"`, `image "` + image + `"`, "unauthorized: ", tt.wantErr, "dislock.io/entrypoint"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			// The registry's own words never reach the tenant.
			for _, body := range []string{"UNAUTHORIZED", "authentication required"} {
				if strings.Contains(err.Error(), body) {
					t.Errorf("error %q repeats the registry's body (%q)", err, body)
				}
			}
		})
	}
}

// Pull secrets match registries as the kubelet's keyring matches them (the
// webhook must find the credentials the kubelet will pull with).
func TestEntrypointPullSecretKeychainMatchesRegistryHost(t *testing.T) {
	t.Parallel()
	secret := func(user string, keys ...string) string {
		auth := base64.StdEncoding.EncodeToString([]byte(user + ":pw"))
		var entries []string
		for _, k := range keys {
			entries = append(entries, fmt.Sprintf("%q:{%q:%q}", k, "auth", auth))
		}
		return `{"auths":{` + strings.Join(entries, ",") + `}}`
	}
	tests := []struct {
		name     string
		secrets  []string
		image    string
		wantUser string // "" = anonymous
	}{
		{"a bare host matches", []string{secret("u", "reg.example.com")}, "reg.example.com/app:1", "u"},
		{"an https:// key matches", []string{secret("u", "https://reg.example.com")}, "reg.example.com/app:1", "u"},
		{"an http:// key with a /v2/ path matches", []string{secret("u", "http://reg.example.com/v2/")}, "reg.example.com/team/app:1", "u"},
		{"host names are case-insensitive", []string{secret("u", "REG.Example.COM")}, "reg.example.com/app:1", "u"},
		{"Docker Hub's legacy key matches a short image name", []string{secret("u", "https://index.docker.io/v1/")}, "nginx", "u"},
		{"index.docker.io matches a Docker Hub image", []string{secret("u", "index.docker.io")}, "docker.io/library/nginx:1", "u"},
		{"docker.io matches a Docker Hub image", []string{secret("u", "docker.io")}, "docker.io/library/nginx:1", "u"},
		{"registry-1.docker.io matches a Docker Hub image", []string{secret("u", "registry-1.docker.io")}, "team/app", "u"},

		{"Docker Hub credentials are not sent to another registry", []string{secret("u", "docker.io")}, "reg.example.com/app", ""},
		{"a port must match", []string{secret("u", "reg.example.com:5000")}, "reg.example.com/app", ""},
		{"a key without a port does not match a registry with one", []string{secret("u", "reg.example.com")}, "reg.example.com:5000/app", ""},
		{"a key with a port matches that port", []string{secret("u", "reg.example.com:5000")}, "reg.example.com:5000/app", "u"},
		{"a glob matches one label", []string{secret("u", "*.example.com")}, "reg.example.com/app", "u"},
		{"a glob does not match the bare domain", []string{secret("u", "*.example.com")}, "example.com/app", ""},
		{"a glob does not match two labels", []string{secret("u", "*.example.com")}, "a.reg.example.com/app", ""},
		{"an exact host wins over a glob", []string{secret("glob", "*.example.com"), secret("exact", "reg.example.com")}, "reg.example.com/app", "exact"},
		{"a repository path limits a key", []string{secret("team", "reg.example.com/team")}, "reg.example.com/other/app", ""},
		{"a repository path is a string prefix, as in the kubelet", []string{secret("team", "reg.example.com/team")}, "reg.example.com/teamx/app", "team"},
		{"the longest repository path wins", []string{secret("all", "reg.example.com"), secret("team", "reg.example.com/team")}, "reg.example.com/team/app", "team"},
		{"the first of equal secrets wins", []string{secret("first", "reg.example.com"), secret("second", "reg.example.com")}, "reg.example.com/app", "first"},
		{"a legacy .dockercfg matches", []string{`{"reg.example.com":{"username":"u","password":"pw"}}`}, "reg.example.com/app", "u"},
		{"an entry without credentials is skipped", []string{`{"auths":{"reg.example.com":{"email":"a@b.c"}}}`}, "reg.example.com/app", ""},
		{"no secret means anonymous", nil, "reg.example.com/app", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ref, err := name.ParseReference(tt.image)
			if err != nil {
				t.Fatal(err)
			}
			a, err := keychainFor(t, tt.image, tt.secrets...).Resolve(ref.Context())
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := authn.Authorization(context.Background(), a)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Username != tt.wantUser {
				t.Errorf("user for %s = %q, want %q", tt.image, cfg.Username, tt.wantUser)
			}
		})
	}
}

func TestEntrypointGivesUpWhenTheRegistryHangs(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs first: frees any handler still waiting
	image := strings.TrimPrefix(srv.URL, "http://") + "/slow/app:1"

	tests := []struct {
		name    string
		timeout time.Duration
		ctx     func() (context.Context, context.CancelFunc)
	}{
		{
			name:    "the resolver's timeout ends the lookup",
			timeout: 200 * time.Millisecond,
			ctx:     func() (context.Context, context.CancelFunc) { return context.Background(), func() {} },
		},
		{
			name:    "an earlier context deadline ends the lookup",
			timeout: time.Minute,
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 200*time.Millisecond)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := tt.ctx()
			defer cancel()
			r := NewResolver(Options{Insecure: true, Timeout: tt.timeout})
			done := make(chan error, 1)
			go func() {
				_, err := r.Entrypoint(ctx, epNamespace, epContainer(image), nil)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("Entrypoint succeeded against a hanging registry")
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("error %q is not context.DeadlineExceeded", err)
				}
				for _, want := range []string{`container "app"`, `image "` + image + `"`, "did not answer in time", "dislock.io/entrypoint"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not contain %q", err, want)
					}
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Entrypoint did not return against a hanging registry")
			}
		})
	}
}

func TestEntrypointResolverOptions(t *testing.T) {
	t.Parallel()
	t.Run("zero options take the defaults", func(t *testing.T) {
		t.Parallel()
		if err := (Options{}).Validate(); err != nil {
			t.Errorf("Validate: %v", err)
		}
		r := NewResolver(Options{})
		if r.timeout != DefaultResolveTimeout || r.budget != DefaultReviewBudget || r.cache.size != DefaultResolverCacheSize ||
			r.maxManifest != DefaultMaxManifestBytes || r.maxConfig != DefaultMaxConfigBytes || r.slots.total != DefaultMaxConcurrentLookups || r.slots.share != DefaultMaxConcurrentLookups/2 ||
			r.platform.OS != "linux" || r.platform.Architecture != "amd64" || r.policy.anyInsecure {
			t.Errorf("NewResolver(zero) = timeout %s, budget %s, cache %d, manifest %d, config %d, slots %d, platform %s, insecure %v",
				r.timeout, r.budget, r.cache.size, r.maxManifest, r.maxConfig, r.slots.total, r.platform.String(), r.policy.anyInsecure)
		}
	})
	t.Run("every bad option is listed", func(t *testing.T) {
		t.Parallel()
		err := Options{Timeout: 6 * time.Second, CacheSize: -1, Platform: &v1.Platform{OS: "linux"}}.Validate()
		if err == nil {
			t.Fatal("Validate accepted bad options")
		}
		for _, want := range []string{"timeout 6s must be positive and shorter than the 5s admission timeout", "cache size -1", `platform "linux"`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not contain %q", err, want)
			}
		}
	})
	t.Run("a negative timeout is refused", func(t *testing.T) {
		t.Parallel()
		if err := (Options{Timeout: -time.Second}).Validate(); err == nil {
			t.Error("Validate accepted a negative timeout")
		}
	})
}

func TestEntrypointCacheEvictsTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	c := newImageConfigCache(2)
	c.add("a", imageEntrypoint{entrypoint: []string{"/a"}})
	c.add("b", imageEntrypoint{entrypoint: []string{"/b"}})
	if _, ok := c.get("a"); !ok { // a is now the most recently used
		t.Fatal("a missing")
	}
	c.add("c", imageEntrypoint{entrypoint: []string{"/c"}})
	if _, ok := c.get("b"); ok {
		t.Error("b kept, want it evicted as the least recently used")
	}
	for _, k := range []string{"a", "c"} {
		if got, ok := c.get(k); !ok || got.entrypoint[0] != "/"+k {
			t.Errorf("get(%s) = %v, %v", k, got, ok)
		}
	}
	c.add("c", imageEntrypoint{entrypoint: []string{"/c2"}})
	if got, _ := c.get("c"); got.entrypoint[0] != "/c2" || c.len() != 2 {
		t.Errorf("re-adding c: got %v, len %d", got, c.len())
	}
}

// basicAuth wraps a registry so that it answers only requests with the
// user's password, as a private registry does.
func basicAuth(user, pass string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="dislock-test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// keychainFor is PullSecretKeychain, for image's registry, over Secrets
// holding the docker configs given: a .dockerconfigjson when it has
// "auths", else a legacy .dockercfg.
func keychainFor(t testing.TB, image string, configs ...string) authn.Keychain {
	t.Helper()
	var secrets []corev1.Secret
	for _, c := range configs {
		typ, key := corev1.SecretTypeDockercfg, corev1.DockerConfigKey
		if strings.Contains(c, `"auths"`) {
			typ, key = corev1.SecretTypeDockerConfigJson, corev1.DockerConfigJsonKey
		}
		secrets = append(secrets, corev1.Secret{Type: typ, Data: map[string][]byte{key: []byte(c)}})
	}
	kc, err := PullSecretKeychain(context.Background(), secrets, Hosts([]corev1.Container{{Image: image}}))
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// hostileDockerConfig is about size bytes of a .dockerconfigjson with
// thousands of entries, none for a registry anyone looks up.
func hostileDockerConfig(size int) []byte {
	var b strings.Builder
	b.WriteString(`{"auths":{`)
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"r%08x.example.com":{"auth":"dTpw"}`, i)
	}
	b.WriteString(`}}`)
	return []byte(b.String())
}

// A tenant's pull secrets are bounded in what they cost the webhook: only
// the entries for the registries looked up are kept, and more than
// maxRegistryCredentials of those are refused, naming the fix. Before, a
// megabyte of entries cost one review seconds of CPU and hundreds of MiB
// (the library re-reads every earlier Secret for each one; see
// BenchmarkPullSecretKeychain).
func TestPullSecretKeychainKeepsOnlyTheLookedUpRegistriesEntries(t *testing.T) {
	t.Parallel()
	hostile := corev1.Secret{Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: hostileDockerConfig(1 << 20)}}
	var secrets []corev1.Secret
	for range 16 {
		secrets = append(secrets, hostile)
	}
	kc, err := PullSecretKeychain(context.Background(), secrets, []string{"reg.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference("reg.example.com/app:1")
	if a, err := kc.Resolve(ref.Context()); err != nil || a != authn.Anonymous {
		t.Errorf("a registry no entry names got %v, %v; want anonymous", a, err)
	}

	var many []string
	for i := range maxRegistryCredentials + 1 {
		many = append(many, fmt.Sprintf(`"reg.example.com/team%d":{"auth":"dTpw"}`, i))
	}
	crowded := corev1.Secret{Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{` + strings.Join(many, ",") + `}}`)}}
	_, err = PullSecretKeychain(context.Background(), []corev1.Secret{crowded}, []string{"reg.example.com"})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than %d credentials for the registries reg.example.com", maxRegistryCredentials)) ||
		!strings.Contains(err.Error(), contract.AnnotationEntrypoint) {
		t.Errorf("%d credentials for one registry: %v; want a refusal naming the bound, the registry and the fix", maxRegistryCredentials+1, err)
	}
}

// BenchmarkPullSecretKeychain builds the keychain of one review from 16
// pull secrets, one of them a megabyte of entries for other registries:
// through PullSecretKeychain, and handed to go-containerregistry's
// authn/kubernetes as they are (the baseline).
func BenchmarkPullSecretKeychain(b *testing.B) {
	secrets := []corev1.Secret{{Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: hostileDockerConfig(1 << 20)}}}
	for range 15 {
		secrets = append(secrets, corev1.Secret{Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{}`)}})
	}
	ref, _ := name.ParseReference("reg.example.com/app:1")
	b.Run("PullSecretKeychain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			kc, err := PullSecretKeychain(context.Background(), secrets, []string{"reg.example.com"})
			if err != nil {
				b.Fatal(err)
			}
			kc.Resolve(ref.Context())
		}
	})
	b.Run("authn-kubernetes-as-is", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			kc, err := kauth.NewFromPullSecrets(context.Background(), secrets)
			if err != nil {
				b.Fatal(err)
			}
			kc.Resolve(ref.Context())
		}
	})
}

// FuzzPullSecretKeychain feeds a tenant's docker configs (both Secret types)
// to the keychain the registry lookups use: no panic, no error but the
// credential bound's, and a keychain that answers for the looked-up
// registry.
func FuzzPullSecretKeychain(f *testing.F) {
	f.Add([]byte(`{"auths":{"reg.example.com":{"auth":"dTpw"}}}`), []byte(`{"reg.example.com":{"username":"u","password":"p"}}`), "reg.example.com/app:1")
	f.Add([]byte(`{"auths":{"https://index.docker.io/v1/":{"auth":"%%%"}}}`), []byte(`not json`), "nginx")
	f.Add([]byte(`{"auths":{"*.example.com:5000/team":{"identitytoken":"t"}}}`), []byte(`{"":{}}`), "a.example.com:5000/team/x@sha256:0000000000000000000000000000000000000000000000000000000000000000")
	f.Add([]byte(`{"auths":null}`), []byte(`[]`), "REG.EXAMPLE.COM/App")
	f.Fuzz(func(t *testing.T, dockerConfigJSON, dockercfg []byte, image string) {
		secrets := []corev1.Secret{
			{Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: dockerConfigJSON}},
			{Type: corev1.SecretTypeDockercfg, Data: map[string][]byte{corev1.DockerConfigKey: dockercfg}},
		}
		kc, err := PullSecretKeychain(context.Background(), secrets, Hosts([]corev1.Container{{Image: image}}))
		if err != nil {
			if !strings.Contains(err.Error(), "credentials for the registries") {
				t.Fatalf("unexpected error: %v", err)
			}
			return
		}
		if ref, err := name.ParseReference(image); err == nil {
			if _, err := kc.Resolve(ref.Context()); err != nil {
				t.Fatalf("Resolve(%s): %v", image, err)
			}
		}
	})
}
