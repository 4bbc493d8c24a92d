package registry

import (
	"bytes"
	"cmp"
	"container/list"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	kauth "github.com/google/go-containerregistry/pkg/authn/kubernetes"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dislock/dislock/lockagent/contract"
)

// Defaults and bounds of Options.
const (
	// DefaultResolveTimeout bounds one registry lookup. The API server gives
	// the whole admission call 5 s (timeoutSeconds: 5); the lookup must leave
	// room for reading the CronJob and pull secrets and for writing the answer.
	DefaultResolveTimeout = 3 * time.Second
	// DefaultReviewBudget bounds all the lookups of one review (they run in
	// parallel, but may wait for a free lookup slot): past it the review is
	// denied with a timeout, rather than the API server timing the call out.
	DefaultReviewBudget = 4 * time.Second
	// DefaultResolverCacheSize is how many image configs are kept, by digest
	// and credential.
	DefaultResolverCacheSize = 1024
	// DefaultMaxManifestBytes bounds a manifest or index. Real ones are a few
	// KiB; an index of 1 000 platforms is about 200 KiB.
	DefaultMaxManifestBytes = 4 << 20
	// DefaultMaxConfigBytes bounds an image config blob. Real ones are a few
	// KiB (a long build history makes tens of KiB).
	DefaultMaxConfigBytes = 1 << 20
	// DefaultMaxConcurrentLookups bounds the lookups in flight across all
	// reviews. With the default size bounds a lookup holds at most about
	// 10 MiB (an index, one manifest, one config, and their parsed forms),
	// so the default keeps the worst case well inside the webhook's 256 Mi.
	// One namespace holds at most half of them (see lookupSlots).
	DefaultMaxConcurrentLookups = 8

	// resolverMaxTimeout is the admission call's own timeout: a lookup that
	// may take longer can only end with the API server failing the call.
	resolverMaxTimeout    = 5 * time.Second
	maxManifestBytesBound = 64 << 20
	maxConfigBytesBound   = 16 << 20
	maxConcurrentBound    = 256
)

// ErrNoImageEntrypoint means the image config has neither Entrypoint nor Cmd:
// there is no program to wrap.
var ErrNoImageEntrypoint = errors.New("the image config has neither Entrypoint nor Cmd")

// Options configure registry lookups. The registry is named by the
// tenant's image, so every bound here is a bound on what a tenant can make
// the webhook do: read (MaxManifestBytes, MaxConfigBytes), wait (Timeout,
// ReviewBudget), hold (MaxConcurrentLookups) and contact (the host lists).
type Options struct {
	// Timeout bounds each lookup (the context's own deadline applies too when
	// it is earlier); 0 means DefaultResolveTimeout.
	Timeout time.Duration
	// ReviewBudget bounds all lookups of one review; 0 means
	// DefaultReviewBudget.
	ReviewBudget time.Duration
	// CacheSize is the number of image configs cached; 0 means
	// DefaultResolverCacheSize.
	CacheSize int
	// MaxManifestBytes bounds a manifest or index, MaxConfigBytes an image
	// config: a larger declared size is refused before it is downloaded, and
	// no more is ever read. 0 means the defaults.
	MaxManifestBytes, MaxConfigBytes int64
	// MaxConcurrentLookups bounds the lookups in flight; 0 means
	// DefaultMaxConcurrentLookups. One namespace holds at most half of them
	// (at least one), so with 1 there is no isolation between namespaces.
	MaxConcurrentLookups int

	// AllowedRegistries, when not empty, are the only registries queried.
	// DeniedRegistries are never contacted, not even through a redirect.
	// InsecureRegistries may be spoken to over plain HTTP. PrivateRegistries
	// may resolve to loopback or private addresses (link-local ones are
	// never contacted). Each entry is a host, or host:port, with "*"
	// matching within one DNS label ("*.example.com", "10.0.0.*:5000"); an
	// entry without a port matches every port.
	AllowedRegistries, DeniedRegistries, InsecureRegistries, PrivateRegistries []string
	// Insecure lets every registry be plain HTTP and on a private address:
	// for tests with a registry on loopback, never for a shared cluster.
	Insecure bool
	// Platform picks the image out of a multi-arch index; nil means
	// linux/amd64.
	Platform *v1.Platform
}

