// Package integration runs the dislock webhook in process against a real
// kube-apiserver (and kube-controller-manager) built from the Kubernetes
// module: the API server calls the webhook over TLS, validates what it
// returns, and stores the result.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"k8s.io/utils/ptr"
	"os"
	"os/exec"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/tlstest"
	"github.com/dislock/dislock/webhook"
	"github.com/dislock/dislock/webhook/inject"
)

func TestMain(m *testing.M) {
	os.Exit(kube.Main(m, kube.Options{Name: "webhook", ControllerManager: true}))
}

const webhookNamespace = "dislock-system"

// startWebhook runs `dislock webhook` in process for the cluster, serving
// real TLS on loopback, and registers its configurations (registerWebhooks).
func startWebhook(t *testing.T, c *kube.Cluster, cs kubernetes.Interface, tune ...func(*webhook.Config)) {
	t.Helper()
	// Printed if the test fails: the manager's goroutines may log after a
	// test ended, so not through t.Log.
	logs := &harness.Buffer{}
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(logs)))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("webhook logs:\n%s", logs)
		}
	})
	dir := t.TempDir()
	port := tlstest.FreePort(t)
	cfg := webhook.Config{
		Inject:    inject.Options{ClusterName: "dc-a", AgentImage: "dislock:test", DBSecretName: inject.DefaultDBSecretName, DBSecretKey: inject.DefaultDBSecretKey},
		Namespace: webhookNamespace,
		Certs:     webhook.CertConfig{CertDir: dir},
	}
	for _, f := range tune {
		f(&cfg)
	}
	// With self-signed certificates the webhook writes its own certificate
	// and fills in the configurations' caBundle; the API server reaches it as
	// localhost, a name the generated certificate carries.
	var ca []byte
	host := "localhost"
	if !cfg.Certs.SelfSigned {
		ca, host = tlstest.ServingCert(t, dir), "127.0.0.1"
	}
	mgr, err := ctrl.NewManager(c.RESTConfig(), ctrl.Options{
		Cache:                  webhook.CacheOptions(cfg),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          crwebhook.NewServer(cfg.ServerOptions(crwebhook.Options{Host: "127.0.0.1", Port: port})),
		// Each test starts a webhook of its own in this one process.
		Controller: crconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := webhook.SetupWithManager(mgr, cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook manager: %v", err)
		}
	})

	registerWebhooks(t, cs, "https://"+host+":"+itoa(port), ca)
}

// registerWebhooks creates the two webhook configurations the way the Helm
// chart does (failurePolicy Fail, the opt-in namespaceSelector that also
// excludes the webhook's own namespace and kube-system, and the
// matchConditions of config/webhook/manifests.yaml, so that the API server
// evaluates the shipped CEL), calling the server at base, and deletes them
// when the test ends.
func registerWebhooks(t *testing.T, cs kubernetes.Interface, base string, ca []byte) {
	t.Helper()
	shipped := shippedMatchConditions(t)
	url := func(path string) *string { u := base + path; return &u }
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	ifNeeded := admissionregistrationv1.IfNeededReinvocationPolicy
	timeout := int32(5)
	optIn := &metav1.LabelSelector{
		MatchLabels: map[string]string{contract.LabelInjection: contract.LabelInjectionEnabled},
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn,
			Values: []string{webhookNamespace, "kube-system"}}},
	}
	ctx2 := context.Background()
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "dislock"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "jobs.dislock.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: url(webhook.MutateJobPath), CABundle: ca},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"batch"}, APIVersions: []string{"v1"}, Resources: []string{"jobs"}}}},
			FailurePolicy: &fail, SideEffects: &none, TimeoutSeconds: &timeout, AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector: optIn, ReinvocationPolicy: &ifNeeded, MatchConditions: shipped.mutating,
		}}}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "dislock"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "cronjobs.dislock.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: url(webhook.ValidateCronJobPath), CABundle: ca},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"batch"}, APIVersions: []string{"v1"}, Resources: []string{"cronjobs"}}}},
			FailurePolicy: &fail, SideEffects: &none, TimeoutSeconds: &timeout, AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector: optIn, MatchConditions: shipped.validating,
		}}}
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx2, mwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx2, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx2, "dislock", metav1.DeleteOptions{})
		cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx2, "dislock", metav1.DeleteOptions{})
	})
}

// matchConditions are the two webhooks' matchConditions.
type matchConditions struct {
	mutating, validating []admissionregistrationv1.MatchCondition
}

