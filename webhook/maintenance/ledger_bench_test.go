package maintenance

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/ledger"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/pgtest"
)

// Ledger benchmark scale: 10 000 keys (100 namespaces of 100 CronJobs, every
// one hourly, schedule,lease, in three clusters) with 30 days of history.
const (
	benchNamespaces = 100
	benchKeysPerNS  = 100
	benchDays       = 30
)

// BenchmarkLedgerMetrics measures what the ledger metrics cost at 10 000
// keys × 30 days of hourly windows (7.2 million windows and as many ledger
// rows): the leader's computation (the detection judging each key's newest
// hour, the statistics, the views, the snapshot stored), a replica's load of
// the snapshot, the scrape of /metrics, and the detection's first run
// (every key's last day judged). The baselines, measured on the same
// server in the same run, are a SELECT 1 and a scrape of the ledger's
// metrics without a key.
func BenchmarkLedgerMetrics(b *testing.B) {
	ctx := log.IntoContext(context.Background(), logr.Discard())
	srv, err := pgtest.Start(pgtest.Options{Name: "ledger-bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close() })
	db, err := store.Open(ctx, srv.DirectDSN(), store.Options{MaxConns: 4})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(db.Close)
	if _, err := migrate.Up(ctx, db); err != nil {
		b.Fatal(err)
	}
	raw, err := pgx.Connect(ctx, srv.DirectDSN())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { raw.Close(context.Background()) })
	began := time.Now()
	populateLedger(b, raw)
	b.Logf("populated %d keys × %d days in %s", benchNamespaces*benchKeysPerNS, benchDays, time.Since(began).Round(time.Second))

	// One hour to judge per key, as in steady state (hourly windows).
	rewind := func(b *testing.B, by string) {
		b.Helper()
		b.StopTimer()
		if _, err := raw.Exec(ctx, `UPDATE dislock.key_stats SET checked_until = date_trunc('hour', now()) - $1::interval`, by); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	leader := NewLedgerMetrics(db, "dc-a", nil)

	b.Run("select1", func(b *testing.B) {
		for b.Loop() {
			if _, err := db.Now(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Every key has its newest hour to judge: the computation after each
	// hour's grace.
	b.Run("compute-each-key-a-window", func(b *testing.B) {
		var last *ledgerSnapshot
		for b.Loop() {
			rewind(b, "2 hours")
			if err := leader.Compute(ctx); err != nil {
				b.Fatal(err)
			}
			leader.state.mu.RLock()
			last = leader.state.snapshot
			leader.state.mu.RUnlock()
		}
		body, _ := json.Marshal(last)
		b.ReportMetric(float64(len(body)), "snapshot-bytes")
		b.ReportMetric(float64(len(last.Keys)), "keys")
		for q, d := range last.Queries {
			b.ReportMetric(d, q+"-s")
		}
	})
	// Most computations find no window whose grace ended since the last.
	b.Run("compute-nothing-new", func(b *testing.B) {
		for b.Loop() {
			if err := leader.Compute(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("detect-first-run", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			if _, err := raw.Exec(ctx, `UPDATE dislock.key_stats SET checked_until = NULL`); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			det, err := ledger.DetectMissed(ctx, db, ledger.MissedOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(det.Windows), "windows-judged")
		}
	})
	replica := NewLedgerMetrics(db, "dc-a", nil)
	b.Run("refresh", func(b *testing.B) {
		for b.Loop() {
			replica.state.loaded = time.Time{} // load it again each time
			if err := replica.Refresh(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The baseline serves what a replica serves of the ledger with no key:
	// the snapshot's own series and the replica's ping.
	withoutKeys := prometheus.NewRegistry()
	withoutKeys.MustRegister(ledgerCollector{state: &ledgerState{pinged: true, up: true,
		snapshot: &ledgerSnapshot{Version: ledgerSnapshotVersion, Queries: map[string]float64{}}}})
	withLedger := prometheus.NewRegistry()
	withLedger.MustRegister(replica.Collector())
	for name, reg := range map[string]*prometheus.Registry{"scrape-without-keys": withoutKeys, "scrape-with-ledger": withLedger} {
		b.Run(name, func(b *testing.B) {
			ts := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
			defer ts.Close()
			var n int64
			for b.Loop() {
				resp, err := http.Get(ts.URL)
				if err != nil {
					b.Fatal(err)
				}
				n, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("scrape: %d %v", resp.StatusCode, err)
				}
			}
			b.ReportMetric(float64(n), "bytes")
		})
	}
}

// populateLedger writes the history the agents of three clusters would
// have left: per key, a view per cluster, 30 days of hourly windows owned by
// dc-a (succeeded), a run and a skip decision per window, the counts and
// statistics, and a lease, held for a tenth of the keys.
func populateLedger(b *testing.B, raw *pgx.Conn) {
	b.Helper()
	ctx := context.Background()
	keys := fmt.Sprintf(`SELECT 'bench-' || n || '/job-' || k AS lock_key FROM generate_series(1, %d) n, generate_series(1, %d) k`,
		benchNamespaces, benchKeysPerNS)
	hours := fmt.Sprintf(`SELECT generate_series(date_trunc('hour', now()) - interval '%d days', date_trunc('hour', now()) - interval '1 hour', interval '1 hour') AS w`, benchDays)
	for _, q := range []string{
		`INSERT INTO dislock.views (lock_key, cluster, view, seen_at)
		 SELECT lock_key, c, '{"schedule":"0 * * * *","timeZone":"Europe/Berlin","mode":"schedule,lease","standby":false,"leaseTTL":"30s","catchup":""}', now()
		 FROM (` + keys + `) k, unnest(ARRAY['dc-a', 'dc-b', 'dc-c']) c`,
		`INSERT INTO dislock.windows (lock_key, window_start, job_index, owner, cluster, pod, token, state, claimed_at, alive_until, finished_at, exit_code)
		 SELECT lock_key, w, -1, 'dc-a/ns/job/uid/pod', 'dc-a', 'pod', 1, 'succeeded', w + interval '1 second', w + interval '31 seconds', w + interval '61 seconds', 0
		 FROM (` + keys + `) k, (` + hours + `) h`,
		`INSERT INTO dislock.decisions (lock_key, window_start, job_index, cluster, job, pod, action, reason, token, decided_at)
		 SELECT lock_key, w, -1, c, 'job', 'pod', a, 'window claimed', 1, w + interval '1 second'
		 FROM (` + keys + `) k, (` + hours + `) h, (VALUES ('dc-a', 'run'), ('dc-b', 'skip')) d(c, a)`,
		`INSERT INTO dislock.decision_counts (lock_key, cluster, action, n)
		 SELECT lock_key, c, a, 24 * ` + fmt.Sprint(benchDays) + `
		 FROM (` + keys + `) k, (VALUES ('dc-a', 'run'), ('dc-a', 'succeeded'), ('dc-b', 'skip'), ('dc-c', 'skip')) d(c, a)`,
		`INSERT INTO dislock.key_stats (lock_key, first_seen, last_decided, last_success, duration_count, duration_sum, duration_buckets)
		 SELECT lock_key, now() - interval '` + fmt.Sprint(benchDays) + ` days', now(), now(), 720, 43200, ARRAY[0, 0, 0, 720, 720, 720, 720, 720]::bigint[]
		 FROM (` + keys + `) k`,
		`INSERT INTO dislock.leases (lock_key, owner, token, acquired_at, expire_at)
		 SELECT lock_key, 'dc-a/ns/job/uid/pod', 1, now() - interval '10 seconds',
		        CASE WHEN random() < 0.1 THEN now() + interval '1 hour' ELSE now() - interval '1 minute' END
		 FROM (` + keys + `) k`,
		`ANALYZE`,
	} {
		if _, err := raw.Exec(ctx, q); err != nil {
			b.Fatalf("%v\n%s", err, q)
		}
	}
}
