package inject

// Sizing the sidecar: the installation's defaults and ceilings (the
// webhook's flags), and a CronJob's own sizes within the ceilings (its
// dislock.io/agent-* annotations).

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/dislock/dislock/lockagent/contract"
)

// The sidecar's sizes by default, and the most a CronJob may ask for.
//
// The agent is idle but for a heartbeat every ttl/3; its peak RSS is what
// `go test ./lockagent/agent/` reports at its end (docs/benchmarks.md). The
// memory limit leaves room for a burst of reconnects without letting a leak
// starve the app. The CPU limit lets a ResourceQuota on limits.cpu admit the
// pod; it is far above what the agent uses, so that its start (copying its
// binary into the shared volume) and its heartbeats are never throttled.
const (
	DefaultAgentCPURequest    = "10m"
	DefaultAgentCPULimit      = "500m"
	DefaultAgentMemoryRequest = "16Mi"
	DefaultAgentMemoryLimit   = "64Mi"
	DefaultAgentMaxCPU        = "1"
	DefaultAgentMaxMemory     = "256Mi"

	// The least a limit may be: below them the agent is killed for memory
	// (its peak RSS is about 20 MiB) or takes seconds to start.
	MinAgentCPULimit    = "10m"
	MinAgentMemoryLimit = "32Mi"
)

// minLimits are the least limits, by resource.
var minLimits = corev1.ResourceList{
	corev1.ResourceCPU:    resource.MustParse(MinAgentCPULimit),
	corev1.ResourceMemory: resource.MustParse(MinAgentMemoryLimit),
}

// agentSize is one of the sidecar's four sizes.
type agentSize struct {
	annotation string
	// setting names it among the webhook's flags ("agent CPU request").
	setting string
	limit   bool
	name    corev1.ResourceName
}

var agentSizes = []agentSize{
	{contract.AnnotationAgentCPURequest, "agent CPU request", false, corev1.ResourceCPU},
	{contract.AnnotationAgentCPULimit, "agent CPU limit", true, corev1.ResourceCPU},
	{contract.AnnotationAgentMemoryRequest, "agent memory request", false, corev1.ResourceMemory},
	{contract.AnnotationAgentMemoryLimit, "agent memory limit", true, corev1.ResourceMemory},
}

// DefaultAgentResources are the sidecar's requests and limits by default.
func DefaultAgentResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse(DefaultAgentCPURequest),
			corev1.ResourceMemory: resource.MustParse(DefaultAgentMemoryRequest),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse(DefaultAgentCPULimit),
			corev1.ResourceMemory: resource.MustParse(DefaultAgentMemoryLimit),
		},
	}
}

// DefaultAgentMaxResources is the most a CronJob may ask for its sidecar,
// request or limit.
func DefaultAgentMaxResources() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse(DefaultAgentMaxCPU),
		corev1.ResourceMemory: resource.MustParse(DefaultAgentMaxMemory),
	}
}

// AgentResources builds the sidecar's default resources from the webhook's
// flags; "" keeps a size's default. A request left at its default that is
// above a limit set lower is lowered to the limit.
func AgentResources(cpuRequest, cpuLimit, memoryRequest, memoryLimit string) (corev1.ResourceRequirements, error) {
	values := map[agentSize]string{agentSizes[0]: cpuRequest, agentSizes[1]: cpuLimit, agentSizes[2]: memoryRequest, agentSizes[3]: memoryLimit}
	r, problems := resize(DefaultAgentResources(),
		func(s agentSize) string { return values[s] },
		func(s agentSize) string { return s.setting })
	var errs []error
	for _, p := range problems {
		if p.value == "" {
			errs = append(errs, fmt.Errorf("%s %s", p.size.setting, p.problem))
			continue
		}
		errs = append(errs, fmt.Errorf("%s %q %s", p.size.setting, p.value, p.problem))
	}
	return r, errors.Join(errs...)
}

