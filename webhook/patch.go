package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"
)

// The admission response's JSON patch is built from the difference between
// the Job as decoded from the request and Inject's result for it, compared
// on the few paths Inject changes. Marshalling the whole injected Job and
// diffing it against the request's JSON decoded both documents into generic
// maps and then encoded every operation from those maps again; it was most
// of a mutation's CPU time and allocations (docs/benchmarks.md). Inject
// stays the only place that decides what is injected: nothing here knows
// what the sidecar, the volume or a wrapped command look like.
//
// The patch only adds, replaces or removes what differs, so what the
// webhook's API types do not know (fields of a newer Kubernetes) survives in
// everything it does not touch.

// decodeJob decodes the request's object as the API server's JSON
// serializer does (field names match case-sensitively, unknown fields are
// dropped), without the codec machinery around it: sniffing the content type
// and reading apiVersion and kind first scanned the whole document once more
// than the decoding itself. The webhook is registered for batch/v1 Jobs; an
// object that names another kind is refused like the codec would.
func decodeJob(raw []byte) (*batchv1.Job, error) {
	if len(raw) == 0 {
		return nil, errors.New("the request has no object")
	}
	job := &batchv1.Job{}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, job); err != nil {
		return nil, err
	}
	want := batchv1.SchemeGroupVersion.WithKind("Job")
	if (job.APIVersion != "" && job.APIVersion != want.GroupVersion().String()) || (job.Kind != "" && job.Kind != want.Kind) {
		return nil, fmt.Errorf("the object is apiVersion %q kind %q, not a %s", job.APIVersion, job.Kind, want)
	}
	return job, nil
}

// patchOp is one RFC 6902 operation. Value refers into the injected Job
// (a pointer, slice or map of it), so that building the patch copies none
// of it.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// patchTypeJSON is the patch type of every mutation this package answers.
var patchTypeJSON = admissionv1.PatchTypeJSONPatch

// patchResponse answers a Job admission with the patch that turns raw, the
// request's object, into injected. job is raw decoded, as Inject received
// it. An empty patch (the Job was already injected) is an allowed response
// without a patch.
func patchResponse(raw []byte, job, injected *batchv1.Job) (admission.Response, error) {
	patch, ok, err := jobPatch(job, injected)
	if err != nil {
		return admission.Response{}, err
	}
	if !ok {
		// Inject changed something jobPatch does not cover, or raw may lack
		// a parent of a path the patch needs: diffing the documents is slow
		// but right for any change.
		b, err := json.Marshal(injected)
		if err != nil {
			return admission.Response{}, fmt.Errorf("encoding the injected Job: %w", err)
		}
		resp := admission.PatchResponseFromRaw(raw, b)
		if !resp.Allowed {
			return admission.Response{}, fmt.Errorf("diffing the injected Job: %s", resp.Result.Message)
		}
		return resp, nil
	}
	resp := admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: true}}
	if patch != nil {
		resp.Patch, resp.PatchType = patch, &patchTypeJSON
	}
	return resp, nil
}

