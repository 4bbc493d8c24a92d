package secretcopy

import (
	"bytes"
	"maps"
	"testing"

	"github.com/dislock/dislock/webhook/inject"
)

// In copy mode a copy carries the source's keys, its ca.crt among them, and
// the webhook's CA as ca.crt when the source has none: the sidecar mounts
// that key.
func TestACopiedSecretCarriesTheCA(t *testing.T) {
	t.Parallel()
	src := map[string][]byte{"url": []byte("postgres://x")}
	if got := copiedData(src, nil); !maps.EqualFunc(got, src, bytes.Equal) {
		t.Errorf("without a CA: %v", got)
	}
	got := copiedData(src, []byte("ca"))
	if string(got[inject.DatabaseCAKey]) != "ca" || string(got["url"]) != "postgres://x" || src[inject.DatabaseCAKey] != nil {
		t.Errorf("a source without ca.crt: %v (source %v)", got, src)
	}
	own := map[string][]byte{"url": []byte("postgres://x"), inject.DatabaseCAKey: []byte("the source's")}
	if got := copiedData(own, []byte("ca")); string(got[inject.DatabaseCAKey]) != "the source's" {
		t.Errorf("a source with its own ca.crt: %v", got)
	}
}
