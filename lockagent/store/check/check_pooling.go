package check

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store/internal/db"
)

// qBackendPid names the PostgreSQL backend serving the statement.
const qBackendPid = `SELECT pg_backend_pid()`

// poolingRounds bounds how often poolingFinding repeats an ambiguous probe.
const poolingRounds = 3

// The ways a URL can reach PostgreSQL, as poolingFinding tells them apart.
type poolMode int

const (
	poolUnknown poolMode = iota
	// poolDirect: PostgreSQL itself, or a TCP proxy (HAProxy, a cloud
	// load balancer): one backend per client connection.
	poolDirect
	// poolTransaction: a pooler that hands a server connection to a client
	// per transaction (or per statement).
	poolTransaction
	// poolSession: a pooler that gives each client a server connection
	// until it disconnects, and the next client that connection again.
	poolSession
)

// poolingFinding tells how the URL reaches PostgreSQL by comparing the
// backend pids of connections of its own:
//
//   - two connections open at once share a backend: only a pooler that
//     hands server connections out per transaction (or statement) does
//     that; so does a connection whose backend changes between two
//     statements;
//   - otherwise close the first and open a third: it gets the first's
//     backend again when a pooler kept that server session for the next
//     client (session pooling); a new backend means each client has its
//     own (PostgreSQL itself, or a TCP proxy).
//
// Limits: a busy transaction pooler may hand every statement another
// backend; that is told by a changing pid, and a round that shows neither
// sign is repeated. A session pooler that does not reuse the last server
// connection first (server_round_robin = 1, or another idle connection
// picked) looks direct. Multi-host URLs are judged by the host the
// connections reached. The check opens three connections at most and
// holds two at once.
func (s checker) poolingFinding(ctx context.Context) Finding {
	mode, pids, err := s.probePooling(ctx)
	f := Finding{Check: "pooling"}
	switch {
	case err != nil:
		f.Status, f.Detail = StatusWarn, "cannot tell how the URL reaches PostgreSQL: "+err.Error()
		f.Fix = "run dislock check again; dislock wants PgBouncer in transaction pooling mode, or PostgreSQL directly"
	case mode == poolTransaction:
		f.Status = StatusOK
		f.Detail = fmt.Sprintf("through a pooler in transaction (or statement) mode: clients share server connections per transaction (backends %v)", pids)
	case mode == poolSession:
		f.Status = StatusWarn
		f.Detail = fmt.Sprintf("through a pooler in session mode (backend %d, held by an idle client, was not shared with the next one): "+
			"each pod then holds a server connection for its whole run, a standby for hours, and a few hundred pods exhaust the pool", pids[0])
		f.Fix = "set pool_mode = transaction in pgbouncer.ini (for dislock's database or users) and reload PgBouncer"
	default:
		f.Status = StatusOK
		f.Detail = fmt.Sprintf("directly to PostgreSQL or through a TCP proxy: each connection has its own backend (%v); "+
			"every pod holds a server connection while it runs, so size max_connections for the pods that run at once, or put PgBouncer in transaction mode in front", pids)
	}
	return f
}

// poolingWait bounds how long a probe connection waits for its first
// answer: longer means a pooler held it back while another client sat idle.
const poolingWait = 5 * time.Second

// probePooling runs the probe poolingFinding describes, up to poolingRounds
// times while the answer is ambiguous, and returns the pids it saw.
func (s checker) probePooling(ctx context.Context) (poolMode, []uint32, error) {
	var seen []uint32
	for range poolingRounds {
		mode, pids, err := s.probePoolingOnce(ctx)
		seen = append(seen, pids...)
		if err != nil || mode != poolUnknown {
			return mode, seen, err
		}
	}
	// Every round: distinct stable backends, and the third connection a
	// new one three times over: no pooler hands out backends like that.
	return poolDirect, seen, nil
}