// Validate lists every problem, naming the dislock webhook flag that sets it.
func (o Options) Validate() error {
	var errs []error
	if o.Timeout < 0 || o.Timeout >= resolverMaxTimeout {
		errs = append(errs, fmt.Errorf("registry lookup timeout %s must be positive and shorter than the %s admission timeout (--registry-timeout, default %s)",
			o.Timeout, resolverMaxTimeout, DefaultResolveTimeout))
	}
	if o.ReviewBudget < 0 || o.ReviewBudget >= resolverMaxTimeout {
		errs = append(errs, fmt.Errorf("registry review budget %s must be positive and shorter than the %s admission timeout (--registry-review-budget, default %s)",
			o.ReviewBudget, resolverMaxTimeout, DefaultReviewBudget))
	} else if t, b := cmp.Or(o.Timeout, DefaultResolveTimeout), cmp.Or(o.ReviewBudget, DefaultReviewBudget); o.Timeout >= 0 && t > b {
		errs = append(errs, fmt.Errorf("registry lookup timeout %s must not be longer than the review budget %s that contains it (--registry-timeout, --registry-review-budget)", t, b))
	}
	if o.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("image config cache size %d must not be negative (default %d)", o.CacheSize, DefaultResolverCacheSize))
	}
	if o.MaxManifestBytes < 0 || o.MaxManifestBytes > maxManifestBytesBound {
		errs = append(errs, fmt.Errorf("registry manifest bound %d bytes must be between 1 and %d (--registry-max-manifest-bytes, default %d)", o.MaxManifestBytes, maxManifestBytesBound, DefaultMaxManifestBytes))
	}
	if o.MaxConfigBytes < 0 || o.MaxConfigBytes > maxConfigBytesBound {
		errs = append(errs, fmt.Errorf("registry config bound %d bytes must be between 1 and %d (--registry-max-config-bytes, default %d)", o.MaxConfigBytes, maxConfigBytesBound, DefaultMaxConfigBytes))
	}
	if o.MaxConcurrentLookups < 0 || o.MaxConcurrentLookups > maxConcurrentBound {
		errs = append(errs, fmt.Errorf("concurrent registry lookups %d must be between 1 and %d (--registry-max-concurrent-lookups, default %d)", o.MaxConcurrentLookups, maxConcurrentBound, DefaultMaxConcurrentLookups))
	}
	errs = append(errs,
		validateHostPatterns("--registry-allow", o.AllowedRegistries),
		validateHostPatterns("--registry-deny", o.DeniedRegistries),
		validateHostPatterns("--registry-insecure", o.InsecureRegistries),
		validateHostPatterns("--registry-private", o.PrivateRegistries))
	if o.Platform != nil && (o.Platform.OS == "" || o.Platform.Architecture == "") {
		errs = append(errs, fmt.Errorf("image platform %q needs both an OS and an architecture (e.g. linux/amd64)", o.Platform.String()))
	}
	return errors.Join(errs...)
}

// Resolver finds the entrypoint of a container image from its registry. It is
// safe for concurrent use.
//
// Lookups that reach a registry hold one of MaxConcurrentLookups slots, and
// the slots are shared fairly among namespaces (lookupSlots): a namespace
// holds at most half of them (at least one), and a freed slot goes to the
// waiting namespace that holds the fewest. A tenant whose images name a
// registry that never answers thus keeps at most half the slots for a
// lookup timeout each, and the other namespaces' lookups start at once
// rather than being denied for a registry they never named. A lookup that
// gets no slot within its review's budget is denied as RegistryBusy, never
// as RegistryTimeout: its registry was not asked.
type Resolver struct {
	timeout, budget        time.Duration
	maxManifest, maxConfig int64
	platform               v1.Platform
	policy                 *destinationPolicy
	transport              *guardedTransport
	slots                  *lookupSlots
	cache                  *imageConfigCache
	// salt makes the cache's credential hashes meaningless outside this
	// process.
	salt [32]byte
}

