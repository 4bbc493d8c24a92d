package chart

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/webhook/inject"
)

// createNamespace creates ns with its "default" ServiceAccount, which the
// controller-manager's ServiceAccount controller creates in a real cluster
// and the API server's admission looks up for every pod that names none
// (the chart's `helm test` pod).
func createNamespace(t *testing.T, c *kube.Cluster, ns string) {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	_, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().ServiceAccounts(ns).Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// ensureOptionalCRDs creates the stand-in CRDs (optionalCRDs) once they are
// needed, and waits until the API server serves them.
func ensureOptionalCRDs(t *testing.T, c *kube.Cluster) {
	t.Helper()
	kubectl(t, c, []byte(optionalCRDs), "apply", "--server-side", "-f", "-")
	kubectl(t, c, nil, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/servicemonitors.monitoring.coreos.com", "crd/certificates.cert-manager.io", "crd/issuers.cert-manager.io")
}

// label opts namespace ns in (on) or out.
func label(t *testing.T, cs kubernetes.Interface, ns string, on bool) {
	t.Helper()
	value := `"` + contract.LabelInjectionEnabled + `"`
	if !on {
		value = "null"
	}
	patch := `{"metadata":{"labels":{"` + contract.LabelInjection + `":` + value + `}}}`
	if _, err := cs.CoreV1().Namespaces().Patch(context.Background(), ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// optIn labels the release namespace and kube-system, and then a new
// namespace team, with the opt-in label, and waits until the API server's
// webhooks see team opted in: the validating webhook refuses a bad CronJob
// there. The API server learns namespace labels from one watch, in order, so
// by then it has seen the first two labels as well, and a webhook call it
// does not make there is a call it skipped, not one it did not know about.
func (r *release) optIn(t *testing.T, team string) string {
	t.Helper()
	label(t, r.admin, r.ns, true)
	label(t, r.admin, "kube-system", true)
	t.Cleanup(func() { label(t, r.admin, "kube-system", false) })
	createNamespace(t, r.c, team)
	label(t, r.admin, team, true)
	probe := cronJobIn(team, "opt-in-probe", contract.AnnotationMode, "sometimes")
	await(t, 30*time.Second, "the webhooks to see namespace "+team+" opted in", func(ctx context.Context) (bool, error) {
		_, err := r.admin.BatchV1().CronJobs(team).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "sometimes"), nil
	})
	return team
}

// injects shows the webhooks at work in an opted-in namespace, configured as
// the chart says: a bad CronJob is refused, a CronJob's Job gets the sidecar
// with the chart's image, cluster name and database Secret, an event says so
// on the CronJob, and a Job no CronJob controls is left alone.
func (r *release) injects(t *testing.T, team string) {
	t.Helper()
	ctx := context.Background()
	bad := cronJobIn(team, "bad", contract.AnnotationMode, "schedule", contract.AnnotationLeaseTTL, "5")
	if _, err := r.admin.BatchV1().CronJobs(team).Create(ctx, bad, metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), contract.AnnotationLeaseTTL) {
		t.Errorf("a CronJob with lease-ttl 5 was not refused for it: %v", err)
	}
	cj, err := r.admin.BatchV1().CronJobs(team).Create(ctx, cronJobIn(team, "report", contract.AnnotationMode, "schedule"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	job, err := r.admin.BatchV1().Jobs(team).Create(ctx, jobOf(cj, time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := job.Spec.Template.Spec
	if job.Annotations[contract.AnnotationStatus] == "" || len(pod.InitContainers) == 0 || pod.InitContainers[0].Name != inject.SidecarName {
		t.Fatalf("the Job was not injected: annotations %v, init containers %+v", job.Annotations, pod.InitContainers)
	}
	sidecar := pod.InitContainers[0]
	env := map[string]corev1.EnvVar{}
	for _, e := range sidecar.Env {
		env[e.Name] = e
	}
	if sidecar.Image != r.flags.value("agent-image") || env[contract.EnvCluster].Value != r.flags.value("cluster-name") {
		t.Errorf("sidecar image %q cluster %q, want the chart's %q and %q", sidecar.Image, env[contract.EnvCluster].Value,
			r.flags.value("agent-image"), r.flags.value("cluster-name"))
	}
	if ref := env[contract.EnvDatabaseURL].ValueFrom; ref == nil || ref.SecretKeyRef == nil ||
		ref.SecretKeyRef.Name != r.flags.value("db-secret-name") || ref.SecretKeyRef.Key != r.flags.value("db-secret-key") {
		t.Errorf("the sidecar's %s is %+v, want the chart's Secret %s key %s", contract.EnvDatabaseURL, ref,
			r.flags.value("db-secret-name"), r.flags.value("db-secret-key"))
	}
	if cmd := pod.Containers[0].Command; !slices.Equal(cmd[:min(len(cmd), len(inject.WrapperPrefix))], inject.WrapperPrefix) {
		t.Errorf("the app's command %v is not wrapped", cmd)
	}
	await(t, 30*time.Second, "the DislockInjected event on the CronJob", func(ctx context.Context) (bool, error) {
		return hasEvent(ctx, r.admin, team, "DislockInjected", cj.Name)
	})
	handmade := jobOf(cj, time.Date(2026, 12, 2, 3, 5, 0, 0, time.UTC))
	handmade.OwnerReferences, handmade.Name = nil, "handmade"
	untouched(t, r.admin, handmade)
}

// leavesAlone shows that neither webhook is called in the namespaces, though
// they carry the opt-in label: a CronJob with a bad mode is stored, and its
// Job is stored as it came.
func (r *release) leavesAlone(t *testing.T, namespaces ...string) {
	t.Helper()
	ctx := context.Background()
	for _, ns := range namespaces {
		name := "ignored-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
		cj, err := r.admin.BatchV1().CronJobs(ns).Create(ctx, cronJobIn(ns, name, contract.AnnotationMode, "sometimes"), metav1.CreateOptions{})
		if err != nil {
			t.Errorf("a CronJob in %s went to the webhook: %v", ns, err)
			continue
		}
		t.Cleanup(func() {
			_ = r.admin.BatchV1().CronJobs(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		untouched(t, r.admin, jobOf(cj, time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)))
	}
}

func untouched(t *testing.T, cs kubernetes.Interface, job *batchv1.Job) {
	t.Helper()
	stored, err := cs.BatchV1().Jobs(job.Namespace).Create(context.Background(), job, metav1.CreateOptions{})
	if err != nil {
		t.Errorf("creating Job %s/%s: %v", job.Namespace, job.Name, err)
		return
	}
	t.Cleanup(func() {
		_ = cs.BatchV1().Jobs(job.Namespace).Delete(context.Background(), job.Name, metav1.DeleteOptions{})
	})
	if _, ok := stored.Annotations[contract.AnnotationStatus]; ok || len(stored.Spec.Template.Spec.InitContainers) > 0 {
		t.Errorf("Job %s/%s was changed by the webhook", job.Namespace, job.Name)
	}
}

// hasEvent reports whether an event with the reason exists in ns, about the
// named object ("" for any).
func hasEvent(ctx context.Context, cs kubernetes.Interface, ns, reason, about string) (bool, error) {
	events, err := cs.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	for _, e := range events.Items {
		if e.Reason == reason && (about == "" || e.Regarding.Name == about) {
			return true, nil
		}
	}
	return false, nil
}

// cronJobIn is a CronJob with the annotations (key, value, ...) whose app
// container has a command.
func cronJobIn(ns, name string, annotations ...string) *batchv1.CronJob {
	a := map[string]string{}
	for i := 0; i+1 < len(annotations); i += 2 {
		a[annotations[i]] = annotations[i+1]
	}
	return &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: a},
		Spec: batchv1.CronJobSpec{Schedule: "0 3 * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyOnFailure,
				Containers: []corev1.Container{{Name: "app", Image: "example.com/report:1", Command: []string{"/report"}}}}}}}},
	}
}

// jobOf is the Job the CronJob controller creates for the tick.
func jobOf(cj *batchv1.CronJob, tick time.Time) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: cj.Namespace, Name: cj.Name + "-" + strconv.FormatInt(tick.Unix()/60, 10),
			Annotations:     map[string]string{batchv1.CronJobScheduledTimestampAnnotation: tick.Format(time.RFC3339)},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))}},
		Spec: *cj.Spec.JobTemplate.Spec.DeepCopy(),
	}
}

// testRegistry is an image registry that wants a password, as a private
// one does: the webhook can only read an image's entrypoint with the Job's
// pull secret.
type testRegistry struct{ host string }

const registryUser, registryPassword = "user", "pass"

func startRegistry(t *testing.T) *testRegistry {
	t.Helper()
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if u, p, ok := req.BasicAuth(); !ok || u != registryUser || p != registryPassword {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	return &testRegistry{host: strings.TrimPrefix(srv.URL, "http://")}
}

// push writes an image whose config has the entrypoint and cmd, and returns
// its reference.
func (reg *testRegistry) push(t *testing.T, repoTag string, entrypoint, cmd []string) string {
	t.Helper()
	img, err := mutate.Config(empty.Image, v1.Config{Entrypoint: entrypoint, Cmd: cmd})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(reg.host+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithAuth(&authn.Basic{Username: registryUser, Password: registryPassword})); err != nil {
		t.Fatal(err)
	}
	return ref.String()
}