// jobPatch returns the JSON patch from job to injected (nil if they do not
// differ), covering the Job's annotations and labels, its
// podReplacementPolicy, the pod template's labels and annotations and its init
// containers, containers and volumes. ok is false when injected differs
// from job anywhere else, or when the request's JSON may lack the object a
// path of the patch lies in: the caller must diff the documents then.
func jobPatch(job, injected *batchv1.Job) (patch []byte, ok bool, err error) {
	s := scratches.Get().(*scratch)
	defer func() {
		*s = scratch{} // keep no references into this request's Jobs
		scratches.Put(s)
	}()
	if !s.sameUncovered(job, injected) {
		return nil, false, nil
	}
	// The handler's fallback name and namespace come from the request only
	// for Jobs with an ownerReference, which is in the request's metadata.
	if absent(&job.ObjectMeta) || absent(&job.Spec.Template.Spec) {
		return nil, false, nil
	}
	p := patcher{scratch: s, ops: make([]patchOp, 0, 8)}
	p.stringMap("/metadata/annotations", job.Annotations, injected.Annotations)
	p.stringMap("/metadata/labels", job.Labels, injected.Labels)
	// /spec exists: the pod spec below it was decoded.
	switch old, cur := job.Spec.PodReplacementPolicy, injected.Spec.PodReplacementPolicy; {
	case cur == nil && old != nil:
		p.remove("/spec/podReplacementPolicy")
	case cur != nil && (old == nil || *old != *cur):
		p.add("/spec/podReplacementPolicy", cur)
	}
	// The pod template's labels (contract.LabelInjected) and annotations (a mesh's
	// configuration): its metadata may be absent from the request, with no
	// member to add a key under, and is then set whole.
	oldMeta, curMeta := &job.Spec.Template.ObjectMeta, &injected.Spec.Template.ObjectMeta
	if !maps.Equal(oldMeta.Annotations, curMeta.Annotations) || !maps.Equal(oldMeta.Labels, curMeta.Labels) {
		if absent(oldMeta) {
			p.add("/spec/template/metadata", curMeta)
		} else {
			p.stringMap("/spec/template/metadata/labels", oldMeta.Labels, curMeta.Labels)
			p.stringMap("/spec/template/metadata/annotations", oldMeta.Annotations, curMeta.Annotations)
		}
	}
	const pod = "/spec/template/spec"
	old, cur := &job.Spec.Template.Spec, &injected.Spec.Template.Spec
	diffList(&p, pod+"/initContainers", old.InitContainers, cur.InitContainers, whole[corev1.Container](&p))
	diffList(&p, pod+"/containers", old.Containers, cur.Containers, p.container)
	diffList(&p, pod+"/volumes", old.Volumes, cur.Volumes, whole[corev1.Volume](&p))
	if len(p.ops) == 0 {
		return nil, true, nil
	}
	b, err := json.Marshal(p.ops)
	if err != nil {
		return nil, false, fmt.Errorf("encoding the JSON patch: %w", err)
	}
	return b, true, nil
}

// absent tells whether the object *v was decoded from may be missing or
// null in the request: any field decoded proves that it was there, as the
// decoder defaults nothing.
func absent[T any](v *T) bool {
	return reflect.ValueOf(v).Elem().IsZero()
}

