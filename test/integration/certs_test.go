package integration

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/test/kube"
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
	startWebhook(t, c, cs, func(cfg *webhook.Config) {
		cfg.Certs = webhook.CertConfig{SelfSigned: true, CertDir: cfg.Certs.CertDir, SecretName: webhook.DefaultCertSecretName,
			ServiceName: webhook.DefaultServiceName, ExtraDNSNames: []string{"localhost"},
			MutatingConfigName: "dislock", ValidatingConfigName: "dislock"}
	})
	// Nothing plays the kubelet: the server serves the certificate from
	// its Secret, not from the cert dir a pod's secret volume would fill.
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
	// The server is added once the certificate is published and trusted;
	// until then the API server's calls fail and, with failurePolicy Fail,
	// so do creates.
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
