package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
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
// it exists.
//
// What a namespace's digests were is kept for CacheFor. A credential that
// matches them is taken for another CacheFor after that while one read
// refreshes them behind it, so a namespace's calls never wait for a
// refresh: a retired credential is refused at most 2 × CacheFor after its
// retirement. A credential that matches none is read again at once, but at
// most once a second per namespace. Reads never hold a namespace's calls:
// one read per namespace at a time, the others waiting for its answer; and
// the namespaces that had digests read on their own slots, apart from the
// names nobody holds a credential for, which whoever reaches the port may
// make up: those cost the database at most a few reads at a time, and are
// forgotten once maxKnownNamespaces are remembered.
type DatabaseCredentials struct {
	// Lookup reads the namespace's live digests (tenant.GatewayDigests with
	// the owner's Store and the gateway's cluster).
	Lookup   func(ctx context.Context, namespace string) ([][sha256.Size]byte, error)
	CacheFor time.Duration

	mu    sync.Mutex
	known map[string]*digests
	// Read slots: for namespaces that had digests when last read, and for
	// every other name.
	holders, strangers chan struct{}
}

// digests are one namespace's, as last read.
type digests struct {
	mu   sync.Mutex
	list [][sha256.Size]byte
	read time.Time
	// reading is closed when the read under way ends (nil: none).
	reading chan struct{}
}

// DefaultCredentialCache is how long a namespace's digests are kept: a
// retired credential is refused at most twice this long after its
// retirement (which comes a grace of days after it was superseded).
const DefaultCredentialCache = 30 * time.Second

// readSlots bounds DatabaseCredentials' reads at once, for each kind of
// name, and maxKnownNamespaces the namespaces it remembers.
const (
	readSlots          = 2
	maxKnownNamespaces = 10000
)

// namespaceName is a Kubernetes namespace name (an RFC 1123 label): a
// caller naming anything else is refused without a read.
var namespaceName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

var errTooManyNames = errors.New("too many namespace names tried at once; try again")

// Check implements Credentials.
func (c *DatabaseCredentials) Check(ctx context.Context, namespace, secret string) error {
	if !namespaceName.MatchString(namespace) {
		return fmt.Errorf("%q is not a namespace name", namespace)
	}
	if secret == "" {
		return fmt.Errorf("no credential for namespace %q", namespace)
	}
	want := tenant.Digest(secret)
	refused := fmt.Errorf("the credential of namespace %q is not a current one", namespace)
	d := c.entry(namespace)
	if d == nil {
		return errTooManyNames
	}
	for {
		d.mu.Lock()
		age, match := time.Since(d.read), matches(d.list, want)
		switch {
		case !d.read.IsZero() && match && age < c.cacheFor():
			d.mu.Unlock()
			return nil
		case !d.read.IsZero() && match && age < 2*c.cacheFor():
			if d.reading == nil {
				d.reading = make(chan struct{})
				go c.refresh(namespace, d, len(d.list) > 0)
			}
			d.mu.Unlock()
			return nil
		case !d.read.IsZero() && !match && age < time.Second:
			d.mu.Unlock()
			return refused
		case d.reading != nil:
			// Another call reads them: wait for its answer and look again.
			reading := d.reading
			d.mu.Unlock()
			select {
			case <-reading:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		d.reading = make(chan struct{})
		holder := len(d.list) > 0
		d.mu.Unlock()
		err := c.readInto(ctx, namespace, d, holder)
		if err != nil {
			return fmt.Errorf("reading the credentials of namespace %q: %w", namespace, err)
		}
		d.mu.Lock()
		match = matches(d.list, want)
		d.mu.Unlock()
		if !match {
			return refused
		}
		return nil
	}
}

// refresh reads namespace's digests again behind the calls it lets through.
func (c *DatabaseCredentials) refresh(namespace string, d *digests, holder bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = c.readInto(ctx, namespace, d, holder)
}

// readInto reads namespace's digests into d once a read slot is free, and
// ends d's read under way, read or not.
func (c *DatabaseCredentials) readInto(ctx context.Context, namespace string, d *digests, holder bool) error {
	list, err := c.read(ctx, namespace, holder)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		d.list, d.read = list, time.Now()
	}
	close(d.reading)
	d.reading = nil
	return err
}

// read reads namespace's digests once a slot of its kind is free.
func (c *DatabaseCredentials) read(ctx context.Context, namespace string, holder bool) ([][sha256.Size]byte, error) {
	c.mu.Lock()
	if c.holders == nil {
		c.holders, c.strangers = make(chan struct{}, readSlots), make(chan struct{}, readSlots)
	}
	slots := c.strangers
	if holder {
		slots = c.holders
	}
	c.mu.Unlock()
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-slots }()
	return c.Lookup(ctx, namespace)
}

func (c *DatabaseCredentials) cacheFor() time.Duration {
	if c.CacheFor > 0 {
		return c.CacheFor
	}
	return DefaultCredentialCache
}

// entry is namespace's, or nil when maxKnownNamespaces are remembered and
// none of them can be forgotten.
func (c *DatabaseCredentials) entry(namespace string) *digests {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known == nil {
		c.known = map[string]*digests{}
	}
	d, ok := c.known[namespace]
	if !ok {
		if len(c.known) >= maxKnownNamespaces {
			c.forgetStrangers()
			if len(c.known) >= maxKnownNamespaces {
				return nil
			}
		}
		d = &digests{}
		c.known[namespace] = d
	}
	return d
}

// forgetStrangers drops the names that had no credential when last read,
// or were never read, and are not being read; c.mu is held.
func (c *DatabaseCredentials) forgetStrangers() {
	for ns, d := range c.known {
		if d.mu.TryLock() {
			if len(d.list) == 0 && d.reading == nil {
				delete(c.known, ns)
			}
			d.mu.Unlock()
		}
	}
}

// matches compares in time independent of which digest, if any, matches.
func matches(list [][sha256.Size]byte, want [sha256.Size]byte) bool {
	found := 0
	for _, d := range list {
		found |= subtle.ConstantTimeCompare(d[:], want[:])
	}
	return found == 1
}
