package inject

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/dislock/dislock/lockagent/contract"
)

// sizes shows a sidecar's resources as "cpu request/limit, memory
// request/limit".
func sizes(r corev1.ResourceRequirements) string {
	q := func(l corev1.ResourceList, n corev1.ResourceName) string {
		v, ok := l[n]
		if !ok {
			return "-"
		}
		return v.String()
	}
	return "cpu " + q(r.Requests, corev1.ResourceCPU) + "/" + q(r.Limits, corev1.ResourceCPU) +
		", memory " + q(r.Requests, corev1.ResourceMemory) + "/" + q(r.Limits, corev1.ResourceMemory)
}

func TestAgentResourcesFromFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		cpuReq, cpuLim string
		memReq, memLim string
		want           string
		wantErr        []string
	}{
		{name: "defaults: a CPU limit, so that a limits.cpu quota admits the pod",
			want: "cpu 10m/500m, memory 16Mi/64Mi"},
		{name: "each set", cpuReq: "50m", cpuLim: "1", memReq: "32Mi", memLim: "128Mi",
			want: "cpu 50m/1, memory 32Mi/128Mi"},
		{name: "a request set above the limit set", cpuReq: "20m", cpuLim: "15m", memReq: "40Mi", memLim: "48Mi",
			wantErr: []string{`agent CPU request "20m" is above the agent CPU limit 15m`}},
		{name: "the least limits", cpuLim: "10m", memLim: "32Mi",
			want: "cpu 10m/10m, memory 16Mi/32Mi"},
		{name: "limits too small for the agent to run", cpuLim: "5m", memLim: "8Mi",
			wantErr: []string{`agent CPU limit "5m" is below 10m`, `agent memory limit "8Mi" is below 32Mi`}},
		{name: "bad quantities, each named", cpuReq: "lots", memLim: "-1Mi",
			wantErr: []string{`agent CPU request "lots" is not a positive quantity`, `agent memory limit "-1Mi" is not a positive quantity`}},
		{name: "a request set above its limit", memReq: "100Mi",
			wantErr: []string{`agent memory request "100Mi" is above the agent memory limit 64Mi`}},
	}
	for _, tc := range tests {
		r, err := AgentResources(tc.cpuReq, tc.cpuLim, tc.memReq, tc.memLim)
		if len(tc.wantErr) > 0 {
			if err == nil {
				t.Errorf("%s: no error, want %q", tc.name, tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if err != nil && !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error does not contain %q: %v", tc.name, w, err)
				}
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got := sizes(r); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestAgentMaxResourcesFromFlags(t *testing.T) {
	t.Parallel()
	if got, err := AgentMaxResources("", ""); err != nil || got.Cpu().String() != DefaultAgentMaxCPU || got.Memory().String() != DefaultAgentMaxMemory {
		t.Errorf("defaults: %v, %v", got, err)
	}
	if got, err := AgentMaxResources("2", "1Gi"); err != nil || got.Cpu().String() != "2" || got.Memory().String() != "1Gi" {
		t.Errorf("set: %v, %v", got, err)
	}
	if _, err := AgentMaxResources("0", "x"); err == nil || !strings.Contains(err.Error(), `agent maximum cpu "0"`) || !strings.Contains(err.Error(), `agent maximum memory "x"`) {
		t.Errorf("bad values: %v", err)
	}
	o := goldenOptions()
	o.AgentResources, _ = AgentResources("", "2", "", "")
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--agent-max-cpu") {
		t.Errorf("a default above the ceiling: %v, want an error naming --agent-max-cpu", err)
	}
}

// A CronJob sizes its sidecar by annotation, within the installation's
// ceiling: what it sets is injected; what is wrong is refused at the
// annotation, by the validating webhook and again at injection.
func TestACronJobSizesItsSidecarWithinTheInstallationsCeiling(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		annotations map[string]string
		want        string
		wantErr     []string
	}{
		{name: "none: the installation's", want: "cpu 100m/500m, memory 48Mi/64Mi"},
		{name: "a strict LimitRange's minimum and ratio",
			annotations: map[string]string{contract.AnnotationAgentCPURequest: "100m", contract.AnnotationAgentCPULimit: "200m", contract.AnnotationAgentMemoryRequest: "64Mi"},
			want:        "cpu 100m/200m, memory 64Mi/64Mi"},
		{name: "only a lower limit: the installation's request follows it",
			annotations: map[string]string{contract.AnnotationAgentCPULimit: "50m", contract.AnnotationAgentMemoryLimit: "32Mi"},
			want:        "cpu 50m/50m, memory 32Mi/32Mi"},
		{name: "a memory limit the agent cannot run in",
			annotations: map[string]string{contract.AnnotationAgentMemoryLimit: "1"},
			wantErr:     []string{contract.AnnotationAgentMemoryLimit + `]: Invalid value: "1": is below 32Mi, the least the agent runs with`}},
		{name: "above the ceiling",
			annotations: map[string]string{contract.AnnotationAgentCPULimit: "4", contract.AnnotationAgentMemoryLimit: "1Gi"},
			wantErr: []string{contract.AnnotationAgentCPULimit + `]: Invalid value: "4": is above the most this installation gives the sidecar, 1 (ask its administrator to raise the webhook's --agent-max-cpu)`,
				contract.AnnotationAgentMemoryLimit + `]: Invalid value: "1Gi": is above the most this installation gives the sidecar, 256Mi`}},
		{name: "not a quantity",
			annotations: map[string]string{contract.AnnotationAgentMemoryRequest: "a lot"},
			wantErr:     []string{contract.AnnotationAgentMemoryRequest + `]: Invalid value: "a lot": is not a positive quantity (want e.g. "16Mi")`}},
		{name: "a request above its limit",
			annotations: map[string]string{contract.AnnotationAgentCPURequest: "800m"},
			wantErr:     []string{contract.AnnotationAgentCPURequest + `]: Invalid value: "800m": is above the limit ` + contract.AnnotationAgentCPULimit + ` 500m (raise that too, or lower this)`}},
	}
	for _, tc := range tests {
		annotations := map[string]string{contract.AnnotationMode: "lease"}
		for k, v := range tc.annotations {
			annotations[k] = v
		}
		cj, job := errCase(annotations, nil)
		// An installation that asks more than the defaults of every sidecar.
		opts := goldenOptions()
		var err error
		if opts.AgentResources, err = AgentResources("100m", "", "48Mi", ""); err != nil {
			t.Fatal(err)
		}
		errs := ValidateCronJob(cj, opts)
		out, _, injectErr := Inject(job, cj, opts, nil)
		if len(tc.wantErr) > 0 {
			for _, w := range tc.wantErr {
				if !strings.Contains(errs.ToAggregate().Error(), w) {
					t.Errorf("%s: validation %v does not contain %q", tc.name, errs, w)
				}
			}
			if injectErr == nil {
				t.Errorf("%s: injected anyway", tc.name)
			}
			continue
		}
		if len(errs) > 0 || injectErr != nil {
			t.Errorf("%s: refused: %v / %v", tc.name, errs, injectErr)
			continue
		}
		if got := sizes(agentOf(t, out).Resources); got != tc.want {
			t.Errorf("%s: sidecar %s, want %s", tc.name, got, tc.want)
		}
	}
}

func agentOf(t *testing.T, job *batchv1.Job) corev1.Container {
	t.Helper()
	for _, c := range job.Spec.Template.Spec.InitContainers {
		if c.Name == SidecarName {
			return c
		}
	}
	t.Fatalf("no %s container in %s", SidecarName, job.Name)
	return corev1.Container{}
}
