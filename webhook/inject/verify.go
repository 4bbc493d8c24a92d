package inject

import (
	"encoding/json"
	"errors"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dislock/dislock/lockagent/contract"
)

// A Job may arrive carrying an injection already: the webhook called again
// (reinvocationPolicy IfNeeded), or an injected Job copied (kubectl get job
// -o yaml | kubectl create -f -). It may also arrive with one written by
// hand: a tenant's sidecar with another team's DISLOCK_KEY, another image,
// or app commands that skip the wrapper. Such a Job is never trusted for
// what it says: the injection is taken off again (strip), the Job it came
// from is injected afresh with this webhook's options, and the Job passes
// only if it is exactly that, byte for byte in its JSON. So whatever passes
// is an injection this webhook would have made, with the key of the Job's
// own namespace.
//
// This keeps dislock's own parts honest; it is not what stops a tenant who
// runs the agent some other way (a pod of its own, an init container of
// another name): the database's row-level security on the tenant role is.

// envPrefix starts the name of every variable dislock sets.
const envPrefix = "DISLOCK_"

// ErrForgedInjection is in the error Inject returns for a Job that carries a
// part of an injection (see InjectionMarker) but is not exactly what dislock
// injects for it.
var ErrForgedInjection = errors.New("the Job carries an injection dislock did not make for it")

// forgedFix is what a user does about a forged or stale injection.
const forgedFix = "remove the " + SidecarName + " init container and the " + StatusAnnotation +
	" annotation (and any other part of an earlier injection: the " + VolumeName + " volume, " + envPrefix +
	" variables, commands run by " + agentCommand + ") and let the webhook inject"

// forgedError is the refusal of a Job that carries a part of an injection.
type forgedError struct {
	marker  *Marker
	problem string
	cause   error
}

func (e *forgedError) Error() string {
	return "the Job looks injected by dislock (" + e.marker.String() + "), but " + e.problem + "; " + forgedFix
}

func (e *forgedError) Is(target error) bool { return target == ErrForgedInjection }

func (e *forgedError) Unwrap() error { return e.cause }

// Marker is the first part of an injection found on a Job: where it is and
// what it is.
type Marker struct {
	path *field.Path
	what string
}

func (m *Marker) String() string { return m.path.String() + " " + m.what }

// InjectionMarker finds the first part of a dislock injection a Job carries:
// the status annotation, a container or init container named like the
// sidecar, the shared volume, a DISLOCK_ variable on any container, or a
// command that runs dislock-agent. nil means none: the Job is injected
// afresh.
func InjectionMarker(job *batchv1.Job) *Marker { return findMarker(job, false) }

// strayMarker finds, in a Job that carries an injection, the first part of
// one that is not where fresh puts it (a second sidecar, a variable on
// another container, a wrapper run twice), named at its path in the Job as
// it arrived. strip leaves these in place; fresh would refuse them at their
// path in the stripped Job, which is not the path a user sees.
func strayMarker(job *batchv1.Job) *Marker { return findMarker(job, true) }

// findMarker is InjectionMarker, or strayMarker when injected is set: then
// the parts fresh adds, at the places it adds them, do not count.
func findMarker(job *batchv1.Job, injected bool) *Marker {
	if _, ok := job.Annotations[StatusAnnotation]; ok && !injected {
		return &Marker{field.NewPath("metadata", "annotations").Key(StatusAnnotation), "is set"}
	}
	podPath := field.NewPath("spec", "template", "spec")
	pod := &job.Spec.Template.Spec
	lists := []struct {
		name       string
		containers []corev1.Container
	}{{"initContainers", pod.InitContainers}, {"containers", pod.Containers}}
	// The sidecar fresh adds: initContainers[0], compared whole later.
	isSidecar := func(list string, i int) bool {
		return injected && list == "initContainers" && i == 0 && pod.InitContainers[0].Name == SidecarName
	}
	for _, l := range lists {
		for i, c := range l.containers {
			if c.Name == SidecarName && !isSidecar(l.name, i) {
				return &Marker{podPath.Child(l.name).Index(i), "is named " + strconv.Quote(SidecarName)}
			}
		}
	}
	for i, v := range pod.Volumes {
		if v.Name == VolumeName && !(injected && i == len(pod.Volumes)-1) {
			return &Marker{podPath.Child("volumes").Index(i), "is named " + strconv.Quote(VolumeName)}
		}
	}
	for _, l := range lists {
		for i, c := range l.containers {
			if isSidecar(l.name, i) {
				continue
			}
			cp := podPath.Child(l.name).Index(i)
			for _, e := range c.Env {
				if dislockVariable(l.name, e.Name) {
					return &Marker{cp.Child("env").Key(e.Name), "is set"}
				}
			}
			command, at := c.Command, 0
			if injected && l.name == "containers" && wrapped(command) {
				// The wrapper fresh adds; what it runs must not be another.
				command, at = command[len(WrapperPrefix):], len(WrapperPrefix)
			}
			if runsAgent(command) {
				return &Marker{cp.Child("command").Index(at), "runs " + agentCommand}
			}
		}
	}
	return nil
}

