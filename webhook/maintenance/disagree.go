package maintenance

import (
	"context"
	"fmt"
	"sort"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/store"
)

// ReasonClustersDisagree is the reason of the Warning Event put on a CronJob
// whose clusters see the job differently.
const ReasonClustersDisagree = "DislockClustersDisagree"

// disagreement is one Event to put on one CronJob of this cluster.
type disagreement struct {
	cronJob client.ObjectKey
	message string
}

// disagreements matches the keys whose clusters' views differ (from
// store.Store.ListDisagreements) with this cluster's opted-in CronJobs that
// lock those keys, and says what differs. Pure: the caller lists and emits.
func disagreements(views []store.ClusterView, cronJobs []batchv1.CronJob) []disagreement {
	byKey := map[string][]store.ClusterView{}
	for _, v := range views {
		byKey[v.Key] = append(byKey[v.Key], v)
	}
	var out []disagreement
	for _, cj := range cronJobs {
		annotations := contract.Merge(cj.Annotations, cj.Spec.JobTemplate.Annotations)
		if !contract.Enabled(annotations) {
			continue
		}
		s, err := contract.FromAnnotations(annotations, cj.Namespace, cj.Name)
		if err != nil {
			continue
		}
		vs := byKey[s.Key()]
		if len(vs) == 0 {
			continue
		}
		parts := make([]string, 0, len(vs))
		views := make([]store.View, 0, len(vs))
		for _, v := range vs {
			parts = append(parts, v.Cluster+": "+v.View.String())
			views = append(views, v.View)
		}
		sort.Strings(parts)
		out = append(out, disagreement{
			cronJob: client.ObjectKeyFromObject(&cj),
			message: fmt.Sprintf("clusters see lock %s differently (%s): %s", s.Key(), strings.Join(parts, "; "), store.DisagreementAdvice(views...)),
		})
	}
	return out
}

// reportDisagreements puts a Warning Event on each CronJob of this cluster
// whose lock's clusters disagree. It says a message again only once it
// changed (seen holds what was said; Events aggregate repeats anyway).
func reportDisagreements(ctx context.Context, db *store.Store, c client.Reader, rec events.EventRecorder, seen map[client.ObjectKey]string) error {
	views, err := db.ListDisagreements(ctx, store.DefaultViewRecency)
	if err != nil || len(views) == 0 {
		return err
	}
	var list batchv1.CronJobList
	if err := c.List(ctx, &list); err != nil {
		return fmt.Errorf("listing CronJobs: %w", err)
	}
	for _, d := range disagreements(views, list.Items) {
		if seen[d.cronJob] == d.message {
			continue
		}
		seen[d.cronJob] = d.message
		for i := range list.Items {
			if cj := &list.Items[i]; client.ObjectKeyFromObject(cj) == d.cronJob {
				rec.Eventf(cj, nil, corev1.EventTypeWarning, ReasonClustersDisagree, "Check", "%s", d.message)
			}
		}
	}
	return nil
}
