package inject

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/dislock/dislock/lockagent/contract"
)

// A classic (non-native) service-mesh sidecar is a regular container that
// serves the pod's traffic and never exits by itself, so a Job's pod never
// completes after its app ended. The agent quits such sidecars: once every
// app container ended for good it POSTs to each one's quit endpoint, listed
// in DISLOCK_PROXY_QUIT. The webhook finds them here, from what the Job's
// pod template and namespace say, because the meshes inject their proxies
// into Pods, after this webhook admitted the Job: at Job admission the proxy
// container is normally not there yet.
//
// A mesh in native-sidecar mode (the proxy an init container with
// restartPolicy Always) ends with the pod by itself; the Job does not tell
// which mode the mesh will use, and a quit POST to a native proxy that the
// kubelet stops anyway does no harm, so the URL is set either way.

// The regular containers the meshes inject. dislock never wraps them and
// never counts them as app containers, whatever else the pod says: they are
// not the app, and wrapping one would hold the pod's network until the
// lock's decision.
const (
	IstioProxyContainer   = "istio-proxy"
	LinkerdProxyContainer = "linkerd-proxy"
)

// Istio's names (istio.io/latest/docs/reference/config/annotations and
// labels) and the quit endpoint of its pilot-agent.
const (
	// istioInjectKey on the pod, as a label or an annotation (the label
	// wins, as in Istio): a true value ("true", "yes", "y", "on") injects,
	// any other opts out.
	istioInjectKey = "sidecar.istio.io/inject"
	// istioInjectionLabel on the namespace: "enabled" or "disabled".
	istioInjectionLabel = "istio-injection"
	// istioRevLabel on the namespace, any value: injected by that revision.
	istioRevLabel = "istio.io/rev"
	// istioStatusPortAnnotation on the pod moves pilot-agent's status
	// server, which serves the quit endpoint.
	istioStatusPortAnnotation = "status.sidecar.istio.io/port"
	istioStatusPort           = "15020"
	istioQuitPath             = "/quitquitquit"
)

// Linkerd's names (linkerd.io/2/reference/proxy-configuration) and the quit
// endpoint of its proxy's admin server.
const (
	// linkerdInjectAnnotation on the pod or the namespace: "enabled" or
	// "ingress" injects, "disabled" opts out.
	linkerdInjectAnnotation = "linkerd.io/inject"
	// linkerdAdminPortAnnotation on the pod or the namespace moves the
	// admin server, which serves the quit endpoint.
	linkerdAdminPortAnnotation = "config.linkerd.io/admin-port"
	linkerdAdminPort           = "4191"
	linkerdQuitPath            = "/shutdown"
	// LinkerdAdminShutdownAnnotation must be "enabled" on the pod for the
	// proxy to serve its quit endpoint: Linkerd turned it off by default,
	// so that an app with a request-forgery hole cannot be made to stop its
	// own proxy. The webhook sets it on the pod template of a Job whose pod
	// Linkerd will inject, unless the template says otherwise.
	LinkerdAdminShutdownAnnotation = "config.linkerd.io/proxy-admin-shutdown"
	linkerdAdminShutdownEnabled    = "enabled"
)

// Mesh names, as messages spell them.
const (
	meshIstio   = "Istio"
	meshLinkerd = "Linkerd"
)

// meshProxy tells whether a regular container is a classic mesh sidecar.
func meshProxy(c corev1.Container) bool {
	return c.Name == IstioProxyContainer || c.Name == LinkerdProxyContainer
}

// MeshFinding is one mesh whose sidecar the pod will have.
type MeshFinding struct {
	Mesh string // meshIstio or meshLinkerd
	Why  string // what says so, e.g. "namespace label istio-injection=enabled"
	URL  string // its quit endpoint
}

// MeshPlan is what an admission decided about the pod's classic mesh
// sidecars, part of the Job's plan.
type MeshPlan struct {
	// Quit is the sidecar's DISLOCK_PROXY_QUIT.
	Quit []string
	// explicit: dislock.io/proxy-quit chose Quit (or none), nothing was
	// detected.
	explicit bool
	Findings []MeshFinding
	// PodAnnotations are added to the pod template.
	PodAnnotations map[string]string
	// notes tell the user what was detected and done; Warnings what will
	// go wrong. Both are admission warnings; each is one line.
	notes, Warnings []string
}

