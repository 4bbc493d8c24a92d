package tokenrecord

import (
	"strings"
	"testing"
	"time"
)

// A record an operator or a tool edited is read back exactly, or refused
// naming the key: never half read.
func FuzzDecode(f *testing.F) {
	f.Add("1099511627790", "1", "7715777595272105342", "1", "dc-a", "2026-12-05T11:00:00Z")
	f.Add("-1", "x", "", "1e3", "", "yesterday")
	f.Fuzz(func(t *testing.T, high, epoch, sysid, timeline, cluster, at string) {
		data := map[string]string{keyHighWater: high, keyEpoch: epoch, keySystemID: sysid, keyTimeline: timeline, keyCluster: cluster, keyRecordedAt: at}
		rec, err := decode(data)
		if err != nil {
			if !strings.Contains(err.Error(), "data.") {
				t.Fatalf("the error does not name the key: %v", err)
			}
			return
		}
		if rec.HighWater < 0 || rec.Epoch < 0 {
			t.Fatalf("decoded a negative record %+v from %v", rec, data)
		}
		again, err := decode(encode(rec))
		if err != nil || again.HighWater != rec.HighWater || again.Epoch != rec.Epoch || again.Cluster != rec.Cluster ||
			!again.RecordedAt.Equal(rec.RecordedAt.Truncate(time.Second)) {
			t.Fatalf("round trip of %+v gave %+v, %v", rec, again, err)
		}
	})
}

func TestParseRefNamesTheFormOnBadInput(t *testing.T) {
	for _, bad := range []string{"", "dislock-token-record", "/x", "ns/", "Ns/x", "a/b/c"} {
		if _, err := ParseRef(bad); err == nil || !strings.Contains(err.Error(), "<namespace>/<name>") {
			t.Errorf("ParseRef(%q) = %v, want an error naming <namespace>/<name>", bad, err)
		}
	}
	if k, err := ParseRef("dislock-system/" + Name); err != nil || k.Namespace != "dislock-system" || k.Name != Name {
		t.Fatalf("ParseRef: %v %v", k, err)
	}
}
