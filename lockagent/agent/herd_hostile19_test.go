package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/lockagent/spec"
	"github.com/dislock/dislock/test/benchscale"
)

// The heartbeats' row of the capacity table divides the winners' heartbeat
// statements by pgbench's throughput on the same statement. Both halves
// can flatter dislock without failing anything: a baseline whose UPDATE
// matches no row (a wrong parameter, a row-level security policy hiding
// the rows, a token above the tenant's high water) commits no WAL and runs
// many times faster than a real renewal, and a count of heartbeats that
// does not match the statement the agent sends reads 0/s. This holds both
// to what a user sizing a database reads: pgbench renews the rows it was
// given, as the tenant role, and the heartbeat phase counts one renewal
// per winner per interval.
func TestHerdHeartbeatFiguresCountRealRenewals(t *testing.T) {
	const keys = 20
	if err := benchscale.RaiseFileLimit(keys + 2000); err != nil {
		t.Fatal(err)
	}
	mode, err := spec.ParseMode("schedule")
	if err != nil {
		t.Fatal(err)
	}
	h := newHerd(t, keys, 3, 1)
	ctx := context.Background()

	saved := *herdBaseline
	*herdBaseline = 2 * time.Second
	t.Cleanup(func() { *herdBaseline = saved })
	tps := h.pgbenchHeartbeat(t)
	if tps <= 0 {
		t.Fatalf("pgbench's baseline is %.0f/s", tps)
	}
	// The rows were inserted alive for an hour; a renewal sets them alive
	// for the TTL (30 s). Rows still alive past a minute were never renewed.
	var renewed, all int
	if err := h.watch.DB.QueryRow(ctx, `SELECT count(*) FILTER (WHERE alive_until < now() + interval '1 minute'), count(*)
		FROM dislock.windows WHERE window_start = '2000-01-01T00:00:00Z'`).Scan(&renewed, &all); err != nil {
		t.Fatal(err)
	}
	// How many depends on the machine's load; none renewed means the
	// baseline measured a no-op.
	if renewed == 0 {
		t.Fatalf("pgbench ran the heartbeat at %.0f/s but renewed %d of its %d rows: the baseline measures a statement that does not write", tps, renewed, all)
	}

	// A heartbeat every TTL/3 = 10 s: over 11 s of running each winner
	// renews once (its first beat falls 10 s after its decision, and the
	// phase starts after the last decision, within the first second here).
	r := h.run(t, keys, mode, 11*time.Second)
	if r.errors != 0 || r.undecided != 0 || r.recordErrors != 0 {
		t.Fatalf("%d error decisions, %d undecided, %d successes not recorded", r.errors, r.undecided, r.recordErrors)
	}
	got := r.hbPerSec * r.hbWall.Seconds()
	if got < keys || got > 2*keys {
		// What pg_stat_statements holds for the heartbeat: it replaces the
		// statement's constants with $n, so its text is not the source's.
		var texts []string
		rows, err := h.watch.DB.Query(ctx, `SELECT calls || ' calls: ' || query FROM pg_stat_statements WHERE query LIKE 'UPDATE dislock.windows SET alive_until%'`)
		if err == nil {
			for rows.Next() {
				var s string
				if rows.Scan(&s) == nil {
					texts = append(texts, s)
				}
			}
			rows.Close()
		}
		// HeartbeatWindowSQL starts with a newline, which SQL's btrim
		// keeps: a prefix match needs it trimmed.
		prefix := strings.TrimSpace(lock.HeartbeatWindowSQL[:strings.Index(lock.HeartbeatWindowSQL, "'")])
		trimmed, _ := benchscale.Calls(ctx, h.watch.DB, prefix)
		t.Logf("benchscale.Calls(the heartbeat up to its first constant, trimmed) = %d", trimmed)
		t.Logf("statements by time over the heartbeat phase:\n  %s\nthe heartbeat as pg_stat_statements holds it:\n  %s",
			strings.Join(r.topHeartbeats, "\n  "), strings.Join(texts, "\n  "))
		t.Fatalf("the heartbeat phase counted %.1f heartbeats (%.2f/s over %s) from %d running winners, want %d..%d: the heartbeat row of the capacity table does not count the winners' renewals",
			got, r.hbPerSec, r.hbWall, keys, keys, 2*keys)
	}
	t.Logf("pgbench %.0f/s renewed %d of %d rows; %d winners renewed %.0f times in %s", tps, renewed, all, keys, got, r.hbWall)
}
