package integration

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/test/kube"
	"github.com/dislock/dislock/webhook"
)

// A private image's entrypoint, which the webhook read with team A's pull
// secret (and cached), is not given to team B's Job naming the same image
// without a working pull secret: the webhook asks the registry again with
// team B's credentials and denies the Job without repeating the entrypoint.
// Team A's Job gets it with a pull secret named by its pod template, and
// with one attached to its service account only (what the pod will pull
// with). A real API server admits and denies; the registry is
// go-containerregistry's, behind basic auth.
func TestASecondTenantWithoutAPullSecretCannotLearnAPrivateImagesEntrypoint(t *testing.T) {
	c := kube.Need(t)
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig())
	ctx := context.Background()
	const user, pass = "team-a", "s3cret"
	secretEntrypoint := []string{"/bin/secret-job", "--token-file=/run/secret"}
	reg := httptest.NewServer(requireBasicAuth(user, pass, registry.New()))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	image := pushPrivateImage(t, host+"/team-a/private:1", secretEntrypoint, &authn.Basic{Username: user, Password: pass})

	startWebhook(t, c, cs, func(cfg *webhook.Config) {
		cfg.Resolver.InsecureRegistries = []string{host} // plain HTTP on loopback
		cfg.Resolver.PrivateRegistries = []string{host}
	})
	namespace(t, cs, webhookNamespace, false)
	dockerConfig := func(u, p string) []byte {
		auth := base64.StdEncoding.EncodeToString([]byte(u + ":" + p))
		return []byte(`{"auths":{"` + host + `":{"auth":"` + auth + `"}}}`)
	}
	for _, ns := range []string{"team-a-registry", "team-b-registry"} {
		namespace(t, cs, ns, true)
		awaitOptedIn(t, cs, ns)
	}
	pullSecret := func(ns, secretName string, config []byte) {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secretName}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: config}}
		if _, err := cs.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pullSecret("team-a-registry", "regcred", dockerConfig(user, pass))
	pullSecret("team-b-registry", "guess", dockerConfig(user, "guess"))
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a-registry", Name: "runner"},
		ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}}}
	if _, err := cs.CoreV1().ServiceAccounts("team-a-registry").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	tick := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	submit := func(ns, cronJobName string, edit func(*corev1.PodSpec)) (*batchv1.Job, error) {
		cj := withAnnotations(cronJob(ns, cronJobName, "*/5 * * * *"), map[string]string{contract.AnnotationMode: "schedule"})
		cj.Spec.Suspend = ptr.To(true)
		pod := &cj.Spec.JobTemplate.Spec.Template.Spec
		pod.Containers[0].Image, pod.Containers[0].Command = image, nil
		edit(pod)
		created, err := cs.BatchV1().CronJobs(ns).Create(ctx, cj, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cs.BatchV1().Jobs(ns).Create(ctx, jobFor(created, tick), metav1.CreateOptions{})
	}
	runsTheSecretEntrypoint := func(job *batchv1.Job) bool {
		for _, c := range job.Spec.Template.Spec.Containers {
			if c.Name == "app" && len(c.Command) >= len(secretEntrypoint) && slices.Equal(c.Command[len(c.Command)-len(secretEntrypoint):], secretEntrypoint) {
				return true
			}
		}
		return false
	}

	for i, tc := range []struct {
		name string
		edit func(*corev1.PodSpec)
	}{
		{"team A with the pull secret in its pod template", func(p *corev1.PodSpec) {
			p.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
		}},
		{"team A with the pull secret on its service account", func(p *corev1.PodSpec) { p.ServiceAccountName = "runner" }},
	} {
		job, err := submit("team-a-registry", "a-"+itoa(i), tc.edit)
		if err != nil {
			t.Fatalf("%s: the Job was refused: %v", tc.name, err)
		}
		if !runsTheSecretEntrypoint(job) {
			t.Fatalf("%s: the injected Job does not run the image's entrypoint %q: %+v", tc.name, secretEntrypoint, job.Spec.Template.Spec.Containers)
		}
	}

	for i, tc := range []struct {
		name string
		edit func(*corev1.PodSpec)
	}{
		{"team B without a pull secret", func(*corev1.PodSpec) {}},
		{"team B with a guessed password", func(p *corev1.PodSpec) {
			p.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "guess"}}
		}},
		{"team B naming team A's pull secret, which its namespace does not have", func(p *corev1.PodSpec) {
			p.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
		}},
	} {
		job, err := submit("team-b-registry", "b-"+itoa(i), tc.edit)
		if err == nil {
			t.Errorf("%s: the Job was admitted (runs the secret entrypoint: %v)", tc.name, runsTheSecretEntrypoint(job))
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "the registry refused access") || !strings.Contains(msg, contract.AnnotationEntrypoint) {
			t.Errorf("%s: denial %q does not say the registry refused access and how to set the entrypoint", tc.name, msg)
		}
		if strings.Contains(msg, "secret-job") || strings.Contains(msg, "token-file") {
			t.Errorf("%s: the denial repeats the private entrypoint: %q", tc.name, msg)
		}
	}
}

// requireBasicAuth answers 401 with a Basic challenge unless the request
// carries user and pass, as a private registry does.
func requireBasicAuth(user, pass string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="registry"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// pushPrivateImage pushes a small image whose config's entrypoint is
// entrypoint, and returns its reference.
func pushPrivateImage(t *testing.T, ref string, entrypoint []string, auth authn.Authenticator) string {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Entrypoint: entrypoint})
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithAuth(auth)); err != nil {
		t.Fatal(err)
	}
	return ref
}
