package gateway_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/gateway"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/gatewaytest"
	"github.com/dislock/dislock/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, pgtest.Options{Name: "gateway"})) }

var seq atomic.Int64

// namespace is a namespace of the test's own.
func namespace() string { return fmt.Sprintf("gw-%d", seq.Add(1)) }

// migrated opens the owner's Store on dsn with the schema migrated.
func migrated(t *testing.T, dsn string) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), dsn, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := migrate.Up(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return s
}

var tick = time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)

func owner(cluster, ns, pod string) store.Owner {
	return store.Owner{Cluster: cluster, Namespace: ns, Job: "report-1", JobUID: "uid-" + cluster, Pod: pod}
}

func claimRequest(key string, o store.Owner) store.ClaimRequest {
	return store.ClaimRequest{Key: key, Window: tick, Index: store.NotIndexed, Owner: o, TTL: 30 * time.Second}
}

// awaitLane waits until the gateway's lane ("decisions", "renewals") is
// doing exactly want.
func awaitLane(t *testing.T, gw *gatewaytest.Gateway, lane string, want gateway.LaneStats) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for gw.Server.Lanes()[lane] != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s lane: %+v, want %+v", lane, gw.Server.Lanes()[lane], want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
