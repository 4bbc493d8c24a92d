package ledger_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/internal/storetest"
	"github.com/dislock/dislock/lockagent/store/ledger"
	"github.com/dislock/dislock/test/pgtest"
)

// grants draws fencing tokens the way agents do (a claim of a new window
// each time) on one server, reopening its Store after the database was
// replaced under it.
type grants struct {
	t      *testing.T
	srv    *pgtest.Server
	s      *store.Store
	key    string
	window int
}

func newGrants(t *testing.T, srv *pgtest.Server) *grants {
	g := &grants{t: t, srv: srv, key: storetest.UniqueKey(t)}
	g.reopen()
	return g
}

// reopen opens a new Store, as the pods started after a restore would.
func (g *grants) reopen() {
	g.t.Helper()
	s, err := store.Open(context.Background(), g.srv.DirectDSN(), store.Options{MaxConns: 2})
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(s.Close)
	g.s = s
}

// try claims the next window, retrying while the database restarts.
func (g *grants) try() (int64, error) {
	g.window++
	for tries := 0; ; tries++ {
		c, err := g.s.ClaimWindow(context.Background(), store.ClaimRequest{Key: g.key, Window: storetest.WindowAt(g.window), Index: store.NotIndexed,
			Owner: storetest.Owner("dc-a", "job", fmt.Sprint("pod-", g.window)), TTL: time.Minute})
		if err == nil || !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrTokensHeld) || tries == 50 {
			return c.Window.Token, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (g *grants) next() int64 {
	g.t.Helper()
	tok, err := g.try()
	if err != nil {
		g.t.Fatalf("grant %d: %v", g.window, err)
	}
	return tok
}

// keep confirms the epoch as the webhook's elected replica does, with the
// highest token it recorded, and returns the new record.
func (g *grants) keep(floor int64, newEpoch bool) (ledger.TokenState, int64) {
	g.t.Helper()
	st, err := ledger.KeepTokens(context.Background(), g.s, floor, newEpoch)
	if err != nil {
		g.t.Fatalf("confirming the epoch: %v", err)
	}
	return st, max(floor, st.HighWater)
}

// checkTokens is dislock check's "tokens" finding against the record.
func (g *grants) checkTokens(floor int64) check.Finding {
	g.t.Helper()
	fs, err := check.Database(context.Background(), g.s, check.Options{AllowAsync: true, TokenFloor: floor, TokenRecord: "the test's record"})
	if err != nil {
		g.t.Fatal(err)
	}
	return storetest.ByCheck(fs)["tokens"]
}

// dump is pg_dump -n dislock as the owner, as docs/install.md's rollback
// takes it.
func (g *grants) dump(file string) {
	g.t.Helper()
	if out, err := exec.Command(g.srv.Program("pg_dump"), "-Fc", "-n", "dislock", "-f", file, g.srv.DirectDSN()).CombinedOutput(); err != nil {
		g.t.Fatalf("pg_dump: %v: %s", err, out)
	}
}

// restoreDump drops the schema and restores the dump into srv, as the
// rollback does.
func restoreDump(t *testing.T, srv *pgtest.Server, file string) {
	t.Helper()
	c := storetest.RawConn(t, srv.DirectDSN())
	if _, err := c.Exec(context.Background(), `DROP SCHEMA IF EXISTS dislock CASCADE`); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(srv.Program("pg_restore"), "-d", srv.DirectDSN(), file).CombinedOutput(); err != nil {
		t.Fatalf("pg_restore: %v: %s", err, out)
	}
}

// A dump restored into the same cluster (docs/install.md's rollback), or
// into a new one after a failover moved the epoch: no token is drawn until
// the owner confirms the epoch, which then moves above every token
// recorded, the failover's included; check fails until then.
func TestARestoredDumpDrawsNoTokenUntilTheEpochMovesPastTheRecord(t *testing.T) {
	t.Parallel() // its own servers: the schema is dropped and restored
	srv := pgtest.New(t, pgtest.Options{Name: "tokens-dump"})
	g := newGrants(t, srv)
	storetest.Open(t, srv.DirectDSN(), 1) // migrated
	g.next()
	file := filepath.Join(t.TempDir(), "dislock.dump")
	g.dump(file)
	g.next()
	if err := srv.PromoteInPlace(); err != nil {
		t.Fatal(err)
	}
	g.reopen()
	_, record := g.keep(0, false)
	highest := g.next()
	_, record = g.keep(record, false)
	if e, _ := store.TokenEpoch(highest); e != 2 {
		t.Fatalf("token %d after the promotion is in epoch %d, want 2", highest, e)
	}

	for _, into := range []string{"the same cluster", "a new cluster"} {
		t.Run(into, func(t *testing.T) {
			target := srv
			if into == "a new cluster" {
				target = pgtest.New(t, pgtest.Options{Name: "tokens-dump-new"})
				// The roles come first (pg_dumpall --roles-only in
				// docs/install.md): the dump grants to them.
				if _, err := storetest.Superuser(t, target).Exec(context.Background(), `CREATE ROLE dislock_tenant NOLOGIN`); err != nil {
					t.Fatal(err)
				}
			}
			restoreDump(t, target, file)
			r := newGrants(t, target)
			r.key, r.window = g.key, g.window
			if tok, err := r.try(); !errors.Is(err, store.ErrTokensHeld) {
				t.Fatalf("a grant on the restored schema before the owner confirmed: token %d, %v; want %v (the highest before was %d)", tok, err, store.ErrTokensHeld, highest)
			}
			if f := r.checkTokens(record); f.Status != check.StatusFail || !strings.Contains(f.Detail, "restored from a dump") && !strings.Contains(f.Detail, "another PostgreSQL cluster") {
				t.Fatalf("check on the restored schema: %+v", f)
			}
			st, _ := r.keep(record, false)
			if st.Moved == "" || st.Epoch <= 2 {
				t.Fatalf("the owner's confirmation: %+v, want a move above epoch 2", st)
			}
			if tok := r.next(); tok <= highest {
				t.Fatalf("token %d after the restore, not above %d handed out before it", tok, highest)
			}
			if f := r.checkTokens(record); f.Status != check.StatusOK {
				t.Fatalf("check after the confirmation: %+v", f)
			}
		})
	}
}

// A volume snapshot restored (the same timeline, crash recovery) is behind
// the record: check fails, and the owner's confirmation moves the epoch
// above it. A lagging standby promoted instead gets a new timeline, which
// moves the epoch by itself.
func TestARestoredSnapshotIsBehindTheRecordUntilTheEpochMoves(t *testing.T) {
	t.Parallel() // its own server: its data directory is replaced
	srv := pgtest.New(t, pgtest.Options{Name: "tokens-snap"})
	storetest.Open(t, srv.DirectDSN(), 1) // migrated
	g := newGrants(t, srv)
	g.next()
	snap := srv.BackupPath("snap")
	if err := srv.SnapshotData(snap); err != nil {
		t.Fatal(err)
	}
	g.reopen()
	var highest int64
	for range 40 { // more than the sequence logs ahead of what it hands out
		highest = g.next()
	}
	_, record := g.keep(0, false)

	// First as a lagging standby promoted, then as the snapshot itself,
	// behind the record the first one left.
	for _, promote := range []bool{true, false} {
		t.Run(fmt.Sprintf("promoted=%v", promote), func(t *testing.T) {
			if err := srv.RestoreData(snap, promote); err != nil {
				t.Fatal(err)
			}
			g.reopen()
			f := g.checkTokens(record)
			if promote {
				if f.Status != check.StatusOK {
					t.Fatalf("check after a promotion to a new timeline: %+v", f)
				}
			} else if f.Status != check.StatusFail || !strings.Contains(f.Detail, "behind the high water") || !strings.Contains(f.Fix, fmt.Sprint("--token-floor ", record)) {
				t.Fatalf("check on the restored snapshot: %+v, want it behind %d", f, record)
			}
			var st ledger.TokenState
			st, record = g.keep(record, false)
			if promote != (st.Moved == "") {
				t.Fatalf("the owner's confirmation: %+v (promoted: %v)", st, promote)
			}
			tok := g.next()
			if tok <= highest {
				t.Fatalf("token %d after the restore, not above %d handed out before it", tok, highest)
			}
			highest = tok
			if f := g.checkTokens(record); f.Status != check.StatusOK {
				t.Fatalf("check after the confirmation: %+v", f)
			}
			_, record = g.keep(record, false)
		})
	}
}

// The restore procedure (dislock tokens --new-epoch with the record) after
// a failover the record never saw: the promotion used an epoch nothing the
// restored database or the record knows of, and the new epoch still lies
// above it (design.md: room for 15 such promotions).
func TestTheRestoreProcedureCoversAPromotionNoRecordSaw(t *testing.T) {
	t.Parallel() // its own servers
	for _, kind := range []string{"a volume snapshot", "a dump into a new cluster"} {
		t.Run(kind, func(t *testing.T) {
			srv := pgtest.New(t, pgtest.Options{Name: "tokens-unrecorded"})
			storetest.Open(t, srv.DirectDSN(), 1) // migrated
			g := newGrants(t, srv)
			g.next()
			snap, file := srv.BackupPath("snap"), filepath.Join(t.TempDir(), "dislock.dump")
			if kind == "a dump into a new cluster" {
				g.dump(file)
			} else {
				if err := srv.SnapshotData(snap); err != nil {
					t.Fatal(err)
				}
				g.reopen()
			}
			g.next()
			_, record := g.keep(0, false) // the last record: epoch 1
			if err := srv.PromoteInPlace(); err != nil {
				t.Fatal(err)
			}
			g.reopen()
			var highest int64
			for range 40 { // grants on the new timeline before the next record
				highest = g.next()
			}
			if kind == "a dump into a new cluster" {
				target := pgtest.New(t, pgtest.Options{Name: "tokens-unrecorded-new"})
				if _, err := storetest.Superuser(t, target).Exec(context.Background(), `CREATE ROLE dislock_tenant NOLOGIN`); err != nil {
					t.Fatal(err)
				}
				restoreDump(t, target, file)
				r := newGrants(t, target)
				r.key, r.window = g.key, g.window
				g = r
			} else {
				if err := srv.RestoreData(snap, false); err != nil {
					t.Fatal(err)
				}
				g.reopen()
			}
			st, _ := g.keep(record, true)
			if tok := g.next(); tok <= highest {
				te, _ := store.TokenEpoch(tok)
				he, _ := store.TokenEpoch(highest)
				t.Fatalf("after the procedure (%+v): token %d (epoch %d) is not above %d (epoch %d) handed out before the restore", st, tok, te, highest, he)
			}
		})
	}
}

var (
	flagTokenSeeds = flag.Int("tokens.seeds", 4, "seeded backup/restore/failover sequences TestTokensNeverGoBackOverSeededRestores runs")
	flagTokenSeed  = flag.Uint64("tokens.seed", 20261205, "seed of its first sequence (sequence i uses seed+i); 0 = random")
)

// Seeded sequences of grants, records (the webhook's), volume snapshots,
// dumps, promotions and restores of either. After every restore the owner
// confirms the epoch with the record, and every later grant is checked:
// above every token recorded before the loss and every token of the
// restored database, always; above every token before it when the operator
// followed the restore procedure (dislock tokens --new-epoch). Check fails
// exactly while the restored database is behind the record or holds its
// tokens, and passes once the epoch moved.
func TestTokensNeverGoBackOverSeededRestores(t *testing.T) {
	t.Parallel() // its own server
	srv := pgtest.New(t, pgtest.Options{Name: "tokens-seeded"})
	storetest.Open(t, srv.DirectDSN(), 1) // migrated
	base := *flagTokenSeed
	if base == 0 {
		base = uint64(time.Now().UnixNano())
	}
	for i := range *flagTokenSeeds {
		seed := base + uint64(i)
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			runTokenSequence(t, srv, seed)
		})
	}
}

