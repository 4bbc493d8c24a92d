package integration

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dislock/dislock/internal/cli"
	"github.com/dislock/dislock/internal/tokenrecord"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/pgtest"
	"github.com/dislock/dislock/test/tlstest"
)

// The operator's path through a restore, with the webhook binary: its
// elected replica records the highest token in its namespace's ConfigMap;
// the schema is rolled back from a dump (docs/install.md); dislock check
// with --token-record fails, naming why, until the replica moved the epoch
// past the record, and the next grant is above every token handed out
// before the restore.
func TestAfterARestoreTheWebhookMovesTokensPastItsRecord(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	ctx := context.Background()
	const ns = "tokens-record" // its own record: other tests' databases differ
	namespace(t, cs, ns, false)
	srv := pgtest.New(t, pgtest.Options{Name: "tokens-record"})
	dsn := srv.DirectDSN()
	db, err := store.Open(ctx, dsn, store.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := migrate.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	window := 0
	grant := func(s *store.Store) (int64, error) {
		window++
		claim, err := s.ClaimWindow(ctx, store.ClaimRequest{Key: "tokens/job", Window: time.Date(2026, 12, 5, 0, window, 0, 0, time.UTC),
			Index: store.NotIndexed, Owner: store.Owner{Cluster: "dc-a", Namespace: "tokens", Job: "job", JobUID: "uid", Pod: "pod-" + strconv.Itoa(window)}, TTL: time.Minute})
		return claim.Window.Token, err
	}
	if _, err := grant(db); err != nil {
		t.Fatal(err)
	}
	dump := filepath.Join(t.TempDir(), "dislock.dump")
	if out, err := exec.Command(srv.Program("pg_dump"), "-Fc", "-n", "dislock", "-f", dump, dsn).CombinedOutput(); err != nil {
		t.Fatalf("pg_dump: %v: %s", err, out)
	}
	var highest int64
	for range 5 {
		if highest, err = grant(db); err != nil {
			t.Fatal(err)
		}
	}

	// The operator records the high water (the webhook does so too, every
	// --token-record-interval).
	kubeFlags := []string{"--kubeconfig", c.Kubeconfig(), "--token-record", ns + "/" + tokenrecord.Name}
	var out, errOut bytes.Buffer
	if code := cli.Main(ctx, append([]string{"tokens", "--database-url", dsn}, kubeFlags...), &out, &errOut); code != 0 {
		t.Fatalf("dislock tokens: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	key := types.NamespacedName{Namespace: ns, Name: tokenrecord.Name}
	reader, err := client.New(c.RESTConfig(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rec, found, err := tokenrecord.Read(ctx, reader, key); !found || err != nil || rec.HighWater < highest {
		t.Fatalf("the record dislock tokens wrote: %+v %v %v, want at least %d", rec, found, err, highest)
	}

	// The rollback: the schema as it was when dumped. Until the epoch is
	// confirmed, check fails and no token is drawn.
	check := func() (int, string) {
		var out, errOut bytes.Buffer
		code := cli.Main(ctx, append([]string{"check", "--database-url", dsn, "--allow-async-replication"}, kubeFlags...), &out, &errOut)
		return code, out.String() + errOut.String()
	}
	if _, err := connect(t, srv.SuperuserDSN()).Exec(ctx, `DROP SCHEMA dislock CASCADE`); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(srv.Program("pg_restore"), "-d", dsn, dump).CombinedOutput(); err != nil {
		t.Fatalf("pg_restore: %v: %s", err, out)
	}
	if code, out := check(); code != 3 || !strings.Contains(out, "restored from a dump") {
		t.Fatalf("dislock check on the restored schema: exit %d, want 3 naming the restore\n%s", code, out)
	}
	restored, err := store.Open(ctx, dsn, store.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restored.Close)
	if tok, err := grant(restored); !errors.Is(err, store.ErrTokensHeld) {
		t.Fatalf("a grant on the restored schema: token %d, %v; want %v", tok, err, store.ErrTokensHeld)
	}

	// The webhook's elected replica confirms the epoch with the record.
	ca := tlstest.NewCA(t)
	certDir := t.TempDir()
	if err := tlstest.WriteFiles(certDir, ca.Issue(t).Files()); err != nil {
		t.Fatal(err)
	}
	startBinary(t, c, "--cert-dir="+certDir, "--namespace="+ns, "--database-url="+dsn, "--tenant-roles=false", "--token-record-interval=300ms")
	var tok int64
	await(t, "a grant after the restore", func() (bool, error) {
		tok, err = grant(restored)
		if errors.Is(err, store.ErrTokensHeld) {
			return false, nil
		}
		return err == nil, err
	})
	if tok <= highest {
		t.Fatalf("token %d after the restore, not above %d handed out before it", tok, highest)
	}
	await(t, "dislock check to pass with the record", func() (bool, error) {
		code, out := check()
		if code != 0 && !strings.Contains(out, "tokens") {
			return false, errors.New(out)
		}
		return code == 0, nil
	})
	await(t, "the webhook to record the new high water", func() (bool, error) {
		rec, _, err := tokenrecord.Read(ctx, reader, key)
		return rec.HighWater >= tok && rec.Cluster == "dc-a", err
	})
	// The record never goes down, whoever writes a lower one.
	kept, err := tokenrecord.Raise(ctx, reader, reader, key, tokenrecord.Record{HighWater: highest, Cluster: "stale"})
	if err != nil || kept.HighWater < tok {
		t.Fatalf("raising the record to a lower high water: %+v %v, want it kept at %d or more", kept, err, tok)
	}
}