// shippedMatchConditions reads the webhooks' matchConditions from
// config/webhook/manifests.yaml (the chart renders the same; test/chart
// compares the two).
func shippedMatchConditions(t *testing.T) matchConditions {
	t.Helper()
	var out matchConditions
	b, err := os.ReadFile("../../config/webhook/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for doc := range bytes.SplitSeq(b, []byte("\n---\n")) {
		var mw admissionregistrationv1.MutatingWebhookConfiguration
		if err := yaml.Unmarshal(doc, &mw); err != nil {
			t.Fatal(err)
		}
		switch {
		case mw.Kind == "MutatingWebhookConfiguration" && len(mw.Webhooks) == 1:
			out.mutating = mw.Webhooks[0].MatchConditions
		case mw.Kind == "ValidatingWebhookConfiguration" && len(mw.Webhooks) == 1:
			out.validating = mw.Webhooks[0].MatchConditions
		}
	}
	if len(out.mutating) == 0 || len(out.validating) == 0 {
		t.Fatal("config/webhook/manifests.yaml: no matchConditions")
	}
	return out
}

func TestJobsOfAnnotatedCronJobsArriveInjected(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	ctx := context.Background()
	startWebhook(t, c, cs)
	namespace(t, cs, webhookNamespace, false)
	namespace(t, cs, "team", true)
	namespace(t, cs, "other", false)
	awaitOptedIn(t, cs, "team")

	cj := cronJob("team", "report", "* * * * *")
	created, err := cs.BatchV1().CronJobs("team").Create(ctx, cj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Opt the existing CronJob in, as `kubectl annotate` would.
	created.Annotations = map[string]string{contract.AnnotationMode: "schedule,lease"}
	if created, err = cs.BatchV1().CronJobs("team").Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("a Job created the way the CronJob controller does is stored injected", func(t *testing.T) {
		tick := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
		job := jobFor(created, tick)
		stored := createJob(t, cs, job)
		assertInjected(t, stored, "2026-12-02T12:00:00Z", "schedule,lease")
	})

	t.Run("a Job in a namespace without the label is stored untouched", func(t *testing.T) {
		other, err := cs.BatchV1().CronJobs("other").Create(ctx, withAnnotations(cronJob("other", "report", "* * * * *"), map[string]string{contract.AnnotationMode: "schedule"}), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stored := createJob(t, cs, jobFor(other, time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)))
		assertUntouched(t, stored)
	})

	t.Run("a Job no CronJob owns is stored untouched", func(t *testing.T) {
		job := jobFor(created, time.Date(2026, 12, 2, 12, 5, 0, 0, time.UTC))
		job.OwnerReferences = nil
		job.Name = "handmade"
		assertUntouched(t, createJob(t, cs, job))
	})

	t.Run("kubectl apply of a CronJob with bad annotations is refused with every problem named", func(t *testing.T) {
		manifest := func(mode, ttl string) string {
			return `apiVersion: batch/v1
kind: CronJob
metadata:
  name: applied
  namespace: team
  annotations:
    dislock.io/mode: "` + mode + `"
    dislock.io/lease-ttl: "` + ttl + `"
spec:
  schedule: "*/5 * * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers:
          - name: app
            image: busybox
            command: ["sh", "-c", "echo hi"]
`
		}
		out, err := kubectl(t, c, manifest("sometimes", "5"), "apply", "-f", "-")
		if err == nil {
			t.Fatalf("kubectl apply succeeded:\n%s", out)
		}
		for _, want := range []string{"denied", "dislock.io/mode", "sometimes", "dislock.io/lease-ttl", `"5"`} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl's refusal does not name %q:\n%s", want, out)
			}
		}
		if _, err := cs.BatchV1().CronJobs("team").Get(ctx, "applied", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the refused CronJob was stored anyway (get: %v)", err)
		}
		// The same manifest with the problems fixed goes through.
		if out, err := kubectl(t, c, manifest("schedule,lease", "5m"), "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply of the fixed CronJob: %v\n%s", err, out)
		}
	})

	t.Run("the real CronJob controller's Job arrives injected", func(t *testing.T) {
		var got *batchv1.Job
		deadline := time.Now().Add(90 * time.Second)
		for got == nil {
			jobs, err := cs.BatchV1().Jobs("team").List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for i, j := range jobs.Items {
				if j.Annotations["batch.kubernetes.io/cronjob-scheduled-timestamp"] != "" && strings.HasPrefix(j.Name, "report-") && j.Name != jobFor(created, time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)).Name {
					got = &jobs.Items[i]
				}
			}
			if time.Now().After(deadline) {
				t.Fatal("kube-controller-manager created no Job within 90s")
			}
			time.Sleep(time.Second)
		}
		assertInjected(t, got, got.Annotations["batch.kubernetes.io/cronjob-scheduled-timestamp"], "schedule,lease")
	})
}

