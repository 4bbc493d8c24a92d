package chart

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dislock/dislock/test/kube"
)

// optionalCRDs stand in for the Prometheus Operator's and cert-manager's
// CRDs, which a bare API server lacks: the kinds exist, and any spec is
// accepted (so the dry run shows these objects are well-formed and
// namespaced as the CRDs want, not that cert-manager would like their spec).
var optionalCRDs = func() string {
	var b strings.Builder
	for _, k := range [][2]string{{"monitoring.coreos.com", "ServiceMonitor"}, {"cert-manager.io", "Certificate"}, {"cert-manager.io", "Issuer"}} {
		group, kind := k[0], k[1]
		singular := strings.ToLower(kind)
		fmt.Fprintf(&b, `---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: %[3]ss.%[1]s}
spec:
  group: %[1]s
  scope: Namespaced
  names: {kind: %[2]s, listKind: %[2]sList, plural: %[3]ss, singular: %[3]s}
  versions:
    - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
`, group, kind, singular)
	}
	return b.String()
}()

// Every object the chart renders and kustomize builds, with every option
// on, passes the API server's validation and admission (server-side apply,
// dry run): schemas, the webhooks' CEL matchConditions, RBAC rules, the
// PodDisruptionBudgets, the NetworkPolicies, the priority class, the webhook
// on the node's network, the lock gateway and the `helm test` pod.
func TestTheAPIServerAcceptsEveryRenderedObject(t *testing.T) {
	c := kube.Need(t)
	ensureOptionalCRDs(t, c)
	// A dry run creates nothing, so the namespaces must exist for real.
	for _, ns := range []string{"accept-defaults", "accept-options", "dislock-system"} {
		createNamespace(t, c, ns)
	}
	every := values("clusterName", "dc-b", "database.url", testURL, "certManager.enabled", true,
		"serviceMonitor.enabled", true, "serviceMonitor.labels", map[string]any{"release": "prometheus"},
		"networkPolicy.enabled", true, "networkPolicy.metricsFrom", []any{map[string]any{"namespaceSelector": map[string]any{
			"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}}}},
		"webhook.excludeNamespaces", []any{"monitoring"}, "webhook.priorityClassName", "system-cluster-critical",
		"webhook.tolerations", []any{map[string]any{"key": "dedicated", "operator": "Exists"}},
		"webhook.nodeSelector", map[string]any{"kubernetes.io/os": "linux"},
		"webhook.topologySpreadConstraints", []any{map[string]any{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
			"whenUnsatisfiable": "ScheduleAnyway", "labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "dislock"}}}},
		"webhook.podAnnotations", map[string]any{"example.com/team": "platform"}, "webhook.podLabels", map[string]any{"team": "platform"},
		"imagePullSecrets", []any{map[string]any{"name": "registry"}}, "serviceAccount.annotations", map[string]any{"example.com/role": "dislock"},
		"agent.cpuRequest", "20m", "agent.cpuLimit", "300m", "agent.memoryRequest", "24Mi", "agent.memoryLimit", "96Mi",
		"agent.maxCPU", "2", "agent.maxMemory", "512Mi", "certManager.issuerRef.name", "corporate-ca",
		"certManager.issuerRef.kind", "ClusterIssuer",
		"agent.podLabels", map[string]any{"egress.corp/pgbouncer": "allow"}, "agent.podAnnotations", map[string]any{"sidecar.istio.io/inject": "false"},
		"database.tls.caSecret.name", "db-ca", "tests.extraArgs", []any{"--allow-async-replication"},
		"webhook.hostNetwork", true, "webhook.port", 10443, "webhook.metricsPort", 10480, "webhook.healthPort", 10481,
		"webhook.extraEnv", []any{map[string]any{"name": "HTTPS_PROXY", "value": "http://proxy.corp:3128"}},
		"webhook.extraArgs", []any{"--zap-devel"},
		"gateway.enabled", true, "gateway.nodeSelector", map[string]any{"kubernetes.io/os": "linux"},
		"gateway.tolerations", []any{map[string]any{"key": "dedicated", "operator": "Exists"}}, "gateway.extraArgs", []any{"--renewal-conns=3"},
		"webhook.extraVolumes", []any{map[string]any{"name": "corp-proxy-ca", "configMap": map[string]any{"name": "corp-proxy-ca"}}},
		"webhook.extraVolumeMounts", []any{map[string]any{"name": "corp-proxy-ca", "mountPath": "/etc/ssl/certs/corp", "readOnly": true}})
	for _, tc := range []struct {
		name string
		m    manifest
	}{
		{"the chart's defaults", helmTemplate(t, "dislock", "accept-defaults", base())},
		{"the chart with every option", helmTemplate(t, "everything", "accept-options", every)},
		{"the chart with the database CA in a ConfigMap", helmTemplate(t, "ca-configmap", "accept-options",
			base("database.tls.caConfigMap.name", "corp-bundle", "database.tls.caConfigMap.key", "bundle.pem"))},
		{"config/default as it is", kustomize(t, "resources:\n  - CONFIG/default\n")},
		{"config/default with a cluster name", kustomize(t, clusterOverlay)},
		{"config/default with cert-manager and a ServiceMonitor", kustomize(t, clusterOverlay+"components:\n  - CONFIG/certmanager\n  - CONFIG/prometheus\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := kubectl(t, c, tc.m.yaml(t), "apply", "--server-side", "--dry-run=server", "--field-manager=dislock-test", "-f", "-")
			if got := strings.Count(out, "serverside-applied (server dry run)"); got != len(tc.m) {
				t.Errorf("%d of %d objects applied (%s):\n%s", got, len(tc.m), tc.m.ids(), out)
			}
		})
	}
}
