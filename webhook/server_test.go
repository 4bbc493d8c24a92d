package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/dislock/dislock/test/tlstest"
	"github.com/dislock/dislock/webhook/inject"
	"github.com/dislock/dislock/webhook/registry"
)

// testServer is the webhook's real server stack (controller-runtime's
// webhook server, TLS, the admission handlers) with an in-memory reader in
// place of the manager's cache. It lets the handlers be fuzzed and
// benchmarked over HTTPS without an API server; the API server tests live in
// test/e2e.
type testServer struct {
	url    string
	client *http.Client
	cancel context.CancelFunc
}

func startTestServer(t testing.TB, objects ...runtime.Object) *testServer {
	t.Helper()
	dir := t.TempDir()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(tlstest.ServingCert(t, dir))
	srv := crwebhook.NewServer(crwebhook.Options{Host: "127.0.0.1", Port: tlstest.FreePort(t), CertDir: dir,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.MinVersion = tls.VersionTLS12; c.NextProtos = []string{"http/1.1"} }}})
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithRuntimeObjects(objects...).Build()
	dec := admission.NewDecoder(scheme)
	srv.Register(MutateJobPath, &crwebhook.Admission{Handler: &jobMutator{cache: reader, api: reader,
		opts: testOptions(), resolver: registry.NewResolver(registry.Options{}), events: &events.FakeRecorder{}}})
	srv.Register(ValidateCronJobPath, &crwebhook.Admission{Handler: &cronJobValidator{decoder: dec}})
	srv.Register("/noop", &crwebhook.Admission{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Allowed("")
	})})
	ctx, cancel := context.WithCancel(context.Background())
	go srv.Start(ctx) //nolint:errcheck // the test sees failures as refused connections
	ts := &testServer{url: "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(srv.(*crwebhook.DefaultServer).Options.Port)), cancel: cancel,
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 64}}}
	t.Cleanup(cancel)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := ts.client.Get(ts.url + "/noop"); err == nil {
			return ts
		}
		if time.Now().After(deadline) {
			t.Fatal("the webhook server did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// review posts an AdmissionReview and returns the response.
func (ts *testServer) review(t testing.TB, path string, body []byte) (*admissionv1.AdmissionResponse, int) {
	t.Helper()
	resp, err := ts.client.Post(ts.url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Response == nil {
		return nil, resp.StatusCode
	}
	return out.Response, resp.StatusCode
}

func reviewBody(t testing.TB, kind string, op admissionv1.Operation, obj runtime.Object) []byte {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: types.UID("review-1"), Operation: op, Namespace: "team",
			Kind:   metav1.GroupVersionKind{Group: "batch", Version: "v1", Kind: kind},
			Object: runtime.RawExtension{Raw: raw}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testOptions() inject.Options {
	return inject.Options{ClusterName: "dc-a", AgentImage: "registry.example/dislock:test", DBSecretName: inject.DefaultDBSecretName, DBSecretKey: inject.DefaultDBSecretKey}.WithDefaults()
}

// cronJobAndJob returns an opted-in CronJob and the Job its controller
// would create for the 12:00 tick.
func cronJobAndJob(annotations map[string]string) (*batchv1.CronJob, *batchv1.Job) {
	tick := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	cj := &batchv1.CronJob{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "CronJob"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "report", UID: "cj-uid", Annotations: annotations},
		Spec: batchv1.CronJobSpec{Schedule: "* * * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "app", Image: "busybox", Command: []string{"sh", "-c", "echo hi"}}}}}}}},
	}
	job := &batchv1.Job{
		TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: fmt.Sprintf("report-%d", tick.Unix()/60),
			Annotations:     map[string]string{"batch.kubernetes.io/cronjob-scheduled-timestamp": tick.Format(time.RFC3339)},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))}},
		Spec: *cj.Spec.JobTemplate.Spec.DeepCopy(),
	}
	return cj, job
}
