package integration

import (
	"bytes"
	"context"
	"maps"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/test/tlstest"
	"github.com/dislock/dislock/webhook"
)

// --self-signed-certs: the webhook generates its CA and serving certificate,
// stores them in its Secret, and fills in both configurations' caBundle, after
// which the API server calls it and Jobs arrive injected.
func TestSelfSignedCertificatesAreGeneratedAndPublished(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	ctx := context.Background()
	namespace(t, cs, webhookNamespace, false)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: webhookNamespace, Name: webhook.DefaultCertSecretName}}
	if _, err := cs.CoreV1().Secrets(webhookNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var certDir string
	startWebhook(t, c, cs, func(cfg *webhook.Config) {
		certDir = cfg.Certs.CertDir
		cfg.Certs = webhook.CertConfig{SelfSigned: true, CertDir: certDir, SecretName: webhook.DefaultCertSecretName,
			ServiceName: webhook.DefaultServiceName, ExtraDNSNames: []string{"localhost"},
			MutatingConfigName: "dislock", ValidatingConfigName: "dislock"}
	})
	// In a pod the kubelet projects the certificate Secret into --cert-dir
	// (the chart mounts it there); here the test plays the kubelet.
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go projectSecret(cs, webhookNamespace, webhook.DefaultCertSecretName, certDir, stop)
	await(t, "the caBundle of both configurations", func() (bool, error) {
		m, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "dislock", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "dislock", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return len(m.Webhooks[0].ClientConfig.CABundle) > 0 && len(v.Webhooks[0].ClientConfig.CABundle) > 0, nil
	})
	stored, err := cs.CoreV1().Secrets(webhookNamespace).Get(ctx, webhook.DefaultCertSecretName, metav1.GetOptions{})
	if err != nil || len(stored.Data) == 0 {
		t.Fatalf("certificate secret: %+v %v", stored, err)
	}

	namespace(t, cs, "selfsigned", true)
	awaitOptedIn(t, cs, "selfsigned")
	// The server starts serving once the certificate is on disk; until then
	// the API server's calls fail and, with failurePolicy Fail, so do creates.
	var cj *batchv1.CronJob
	await(t, "the webhook to admit a CronJob", func() (bool, error) {
		var err error
		cj, err = cs.BatchV1().CronJobs("selfsigned").Create(ctx, withAnnotations(cronJob("selfsigned", "report", "0 0 1 1 *"), map[string]string{contract.AnnotationMode: "schedule"}), metav1.CreateOptions{})
		return err == nil, nil
	})
	tick := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	await(t, "an injected Job", func() (bool, error) {
		job, err := cs.BatchV1().Jobs("selfsigned").Create(ctx, jobFor(cj, tick), metav1.CreateOptions{})
		if err != nil {
			t.Logf("create: %v", err)
			return false, nil
		}
		assertInjected(t, job, "2026-12-02T12:00:00Z", "schedule")
		return true, nil
	})
}

// projectSecret writes the Secret's keys into dir whenever they change, the
// way the kubelet updates a secret volume.
func projectSecret(cs kubernetes.Interface, ns, name, dir string, stop <-chan struct{}) {
	var last map[string][]byte
	for {
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		s, err := cs.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || len(s.Data) == 0 || maps.EqualFunc(s.Data, last, bytes.Equal) {
			continue
		}
		if tlstest.WriteFiles(dir, s.Data) == nil {
			last = s.Data
		}
	}
}
