package maintenance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	"github.com/jackc/pgx/v5"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
	"github.com/dislock/dislock/test/pgtest"
)

// startGate runs a databaseGate with short pauses until the test ends.
func startGate(t *testing.T, migrate func(context.Context) (migration, error)) (*databaseGate, <-chan error) {
	t.Helper()
	g := newDatabaseGate(migrate)
	g.backoffFirst, g.backoff, g.recheck = time.Millisecond, 5*time.Millisecond, 5*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done, stopped := make(chan error, 1), make(chan struct{})
	go func() {
		done <- g.Start(ctx)
		close(stopped)
	}()
	t.Cleanup(func() {
		cancel()
		<-stopped
	})
	return g, done
}

// awaitReady waits for the gate to pass; awaitReason for its check to fail
// saying want.
func awaitReady(t *testing.T, g *databaseGate) {
	t.Helper()
	select {
	case <-g.passed:
	case <-time.After(30 * time.Second):
		t.Fatalf("not ready after 30s: %v", g.Check(nil))
	}
	if err := g.Check(nil); err != nil {
		t.Fatalf("passed, yet the check fails: %v", err)
	}
}

func awaitReason(t *testing.T, g *databaseGate, want ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := g.Check(nil)
		if err == nil {
			t.Fatalf("ready; want not ready saying %q", want)
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(err.Error(), w)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness says %q; want it to say %q", err, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A replica is ready once it reached the database and found the schema
// usable, and says until then why not; afterwards no outage makes it
// unready (admission needs no database; the agents fail closed).
func TestDatabaseGateTellsWhyAReplicaIsNotReady(t *testing.T) {
	t.Parallel()
	type result struct {
		m   migration
		err error
	}
	attempts, results := make(chan struct{}), make(chan result)
	g, done := startGate(t, func(ctx context.Context) (migration, error) {
		select {
		case attempts <- struct{}{}:
		case <-ctx.Done():
			return migration{}, ctx.Err()
		}
		select {
		case r := <-results:
			return r.m, r.err
		case <-ctx.Done():
			return migration{}, ctx.Err()
		}
	})
	<-attempts
	if err := g.Check(nil); err == nil || !strings.Contains(err.Error(), "not connected to the database yet") {
		t.Fatalf("during the first attempt: %v", err)
	}
	incompatible := &migrate.IncompatibleSchemaError{Current: 7, Known: 6, Version: 7, Name: "0007_x.sql", CompatibleFrom: 7}
	for _, step := range []struct {
		name string
		r    result
		want string
	}{
		{"an unreachable database", result{err: fmt.Errorf("migrating: %w at db:6432: connection refused", store.ErrUnavailable)}, "connection refused"},
		{"a missing grant", result{err: errors.New("migrating: permission denied for database dislock")}, "permission denied"},
		{"a schema a newer dislock made incompatible", result{err: fmt.Errorf("migrating: %w", incompatible)}, "upgrade this cluster's dislock to a release that knows schema version 7"},
		{"a schema another cluster moved on after migrating", result{m: migration{schema: migrate.SchemaState{Current: 7, Known: 6, Incompatible: incompatible}}}, "version 7 after migrating"},
	} {
		results <- step.r
		<-attempts // the next attempt begins after the reason is recorded
		if err := g.Check(nil); err == nil || !strings.Contains(err.Error(), step.want) {
			t.Fatalf("after %s: readiness says %v; want %q", step.name, err, step.want)
		}
	}
	results <- result{m: migration{schema: migrate.SchemaState{Current: 7, Known: 6}}}
	awaitReady(t, g)
	<-attempts // the first check after passing began
	// Passed, it asks again: an outage or a failed migration leaves it
	// ready; a schema another cluster made incompatible makes it unready,
	// saying so, and a usable one ready again.
	for _, step := range []struct {
		name  string
		r     result
		ready bool
		want  string
	}{
		{"an outage", result{err: fmt.Errorf("migrating: %w at db:6432: connection refused", store.ErrUnavailable)}, true, ""},
		{"a failed migration", result{err: errors.New("migrating: permission denied for database dislock")}, true, ""},
		{"an incompatible schema", result{err: fmt.Errorf("migrating: %w", incompatible)}, false, "schema dislock is incompatible with this dislock"},
		{"a schema moved on after migrating", result{m: migration{schema: migrate.SchemaState{Current: 7, Known: 6, Incompatible: incompatible}}}, false, "version 7, which this dislock (6) cannot use"},
		{"a usable schema again", result{m: migration{schema: migrate.SchemaState{Current: 7, Known: 6}}}, true, ""},
	} {
		results <- step.r
		<-attempts // the next check begins after this one's outcome is kept
		err := g.Check(nil)
		switch {
		case step.ready && err != nil:
			t.Fatalf("after %s: readiness says %v; want ready", step.name, err)
		case !step.ready && (err == nil || !strings.Contains(err.Error(), step.want)):
			t.Fatalf("after %s: readiness says %v; want not ready saying %q", step.name, err, step.want)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("the gate ended with %v; want it to keep checking the schema", err)
	default:
	}
}

// The gate against a real PostgreSQL, directly and through PgBouncer: a
// wrong URL, a role that may not create the schema and a schema a newer
// dislock made incompatible each keep the replica unready, saying so; the
// right URL migrates and makes it ready.
func TestDatabaseGateAgainstARealDatabase(t *testing.T) {
	t.Parallel()
	srv, err := pgtest.Start(pgtest.Options{Name: "gate", Logf: t.Logf})
	if err != nil {
		pgtest.Missing(t, err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx := context.Background()
	super, err := pgx.Connect(ctx, srv.SuperuserDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { super.Close(ctx) })
	// A role that may log in but not create schema dislock: what a DBA
	// who forgot the grant leaves.
	if _, err := super.Exec(ctx, `CREATE ROLE gate_nogrant LOGIN PASSWORD 'nogrant-pw'`); err != nil {
		t.Fatal(err)
	}
	nograntDSN := strings.Replace(srv.DirectDSN(), pgtest.AppUser+":"+pgtest.AppPassword, "gate_nogrant:nogrant-pw", 1)
	if nograntDSN == srv.DirectDSN() {
		t.Fatalf("cannot derive a DSN for another role from %s", srv.DirectDSN())
	}

	t.Run("a wrong URL", func(t *testing.T) {
		g, _ := startGate(t, migrateDatabase(pgtest.DSN(pgtest.AppUser, pgtest.AppPassword, 1)))
		awaitReason(t, g, "database unavailable", "127.0.0.1:1")
	})
	t.Run("a role without the grant to create the schema", func(t *testing.T) {
		g, _ := startGate(t, migrateDatabase(nograntDSN))
		awaitReason(t, g, "permission denied")
		if err := g.Check(nil); strings.Contains(err.Error(), "nogrant-pw") {
			t.Fatalf("readiness prints the password: %v", err)
		}
	})
	for _, tg := range srv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			if _, err := super.Exec(ctx, `DROP SCHEMA IF EXISTS dislock CASCADE`); err != nil {
				t.Fatal(err)
			}
			g, _ := startGate(t, migrateDatabase(tg.DSN))
			awaitReady(t, g)
			var v int
			if err := super.QueryRow(ctx, `SELECT max(version) FROM dislock.schema_migrations`).Scan(&v); err != nil || v != migrate.SchemaVersion() {
				t.Fatalf("schema at %d, %v; want %d", v, err, migrate.SchemaVersion())
			}

			next := migrate.SchemaVersion() + 1
			if _, err := super.Exec(ctx, `INSERT INTO dislock.schema_migrations (version, name, compatible_from) VALUES ($1, 'future.sql', $1)`, next); err != nil {
				t.Fatal(err)
			}
			g, _ = startGate(t, migrateDatabase(tg.DSN))
			awaitReason(t, g, fmt.Sprintf("migration %d (future.sql)", next), fmt.Sprintf("upgrade this cluster's dislock to a release that knows schema version %d", next))

			if _, err := super.Exec(ctx, `UPDATE dislock.schema_migrations SET compatible_from = $1 WHERE version = $2`, next-1, next); err != nil {
				t.Fatal(err)
			}
			awaitReady(t, g) // the same gate, asking again
		})
	}
}

// A tenant holds old rows of its own namespace locked (an open transaction
// that updated them). The leader's maintenance used to wait for them in its
// retention for as long as the tenant liked, and with it every later step:
// no namespace's old rows went, and no disagreement between clusters was
// reported any more. Now retention skips the tenant's rows and the loop goes
// on: another namespace's old window is deleted and its CronJob gets the
// disagreement Event.
func TestMaintenanceGoesOnWhileATenantHoldsItsOldRowsLocked(t *testing.T) {
	t.Parallel()
	d := newTenantsDB(t)
	ctx := context.Background()
	tenant := d.tenant(t, "keeper")
	old := `INSERT INTO dislock.windows (lock_key, window_start, owner, cluster, pod, token, state, claimed_at, alive_until, finished_at, exit_code)
		SELECT $1::text, t, 'dc-a/ns/job/uid/pod', 'dc-a', 'pod', dislock.next_token(), 'succeeded', t, t, t, 0
		FROM (SELECT date_trunc('minute', now() - interval '400 days') AS t) o`
	if _, err := tenant.Exec(ctx, old, "keeper/report"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.raw.Exec(ctx, old, "bystander/report"); err != nil {
		t.Fatal(err)
	}
	tx, err := tenant.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the tenant's transaction stays open for the test
	if _, err := tx.Exec(ctx, `UPDATE dislock.windows SET finished_at = finished_at WHERE lock_key = 'keeper/report'`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ cluster, zone string }{{"dc-a", "UTC"}, {"dc-b", "Europe/Berlin"}} {
		if _, err := d.own.RecordView(ctx, "bystander/report", c.cluster, store.View{Schedule: "0 2 * * *", TimeZone: c.zone, Mode: "schedule"}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cj := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: "bystander", Name: "report",
		Annotations: map[string]string{contract.AnnotationMode: "schedule"}}, Spec: batchv1.CronJobSpec{Schedule: "0 2 * * *"}}
	rec := events.NewFakeRecorder(100)
	ready := make(chan struct{})
	close(ready)
	m := &maintenance{databaseURL: d.dsn, retention: store.DefaultRetention, ready: ready,
		cronJobs: fake.NewClientBuilder().WithScheme(scheme).WithObjects(cj).Build(), events: rec}
	mctx, cancel := context.WithCancel(log.IntoContext(ctx, testr.New(t)))
	stopped := make(chan error, 1)
	go func() { stopped <- m.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		<-stopped
	})

	select {
	case e := <-rec.Events:
		if !strings.Contains(e, ReasonClustersDisagree) {
			t.Fatalf("event %q, want %s", e, ReasonClustersDisagree)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no disagreement reported within 30 s while a tenant holds its old rows locked: the maintenance loop is stuck")
	}
	for key, want := range map[string]int{"bystander/report": 0, "keeper/report": 1} {
		var n int
		if err := d.raw.QueryRow(ctx, `SELECT count(*) FROM dislock.windows WHERE lock_key = $1`, key).Scan(&n); err != nil || n != want {
			t.Errorf("old windows of %s: %d, %v; want %d", key, n, err, want)
		}
	}
}

// A step that overruns its bound is cut, logged by name, and the next step
// runs: the loop never waits for one step for ever.
func TestAMaintenanceStepThatOverrunsIsCutNamedAndTheNextRuns(t *testing.T) {
	t.Parallel()
	var logged []string
	logger := funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{})
	start := time.Now()
	runStep(context.Background(), logger, "deleting old windows", 50*time.Millisecond, func(ctx context.Context) error {
		<-ctx.Done() // a statement that never answers
		return ctx.Err()
	})
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the overrunning step returned after %s, want soon after its 50ms", took)
	}
	ran := false
	runStep(context.Background(), logger, "comparing the clusters' views of the jobs", time.Minute, func(context.Context) error {
		ran = true
		return nil
	})
	if !ran || len(logged) != 1 || !strings.Contains(logged[0], `"step"="deleting old windows"`) || !strings.Contains(logged[0], `"timedOut"=true`) {
		t.Fatalf("next step ran: %v; logged %q; want one line naming the step that timed out", ran, logged)
	}
}