func assertInjected(t *testing.T, job *batchv1.Job, window, mode string) {
	t.Helper()
	if job.Annotations[contract.AnnotationStatus] == "" {
		t.Fatalf("no %s annotation: %v", contract.AnnotationStatus, job.Annotations)
	}
	pod := job.Spec.Template.Spec
	if len(pod.InitContainers) == 0 || pod.InitContainers[0].Name != "dislock-agent" ||
		pod.InitContainers[0].RestartPolicy == nil || *pod.InitContainers[0].RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatalf("no native sidecar: %+v", pod.InitContainers)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range pod.InitContainers[0].Env {
		env[e.Name] = e
	}
	cronJob := job.Name[:max(0, strings.LastIndex(job.Name, "-"))] // <cronjob>-<minutes>
	if env[contract.EnvMode].Value != mode || env[contract.EnvKey].Value != job.Namespace+"/"+cronJob || env[contract.EnvCluster].Value != "dc-a" {
		t.Errorf("sidecar env: %+v", env)
	}
	if w, _ := time.Parse(time.RFC3339, window); env[contract.EnvWindow].Value != w.UTC().Format(time.RFC3339) {
		t.Errorf("DISLOCK_WINDOW %q, want %s", env[contract.EnvWindow].Value, window)
	}
	if ref := env[contract.EnvDatabaseURL].ValueFrom; ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != inject.DefaultDBSecretName {
		t.Errorf("database URL is not a secretKeyRef: %+v", env[contract.EnvDatabaseURL])
	}
	for _, c := range pod.Containers {
		if len(c.Command) < 3 || c.Command[0] != "/dislock/bin/dislock-agent" || c.Command[1] != "exec" {
			t.Errorf("container %s command %v is not wrapped", c.Name, c.Command)
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				t.Errorf("app container %s sees a secret: %+v", c.Name, e)
			}
		}
	}
}

func assertUntouched(t *testing.T, job *batchv1.Job) {
	t.Helper()
	if _, ok := job.Annotations[contract.AnnotationStatus]; ok || len(job.Spec.Template.Spec.InitContainers) != 0 {
		b, _ := json.Marshal(job.Spec.Template.Spec)
		t.Fatalf("job %s was changed: %s", job.Name, b)
	}
}

func namespace(t *testing.T, cs kubernetes.Interface, name string, optIn bool) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if optIn {
		ns.Labels = map[string]string{contract.LabelInjection: contract.LabelInjectionEnabled}
	}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func cronJob(ns, name, schedule string) *batchv1.CronJob {
	return &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: batchv1.CronJobSpec{Schedule: schedule, JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "app", Image: "busybox", Command: []string{"sh", "-c", "echo hi"}}}}}}}}}
}

func withAnnotations(cj *batchv1.CronJob, a map[string]string) *batchv1.CronJob {
	cj.Annotations = a
	return cj
}

// jobFor builds the Job the CronJob controller would create for tick: the
// name suffix, the scheduled-timestamp annotation and the controller
// ownerReference.
func jobFor(cj *batchv1.CronJob, tick time.Time) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: cj.Namespace, Name: cj.Name + "-" + itoa(int(tick.Unix()/60)),
			Annotations:     map[string]string{"batch.kubernetes.io/cronjob-scheduled-timestamp": tick.Format(time.RFC3339)},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))}},
		Spec: *cj.Spec.JobTemplate.Spec.DeepCopy(),
	}
}

func createJob(t *testing.T, cs kubernetes.Interface, job *batchv1.Job) *batchv1.Job {
	t.Helper()
	stored, err := cs.BatchV1().Jobs(job.Namespace).Create(context.Background(), job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating job %s: %v", job.Name, err)
	}
	return stored
}

func itoa(n int) string { return strconv.Itoa(n) }

// kubectl runs bin/kubectl against the cluster with stdin and returns its
// combined output.
func kubectl(t *testing.T, c *kube.Cluster, stdin string, args ...string) (string, error) {
	t.Helper()
	bin, err := kube.FindBinary("kubectl")
	if err != nil {
		kube.Missing(t, err)
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
