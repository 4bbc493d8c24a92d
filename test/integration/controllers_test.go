package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/webhook"
	"github.com/dislock/dislock/webhook/controller"
	"github.com/dislock/dislock/webhook/inject"
)

// await polls cond until it holds or the deadline passes.
func await(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The sidecar's secretKeyRef can only name a Secret of the pod's namespace:
// the copier keeps one in every opted-in namespace, follows the source, and
// never touches a Secret it did not create.
func TestTheDatabaseSecretFollowsOptedInNamespaces(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	ctx := context.Background()
	namespace(t, cs, webhookNamespace, false)
	src := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: webhookNamespace, Name: inject.DefaultDBSecretName},
		StringData: map[string]string{"url": "postgres://dislock:one@db/dislock"}}
	if _, err := cs.CoreV1().Secrets(webhookNamespace).Create(ctx, src, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	startWebhook(t, c, cs, func(cfg *webhook.Config) { cfg.CopyDBSecret = true })
	namespace(t, cs, "copy-a", true)
	namespace(t, cs, "copy-b", true)
	mine := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "copy-b", Name: inject.DefaultDBSecretName},
		StringData: map[string]string{"url": "postgres://team-b@own-db/x"}}
	if _, err := cs.CoreV1().Secrets("copy-b").Create(ctx, mine, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	copyHas := func(ns, url string) func() (bool, error) {
		return func() (bool, error) {
			s, err := cs.CoreV1().Secrets(ns).Get(ctx, inject.DefaultDBSecretName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil && string(s.Data["url"]) == url && s.Labels[controller.ManagedByLabel] == controller.ManagedByValue, err
		}
	}
	await(t, "the copy in copy-a", copyHas("copy-a", "postgres://dislock:one@db/dislock"))

	src, err := cs.CoreV1().Secrets(webhookNamespace).Get(ctx, inject.DefaultDBSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src.Data = map[string][]byte{"url": []byte("postgres://dislock:two@db/dislock")}
	if _, err := cs.CoreV1().Secrets(webhookNamespace).Update(ctx, src, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, "the copy to follow the source", copyHas("copy-a", "postgres://dislock:two@db/dislock"))

	// copy-b's own Secret was reconciled too (the source changed) and is untouched.
	got, err := cs.CoreV1().Secrets("copy-b").Get(ctx, inject.DefaultDBSecretName, metav1.GetOptions{})
	if err != nil || string(got.Data["url"]) != "postgres://team-b@own-db/x" || got.Labels[controller.ManagedByLabel] != "" {
		t.Fatalf("the user's own Secret was changed: %+v %v", got, err)
	}

	setOptIn(t, cs, "copy-a", false)
	await(t, "the copy to go when the namespace opts out", func() (bool, error) {
		_, err := cs.CoreV1().Secrets("copy-a").Get(ctx, inject.DefaultDBSecretName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), client404(err)
	})
}

func client404(err error) error {
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// A person reading `kubectl describe cronjob` learns what dislock did.
func TestInjectionsAndDenialsAreEventsOnTheCronJob(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	ctx := context.Background()
	namespace(t, cs, webhookNamespace, false)
	startWebhook(t, c, cs)
	// Created before the namespace opted in, so the validating webhook never
	// saw its bad annotation; its Jobs are denied once the namespace opts in.
	namespace(t, cs, "events", false)
	good, err := cs.BatchV1().CronJobs("events").Create(ctx, withAnnotations(cronJob("events", "good", "0 0 1 1 *"), map[string]string{contract.AnnotationMode: "lease"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := cs.BatchV1().CronJobs("events").Create(ctx, withAnnotations(cronJob("events", "bad", "0 0 1 1 *"), map[string]string{contract.AnnotationMode: "lease", contract.AnnotationLeaseTTL: "2h"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cs.CoreV1().Namespaces().Get(ctx, "events", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels[contract.LabelInjection] = contract.LabelInjectionEnabled
	if _, err := cs.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	tick := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	// The API server matches namespaceSelector against its own informer's
	// copy of the namespace, so the new label takes a moment to count: the
	// bad CronJob's Job is retried until the webhook denies it.
	await(t, "the webhook to see the namespace opted in", func() (bool, error) {
		_, err := cs.BatchV1().Jobs("events").Create(ctx, jobFor(bad, tick), metav1.CreateOptions{})
		if err == nil {
			cs.BatchV1().Jobs("events").Delete(ctx, jobFor(bad, tick).Name, metav1.DeleteOptions{})
			return false, nil
		}
		return strings.Contains(err.Error(), "lease-ttl"), nil
	})
	assertInjected(t, createJob(t, cs, jobFor(good, tick)), tick.Format(time.RFC3339), "lease")
	// What the namespace held at the last look, for the failure message.
	var seen []string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("events seen in namespace events:\n%s", strings.Join(seen, "\n"))
		}
	})
	for _, want := range []struct{ cronJob, reason, text string }{
		{"good", "DislockInjected", "lease lock events/good"},
		{"bad", "DislockDenied", "dislock.io/lease-ttl"},
	} {
		await(t, want.reason+" event on "+want.cronJob, func() (bool, error) {
			evs, err := cs.EventsV1().Events("events").List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			seen = seen[:0]
			for _, e := range evs.Items {
				seen = append(seen, e.Regarding.Kind+"/"+e.Regarding.Name+" "+e.Reason+": "+e.Note)
			}
			for _, e := range evs.Items {
				if e.Regarding.Name != want.cronJob {
					continue
				}
				if e.Reason == want.reason && e.Regarding.Kind == "CronJob" && strings.Contains(e.Note, want.text) {
					return true, nil
				}
			}
			return false, nil
		})
	}
}

// awaitOptedIn waits until the API server's namespaceSelector sees ns as
// opted in (it matches against its own informer's copy of the namespace): a
// dry-run CronJob with a bad mode is refused by the webhook.
func awaitOptedIn(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	probe := withAnnotations(cronJob(ns, "opt-in-probe", "* * * * *"), map[string]string{contract.AnnotationMode: "sometimes"})
	await(t, "the webhook to see namespace "+ns+" opted in", func() (bool, error) {
		_, err := cs.BatchV1().CronJobs(ns).Create(context.Background(), probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "sometimes"), nil
	})
}
