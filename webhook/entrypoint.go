package webhook

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	corev1 "k8s.io/api/core/v1"

	"github.com/dislock/dislock/lockagent/spec"
)

// Defaults of ResolverOptions.
const (
	// DefaultResolveTimeout bounds one registry lookup. The API server gives
	// the whole admission call 5 s (timeoutSeconds: 5); the lookup must leave
	// room for reading the CronJob and pull secrets and for writing the answer.
	DefaultResolveTimeout = 3 * time.Second
	// DefaultResolverCacheSize is how many image configs are kept, by digest.
	DefaultResolverCacheSize = 1024
	// resolverMaxTimeout is the admission call's own timeout: a lookup that
	// may take longer can only end with the API server failing the call.
	resolverMaxTimeout = 5 * time.Second
)

// ErrNoImageEntrypoint means the image config has neither Entrypoint nor Cmd:
// there is no program to wrap.
var ErrNoImageEntrypoint = errors.New("the image config has neither Entrypoint nor Cmd")

// ResolverOptions configure registry lookups.
type ResolverOptions struct {
	// Timeout bounds each lookup (the context's own deadline applies too when
	// it is earlier); 0 means DefaultResolveTimeout.
	Timeout time.Duration
	// CacheSize is the number of image configs cached by digest; 0 means
	// DefaultResolverCacheSize.
	CacheSize int
	// Insecure allows plain-HTTP registries (tests, local registries).
	Insecure bool
	// Platform picks the image out of a multi-arch index; nil means
	// linux/amd64.
	Platform *v1.Platform
}

// Validate lists every problem.
func (o ResolverOptions) Validate() error {
	var errs []error
	if o.Timeout < 0 || o.Timeout >= resolverMaxTimeout {
		errs = append(errs, fmt.Errorf("registry lookup timeout %s must be positive and shorter than the %s admission timeout (default %s)",
			o.Timeout, resolverMaxTimeout, DefaultResolveTimeout))
	}
	if o.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("image config cache size %d must not be negative (default %d)", o.CacheSize, DefaultResolverCacheSize))
	}
	if o.Platform != nil && (o.Platform.OS == "" || o.Platform.Architecture == "") {
		errs = append(errs, fmt.Errorf("image platform %q needs both an OS and an architecture (e.g. linux/amd64)", o.Platform.String()))
	}
	return errors.Join(errs...)
}

// Resolver finds the entrypoint of a container image from its registry. It is
// safe for concurrent use.
type Resolver struct {
	timeout  time.Duration
	platform v1.Platform
	nameOpts []name.Option
	cache    *imageConfigCache
}

// NewResolver returns a Resolver; zero or negative options take their defaults
// (ResolverOptions.Validate reports them).
func NewResolver(opts ResolverOptions) *Resolver {
	r := &Resolver{
		timeout:  opts.Timeout,
		platform: v1.Platform{OS: "linux", Architecture: "amd64"},
		cache:    newImageConfigCache(opts.CacheSize),
	}
	if r.timeout <= 0 {
		r.timeout = DefaultResolveTimeout
	}
	if opts.Platform != nil {
		r.platform = *opts.Platform
	}
	if opts.Insecure {
		r.nameOpts = append(r.nameOpts, name.Insecure)
	}
	return r
}

// Entrypoint returns the command to wrap for container c, whose Command is
// empty: the image's Entrypoint, followed by its Cmd when c.Args is empty.
// That is what the container runtime would run: with no command Kubernetes
// runs ENTRYPOINT + CMD, or ENTRYPOINT + args when args are set; the wrapped
// command replaces ENTRYPOINT and Kubernetes still appends c.Args, so Cmd must
// be in the result exactly when it would have been used.
//
// The result is empty (not nil) for an image with only a Cmd when c.Args is
// set: Kubernetes then runs the args as the program, and the wrapper prefix
// alone is the right command. An image with neither Entrypoint nor Cmd is an
// error (ErrNoImageEntrypoint).
//
// pullSecrets are the contents of the pod's imagePullSecrets
// (.dockerconfigjson, or the legacy .dockercfg); the registry is queried
// anonymously when none matches its host.
func (r *Resolver) Entrypoint(ctx context.Context, c corev1.Container, pullSecrets [][]byte) ([]string, error) {
	cfg, err := r.imageConfig(ctx, c.Image, pullSecrets)
	if err == nil && len(cfg.entrypoint) == 0 && len(cfg.cmd) == 0 {
		err = ErrNoImageEntrypoint
	}
	if err != nil {
		return nil, fmt.Errorf("container %q: cannot resolve the entrypoint of image %q (%w); set the container's command or the annotation %s",
			c.Name, c.Image, err, spec.AnnotationEntrypoint)
	}
	out := make([]string, 0, len(cfg.entrypoint)+len(cfg.cmd))
	out = append(out, cfg.entrypoint...)
	if len(c.Args) == 0 {
		out = append(out, cfg.cmd...)
	}
	return out, nil
}