// NewResolver returns a Resolver; zero or negative options take their defaults
// (Options.Validate reports them).
func NewResolver(opts Options) *Resolver {
	positive := func(v, def int64) int64 {
		if v <= 0 {
			return def
		}
		return v
	}
	r := &Resolver{
		timeout:     time.Duration(positive(int64(opts.Timeout), int64(DefaultResolveTimeout))),
		budget:      time.Duration(positive(int64(opts.ReviewBudget), int64(DefaultReviewBudget))),
		maxManifest: positive(opts.MaxManifestBytes, DefaultMaxManifestBytes),
		maxConfig:   positive(opts.MaxConfigBytes, DefaultMaxConfigBytes),
		platform:    v1.Platform{OS: "linux", Architecture: "amd64"},
		slots:       newLookupSlots(int(positive(int64(opts.MaxConcurrentLookups), DefaultMaxConcurrentLookups))),
		cache:       newImageConfigCache(opts.CacheSize),
		policy: &destinationPolicy{
			allowed:     opts.AllowedRegistries,
			denied:      opts.DeniedRegistries,
			insecure:    opts.InsecureRegistries,
			private:     opts.PrivateRegistries,
			anyInsecure: opts.Insecure,
		},
	}
	if opts.Platform != nil {
		r.platform = *opts.Platform
	}
	r.transport = newGuardedTransport(r.policy, r.maxManifest, r.maxConfig)
	_, _ = rand.Read(r.salt[:]) // never fails (crypto/rand)
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
// namespace is the Job's: the lookup slots are shared fairly among
// namespaces (see Resolver). kc holds the pod's registry credentials (see
// PullSecretKeychain); nil, or no match for the registry, queries it
// anonymously.
func (r *Resolver) Entrypoint(ctx context.Context, namespace string, c corev1.Container, kc authn.Keychain) ([]string, error) {
	cfg, err := r.imageConfig(ctx, namespace, c.Image, orAnonymous(kc))
	return containerEntrypoint(c, cfg, err)
}

func orAnonymous(kc authn.Keychain) authn.Keychain {
	if kc == nil {
		return authn.NewMultiKeychain()
	}
	return kc
}

// Entrypoints resolves the entrypoints of containers (see Entrypoint), by
// container name. The lookups run in parallel, one per distinct image, and
// all of them inside the review budget: a slow registry gets the review a
// clear denial before the API server's own timeout would fail it. Every
// container that cannot be resolved is listed in the error. namespace is the
// Job's, whose share of the lookup slots the lookups use (see Resolver).
func (r *Resolver) Entrypoints(ctx context.Context, namespace string, containers []corev1.Container, kc authn.Keychain) (map[string][]string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.budget)
	defer cancel()
	kc = orAnonymous(kc)
	type result struct {
		cfg imageEntrypoint
		err error
	}
	results := make(map[string]*result, len(containers))
	var wg sync.WaitGroup
	// One review holds at most maxLookupsPerReview of the webhook's shared
	// slots: a Job with many images from a registry that never answers
	// cannot take them all from other namespaces' reviews.
	mine := make(chan struct{}, maxLookupsPerReview)
	for _, c := range containers {
		if _, ok := results[c.Image]; ok {
			continue
		}
		res := &result{}
		results[c.Image] = res
		wg.Go(func() {
			select {
			case mine <- struct{}{}:
				defer func() { <-mine }()
			case <-ctx.Done():
				res.err = registryErr(RegistryBusy, ctx.Err(), "the registry was never asked: the Job's other images held the %d lookups a review may run at once until the review ran out of time",
					maxLookupsPerReview)
				return
			}
			res.cfg, res.err = r.imageConfig(ctx, namespace, c.Image, kc)
		})
	}
	wg.Wait()
	out := make(map[string][]string, len(containers))
	var errs []error
	for _, c := range containers {
		res := results[c.Image]
		ep, err := containerEntrypoint(c, res.cfg, res.err)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[c.Name] = ep
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

func containerEntrypoint(c corev1.Container, cfg imageEntrypoint, err error) ([]string, error) {
	if err == nil && len(cfg.entrypoint) == 0 && len(cfg.cmd) == 0 {
		err = ErrNoImageEntrypoint
	}
	if err != nil {
		return nil, fmt.Errorf("container %q: cannot resolve the entrypoint of image %q (%w); set the container's command or the annotation %s",
			c.Name, c.Image, err, contract.AnnotationEntrypoint)
	}
	out := make([]string, 0, len(cfg.entrypoint)+len(cfg.cmd))
	out = append(out, cfg.entrypoint...)
	if len(c.Args) == 0 {
		out = append(out, cfg.cmd...)
	}
	return out, nil
}

// imageConfig returns the Entrypoint and Cmd of image.
//
// The cache is keyed by repository, digest and the credential the requester
// would use (a salted hash of it), so it never answers a requester with
// another's credential: a tenant without a pull secret asking for a private
// image by digest misses the cache and is refused by the registry itself.
// The alternative, an authenticated HEAD of the manifest before every cache
// hit, would also notice a revoked credential, but costs a registry round
// trip (ping, token, HEAD) on every review, so a registry outage would deny
// Jobs whose images are cached; a requester holding the same credential as
// before has already proven it could pull the image.
//
// A reference by digest is answered from the cache without any request. A
// tag is resolved to its digest on every call (tags move, so that answer is
// never cached), and only the config behind the digest, which can never
// change, comes from the cache.
func (r *Resolver) imageConfig(ctx context.Context, namespace, image string, kc authn.Keychain) (imageEntrypoint, error) {
	if image == "" {
		return imageEntrypoint{}, errors.New("the container has no image")
	}
	ref, err := name.ParseReference(image)
	if err != nil {
		return imageEntrypoint{}, fmt.Errorf("parsing the image reference: %w", err)
	}
	if err := r.policy.checkRegistry(registryHostPort(ref.Context().Registry)); err != nil {
		return imageEntrypoint{}, err
	}
	if r.policy.anyInsecure || r.policy.insecure.match(registryHostPort(ref.Context().Registry)) {
		if ref, err = name.ParseReference(image, name.Insecure); err != nil {
			return imageEntrypoint{}, fmt.Errorf("parsing the image reference: %w", err)
		}
	}
	cred, err := r.credentialID(ctx, kc, ref.Context())
	if err != nil {
		return imageEntrypoint{}, registryErr(RegistryUnauthorized, err, "the pull secret for the registry could not be used")
	}
	if d, ok := ref.(name.Digest); ok {
		if cfg, ok := r.cache.get(imageConfigKey(d.Context(), d.DigestStr(), cred)); ok {
			return cfg, nil
		}
	}

	// The wait for a slot spends the review's budget, not the lookup's
	// timeout: a lookup that waited behind other reviews' slow registries
	// still gets its whole timeout once it starts.
	waitStart := time.Now()
	if busy, err := r.slots.acquire(ctx, namespace); err != nil {
		waited := time.Since(waitStart).Round(10 * time.Millisecond)
		// The tenant learns what its own namespace holds, which tells its
		// own lookups from other tenants' apart; which namespace holds the
		// rest is for the operator only.
		logf.FromContext(ctx).Info("registry lookup never started: every lookup slot it may use was busy",
			"image", image, "namespace", namespace, "waited", waited.String(), "held", busy.held, "slots", busy.total, "share", busy.share,
			"busiestNamespace", busy.busiest, "busiestHeld", busy.busiestHeld)
		if busy.held >= busy.share {
			return imageEntrypoint{}, registryErr(RegistryBusy, err,
				"the registry was never asked: namespace %s holds its share of the webhook's registry lookups (%d of %d) with its other lookups, and none of them ended in the %s this one could wait",
				namespace, busy.held, busy.total, waited)
		}
		return imageEntrypoint{}, registryErr(RegistryBusy, err,
			"the registry was never asked: the webhook's registry lookups were all busy for the %s this one could wait; namespace %s holds %d of %d",
			waited, namespace, busy.held, busy.total)
	}
	defer r.slots.release(namespace)
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	lt := &lookupTransport{g: r.transport}
	cfg, err := r.fetch(ctx, ref, kc, cred, lt)
	if err != nil {
		re := classifyRegistryError(ctx, err, lt.firstRefusal(), r.timeout)
		// The cause, which may quote the registry, is for the operator only.
		logf.FromContext(ctx).Info("registry lookup failed", "image", image, "class", string(re.Class), "cause", err.Error())
		return imageEntrypoint{}, re
	}
	return cfg, nil
}

func (r *Resolver) fetch(ctx context.Context, ref name.Reference, kc authn.Keychain, cred string, lt *lookupTransport) (imageEntrypoint, error) {
	// One Puller per lookup: it authenticates once for the HEAD and the GETs
	// that follow. It cannot be shared between lookups because the keychain
	// comes from each pod's own pull secrets.
	puller, err := remote.NewPuller(
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(kc),
		remote.WithTransport(lt),
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
			if ctx.Err() != nil || lt.firstRefusal() != nil {
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
	key := imageConfigKey(digest.Context(), digest.DigestStr(), cred)
	if cfg, ok := r.cache.get(key); ok {
		return cfg, nil
	}

	if got == nil {
		if got, err = puller.Get(ctx, digest); err != nil {
			return imageEntrypoint{}, err
		}
	}
	m, err := r.imageManifest(ctx, puller, digest.Context(), got)
	if err != nil {
		return imageEntrypoint{}, err
	}
	cfg, err := r.configBlob(ctx, puller, digest.Context(), m.Config)
	if err != nil {
		return imageEntrypoint{}, err
	}
	// For an index the entry is r.platform's image; the cache belongs to
	// this Resolver, whose platform is fixed, so the index digest is a valid
	// key.
	r.cache.add(key, cfg)
	return cfg, nil
}

// manifestOrIndex is the part of an image manifest or index the resolver
// reads.
type manifestOrIndex struct {
	MediaType types.MediaType `json:"mediaType"`
	Config    *v1.Descriptor  `json:"config"`
	// Manifests is an index's entries, read one at a time (indexEntries):
	// decoded all at once, a few bytes of JSON per empty entry become a
	// whole descriptor each, and a 4 MiB index took half a gigabyte.
	Manifests json.RawMessage `json:"manifests"`
}

// indexEntry is what the webhook reads of an index's entry.
type indexEntry struct {
	Digest   v1.Hash      `json:"digest"`
	Size     int64        `json:"size"`
	Platform *v1.Platform `json:"platform"`
}

// maxIndexEntries bounds the entries of an index the webhook reads; real
// indexes have a few dozen (platforms and attestations).
const maxIndexEntries = 1024

// maxLookupsPerReview bounds how many of the webhook's shared lookup slots
// one review holds at a time.
const maxLookupsPerReview = 4

// platformEntry returns the first entry of an index's manifests that is for
// platform, reading the entries one at a time.
func platformEntry(manifests json.RawMessage, platform v1.Platform) (*indexEntry, error) {
	dec := json.NewDecoder(bytes.NewReader(manifests))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil, registryErr(RegistryInvalid, err, "the image index's manifests are not a list")
	}
	for n := 0; dec.More(); n++ {
		if n == maxIndexEntries {
			return nil, registryErr(RegistryTooLarge, nil, "the image index has more than %d entries", maxIndexEntries)
		}
		var e indexEntry
		if err := dec.Decode(&e); err != nil {
			return nil, registryErr(RegistryInvalid, err, "the image index's entry %d is not valid JSON", n)
		}
		// An entry without a platform is linux/amd64, as go-containerregistry
		// and the container runtimes read it.
		p := v1.Platform{OS: "linux", Architecture: "amd64"}
		if e.Platform != nil {
			p = *e.Platform
		}
		if p.Satisfies(platform) {
			return &e, nil
		}
	}
	return nil, nil
}

func parseManifest(d *remote.Descriptor) (manifestOrIndex, bool, error) {
	var m manifestOrIndex
	if err := json.Unmarshal(d.Manifest, &m); err != nil {
		return m, false, registryErr(RegistryInvalid, err, "the registry's manifest is not valid JSON")
	}
	mt := cmp.Or(d.MediaType, m.MediaType)
	isIndex := mt.IsIndex() || (m.Config == nil && len(m.Manifests) > 0 && string(m.Manifests) != "null")
	if !isIndex && m.Config == nil {
		return m, false, registryErr(RegistryInvalid, nil, "the manifest (%s) has no image config", mt)
	}
	return m, isIndex, nil
}

// imageManifest returns the image manifest of got: got itself, or for an
// index, the entry for r.platform. Only one level of index is followed, and
// the entry's size is checked before it is fetched. An index's cost is
// bounded by its bytes (MaxManifestBytes): it is decoded once and scanned
// once, entry by entry, up to maxIndexEntries.
func (r *Resolver) imageManifest(ctx context.Context, puller *remote.Puller, repo name.Repository, got *remote.Descriptor) (manifestOrIndex, error) {
	m, isIndex, err := parseManifest(got)
	if err != nil || !isIndex {
		return m, err
	}
	child, err := platformEntry(m.Manifests, r.platform)
	if err != nil {
		return manifestOrIndex{}, err
	}
	if child == nil {
		return manifestOrIndex{}, registryErr(RegistryNotFound, nil, "the image index has no image for platform %s", r.platform.String())
	}
	if child.Digest.Algorithm == "" || child.Digest.Hex == "" {
		return manifestOrIndex{}, registryErr(RegistryInvalid, nil, "the image index's entry for %s has no digest", r.platform.String())
	}
	if child.Size > r.maxManifest {
		return manifestOrIndex{}, registryErr(RegistryTooLarge, nil, "the image index declares a %s manifest of %d bytes, more than the %d the webhook reads", r.platform.String(), child.Size, r.maxManifest)
	}
	childGot, err := puller.Get(ctx, repo.Digest(child.Digest.String()))
	if err != nil {
		return manifestOrIndex{}, err
	}
	m, isIndex, err = parseManifest(childGot)
	if err != nil {
		return m, err
	}
	if isIndex {
		return manifestOrIndex{}, registryErr(RegistryInvalid, nil, "the image index's entry for %s is another index, which the webhook does not follow", r.platform.String())
	}
	return m, nil
}

// configBlob reads the image config: its declared size is checked before
// the request, and no more than that size is read.
func (r *Resolver) configBlob(ctx context.Context, puller *remote.Puller, repo name.Repository, d *v1.Descriptor) (imageEntrypoint, error) {
	if d.Size > r.maxConfig {
		return imageEntrypoint{}, registryErr(RegistryTooLarge, nil, "the manifest declares an image config of %d bytes, more than the %d the webhook reads", d.Size, r.maxConfig)
	}
	if d.Size <= 0 {
		return imageEntrypoint{}, registryErr(RegistryInvalid, nil, "the manifest declares an image config of %d bytes", d.Size)
	}
	layer, err := puller.Layer(ctx, repo.Digest(d.Digest.String()))
	if err != nil {
		return imageEntrypoint{}, err
	}
	rc, err := layer.Compressed()
	if err != nil {
		return imageEntrypoint{}, err
	}
	defer rc.Close()
	// One byte past the declared size tells a longer blob from an exact one;
	// go-containerregistry checks the digest when the body ends.
	raw, err := io.ReadAll(io.LimitReader(rc, d.Size+1))
	if err != nil {
		return imageEntrypoint{}, err
	}
	if int64(len(raw)) != d.Size {
		return imageEntrypoint{}, registryErr(RegistryInvalid, nil, "the image config is %d bytes, not the %d its manifest declares", len(raw), d.Size)
	}
	if h, _, err := v1.SHA256(bytes.NewReader(raw)); err != nil || h != d.Digest {
		return imageEntrypoint{}, registryErr(RegistryInvalid, err, "the image config does not match its digest")
	}
	file, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return imageEntrypoint{}, registryErr(RegistryInvalid, err, "the image config is not valid JSON")
	}
	return imageEntrypoint{entrypoint: slices.Clone(file.Config.Entrypoint), cmd: slices.Clone(file.Config.Cmd)}, nil
}

// credentialID names the credential a requester would use for repo: a salted
// hash, so the cache holds no secret and no two credentials share entries.
func (r *Resolver) credentialID(ctx context.Context, kc authn.Keychain, repo name.Repository) (string, error) {
	a, err := kc.Resolve(repo)
	if err != nil {
		return "", err
	}
	if a == authn.Anonymous {
		return "anonymous", nil
	}
	cfg, err := authn.Authorization(ctx, a)
	if err != nil {
		return "", err
	}
	if *cfg == (authn.AuthConfig{}) {
		return "anonymous", nil
	}
	h := sha256.New()
	h.Write(r.salt[:])
	for _, f := range []string{cfg.Username, cfg.Password, cfg.Auth, cfg.IdentityToken, cfg.RegistryToken} {
		fmt.Fprintf(h, "%d:%s;", len(f), f)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// registryHostPort is the registry's host with the HTTPS port made explicit
// when the image names none.
func registryHostPort(reg name.Registry) string {
	if _, port := splitHostPort(reg.RegistryStr()); port != "" {
		return strings.ToLower(reg.RegistryStr())
	}
	return strings.ToLower(reg.RegistryStr()) + ":443"
}

// imageEntrypoint is what the cache keeps of an image config.
type imageEntrypoint struct {
	entrypoint, cmd []string
}

// imageConfigKey names an image by repository, digest and credential. The
// repository is part of the key so that a lookup in one repository never
// answers for another one; the digest makes the entry immutable; the
// credential (see credentialID) keeps one requester's access from answering
// another.
func imageConfigKey(repo name.Repository, digest, cred string) string {
	return repo.Name() + "@" + digest + " " + cred
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

// maxRegistryCredentials bounds the credentials one review keeps from the
// pod's pull secrets for the registries it looks up.
const maxRegistryCredentials = 64

// PullSecretKeychain matches the pod's pull secrets to registries as the
// kubelet's keyring does (go-containerregistry's authn/kubernetes follows
// it): by host and port, "*" globs per DNS label, a repository path prefix,
// the most specific key first, and among equal keys the first Secret's.
//
// The docker configs are the tenant's bytes, so they are read here first,
// once, and only the entries for the registries of the images looked up
// (hosts, as go-containerregistry names them) are handed on, at most
// maxRegistryCredentials of them: the library re-reads every earlier Secret
// for each one, and a megabyte of entries cost it seconds and gigabytes.
// Host names are compared without case, and Docker Hub's names (docker.io,
// registry-1.docker.io, ...) are one, as for the kubelet. Entries that
// cannot be parsed or hold no credentials are skipped, as the kubelet skips
// them: the pull would not use them either, and if credentials were needed
// the registry's refusal says so.
func PullSecretKeychain(ctx context.Context, secrets []corev1.Secret, hosts []string) (authn.Keychain, error) {
	auths := map[string]authn.AuthConfig{}
	for _, s := range secrets {
		var entries map[string]json.RawMessage
		switch s.Type {
		case corev1.SecretTypeDockerConfigJson:
			var top struct {
				Auths map[string]json.RawMessage `json:"auths"`
			}
			if json.Unmarshal(s.Data[corev1.DockerConfigJsonKey], &top) != nil {
				continue
			}
			entries = top.Auths
		case corev1.SecretTypeDockercfg:
			if json.Unmarshal(s.Data[corev1.DockerConfigKey], &entries) != nil {
				continue
			}
		}
		for _, k := range slices.Sorted(maps.Keys(entries)) { // map order is random; the first match must not be
			host, repoPath := parseRegistryKey(k)
			if host == "" || !slices.ContainsFunc(hosts, func(h string) bool { return registryHostMatches(host, canonicalRegistryHost(h)) }) {
				continue
			}
			var cfg authn.AuthConfig
			if json.Unmarshal(entries[k], &cfg) != nil ||
				cfg.Auth == "" && cfg.Username == "" && cfg.Password == "" && cfg.IdentityToken == "" && cfg.RegistryToken == "" {
				continue
			}
			key := path.Join(host, repoPath)
			if _, seen := auths[key]; seen {
				continue
			}
			if len(auths) == maxRegistryCredentials {
				return nil, fmt.Errorf("the pod's image pull secrets hold more than %d credentials for the registries %s; the webhook uses at most %d: "+
					"set the container's command, or the annotation %s on the CronJob", maxRegistryCredentials, strings.Join(hosts, ", "), maxRegistryCredentials, contract.AnnotationEntrypoint)
			}
			auths[key] = cfg
		}
	}
	config, err := json.Marshal(map[string]any{"auths": auths})
	if err != nil {
		return nil, err
	}
	return kauth.NewFromPullSecrets(ctx, []corev1.Secret{{Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: config}}})
}

// Hosts are the registries (host[:port], as go-containerregistry
// names them) of the containers' images; an image that does not parse is
// left to the lookup to report.
func Hosts(containers []corev1.Container) []string {
	var hosts []string
	for _, c := range containers {
		if ref, err := name.ParseReference(c.Image); err == nil && !slices.Contains(hosts, ref.Context().RegistryStr()) {
			hosts = append(hosts, ref.Context().RegistryStr())
		}
	}
	return hosts
}

// parseRegistryKey splits a config key such as "reg.example.com",
// "https://reg.example.com:5000/team" or "https://index.docker.io/v1/" into
// host (canonical: see canonicalRegistryHost) and repository path.
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

// canonicalRegistryHost lowercases a registry host and folds Docker Hub's
// names into the one go-containerregistry uses.
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
