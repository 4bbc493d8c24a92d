package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/dislock/dislock/lockagent/store/tenant"
)

// DatabaseCredentials check a namespace's credential against the digests of
// its live gateway credentials in the database (tenant.GatewayDigests),
// which the webhook mints: every replica of every cluster's gateway sees a
// new credential as soon as it is committed, before the Secret that carries
// it exists. What a namespace's digests were is kept for CacheFor, and read
// again sooner only for a credential that matches none of them, at most
// once a second per namespace: a pod with a credential minted a moment ago
// waits at most that second, and a caller guessing costs the database one
// read a second per namespace name it tries.
type DatabaseCredentials struct {
	// Lookup reads the namespace's live digests (tenant.GatewayDigests with
	// the owner's Store and the gateway's cluster).
	Lookup   func(ctx context.Context, namespace string) ([][sha256.Size]byte, error)
	CacheFor time.Duration

	mu    sync.Mutex
	known map[string]*digests
	// reading bounds the reads at once: whoever reaches the port chooses
	// the namespace names, and each unknown one costs a read.
	reading chan struct{}
}

// maxReadsAtOnce bounds DatabaseCredentials' reads at once, and
// maxKnownNamespaces the namespaces it remembers before it forgets those
// that had no credential.
const (
	maxReadsAtOnce     = 4
	maxKnownNamespaces = 10000
)

// digests are one namespace's, as last read.
type digests struct {
	mu   sync.Mutex // held while reading them again
	list [][sha256.Size]byte
	read time.Time
}

// DefaultCredentialCache is how long a namespace's digests are kept: a
// retired credential is refused at most this long after its retirement
// (which comes a grace of days after it was superseded).
const DefaultCredentialCache = 30 * time.Second

// namespaceName is a Kubernetes namespace name (an RFC 1123 label): a
// caller naming anything else is refused without a read.
var namespaceName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// Check implements Credentials.
func (c *DatabaseCredentials) Check(ctx context.Context, namespace, secret string) error {
	if !namespaceName.MatchString(namespace) {
		return fmt.Errorf("%q is not a namespace name", namespace)
	}
	if secret == "" {
		return fmt.Errorf("no credential for namespace %q", namespace)
	}
	want := tenant.Digest(secret)
	d := c.entry(namespace)
	d.mu.Lock()
	defer d.mu.Unlock()
	fresh := time.Since(d.read) < c.cacheFor()
	if fresh && matches(d.list, want) {
		return nil
	}
	if !d.read.IsZero() && time.Since(d.read) < time.Second {
		return fmt.Errorf("the credential of namespace %q is not a current one", namespace)
	}
	list, err := c.read(ctx, namespace)
	if err != nil {
		return fmt.Errorf("reading the credentials of namespace %q: %w", namespace, err)
	}
	d.list, d.read = list, time.Now()
	if !matches(list, want) {
		return fmt.Errorf("the credential of namespace %q is not a current one", namespace)
	}
	return nil
}

// read reads namespace's digests once a read may start.
func (c *DatabaseCredentials) read(ctx context.Context, namespace string) ([][sha256.Size]byte, error) {
	c.mu.Lock()
	if c.reading == nil {
		c.reading = make(chan struct{}, maxReadsAtOnce)
	}
	reading := c.reading
	c.mu.Unlock()
	select {
	case reading <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-reading }()
	return c.Lookup(ctx, namespace)
}

func (c *DatabaseCredentials) cacheFor() time.Duration {
	if c.CacheFor > 0 {
		return c.CacheFor
	}
	return DefaultCredentialCache
}

func (c *DatabaseCredentials) entry(namespace string) *digests {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known == nil {
		c.known = map[string]*digests{}
	}
	d, ok := c.known[namespace]
	if !ok {
		if len(c.known) >= maxKnownNamespaces {
			c.forgetUnknown()
		}
		d = &digests{}
		c.known[namespace] = d
	}
	return d
}

// matches compares in time independent of which digest, if any, matches.
func matches(list [][sha256.Size]byte, want [sha256.Size]byte) bool {
	found := 0
	for _, d := range list {
		found |= subtle.ConstantTimeCompare(d[:], want[:])
	}
	return found == 1
}

// forgetUnknown drops the namespaces that had no credential when last read
// (names a caller made up); c.mu is held.
func (c *DatabaseCredentials) forgetUnknown() {
	for ns, d := range c.known {
		if d.mu.TryLock() {
			if len(d.list) == 0 && !d.read.IsZero() {
				delete(c.known, ns)
			}
			d.mu.Unlock()
		}
	}
}
