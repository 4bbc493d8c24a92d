package webhook

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dislock/dislock/lockagent/spec"
)

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
