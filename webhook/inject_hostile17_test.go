package webhook

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/dislock/dislock/lockagent/lock"
	"github.com/dislock/dislock/lockagent/spec"
)

// Hostile review of issue 17. docs/agent.md: "the sidecar alone mounts
// ca.crt ... the app containers never see it". A tenant's pod template
// names the volume dislock is about to add in an app container's
// volumeMounts; the API server validates the pod only after mutation, when
// the volume exists. makePlan refuses a *volume* of that name but not a
// *mount* of it, so the app container gets the sidecar's CA volume.
// (Low impact: only ca.crt is projected.) PROVEN if this fails.
func TestHostile17_AppContainerCannotMountTheCAVolume(t *testing.T) {
	t.Parallel()
	opts := goldenOptions()
	opts.DatabaseCA = testCA
	cj, job := errCase(map[string]string{spec.AnnotationMode: "schedule"}, func(_ *batchv1.CronJob, job *batchv1.Job) {
		c := &job.Spec.Template.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: DatabaseCAVolumeName, MountPath: "/stolen"})
	})
	out, _, err := Inject(job, cj, opts, nil)
	if err != nil {
		return // refused: held
	}
	for _, c := range out.Spec.Template.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.Name == DatabaseCAVolumeName {
				t.Errorf("app container %q mounts the sidecar's %s volume at %s: admitted", c.Name, m.Name, m.MountPath)
			}
		}
	}
}

// Hostile review of issue 17. Without --database-ca-file a Job may have a
// volume of its own named dislock-database-ca (makePlan refuses it only
// with a CA). If it is shaped like dislock's (ca.crt of the namespace's
// Secret, mode 0444), strip takes it for dislock's on the webhook's
// reinvocation (or a copied Job), fresh does not add it back, and the
// injection dislock itself made is refused as forged. PROVEN if this fails.
func TestHostile17_OwnCAShapedVolumeSurvivesReinvocationWithoutCA(t *testing.T) {
	t.Parallel()
	opts := goldenOptions()
	cj, job := errCase(map[string]string{spec.AnnotationMode: "schedule"}, func(_ *batchv1.CronJob, job *batchv1.Job) {
		pod := &job.Spec.Template.Spec
		pod.Volumes = append(pod.Volumes, databaseCAVolume(opts.DBSecretName))
		pod.Containers[0].VolumeMounts = append(pod.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: DatabaseCAVolumeName, MountPath: "/etc/my-ca", ReadOnly: true})
	})
	out, _, err := Inject(job, cj, opts, nil)
	if err != nil {
		t.Fatalf("first injection: %v", err)
	}
	if _, _, err := Inject(out, cj, opts, nil); err != nil {
		t.Errorf("reinvocation refuses the webhook's own injection: %v", err)
	}
}

// Hostile review of issue 17: a forged injection made by a tenant against a
// webhook without a CA, adding a CA-shaped volume (of any Secret) and its
// mount to the sidecar, is not trusted. HELD if this passes.
func TestHostile17_ForgedCAVolumeWithoutCAIsRefused(t *testing.T) {
	t.Parallel()
	opts := goldenOptions()
	cj, job := errCase(map[string]string{spec.AnnotationMode: "schedule"}, nil)
	out, _, err := Inject(job, cj, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{opts.DBSecretName, "another-teams-db"} {
		forged := out.DeepCopy()
		pod := &forged.Spec.Template.Spec
		n := len(pod.Volumes)
		pod.Volumes = append(pod.Volumes[:n-1:n-1], databaseCAVolume(secret), pod.Volumes[n-1])
		pod.InitContainers[0].VolumeMounts = append(pod.InitContainers[0].VolumeMounts,
			corev1.VolumeMount{Name: DatabaseCAVolumeName, MountPath: DatabaseCADir, ReadOnly: true})
		if _, _, err := Inject(forged, cj, opts, nil); !errors.Is(err, ErrForgedInjection) {
			t.Errorf("forged CA volume of Secret %q: %v, want ErrForgedInjection", secret, err)
		}
	}
}

// Hostile review of issue 17 (readiness). The issue asks for readiness that
// reflects the database "without making Job admission depend on the
// database". A replica started while the database is down (a node drain,
// an eviction, an OOM kill, a chart upgrade of an unrelated value) never
// becomes ready until the database answers; when every replica restarts
// during an outage, no endpoint serves and failurePolicy Fail refuses every
// Job and every CronJob create/update of opted-in namespaces. Design
// trade-off, named here as a finding. PROVEN (design gap) if this fails.
func TestHostile17_ReplicaStartedDuringOutageServesAdmission(t *testing.T) {
	t.Parallel()
	g, _ := startGate(t, func(context.Context) (migration, error) {
		return migration{}, fmt.Errorf("migrating: %w at pgbouncer:6432: connection refused", lock.ErrUnavailable)
	})
	time.Sleep(50 * time.Millisecond)
	if err := g.Check(nil); err != nil {
		t.Errorf("a replica restarted during a database outage is unready, so admission depends on the database: %v", err)
	}
}

// Hostile review of issue 17 (readiness, skew). Once passed the gate never
// looks at the schema again, and the agent has no schema check of its own
// (only dislock check and the CLI call Store.Schema). When another
// cluster's newer dislock applies a migration incompatible with this build,
// this replica stays ready and keeps injecting its agent against a schema it
// cannot use. PROVEN (design gap) if this fails.
func TestHostile17_ReadyReplicaNoticesAnIncompatibleSchema(t *testing.T) {
	t.Parallel()
	calls := 0
	incompatible := &lock.IncompatibleSchemaError{Current: 8, Known: 6, Version: 8, Name: "0008_x.sql", CompatibleFrom: 8}
	g, _ := startGate(t, func(context.Context) (migration, error) {
		calls++
		if calls == 1 {
			return migration{schema: lock.SchemaState{Current: 6, Known: 6}}, nil
		}
		return migration{}, fmt.Errorf("migrating: %w", incompatible)
	})
	awaitReady(t, g)
	// Another cluster's dislock now applies migration 8 (compatible-from 8).
	time.Sleep(100 * time.Millisecond)
	if err := g.Check(nil); err == nil {
		t.Errorf("the schema became incompatible (%v), yet the replica stays ready (the gate asked the database %d time(s))", incompatible, calls)
	}
}
