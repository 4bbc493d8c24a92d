package failover_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/benchmark"
	"github.com/dislock/dislock/test/hapg"
	"github.com/dislock/dislock/test/pgtest"
)

// BenchmarkClaimWindow prices synchronous replication: the same claims
// through a PgBouncer, against a single PostgreSQL (the baseline) and
// against a Patroni cluster in synchronous_mode (every commit waits for the
// sync standby), in the same run. All nodes share this host, so the figures
// hold the standby's flush but no network distance: between data centres,
// add one round trip to every claim.
func BenchmarkClaimWindow(b *testing.B) {
	single := pgtest.New(b, pgtest.Options{Name: "bench-single"})
	ha := hapg.New(b, hapg.Options{Name: "bench-sync"})
	for _, db := range []struct{ name, dsn string }{
		{"single-primary", single.BouncerDSN()},
		{"patroni-sync", ha.BouncerDSN("a")},
	} {
		migrateSchema(b, db.dsn)
		for _, clients := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/clients=%d", db.name, clients), func(b *testing.B) {
				s, err := store.Open(context.Background(), db.dsn, store.Options{MaxConns: int32(clients)})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				key := fmt.Sprintf("bench/%s-%d-%d", db.name, clients, time.Now().UnixNano())
				o := store.Owner{Cluster: "dc-a", Namespace: "bench", Job: "job", JobUID: "uid", Pod: "pod"}
				lat, elapsed := benchmark.Run(b, clients, func(i int64) error {
					_, err := s.ClaimWindow(context.Background(), store.ClaimRequest{Key: key, Window: windowAt(int(i)), Index: store.NotIndexed, Owner: o, TTL: time.Minute})
					return err
				})
				benchmark.Report(b, lat, time.Microsecond, "claims/s", float64(len(lat))/elapsed.Seconds())
			})
		}
	}
}