// planMeshes decides the quit endpoints of a Job's pod. choice is the
// CronJob's dislock.io/proxy-quit; namespace is the Job's, nil when it could
// not be read, and the pod template alone decides then.
//
// A pod on the node's network (hostNetwork) gets no mesh sidecar (Istio and
// Linkerd never inject one), and its loopback is the node's: a quit URL
// there reaches whatever listens on the node (an ingress gateway's
// pilot-agent on 15020), so nothing is detected for it, and an explicit
// choice is kept with a warning.
func planMeshes(tmpl *corev1.PodTemplateSpec, namespace *corev1.Namespace, choice contract.ProxyQuit) MeshPlan {
	if choice.Set {
		mp := MeshPlan{Quit: choice.URLs, explicit: true}
		if tmpl.Spec.HostNetwork && len(choice.URLs) > 0 {
			mp.Warnings = append(mp.Warnings, fmt.Sprintf("dislock: the pod uses the node's network (hostNetwork), so %s %s reaches the node's loopback: "+
				"the agent will POST there once the app containers ended, whatever listens on the node", contract.AnnotationProxyQuit, strings.Join(choice.URLs, ",")))
		}
		return mp
	}
	if tmpl.Spec.HostNetwork {
		return MeshPlan{}
	}
	var nsLabels, nsAnnotations map[string]string
	if namespace != nil {
		nsLabels, nsAnnotations = namespace.Labels, namespace.Annotations
	}
	var mp MeshPlan
	if why, ok := istioInjected(tmpl, nsLabels); ok {
		port, warning := podPort(tmpl.Annotations, nil, istioStatusPortAnnotation, istioStatusPort)
		mp.add(MeshFinding{Mesh: meshIstio, Why: why, URL: loopbackURL(port, istioQuitPath)}, warning)
	}
	if why, ok := linkerdInjected(tmpl, nsAnnotations); ok {
		port, warning := podPort(tmpl.Annotations, nsAnnotations, linkerdAdminPortAnnotation, linkerdAdminPort)
		f := MeshFinding{Mesh: meshLinkerd, Why: why, URL: loopbackURL(port, linkerdQuitPath)}
		mp.add(f, warning)
		switch v, set := tmpl.Annotations[LinkerdAdminShutdownAnnotation]; {
		case !set:
			mp.PodAnnotations = map[string]string{LinkerdAdminShutdownAnnotation: linkerdAdminShutdownEnabled}
			mp.notes[len(mp.notes)-1] += fmt.Sprintf(" (the pod template gets %s=%s, so that the proxy serves it)",
				LinkerdAdminShutdownAnnotation, linkerdAdminShutdownEnabled)
		case v != linkerdAdminShutdownEnabled:
			// The user's choice stands (Linkerd's own install may enable
			// the endpoint for every pod), but it is likely to keep the pod
			// running forever, so it is said.
			mp.Warnings = append(mp.Warnings, fmt.Sprintf("dislock: the pod template sets %s=%q, so the Linkerd proxy may refuse the agent's POST to %s "+
				"and the pod will not end by itself after its app (remove the annotation, or set it to %q)",
				LinkerdAdminShutdownAnnotation, v, f.URL, linkerdAdminShutdownEnabled))
		}
	}
	return mp
}

func (mp *MeshPlan) add(f MeshFinding, warning string) {
	mp.Findings = append(mp.Findings, f)
	mp.Quit = append(mp.Quit, f.URL)
	mp.notes = append(mp.notes, fmt.Sprintf("dislock: %s sidecar detected (%s): the agent will POST %s once the app containers ended", f.Mesh, f.Why, f.URL))
	if warning != "" {
		mp.Warnings = append(mp.Warnings, warning)
	}
}

// istioInjected tells whether Istio will inject its proxy into the pod, and
// why, following Istio's own rules: a namespace labelled
// istio-injection=disabled is never injected; otherwise the pod's
// sidecar.istio.io/inject decides when set; otherwise the namespace's
// istio-injection=enabled or istio.io/rev label. A proxy container already
// in the template is one whatever the labels say.
func istioInjected(tmpl *corev1.PodTemplateSpec, nsLabels map[string]string) (string, bool) {
	if hasContainer(tmpl, IstioProxyContainer) {
		return "container " + IstioProxyContainer + " in the pod template", true
	}
	if nsLabels[istioInjectionLabel] == "disabled" {
		return "", false
	}
	where, v, set := "pod template label", "", false
	if v, set = tmpl.Labels[istioInjectKey]; !set {
		where = "pod template annotation"
		v, set = tmpl.Annotations[istioInjectKey]
	}
	if set {
		switch strings.ToLower(v) {
		case "true", "yes", "y", "on":
			return where + " " + istioInjectKey + "=" + v, true
		}
		return "", false
	}
	if nsLabels[istioInjectionLabel] == "enabled" {
		return "namespace label " + istioInjectionLabel + "=enabled", true
	}
	if rev, ok := nsLabels[istioRevLabel]; ok {
		return "namespace label " + istioRevLabel + "=" + rev, true
	}
	return "", false
}

// linkerdInjected tells whether Linkerd will inject its proxy into the pod,
// and why: the pod's linkerd.io/inject annotation decides when set, else the
// namespace's. A proxy container already in the template is one whatever the
// annotations say.
func linkerdInjected(tmpl *corev1.PodTemplateSpec, nsAnnotations map[string]string) (string, bool) {
	injects := func(v string) bool { return v == "enabled" || v == "ingress" }
	if hasContainer(tmpl, LinkerdProxyContainer) {
		return "container " + LinkerdProxyContainer + " in the pod template", true
	}
	if v, set := tmpl.Annotations[linkerdInjectAnnotation]; set {
		if injects(v) {
			return "pod template annotation " + linkerdInjectAnnotation + "=" + v, true
		}
		return "", false
	}
	if v := nsAnnotations[linkerdInjectAnnotation]; injects(v) {
		return "namespace annotation " + linkerdInjectAnnotation + "=" + v, true
	}
	return "", false
}

func hasContainer(tmpl *corev1.PodTemplateSpec, name string) bool {
	for _, c := range tmpl.Spec.Containers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// podPort is the port the pod's annotation key (else the namespace's, when
// nsAnnotations is given) sets, or def; a value that is not a port is
// ignored with a warning, since the mesh cannot use it either.
func podPort(podAnnotations, nsAnnotations map[string]string, key, def string) (string, string) {
	v, set := podAnnotations[key]
	where := "the pod template's annotation"
	if !set {
		v, set = nsAnnotations[key]
		where = "the namespace's annotation"
	}
	if !set {
		return def, ""
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 1 && n <= 65535 && strings.TrimLeft(v, "0123456789") == "" && v[0] != '0' {
		return v, ""
	}
	return def, fmt.Sprintf("dislock: %s %s=%q is not a port (want 1-65535): the agent will use the default port %s", where, key, shown(v), def)
}

func loopbackURL(port, path string) string {
	return "http://" + net.JoinHostPort("127.0.0.1", port) + path
}