// imageConfig returns the Entrypoint and Cmd of image. A reference by digest
// is answered from the cache without any request. A tag is resolved to its
// digest on every call (tags move, so that answer is never cached), and only
// the config behind the digest, which can never change, comes from the cache.
func (r *Resolver) imageConfig(ctx context.Context, image string, pullSecrets [][]byte) (imageEntrypoint, error) {
	if image == "" {
		return imageEntrypoint{}, errors.New("the container has no image")
	}
	ref, err := name.ParseReference(image, r.nameOpts...)
	if err != nil {
		return imageEntrypoint{}, fmt.Errorf("parsing the image reference: %w", err)
	}
	if d, ok := ref.(name.Digest); ok {
		if cfg, ok := r.cache.get(imageConfigKey(d.Context(), d.DigestStr())); ok {
			return cfg, nil
		}
	}

	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	cfg, err := r.fetch(ctx, ref, pullSecretKeychain(pullSecrets))
	if err != nil {
		return imageEntrypoint{}, explainRegistryError(ctx, err)
	}
	return cfg, nil
}

func (r *Resolver) fetch(ctx context.Context, ref name.Reference, keychain authn.Keychain) (imageEntrypoint, error) {
	// One Puller per lookup: it authenticates once for the HEAD and the GETs
	// that follow. It cannot be shared between lookups because the keychain
	// comes from each pod's own pull secrets.
	puller, err := remote.NewPuller(
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(keychain),
		remote.WithPlatform(r.platform),
		remote.WithUserAgent("dislock-webhook"),
		// The default backoff waits 1 s then 3 s: longer than the whole
		// lookup may take.
		remote.WithRetryBackoff(remote.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 3}),
	)
	if err != nil {
		return imageEntrypoint{}, err
	}

	var got *remote.Descriptor
	digest, isDigest := ref.(name.Digest)
	if !isDigest {
		head, err := puller.Head(ctx, ref)
		if err != nil {
			if ctx.Err() != nil {
				return imageEntrypoint{}, err
			}
			// Some registries answer HEAD poorly (no Docker-Content-Digest,
			// no error body); a GET works there and explains a failure.
			if got, err = puller.Get(ctx, ref); err != nil {
				return imageEntrypoint{}, err
			}
			head = &got.Descriptor
		}
		digest = ref.Context().Digest(head.Digest.String())
	}
	key := imageConfigKey(digest.Context(), digest.DigestStr())
	if cfg, ok := r.cache.get(key); ok {
		return cfg, nil
	}

	if got == nil {
		if got, err = puller.Get(ctx, digest); err != nil {
			return imageEntrypoint{}, err
		}
	}
	// For an index, Image picks the manifest for r.platform (the Puller's
	// platform); the cache belongs to this Resolver, whose platform is fixed,
	// so the index digest is a valid key.
	img, err := got.Image()
	if err != nil {
		return imageEntrypoint{}, err
	}
	file, err := img.ConfigFile()
	if err != nil {
		return imageEntrypoint{}, fmt.Errorf("reading the image config: %w", err)
	}
	cfg := imageEntrypoint{entrypoint: slices.Clone(file.Config.Entrypoint), cmd: slices.Clone(file.Config.Cmd)}
	r.cache.add(key, cfg)
	return cfg, nil
}

// explainRegistryError puts the likely fix in front of the registry's words.
func explainRegistryError(ctx context.Context, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("the registry did not answer in time: %w", err)
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch terr.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("the registry refused access; check the pod's imagePullSecrets: %w", err)
		case http.StatusNotFound:
			return fmt.Errorf("the image is not in the registry: %w", err)
		}
	}
	return err
}

// imageEntrypoint is what the cache keeps of an image config.
type imageEntrypoint struct {
	entrypoint, cmd []string
}

// imageConfigKey names an image by repository and digest. The repository is
// part of the key so that a lookup in one repository never answers for
// another one; the digest makes the entry immutable.
func imageConfigKey(repo name.Repository, digest string) string {
	return repo.Name() + "@" + digest
}

// imageConfigCache is a bounded LRU of image configs, safe for concurrent use.
type imageConfigCache struct {
	mu    sync.Mutex
	size  int
	order *list.List // of *imageConfigCacheItem, most recently used first
	items map[string]*list.Element
}

type imageConfigCacheItem struct {
	key string
	cfg imageEntrypoint
}

func newImageConfigCache(size int) *imageConfigCache {
	if size <= 0 {
		size = DefaultResolverCacheSize
	}
	return &imageConfigCache{size: size, order: list.New(), items: make(map[string]*list.Element)}
}

// get returns the entry; its slices are shared and must not be modified.
func (c *imageConfigCache) get(key string) (imageEntrypoint, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[key]
	if !ok {
		return imageEntrypoint{}, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*imageConfigCacheItem).cfg, true
}

func (c *imageConfigCache) add(key string, cfg imageEntrypoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[key]; ok {
		e.Value.(*imageConfigCacheItem).cfg = cfg
		c.order.MoveToFront(e)
		return
	}
	c.items[key] = c.order.PushFront(&imageConfigCacheItem{key: key, cfg: cfg})
	for c.order.Len() > c.size {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.items, oldest.Value.(*imageConfigCacheItem).key)
	}
}

