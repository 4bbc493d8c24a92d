package inject

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/window"
)

// ValidateCronJob checks an opted-in CronJob: its dislock annotations (its
// own metadata merged with spec.jobTemplate.metadata, the template winning,
// as on the Jobs it creates), in schedule mode that spec.schedule and
// spec.timeZone give every cluster the same windows, and that its job
// template leaves room for the injection, and that the sidecar sizes it
// asks for are within what opts allows. Every problem is listed, each at
// the path where it is fixed. A CronJob that is not opted in gives nil.
func ValidateCronJob(cj *batchv1.CronJob, opts Options) field.ErrorList {
	if cj == nil {
		return nil
	}
	own, tmpl := cj.Annotations, cj.Spec.JobTemplate.Annotations
	merged := contract.Merge(own, tmpl)
	if !contract.Enabled(merged) {
		return nil
	}
	var errs field.ErrorList
	annotationPath := func(key string) *field.Path { return annotationPathOf(cj, key) }
	spec, err := contract.FromAnnotations(merged, cj.Namespace, cj.Name)
	if err != nil {
		for _, e := range flatten(err) {
			var fe *contract.FieldError
			switch {
			case !errors.As(e, &fe):
				errs = append(errs, field.Invalid(field.NewPath("metadata", "namespace"), cj.Namespace, e.Error()))
			case !hasKey(merged, fe.Annotation):
				errs = append(errs, field.Required(annotationPath(fe.Annotation), fe.Problem))
			default:
				errs = append(errs, field.Invalid(annotationPath(fe.Annotation), shown(fe.Value), fe.Problem))
			}
		}
	}
	_, sizeErrs := agentResourcesFor(merged, opts.WithDefaults())
	for _, fe := range sizeErrs {
		errs = append(errs, field.Invalid(annotationPath(fe.Annotation), shown(fe.Value), fe.Problem))
	}
	if _, ok := tmpl[StatusAnnotation]; ok {
		// It would be copied onto every Job, where it means "already
		// injected"; Inject refuses such Jobs, so refuse the CronJob now.
		errs = append(errs, field.Forbidden(annotationPath(StatusAnnotation),
			"only the dislock webhook writes this annotation, on the Jobs it injects (remove it)"))
	}
	errs = append(errs, scheduleProblems(cj, merged)...)
	errs = append(errs, preferProblems(cj, spec, merged)...)
	errs = append(errs, templateProblems(field.NewPath("spec", "jobTemplate", "spec"), &cj.Spec.JobTemplate.Spec)...)
	return errs
}

// CronJobWarnings lists what an opted-in CronJob is admitted with but should
// fix, as admission warnings (kubectl prints them). A CronJob that is not
// opted in gives none.
func CronJobWarnings(cj *batchv1.CronJob) []string {
	if cj == nil || !contract.Enabled(contract.Merge(cj.Annotations, cj.Spec.JobTemplate.Annotations)) {
		return nil
	}
	var out []string
	if ptr.Deref(cj.Spec.TimeZone, "") == "" {
		// Kubernetes reads a schedule without a zone in each
		// controller-manager's local zone: nothing in the CronJob says
		// when its ticks are, and the clusters cannot be made to agree.
		out = append(out, "dislock: spec.timeZone is not set, so each cluster's CronJob controller reads spec.schedule in its own local time zone: "+
			"controllers in different zones fire at different instants, and the same tick becomes two windows that both run. "+
			`Set spec.timeZone to the same zone in every cluster, e.g. "Etc/UTC".`)
	}
	if ptr.Deref(cj.Spec.JobTemplate.Spec.Template.Spec.ShareProcessNamespace, false) {
		out = append(out, "dislock: spec.jobTemplate.spec.template.spec.shareProcessNamespace is true, so the app containers see the dislock-agent sidecar's processes: "+
			"an app that can become the sidecar's uid (root with the container runtime's default capabilities can) may read this namespace's database credential "+
			"from a sidecar that is starting. Run the apps as non-root with all capabilities dropped (the restricted Pod Security Standard), or do not share the process namespace.")
	}
	return out
}

// probeSchedule is a schedule that always parses: ParseSchedule with it
// tells a bad time zone from a bad schedule.
const probeSchedule = "0 0 * * *"

// scheduleProblems checks, in schedule mode, that the CronJob's schedule and
// time zone are what window.ParseSchedule accepts: the same parser the agent
// computes windows with, which refuses @every (its ticks differ per cluster).
func scheduleProblems(cj *batchv1.CronJob, annotations map[string]string) field.ErrorList {
	mode, err := contract.ParseMode(annotations[contract.AnnotationMode])
	if err != nil || !mode.Schedule {
		return nil // a bad mode is reported by its annotation's error
	}
	tz := ptr.Deref(cj.Spec.TimeZone, "")
	if _, err := window.ParseSchedule(cj.Spec.Schedule, tz); err == nil {
		return nil
	}
	var errs field.ErrorList
	if _, err := window.ParseSchedule(probeSchedule, tz); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("spec", "timeZone"), tz, err.Error()))
	}
	if _, err := window.ParseSchedule(cj.Spec.Schedule, ""); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("spec", "schedule"), shown(cj.Spec.Schedule),
			err.Error()+"; dislock.io/mode "+mode.String()+" needs it"))
	}
	return errs
}

// annotationPathOf is where the CronJob's merged annotation key came
// from: the job template's wins.
func annotationPathOf(cj *batchv1.CronJob, key string) *field.Path {
	if _, ok := cj.Spec.JobTemplate.Annotations[key]; ok {
		return field.NewPath("spec", "jobTemplate", "metadata", "annotations").Key(key)
	}
	return field.NewPath("metadata", "annotations").Key(key)
}

// gapLookahead is how many of its next activations a schedule's shortest
// period is taken from: a daily schedule's cover its days across both
// daylight saving changes.
const gapLookahead = 1000

// preferProblems checks that a preferred cluster's grace ends before the
// schedule's next window begins. The other clusters claim a window the
// preferred one left only once the grace is over: by then the next tick's
// Job must not have replaced it (concurrencyPolicy Replace) or been held
// back by it (Forbid), and the window must not be judged missed yet (the
// default dislock.io/missed-after is one period).
// s is the CronJob's parsed annotations (the zero Spec when they are bad,
// which their own errors report).
func preferProblems(cj *batchv1.CronJob, s contract.Spec, annotations map[string]string) field.ErrorList {
	if s.PreferCluster == "" {
		return nil
	}
	sched, err := window.ParseSchedule(cj.Spec.Schedule, ptr.Deref(cj.Spec.TimeZone, ""))
	if err != nil {
		return nil // reported by scheduleProblems
	}
	gap := sched.ShortestGap(time.Now(), gapLookahead)
	if gap == 0 || s.PreferGrace < gap {
		return nil
	}
	value, ok := annotations[contract.AnnotationPreferGrace]
	if !ok {
		value = s.PreferGrace.String() + " (the default)"
	}
	return field.ErrorList{field.Invalid(annotationPathOf(cj, contract.AnnotationPreferGrace), shown(value),
		fmt.Sprintf("is not below the schedule's shortest period, %s: a window the preferred cluster leaves would be claimed elsewhere only after the next one began (want a grace below %s)", gap, gap))}
}

// flatten lists the leaves of an errors.Join tree.
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

// maxShownValue bounds how much of a bad value an error repeats, so that a
// large annotation does not swamp the admission message.
const maxShownValue = 120

func shown(v string) string {
	if len(v) <= maxShownValue {
		return v
	}
	cut := maxShownValue
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return v[:cut] + "..."
}
