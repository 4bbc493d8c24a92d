package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
)

var nsSeq atomic.Int64

// namespace gives a test a namespace of its own, so that tests share one
// database.
func namespace(team string) string { return fmt.Sprintf("%s-%d", team, nsSeq.Add(1)) }

// migratedStore migrates the schema with the CLI and opens a Store as its
// owner, closed with the test.
func migratedStore(t *testing.T, dsn string) *store.Store {
	t.Helper()
	if code, _, errOut := run(t, "migrate", "--database-url", dsn); code != 0 {
		t.Fatalf("migrate: exit %d: %s", code, errOut)
	}
	s, err := store.Open(context.Background(), dsn, store.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// rawConn is a plain connection for statements the Store never sends,
// usable through PgBouncer's transaction pooling.
func rawConn(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	cfg, err := store.ParseDatabaseURL(dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(context.Background(), cfg.ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func dbNow(t *testing.T, s *store.Store) time.Time {
	t.Helper()
	now, err := s.Now(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return now
}

func record(t *testing.T, s *store.Store, d store.Decision) {
	t.Helper()
	if d.Job == "" {
		d.Job = "report-1"
	}
	if d.Pod == "" {
		d.Pod = "report-1-" + d.Cluster
	}
	if err := s.RecordDecision(context.Background(), d); err != nil {
		t.Fatalf("recording %s's %s decision: %v", d.Cluster, d.Action, err)
	}
}

// runWindow claims window w of key for cluster and ends it in state
// (running: left running with the TTL).
func runWindow(t *testing.T, s *store.Store, key string, w time.Time, cluster string, state store.State, ttl time.Duration) store.Claim {
	t.Helper()
	ns, _, _ := strings.Cut(key, "/")
	o := store.Owner{Cluster: cluster, Namespace: ns, Job: "job-" + w.Format("150405"), JobUID: "uid-" + w.Format("150405"), Pod: "pod-" + cluster}
	c, err := s.ClaimWindow(context.Background(), store.ClaimRequest{Key: key, Window: w, Index: store.NotIndexed, Owner: o, TTL: ttl})
	if err != nil {
		t.Fatalf("claiming %s of %s: %v", w, key, err)
	}
	if state == store.StateRunning {
		return c
	}
	code := 0
	if state == store.StateFailed {
		code = 1
	}
	if _, err := s.Finish(context.Background(), key, w, store.NotIndexed, c.Window.Token, state, &code); err != nil {
		t.Fatal(err)
	}
	return c
}

// tableRows returns the lines of a table whose first field is key.
func tableRows(out, key string) []string {
	var rows []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == key {
			rows = append(rows, l)
		}
	}
	return rows
}

// watchedBuffer is an output a test can await a condition on while a
// command is still writing to it.
type watchedBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newWatchedBuffer() *watchedBuffer { return &watchedBuffer{changed: make(chan struct{})} }

func (b *watchedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	close(b.changed)
	b.changed = make(chan struct{})
	return n, err
}

func (b *watchedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// await returns once cond holds for what was written, and fails the test
// if it does not within the deadline.
func (b *watchedBuffer) await(t *testing.T, what string, cond func(string) bool) {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		b.mu.Lock()
		out, changed := b.buf.String(), b.changed
		b.mu.Unlock()
		if cond(out) {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("waited 30s for %s; the output so far:\n%s", what, out)
		}
	}
}