// AgentMaxResources builds the most a CronJob may ask for from the
// webhook's flags; "" keeps the default.
func AgentMaxResources(maxCPU, maxMemory string) (corev1.ResourceList, error) {
	out := DefaultAgentMaxResources()
	var errs []error
	for name, v := range map[corev1.ResourceName]string{corev1.ResourceCPU: maxCPU, corev1.ResourceMemory: maxMemory} {
		if v == "" {
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() <= 0 {
			def := out[name]
			errs = append(errs, fmt.Errorf("agent maximum %s %q is not a positive quantity (want e.g. %q)", name, v, def.String()))
			continue
		}
		out[name] = q
	}
	return out, errors.Join(errs...)
}

// limitOf is the limit size of a resource.
func limitOf(name corev1.ResourceName) agentSize {
	for _, s := range agentSizes {
		if s.limit && s.name == name {
			return s
		}
	}
	panic("webhook: no agent limit size for " + string(name))
}

// sizeProblem is a size that cannot be used, and why.
type sizeProblem struct {
	size    agentSize
	value   string
	problem string
}

// resize returns base with each size value(size) gives set to it ("" keeps
// base's), and every problem: a value that is not a positive quantity, a
// request above its limit (named by name).
func resize(base corev1.ResourceRequirements, value, name func(agentSize) string) (corev1.ResourceRequirements, []sizeProblem) {
	r := *base.DeepCopy()
	if r.Requests == nil {
		r.Requests = corev1.ResourceList{}
	}
	if r.Limits == nil {
		r.Limits = corev1.ResourceList{}
	}
	var problems []sizeProblem
	set := map[agentSize]bool{}
	for _, s := range agentSizes {
		v := value(s)
		if v == "" {
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() <= 0 {
			def := defaultOf(s)
			problems = append(problems, sizeProblem{s, v, fmt.Sprintf("is not a positive quantity (want e.g. %q)", def.String())})
			continue
		}
		if least, ok := minLimits[s.name]; s.limit && ok && q.Cmp(least) < 0 {
			problems = append(problems, sizeProblem{s, v, fmt.Sprintf("is below %s, the least the agent runs with", least.String())})
			continue
		}
		set[s] = true
		if s.limit {
			r.Limits[s.name] = q
		} else {
			r.Requests[s.name] = q
		}
	}
	for _, req := range agentSizes {
		if req.limit {
			continue
		}
		lim := limitOf(req.name)
		rq, rok := r.Requests[req.name]
		lq, lok := r.Limits[req.name]
		if !rok || !lok || rq.Cmp(lq) <= 0 {
			continue
		}
		if !set[req] {
			// Only the limit was chosen: the default request follows it.
			r.Requests[req.name] = lq
			continue
		}
		problems = append(problems, sizeProblem{req, value(req), fmt.Sprintf("is above the %s %s (raise that too, or lower this)", name(lim), lq.String())})
	}
	if len(r.Requests) == 0 {
		r.Requests = nil
	}
	if len(r.Limits) == 0 {
		r.Limits = nil
	}
	return r, problems
}

func defaultOf(s agentSize) resource.Quantity {
	d := DefaultAgentResources()
	if s.limit {
		return d.Limits[s.name]
	}
	return d.Requests[s.name]
}

// agentResourcesFor is the sidecar's resources for a Job with these
// (merged) dislock annotations: the installation's, with each size the
// annotations set instead, none above the installation's ceiling.
func agentResourcesFor(annotations map[string]string, opts Options) (corev1.ResourceRequirements, []*contract.FieldError) {
	r, problems := resize(opts.AgentResources,
		func(s agentSize) string { return annotations[s.annotation] },
		func(s agentSize) string { return "limit " + s.annotation })
	var errs []*contract.FieldError
	for _, p := range problems {
		errs = append(errs, &contract.FieldError{Annotation: p.size.annotation, Value: p.value, Problem: p.problem})
	}
	for _, s := range agentSizes {
		v, ok := annotations[s.annotation]
		if !ok {
			continue
		}
		got := r.Requests[s.name]
		if s.limit {
			got = r.Limits[s.name]
		}
		if most, ok := opts.AgentMaxResources[s.name]; ok && got.Cmp(most) > 0 {
			errs = append(errs, &contract.FieldError{Annotation: s.annotation, Value: v,
				Problem: fmt.Sprintf("is above the most this installation gives the sidecar, %s (ask its administrator to raise the webhook's --agent-max-%s)", most.String(), s.name)})
		}
	}
	return r, errs
}