// wrapped tells whether a command starts with WrapperPrefix.
func wrapped(command []string) bool {
	return len(command) >= len(WrapperPrefix) && slices.Equal(command[:len(WrapperPrefix)], WrapperPrefix)
}

// dislockVariable tells whether a variable of a container in the pod spec's
// list ("initContainers" or "containers") is one only dislock sets. An app
// container's own DISLOCK_CONTAINER_NAME is not: the injection replaces it
// (it is what a template copied from an injected pod carries), so it can
// neither point the wrapper elsewhere nor survive.
func dislockVariable(list, name string) bool {
	return strings.HasPrefix(name, envPrefix) && (list != "containers" || name != contract.EnvContainerName)
}

// runsAgent tells whether a command runs the dislock-agent binary, from the
// image's PATH (the sidecar) or from the shared volume (a wrapper).
func runsAgent(command []string) bool {
	return len(command) > 0 && path.Base(command[0]) == agentCommand
}

// verify checks a Job that carries a part of an injection against what
// fresh makes of the Job it came from, and returns it unchanged if it is
// exactly that.
func (r *Review) verify(opts Options) (Injection, error) {
	if !r.enabled {
		return Injection{}, &forgedError{marker: r.marker,
			problem: "neither it nor its CronJob opts in to dislock (no dislock.io/ annotation other than " + StatusAnnotation + ")"}
	}
	if stray := strayMarker(r.job); stray != nil {
		problem := "dislock never injects that"
		if stray.String() != r.marker.String() {
			problem = stray.String() + " too, which dislock never injects"
		}
		return Injection{}, &forgedError{marker: r.marker, problem: problem}
	}
	recovered, entrypoints := strip(r.job)
	r.carriedQuit = carriedProxyQuit(r.job)
	want, err := r.fresh(recovered, opts, entrypoints)
	if err != nil {
		return Injection{}, &forgedError{marker: r.marker, problem: "dislock would refuse the Job it was made from: " + err.Error(), cause: err}
	}
	// contract.LabelInjected only tells the outcome controller which pods
	// to watch: a webhook called after dislock that sets the template's
	// labels as a whole drops it, and the reinvocation puts it back rather
	// than refuse every Job of the CronJob.
	// The pod labels and annotations of the webhook's options serve the
	// same kind of purpose (a NetworkPolicy's selector, a mesh's setting)
	// and are put back the same way; a value that differs is taken for the
	// Job author's own, as on the first pass.
	job := r.job.DeepCopy()
	if job.Spec.Template.Labels[contract.LabelInjected] != contract.LabelInjectedValue {
		if job.Spec.Template.Labels == nil {
			job.Spec.Template.Labels = map[string]string{}
		}
		job.Spec.Template.Labels[contract.LabelInjected] = contract.LabelInjectedValue
	}
	addPodMetadata(&job.Spec.Template.ObjectMeta, opts)
	if d := firstDifference(job, want.Job); d != "" {
		return Injection{}, &forgedError{marker: r.marker, problem: "it is not what dislock injects for it: " + d}
	}
	want.Job = job
	return want, nil
}