// probePoolingOnce is one round; poolUnknown when it saw neither sign.
func (s checker) probePoolingOnce(ctx context.Context) (poolMode, []uint32, error) {
	a, err := s.connect(ctx)
	if err != nil {
		return poolUnknown, nil, err
	}
	defer a.Close(context.Background())
	b, err := s.connect(ctx)
	if err != nil {
		return poolUnknown, nil, err
	}
	defer b.Close(context.Background())
	var pidA, pidA2, pidB, pidB2 uint32
	for i, q := range []struct {
		c   *pgx.Conn
		pid *uint32
	}{{a, &pidA}, {b, &pidB}, {a, &pidA2}, {b, &pidB2}} {
		qctx, cancel := context.WithTimeout(ctx, poolingWait)
		err := q.c.QueryRow(qctx, qBackendPid).Scan(q.pid)
		cancel()
		if i == 1 && err != nil && qctx.Err() != nil && ctx.Err() == nil {
			// B waited for a server connection while A sat idle between
			// statements: a transaction pooler would have given it A's.
			// A session pooler whose pool A (or running pods) filled
			// holds it back instead, for up to query_wait_timeout.
			return poolSession, []uint32{pidA}, nil
		}
		if err != nil {
			return poolUnknown, nil, err
		}
	}
	pids := []uint32{pidA, pidB}
	if pidA == pidB || pidA2 == pidB2 || pidA != pidA2 || pidB != pidB2 {
		return poolTransaction, pids, nil
	}
	// The pooler learns of the close only when the terminate message
	// arrives; Close sends it before it returns.
	if err := a.Close(ctx); err != nil {
		return poolUnknown, pids, err
	}
	c, err := s.connect(ctx)
	if err != nil {
		return poolUnknown, pids, err
	}
	defer c.Close(context.Background())
	var pidC uint32
	if err := c.QueryRow(ctx, qBackendPid).Scan(&pidC); err != nil {
		return poolUnknown, pids, err
	}
	switch pidC {
	case pidA:
		return poolSession, []uint32{pidA, pidB, pidC}, nil
	case pidB:
		// B is idle between statements: a transaction pooler gave C its
		// backend.
		return poolTransaction, []uint32{pidA, pidB, pidC}, nil
	}
	return poolUnknown, []uint32{pidA, pidB, pidC}, nil
}

// clockWarnAbove is the clock offset above which check warns.
const clockWarnAbove = 2 * time.Second

// clockSamples is how many round trips clockFinding measures; the one with
// the shortest round trip bounds the offset best.
const clockSamples = 3

// clockFinding compares the database's clock with this host's: the
// database's now() against the midpoint of the round trip that read it,
// so the offset is known to within half the round trip.
func clockFinding(ctx context.Context, conn *pgx.Conn) Finding {
	var best, offset time.Duration
	for i := range clockSamples {
		var dbNow time.Time
		sent := time.Now()
		if err := conn.QueryRow(ctx, db.QNow).Scan(&dbNow); err != nil {
			return Finding{Check: "clock", Status: StatusWarn, Detail: "cannot read the database clock: " + err.Error(),
				Fix: "run dislock check again once the database answers"}
		}
		rtt := time.Since(sent)
		if i == 0 || rtt < best {
			best, offset = rtt, dbNow.Sub(sent.Add(rtt/2))
		}
	}
	detail := fmt.Sprintf("the database clock is %s %s this host's (round trip %s)", offset.Abs().Round(time.Millisecond), aheadOrBehind(offset), best.Round(time.Microsecond))
	if offset.Abs()-best/2 <= clockWarnAbove {
		return Finding{Check: "clock", Status: StatusOK, Detail: detail}
	}
	return Finding{Check: "clock", Status: StatusWarn, Detail: detail + ": dislock decides by the database clock, " +
		"but each node's CronJob controller fires by its own: a skewed controller starts pods late or early, and a catchup bound may skip them as stale",
		Fix: "keep every node's and the database host's clock in sync with NTP (chrony or systemd-timesyncd) and check it (chronyc tracking)"}
}

func aheadOrBehind(d time.Duration) string {
	if d < 0 {
		return "behind"
	}
	return "ahead of"
}