func (c *imageConfigCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// pullSecretKeychain turns the pod's pull secrets into a keychain.
//
// Entries that cannot be used (bad JSON, bad base64, no credentials) are
// skipped, as the kubelet does: the image pull would not use them either, and
// if credentials were needed the registry's refusal names the problem.
func pullSecretKeychain(secrets [][]byte) authn.Keychain {
	var kc registryKeychain
	for _, secret := range secrets {
		var top map[string]json.RawMessage
		if json.Unmarshal(secret, &top) != nil {
			continue
		}
		// .dockerconfigjson nests the hosts under "auths"; the legacy
		// .dockercfg is the bare host map.
		hosts := top
		if raw, ok := top["auths"]; ok {
			hosts = nil
			if json.Unmarshal(raw, &hosts) != nil {
				continue
			}
		}
		keys := make([]string, 0, len(hosts))
		for k := range hosts {
			keys = append(keys, k)
		}
		slices.Sort(keys) // map order is random; the first match must not be
		for _, k := range keys {
			var cfg authn.AuthConfig
			if json.Unmarshal(hosts[k], &cfg) != nil {
				continue
			}
			if cfg.Username == "" && cfg.Password == "" && cfg.IdentityToken == "" && cfg.RegistryToken == "" {
				continue
			}
			host, repoPath := parseRegistryKey(k)
			if host == "" {
				continue
			}
			kc = append(kc, registryCredential{host: host, path: repoPath, auth: cfg})
		}
	}
	return kc
}

// registryKeychain matches credentials to a registry the way the kubelet's
// keyring does: by host (with "*" globs per DNS label), port, and optional
// repository path prefix. The most specific match wins; among equals, the
// first pull secret.
type registryKeychain []registryCredential

type registryCredential struct {
	host string // lowercased, Docker Hub aliases folded to index.docker.io
	path string // repository prefix, or "" for the whole registry
	auth authn.AuthConfig
}

func (kc registryKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	host := canonicalRegistryHost(target.RegistryStr())
	repo := strings.TrimPrefix(strings.TrimPrefix(target.String(), target.RegistryStr()), "/")
	var best *registryCredential
	for i := range kc {
		c := &kc[i]
		if !registryHostMatches(c.host, host) || !repoPathMatches(c.path, repo) {
			continue
		}
		if best == nil || moreSpecific(c, best) {
			best = c
		}
	}
	if best == nil {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(best.auth), nil
}

func moreSpecific(a, b *registryCredential) bool {
	aGlob, bGlob := strings.Contains(a.host, "*"), strings.Contains(b.host, "*")
	if aGlob != bGlob {
		return !aGlob
	}
	return len(a.path) > len(b.path)
}

// parseRegistryKey splits a config key such as "reg.example.com",
// "https://reg.example.com:5000/team" or "https://index.docker.io/v1/" into
// host and repository path.
func parseRegistryKey(key string) (host, repoPath string) {
	key = strings.TrimSpace(key)
	for _, scheme := range []string{"https://", "http://"} {
		if len(key) >= len(scheme) && strings.EqualFold(key[:len(scheme)], scheme) {
			key = key[len(scheme):]
		}
	}
	host, repoPath, _ = strings.Cut(key, "/")
	// Docker writes API version paths ("/v1/", "/v2/") into its keys; they
	// say nothing about repositories.
	for _, v := range []string{"v1", "v2"} {
		if repoPath == v || strings.HasPrefix(repoPath, v+"/") {
			repoPath = strings.TrimPrefix(repoPath[len(v):], "/")
		}
	}
	return canonicalRegistryHost(host), strings.Trim(repoPath, "/")
}

// canonicalRegistryHost folds Docker Hub's names into the one
// go-containerregistry uses.
func canonicalRegistryHost(host string) string {
	host = strings.ToLower(host)
	switch host {
	case "docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com":
		return name.DefaultRegistry
	}
	return host
}

// registryHostMatches compares host[:port], allowing "*" globs within DNS
// labels of pattern ("*.example.com" matches "a.example.com", not
// "example.com" nor "a.b.example.com"). Ports must be equal.
func registryHostMatches(pattern, host string) bool {
	if pattern == host {
		return true
	}
	if !strings.Contains(pattern, "*") {
		return false
	}
	pHost, pPort, _ := strings.Cut(pattern, ":")
	hHost, hPort, _ := strings.Cut(host, ":")
	if pPort != hPort {
		return false
	}
	pLabels, hLabels := strings.Split(pHost, "."), strings.Split(hHost, ".")
	if len(pLabels) != len(hLabels) {
		return false
	}
	for i := range pLabels {
		if ok, err := path.Match(pLabels[i], hLabels[i]); err != nil || !ok {
			return false
		}
	}
	return true
}

// repoPathMatches reports whether repo is prefix or under it.
func repoPathMatches(prefix, repo string) bool {
	return prefix == "" || repo == prefix || strings.HasPrefix(repo, prefix+"/")
}
