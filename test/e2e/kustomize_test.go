package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dislock/dislock/test/harness"
	"github.com/dislock/dislock/test/images"
)

// kustomizeOverlay is a data centre's overlay of config/default, the one
// docs/install.md shows (cluster name, agent image, webhook image), plus
// this harness's two differences from a cluster with a pod network (see
// release.go): the host's network on ports of the node's own (which the
// namespace's Pod Security level must then allow), and the API server at
// 127.0.0.1. Flags appended to the webhook's arguments override
// the ones config/ sets. CONFIG is config/'s path relative to the overlay.
const kustomizeOverlay = `resources:
  - CONFIG/default
configMapGenerator:
  - name: dislock-config
    behavior: merge
    literals:
      - cluster-name=%[1]s
      - agent-image=%[2]s
images:
  - name: ghcr.io/dislock/dislock
    newName: %[3]s
    newTag: %[4]s
patches:
  - target:
      kind: Namespace
      name: dislock-system
    patch: |-
      - {op: replace, path: /metadata/labels/pod-security.kubernetes.io~1enforce, value: privileged}
  - target:
      kind: Deployment
      name: dislock-webhook
    patch: |-
      - {op: replace, path: /spec/replicas, value: 1}
      - {op: add, path: /spec/template/spec/hostNetwork, value: true}
      - {op: add, path: /spec/template/spec/dnsPolicy, value: ClusterFirstWithHostNet}
      - {op: replace, path: /spec/template/spec/containers/0/imagePullPolicy, value: Never}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --port=%[5]d}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --plugin-api-port=%[10]d}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --host=$(POD_IP)}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--metrics-bind-address=[$(POD_IP)]:%[6]d"}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--health-probe-bind-address=[$(POD_IP)]:%[7]d"}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --insecure-registry}
      - op: replace
        path: /spec/template/spec/containers/0/ports
        value: [{name: webhook, containerPort: %[5]d}, {name: metrics, containerPort: %[6]d}, {name: health, containerPort: %[7]d}, {name: plugin-api, containerPort: %[10]d}]
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}}
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_HOST, value: "%[8]s"}}
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_PORT, value: "%[9]s"}}
`

// Installing with kustomize, as docs/install.md tells a user: the Secret
// with the owner's URL, then `kubectl apply --server-side -k` of an overlay
// of config/default. The webhook Deployment becomes ready on the node, the
// API server calls it through its Service, and a CronJob's window runs
// with the injected sidecar. `kubectl delete -k` then removes it, and the
// data centre's Helm release is installed again for the tests that follow.
func TestKustomizeInstallRunsAWindow(t *testing.T) {
	e := Need(t)
	dc := e.DCs[0]
	ctx := context.Background()
	if _, err := dc.helm(ctx, "uninstall", ReleaseName, "--namespace", WebhookNamespace, "--wait"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Cleanup(func() {
		// The overlay holds the Namespace too: deleting it waits for the
		// namespace to go, and the release is installed into a new one.
		if out, err := dc.Kubectl(ctx, "delete", "-k", dir, "--ignore-not-found", "--timeout", installTimeout.String()); err != nil {
			t.Errorf("kubectl delete -k: %v\n%s", err, out)
		}
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: WebhookNamespace}}
		if _, err := dc.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating namespace %s again: %v", WebhookNamespace, err)
		}
		if err := installRelease(ctx, dc, e.root, dc.bouncer.DSN(), t.Logf); err != nil {
			t.Fatalf("installing %s again: %v", ReleaseName, err)
		}
		for _, team := range Teams {
			if err := awaitReady(ctx, dc, team); err != nil {
				t.Fatal(err)
			}
		}
	})

	ports, err := harness.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	api, err := url.Parse(dc.Cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	config, err := filepath.Rel(dir, filepath.Join(e.root, "config"))
	if err != nil {
		t.Fatal(err)
	}
	repo, tag, _ := strings.Cut(images.DislockRef, ":")
	overlay := fmt.Sprintf(strings.ReplaceAll(kustomizeOverlay, "CONFIG", config),
		dc.Name, images.AgentRef, repo, tag, ports[0], ports[1], ports[2], api.Hostname(), api.Port(), ports[3])
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(overlay), 0o600); err != nil {
		t.Fatal(err)
	}

	begun := time.Now()
	if out, err := dc.Kubectl(ctx, "--namespace", WebhookNamespace, "create", "secret", "generic", DBSecretName,
		"--from-literal=url="+dc.bouncer.DSN()); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := dc.Kubectl(ctx, "apply", "--server-side", "-k", dir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := dc.Kubectl(ctx, "--namespace", WebhookNamespace, "rollout", "status", "deployment/dislock-webhook",
		"--timeout", installTimeout.String()); err != nil {
		t.Fatalf("the webhook Deployment config/ builds did not become ready: %v\n%s", err, out)
	}
	if err := awaitReady(ctx, dc, Namespace); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: kubectl apply -k to a webhook answering in %v", dc.Name, time.Since(begun).Round(time.Millisecond))

	const name = "kustomized"
	job, tick := tickHere(t, dc, LedgerCronJob(dc.Name, name, "* * * * *", "schedule", Ledger{DSN: dc.BouncerDSN(), Work: time.Second, Suspend: true}))
	ranOnceHere(t, e, dc, job.Name, name, tick)
}