// runTokenSequence runs one seeded sequence; see
// TestTokensNeverGoBackOverSeededRestores.
func runTokenSequence(t *testing.T, srv *pgtest.Server, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0))
	g := newGrants(t, srv)
	type backup struct {
		physical bool
		path     string
		highest  int64 // the highest token handed out when it was taken
	}
	var (
		tokens   []int64 // every grant's token, in order
		record   int64   // the webhook's record
		recorded int     // len(tokens) when it was last taken
		backups  []backup
		steps    []string
	)
	highestOf := func(ts []int64) int64 {
		if len(ts) == 0 {
			return 0
		}
		return slices.Max(ts)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d after %s: %s", seed, strings.Join(steps, ", "), fmt.Sprintf(format, args...))
	}
	for step := range 14 {
		switch op := rng.IntN(10); {
		case op < 4:
			n := 1 + rng.IntN(40)
			steps = append(steps, fmt.Sprintf("%d grants", n))
			for range n {
				tok := g.next()
				if tok <= highestOf(tokens) {
					fail("token %d is not above %d handed out before it", tok, highestOf(tokens))
				}
				tokens = append(tokens, tok)
			}
		case op < 6:
			steps = append(steps, "record")
			_, record = g.keep(record, false)
			recorded = len(tokens)
		case op < 7:
			steps = append(steps, "promotion")
			if err := srv.PromoteInPlace(); err != nil {
				t.Fatal(err)
			}
			g.reopen()
		case op < 8 || len(backups) == 0:
			b := backup{physical: rng.IntN(2) == 0, path: srv.BackupPath(fmt.Sprintf("%d-%d", seed, step)), highest: highestOf(tokens)}
			if b.physical {
				steps = append(steps, "snapshot")
				if err := srv.SnapshotData(b.path); err != nil {
					t.Fatal(err)
				}
				g.reopen()
			} else {
				steps = append(steps, "dump")
				b.path += ".dump"
				g.dump(b.path)
			}
			backups = append(backups, b)
		default:
			b := backups[rng.IntN(len(backups))]
			promote := b.physical && rng.IntN(2) == 0
			procedure := rng.IntN(2) == 0
			steps = append(steps, fmt.Sprintf("restore (physical=%v promote=%v procedure=%v)", b.physical, promote, procedure))
			if b.physical {
				if err := srv.RestoreData(b.path, promote); err != nil {
					t.Fatal(err)
				}
			} else {
				restoreDump(t, srv, b.path)
			}
			g.reopen()
			// What check says before anything repaired the database:
			// it fails exactly when the restore lost recorded tokens
			// (or the schema was recreated), unless a promotion moved
			// the epoch above the record by itself.
			f := g.checkTokens(record)
			lostRecorded := record > b.highest+32 // the sequence logs up to 32 values ahead
			if !b.physical && f.Status != check.StatusFail {
				fail("check on a restored dump: %+v", f)
			}
			if b.physical && !promote && lostRecorded && f.Status != check.StatusFail {
				fail("check on a snapshot behind the record %d (it holds up to %d): %+v", record, b.highest, f)
			}
			st, newRecord := g.keep(record, procedure)
			if procedure {
				// The operator's procedure: a new epoch after every
				// restore, whatever the record.
				if st.Moved == "" {
					fail("dislock tokens --new-epoch moved nothing: %+v", st)
				}
			}
			mustExceed := max(highestOf(tokens[:recorded]), b.highest)
			if procedure {
				mustExceed = highestOf(tokens)
			}
			tok := g.next()
			if tok <= mustExceed {
				fail("token %d after the restore is not above %d (confirmation %+v)", tok, mustExceed, st)
			}
			if f := g.checkTokens(newRecord); f.Status != check.StatusOK {
				fail("check after the confirmation: %+v", f)
			}
			record = newRecord
			if !procedure {
				// Tokens handed out after both the backup and the last
				// record may come again (the documented exposure): what
				// follows is compared with what the database and the
				// record can know of.
				kept := max(recorded, 1+slices.Index(tokens, b.highest))
				tokens = slices.Clone(tokens[:kept])
				recorded = min(recorded, kept)
			}
			tokens = append(tokens, tok)
		}
	}
	t.Logf("seed %d: %s; %d grants", seed, strings.Join(steps, ", "), len(tokens))
}
