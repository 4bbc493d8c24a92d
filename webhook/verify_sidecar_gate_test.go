package webhook

import (
	"errors"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/contract"
)

// The sidecar's gate is a postStart hook (dislock-agent probe --wait=…),
// not a startupProbe. The gate is what keeps the app containers from
// starting before the wrapper binary exists, and nothing may restart a
// sidecar that waits, as a standby does, for hours. A Job whose sidecar
// carries any other gate, or an extra probe or hook, is not what dislock
// injects: whether it is a tenant's forgery, a copy of a Job the previous
// release injected (with its startupProbe), or a stale shape, it is
// refused, never trusted. The unchanged injection passes again unchanged
// (reinvocation).
func TestForgedSidecarGatesAreRefused(t *testing.T) {
	t.Parallel()
	opts := goldenOptions()
	cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, nil)
	out, _, err := Inject(job, cj, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := Inject(out.DeepCopy(), cj, opts, nil)
	if err != nil || !reflect.DeepEqual(again, out) {
		t.Fatalf("the webhook's own injection, called again: err %v, changed %v", err, !reflect.DeepEqual(again, out))
	}
	hook := out.Spec.Template.Spec.InitContainers[0].Lifecycle.PostStart.Exec.Command
	probeOnce := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{agentCommand, "probe"}}},
		PeriodSeconds: 1, FailureThreshold: 600}
	for _, tc := range []struct {
		name string
		edit func(sc *corev1.Container)
	}{
		{"no gate at all: the app starts before the wrapper binary exists", func(sc *corev1.Container) { sc.Lifecycle = nil }},
		{"a hook that returns at once", func(sc *corev1.Container) {
			sc.Lifecycle.PostStart.Exec.Command = []string{"true"}
		}},
		{"the hook looking only once", func(sc *corev1.Container) {
			sc.Lifecycle.PostStart.Exec.Command = []string{agentCommand, "probe"}
		}},
		{"the hook without a bound", func(sc *corev1.Container) {
			sc.Lifecycle.PostStart.Exec.Command = []string{agentCommand, "probe", "--wait=87600h"}
		}},
		{"the hook as an HTTP call", func(sc *corev1.Container) {
			sc.Lifecycle.PostStart = &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/"}}
		}},
		{"a preStop hook beside the gate", func(sc *corev1.Container) {
			sc.Lifecycle.PreStop = &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: hook}}
		}},
		{"the previous release's startupProbe instead of the hook", func(sc *corev1.Container) {
			sc.Lifecycle, sc.StartupProbe = nil, probeOnce
		}},
		{"a startupProbe beside the hook", func(sc *corev1.Container) { sc.StartupProbe = probeOnce }},
		{"a livenessProbe that would restart a waiting standby", func(sc *corev1.Container) {
			sc.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"false"}}}}
		}},
		{"a plain init container instead of a native sidecar", func(sc *corev1.Container) { sc.RestartPolicy = nil }},
		{"the sidecar told to restart never", func(sc *corev1.Container) {
			sc.RestartPolicy = ptr.To(corev1.ContainerRestartPolicy("Never"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			forged := out.DeepCopy()
			tc.edit(&forged.Spec.Template.Spec.InitContainers[0])
			if _, _, err := Inject(forged, cj, opts, nil); !errors.Is(err, ErrForgedInjection) {
				t.Fatalf("%v, want ErrForgedInjection", err)
			}
		})
	}
}

// A tenant names a container of its own like the sidecar, with its own
// hook or probe, in the CronJob it applies: it is refused at apply time,
// and a Job carrying it is denied, rather than the tenant's gate standing
// in for dislock's.
func TestATenantsContainerNamedLikeTheSidecarIsRefused(t *testing.T) {
	t.Parallel()
	opts := goldenOptions()
	for _, tc := range []struct {
		name string
		init bool
		c    corev1.Container
	}{
		{"a native sidecar with a hook that returns at once", true, corev1.Container{Name: SidecarName, Image: "registry.example/x",
			RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
			Lifecycle:     &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}}},
		{"a native sidecar with a startupProbe", true, corev1.Container{Name: SidecarName, Image: "registry.example/x",
			RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
			StartupProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}}},
		{"an app container", false, corev1.Container{Name: SidecarName, Image: "registry.example/x", Command: []string{"/x"},
			Lifecycle: &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{agentCommand, "probe", "--wait=5m0s"}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cj, job := errCase(map[string]string{contract.AnnotationMode: "schedule"}, nil)
			for _, pod := range []*corev1.PodSpec{&cj.Spec.JobTemplate.Spec.Template.Spec, &job.Spec.Template.Spec} {
				if tc.init {
					pod.InitContainers = append(pod.InitContainers, tc.c)
				} else {
					pod.Containers = append(pod.Containers, tc.c)
				}
			}
			if errs := ValidateCronJob(cj, opts); len(errs) == 0 {
				t.Errorf("the CronJob was admitted with a container named %s", SidecarName)
			}
			if _, _, err := Inject(job, cj, opts, nil); err == nil {
				t.Errorf("the Job was injected with a container of its own named %s", SidecarName)
			}
		})
	}
}