// carriedProxyQuit is the proxy-quit choice of an injected Job's sidecar:
// its DISLOCK_PROXY_QUIT, none when it has no such variable, nil when it has
// no sidecar or a value the agent would refuse (then the plan is made afresh
// and the comparison finds the difference). A forged value can reach only
// the pod's loopback, as the tenant's own dislock.io/proxy-quit can.
func carriedProxyQuit(job *batchv1.Job) *contract.ProxyQuit {
	pod := &job.Spec.Template.Spec
	if len(pod.InitContainers) == 0 || pod.InitContainers[0].Name != SidecarName {
		return nil
	}
	for _, e := range pod.InitContainers[0].Env {
		if e.Name != contract.EnvProxyQuit {
			continue
		}
		if e.ValueFrom != nil || e.Value == "" {
			return nil
		}
		urls := strings.Split(e.Value, ",")
		if len(urls) > contract.MaxProxyQuit || slices.ContainsFunc(urls, func(u string) bool { return contract.ProxyQuitProblem(u) != "" }) {
			return nil
		}
		return &contract.ProxyQuit{Set: true, URLs: urls}
	}
	return &contract.ProxyQuit{Set: true}
}

// unknownEntrypoint stands for the image's entrypoint of an app container
// that has no command and no wrapper: such a Job differs from its injection
// at that container's command whatever the image says, so the registry is
// not asked.
const unknownEntrypoint = "<the image's entrypoint>"

// strip undoes an injection: it returns the Job an injected Job was made
// from, and the original entrypoint of every app container, read from
// behind its wrapper, for fresh to wrap again without a registry lookup.
// Only what fresh adds, where fresh adds it, is taken away; anything else
// (a second dislock-agent, a DISLOCK_ variable fresh never sets) stays, for
// fresh to refuse or the comparison to find.
func strip(job *batchv1.Job) (*batchv1.Job, map[string][]string) {
	out := job.DeepCopy()
	delete(out.Annotations, StatusAnnotation)
	delete(out.Spec.Template.Labels, contract.LabelInjected)
	pod := &out.Spec.Template.Spec
	if len(pod.InitContainers) > 0 && pod.InitContainers[0].Name == SidecarName {
		pod.InitContainers = slices.Delete(pod.InitContainers, 0, 1)
	}
	if n := len(pod.Volumes); n > 0 && pod.Volumes[n-1].Name == VolumeName {
		pod.Volumes = pod.Volumes[:n-1]
	}
	// The database CA's volume, just before it, only in the shape fresh
	// gives it: a volume of the user's that merely has the name stays, for
	// fresh to refuse when it adds its own.
	if n := len(pod.Volumes); n > 0 && pod.Volumes[n-1].Secret != nil &&
		reflect.DeepEqual(pod.Volumes[n-1], databaseCAVolume(pod.Volumes[n-1].Secret.SecretName)) {
		pod.Volumes = pod.Volumes[:n-1]
	}
	entrypoints := make(map[string][]string, len(pod.Containers))
	for i := range pod.Containers {
		c := &pod.Containers[i]
		if meshProxy(*c) {
			continue // fresh leaves a mesh proxy as it is
		}
		c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == contract.EnvContainerName })
		if n := len(c.VolumeMounts); n > 0 && c.VolumeMounts[n-1].Name == VolumeName && c.VolumeMounts[n-1].MountPath == SharedDir {
			c.VolumeMounts = c.VolumeMounts[:n-1]
		}
		switch {
		case wrapped(c.Command):
			rest := slices.Clone(c.Command[len(WrapperPrefix):])
			c.Command = nil
			if len(rest) > 0 {
				c.Command = rest
			}
			// Non-nil even when empty: an image entrypoint that was empty
			// (the args are the program) is a resolved one.
			entrypoints[c.Name] = append([]string{}, rest...)
		case len(c.Command) == 0:
			entrypoints[c.Name] = []string{unknownEntrypoint}
		}
	}
	return out, entrypoints
}

// firstDifference describes the first field where got differs from want,
// the injection dislock makes for it, or returns "" if they are the same
// JSON. The parts an injection consists of are compared first, so that the
// message names what a forger changed rather than a consequence of it.
func firstDifference(got, want *batchv1.Job) string {
	g, errG := generic(got)
	w, errW := generic(want)
	if err := errors.Join(errG, errW); err != nil {
		return "it cannot be compared (" + err.Error() + ")"
	}
	for _, at := range [][]string{
		{"spec", "template", "spec", "containers"},
		{"spec", "template", "spec", "initContainers"},
		{"spec", "template", "spec", "volumes"},
		{"metadata", "annotations"},
		{"spec", "podReplacementPolicy"},
		nil, // everything else
	} {
		if d := diffJSON(strings.Join(at, "."), dig(g, at), dig(w, at)); d != "" {
			return d
		}
	}
	return ""
}

