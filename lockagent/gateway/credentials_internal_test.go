package gateway

import (
	"context"
	"crypto/sha256"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store/tenant"
)

// Made-up namespace names, however many and however slow their reads, never
// hold up a namespace that has credentials: its reads have slots of their
// own. And past maxKnownNamespaces a new name is refused, not remembered.
func TestMadeUpNamesNeverHoldUpANamespacesCredentials(t *testing.T) {
	stuck := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(stuck) }) }
	defer release()
	c := &DatabaseCredentials{CacheFor: time.Millisecond, Lookup: func(ctx context.Context, ns string) ([][sha256.Size]byte, error) {
		if strings.HasPrefix(ns, "stranger-") {
			select {
			case <-stuck:
			case <-ctx.Done():
			}
			return nil, nil
		}
		return [][sha256.Size]byte{tenant.Digest("s3cret")}, nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Check(ctx, "team", "s3cret"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() { _ = c.Check(ctx, "stranger-"+strings.Repeat("x", i%7)+string(rune('a'+i%26)), "guess") })
	}
	// Every stranger slot is taken and more strangers wait; team's
	// digests are long expired (beyond twice the cache), so it must read.
	deadline := time.Now().Add(10 * time.Second)
	for len(c.strangers) < readSlots {
		if time.Now().After(deadline) {
			t.Fatal("the made-up names never took the read slots")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(3 * c.CacheFor)
	if err := c.Check(ctx, "team", "s3cret"); err != nil {
		t.Fatalf("team's credential while made-up names' reads are stuck: %v", err)
	}
	release()
	wg.Wait()

	full := &DatabaseCredentials{Lookup: func(context.Context, string) ([][sha256.Size]byte, error) {
		return [][sha256.Size]byte{tenant.Digest("x")}, nil
	}}
	for i := range maxKnownNamespaces {
		full.entry("holder-" + strconv.Itoa(i)).list = [][sha256.Size]byte{{1}}
	}
	if err := full.Check(context.Background(), "one-more", "x"); err != errTooManyNames {
		t.Fatalf("a new name with every slot of memory held: %v, want a refusal", err)
	}
}