// scratch holds the copies jobPatch compares with the fields it patches
// itself cleared. It is pooled: the two Jobs alone are 2.6 KB, which every
// admission would allocate otherwise, and the rate of allocation sets how
// often the garbage collector runs, most of the webhook's tail latency under
// concurrent load (docs/benchmarks.md).
type scratch struct {
	jobs       [2]batchv1.Job
	containers [2]corev1.Container
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// sameUncovered tells whether a and b are equal but for the fields jobPatch
// compares itself.
func (s *scratch) sameUncovered(a, b *batchv1.Job) bool {
	s.jobs[0], s.jobs[1] = *a, *b
	for i := range s.jobs {
		u := &s.jobs[i]
		u.Annotations, u.Labels = nil, nil
		u.Spec.PodReplacementPolicy = nil
		u.Spec.Template.Annotations, u.Spec.Template.Labels = nil, nil
		u.Spec.Template.Spec.InitContainers = nil
		u.Spec.Template.Spec.Containers = nil
		u.Spec.Template.Spec.Volumes = nil
	}
	return reflect.DeepEqual(&s.jobs[0], &s.jobs[1])
}

// sameUnwrapped tells whether a and b are equal but for the fields
// patcher.container compares itself.
func (s *scratch) sameUnwrapped(a, b *corev1.Container) bool {
	s.containers[0], s.containers[1] = *a, *b
	for i := range s.containers {
		u := &s.containers[i]
		u.Command, u.Args, u.Env, u.VolumeMounts = nil, nil, nil, nil
	}
	return reflect.DeepEqual(&s.containers[0], &s.containers[1])
}

// patcher collects the operations of one patch.
type patcher struct {
	*scratch
	ops []patchOp
}

func (p *patcher) add(path string, v any) {
	p.ops = append(p.ops, patchOp{Op: "add", Path: path, Value: v})
}

func (p *patcher) replace(path string, v any) {
	p.ops = append(p.ops, patchOp{Op: "replace", Path: path, Value: v})
}

func (p *patcher) remove(path string) {
	p.ops = append(p.ops, patchOp{Op: "remove", Path: path})
}

// member sets the object member at path to cur when it differs from old. An
// empty value is omitted from the Job's JSON, so it removes the member. An
// "add" replaces a member that exists, and creates one that does not.
func member[T any](p *patcher, path string, old, cur []T) {
	switch {
	case len(old) == 0 && len(cur) == 0:
	case len(cur) == 0:
		p.remove(path)
	case !reflect.DeepEqual(old, cur):
		p.add(path, cur)
	}
}

// stringMap patches the map at path key by key. An empty or absent map is
// set whole: a key cannot be added under an object that is not there.
func (p *patcher) stringMap(path string, old, cur map[string]string) {
	switch {
	case len(old) == 0 && len(cur) == 0:
		return
	case len(cur) == 0:
		p.remove(path)
		return
	case len(old) == 0:
		p.add(path, cur)
		return
	}
	var changed, gone []string
	for k, v := range cur {
		if was, ok := old[k]; !ok || was != v {
			changed = append(changed, k)
		}
	}
	for k := range old {
		if _, ok := cur[k]; !ok {
			gone = append(gone, k)
		}
	}
	// Sorted, so that one Job always gives the same patch.
	slices.Sort(gone)
	slices.Sort(changed)
	for _, k := range gone {
		p.remove(path + "/" + pointerEscaper.Replace(k))
	}
	for _, k := range changed {
		p.add(path+"/"+pointerEscaper.Replace(k), cur[k])
	}
}

// pointerEscaper escapes a JSON-pointer reference token (RFC 6901): "~" is
// "~0" and "/" is "~1", as in the annotation key dislock.io/status.
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// diffList patches the array at path from old to cur: elements equal at
// both ends stay, the differing ones in between are updated pairwise with
// update, and the rest are inserted or removed there. An empty or absent
// array is set whole, since "add" to an index needs the array to exist.
func diffList[T any](p *patcher, path string, old, cur []T, update func(path string, old, cur *T)) {
	if len(old) == 0 || len(cur) == 0 {
		member(p, path, old, cur)
		return
	}
	n := min(len(old), len(cur))
	head := 0
	for head < n && reflect.DeepEqual(&old[head], &cur[head]) {
		head++
	}
	tail := 0
	for tail < n-head && reflect.DeepEqual(&old[len(old)-1-tail], &cur[len(cur)-1-tail]) {
		tail++
	}
	oldMid, curMid := old[head:len(old)-tail], cur[head:len(cur)-tail]
	both := min(len(oldMid), len(curMid))
	for i := range both {
		update(path+"/"+strconv.Itoa(head+i), &oldMid[i], &curMid[i])
	}
	at := path + "/" + strconv.Itoa(head+both)
	for range len(oldMid) - both {
		p.remove(at)
	}
	for i := range len(curMid) - both {
		p.add(path+"/"+strconv.Itoa(head+both+i), &curMid[both+i])
	}
}

// whole is the update of diffList for elements replaced whole.
func whole[T any](p *patcher) func(path string, old, cur *T) {
	return func(path string, _, cur *T) { p.replace(path, cur) }
}

// container updates the container at path field by field when only the
// fields Inject wraps differ, and whole otherwise. A container decoded as
// all zero may be null in the request, with no member to set.
func (p *patcher) container(path string, old, cur *corev1.Container) {
	if absent(old) || !p.sameUnwrapped(old, cur) {
		p.replace(path, cur)
		return
	}
	member(p, path+"/command", old.Command, cur.Command)
	member(p, path+"/args", old.Args, cur.Args)
	diffList(p, path+"/env", old.Env, cur.Env, whole[corev1.EnvVar](p))
	diffList(p, path+"/volumeMounts", old.VolumeMounts, cur.VolumeMounts, whole[corev1.VolumeMount](p))
}