// generic is v as JSON decodes into any: what the API server stores, with
// no distinction between a nil and an empty list.
func generic(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	return out, json.Unmarshal(b, &out)
}

func dig(v any, keys []string) any {
	for _, k := range keys {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	return v
}

// firstKeys are compared before the other members of an object, in this
// order: they say which container or variable a difference is in.
var firstKeys = []string{"name", "key", "mode", "image", "command", "args", "env", "value", "valueFrom"}

// diffJSON describes the first difference of two JSON values at path, or
// returns "". A missing object or list member compares as an empty one, so
// that the difference is named inside it.
func diffJSON(at string, got, want any) string {
	if reflect.DeepEqual(got, want) {
		return ""
	}
	gm, gIsMap := got.(map[string]any)
	wm, wIsMap := want.(map[string]any)
	if (gIsMap || got == nil) && (wIsMap || want == nil) {
		keys := make([]string, 0, len(gm)+len(wm))
		for k := range gm {
			keys = append(keys, k)
		}
		for k := range wm {
			if _, ok := gm[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.SortFunc(keys, func(a, b string) int {
			ia, ib := slices.Index(firstKeys, a), slices.Index(firstKeys, b)
			switch {
			case ia >= 0 && ib >= 0:
				return ia - ib
			case ia >= 0:
				return -1
			case ib >= 0:
				return 1
			}
			return strings.Compare(a, b)
		})
		for _, k := range keys {
			if d := diffJSON(memberPath(at, k), gm[k], wm[k]); d != "" {
				return d
			}
		}
		return ""
	}
	gl, gIsList := got.([]any)
	wl, wIsList := want.([]any)
	if (gIsList || got == nil) && (wIsList || want == nil) {
		for i := range max(len(gl), len(wl)) {
			var ge, we any
			if i < len(gl) {
				ge = gl[i]
			}
			if i < len(wl) {
				we = wl[i]
			}
			el := element(at, i, ge, we)
			if ge == nil || we == nil {
				// A whole element too many or missing: named, not entered.
				return differs(el, ge, we)
			}
			if d := diffJSON(el, ge, we); d != "" {
				return d
			}
		}
		return ""
	}
	// The status annotation is JSON itself: name the member that differs.
	if gs, ok := got.(string); ok && at == "metadata.annotations["+StatusAnnotation+"]" {
		if ws, ok := want.(string); ok {
			var gv, wv map[string]any
			if json.Unmarshal([]byte(gs), &gv) == nil && json.Unmarshal([]byte(ws), &wv) == nil {
				return diffJSON(at, gv, wv)
			}
		}
	}
	return differs(at, got, want)
}

func differs(at string, got, want any) string {
	if want == nil {
		return at + " is " + show(got) + "; dislock injects nothing there"
	}
	return at + " is " + show(got) + "; dislock injects " + show(want)
}

// memberPath is the path of an object's member: a.b, or a[b] for a key that
// is not a plain name (an annotation, say).
func memberPath(at, key string) string {
	plain := key != "" && strings.IndexFunc(key, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9')
	}) < 0
	switch {
	case !plain:
		return at + "[" + key + "]"
	case at == "":
		return key
	}
	return at + "." + key
}

// element is the path of a list element: env[NAME] for a variable (its
// name is what a reader looks for), list[i] otherwise.
func element(at string, i int, got, want any) string {
	if strings.HasSuffix(at, ".env") {
		gn, _ := dig(got, []string{"name"}).(string)
		wn, _ := dig(want, []string{"name"}).(string)
		switch {
		case gn != "" && (gn == wn || want == nil):
			return at + "[" + gn + "]"
		case wn != "" && got == nil:
			return at + "[" + wn + "]"
		}
	}
	return at + "[" + strconv.Itoa(i) + "]"
}

// show spells a JSON value for a message, shortened; an object by its name
// when it has one.
func show(v any) string {
	switch v := v.(type) {
	case nil:
		return "not set"
	case string:
		v = shown(v)
		if strings.Contains(v, `"`) && strconv.CanBackquote(v) {
			return "`" + v + "`"
		}
		return strconv.Quote(v)
	case map[string]any:
		if name, ok := v["name"].(string); ok {
			return `{"name":` + strconv.Quote(shown(name)) + ", …}"
		}
	}
	b, _ := json.Marshal(v)
	return shown(string(b))
}
