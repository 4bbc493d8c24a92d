package chart

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/webhook"
)

const testURL = "postgres://dislock:s3cret@pgbouncer.db:6432/dislock?sslmode=verify-full&connect_timeout=5"

func TestTheChartLintsStrictly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		vals map[string]any
	}{
		{"with its own certificates and a database Secret the user manages", base()},
		{"with a database URL, cert-manager, a ServiceMonitor and a NetworkPolicy", values(
			"clusterName", "dc-b", "database.url", testURL, "certManager.enabled", true,
			"serviceMonitor.enabled", true, "networkPolicy.enabled", true,
			"networkPolicy.metricsFrom", []any{map[string]any{"namespaceSelector": map[string]any{
				"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}}}})},
		{"with every escape hatch, the node's network, a database CA and sidecar labels", base(
			"webhook.hostNetwork", true, "webhook.port", 10443, "webhook.extraArgs", []any{"--zap-devel"},
			"webhook.extraEnv", []any{map[string]any{"name": "HTTPS_PROXY", "value": "http://proxy.corp:3128"}},
			"webhook.extraVolumes", []any{map[string]any{"name": "x", "emptyDir": map[string]any{}}},
			"webhook.extraVolumeMounts", []any{map[string]any{"name": "x", "mountPath": "/x"}},
			"database.tls.caConfigMap.name", "corp-bundle", "agent.podLabels", map[string]any{"team": "payments"},
			"agent.podAnnotations", map[string]any{"sidecar.istio.io/inject": "false"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := run(nil, tool(t, "helm"), "lint", "--strict", chartDir, "--values", valuesFile(t, tc.vals))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(out), "0 chart(s) failed") {
				t.Fatalf("helm lint:\n%s", out)
			}
		})
	}
}

func TestRenderingRefusesMissingOrBadValuesSayingWhatToSet(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		vals map[string]any
		want []string
	}{
		{"without a cluster name", values("database.existingSecret", "dislock-db"),
			[]string{"clusterName is required", "--set clusterName=dc-a"}},
		{"with a cluster name holding a slash", base("clusterName", "dc/a"),
			[]string{`clusterName "dc/a" is not usable`, "without '/' or spaces"}},
		{"with a cluster name holding a space", base("clusterName", "dc a"),
			[]string{`clusterName "dc a" is not usable`}},
		{"with a cluster name longer than 63 characters", base("clusterName", strings.Repeat("a", 64)),
			[]string{"at most 63"}},
		{"without a database", values("clusterName", "dc-a"),
			[]string{"the database is not set", "database.existingSecret", "database.url"}},
		{"with both a database URL and an existing Secret", base("database.url", testURL),
			[]string{"database.url and database.existingSecret are both set"}},
		{"with a database URL that is not PostgreSQL's", values("clusterName", "dc-a", "database.url", "mysql://db/x"),
			[]string{"/database/url", "mysql://db/x"}},
		{"with a webhook timeout above the API server's 30 s", base("webhook.timeoutSeconds", 31),
			[]string{"/webhook/timeoutSeconds", "maximum"}},
		{"with no replica at all", base("webhook.replicas", 0),
			[]string{"/webhook/replicas", "minimum"}},
		{"with a misspelt key", base("webhook.replica", 3),
			[]string{"additional properties 'replica' not allowed"}},
		{"with a registry lookup the webhook would refuse (5 s or more)", base("webhook.registryTimeout", "5s"),
			[]string{"/webhook/registryTimeout"}},
		{"with a registry review budget the webhook would refuse (5 s or more)", base("webhook.registry.reviewBudget", "5s"),
			[]string{"/webhook/registry/reviewBudget"}},
		{"with a registry allow-list entry that is a URL, not a host", base("webhook.registry.allow", []any{"https://ghcr.io/team"}),
			[]string{"/webhook/registry/allow/0"}},
		{"with a registry config bound of nothing", base("webhook.registry.maxConfigBytes", 0),
			[]string{"/webhook/registry/maxConfigBytes", "minimum"}},
		{"with a retention that is not a Go duration", base("database.retention", "30d"),
			[]string{"/database/retention", "30d"}},
		{"with an issuer kind cert-manager does not have", base("certManager.issuerRef.kind", "Vault"),
			[]string{"/certManager/issuerRef/kind"}},
		{"without a sidecar image (it never falls back to the webhook's, which holds the CLI)", base("agent.image.repository", ""),
			[]string{"/agent/image/repository"}},
		{"with a sidecar image tag that is not a tag", base("agent.image.tag", "v1 latest"),
			[]string{"/agent/image/tag"}},
		{"with the database CA in both a Secret and a ConfigMap", base("database.tls.caSecret.name", "db-ca",
			"database.tls.caConfigMap.name", "corp-bundle"),
			[]string{"database.tls.caSecret.name", "database.tls.caConfigMap.name", "both set", `"db-ca"`, `"corp-bundle"`}},
		{"with a database CA key that is empty", base("database.tls.caSecret.name", "db-ca", "database.tls.caSecret.key", ""),
			[]string{"/database/tls/caSecret/key"}},
		{"with a sidecar pod label holding a comma, which no label value may", base("agent.podLabels", map[string]any{"teams": "a,b"}),
			[]string{"/agent/podLabels/teams", "'a,b' does not match pattern"}},
		{"with a runbook URL holding a template, which Prometheus would expand", base("prometheusRule.enabled", true, "prometheusRule.runbookBaseURL", "https://runbooks.example.com/{{"),
			[]string{"/prometheusRule/runbookBaseURL"}},
		{"with an alert label holding a template", base("prometheusRule.enabled", true, "prometheusRule.additionalRuleLabels", map[string]any{"team": "{{ oops"}),
			[]string{"/prometheusRule/additionalRuleLabels/team"}},
		{"with a sidecar pod annotation holding a comma", base("agent.podAnnotations", map[string]any{"example.com/hosts": "db1,db2"}),
			[]string{"agent.podAnnotations.example.com/hosts", "--pod-annotations", "comma"}},
		{"with a sidecar pod label that is a number", base("agent.podLabels", map[string]any{"tier": 1}),
			[]string{"/agent/podLabels/tier", "want string"}},
		{"with extraArgs that are one string, not a list", base("webhook.extraArgs", "--zap-devel"),
			[]string{"/webhook/extraArgs", "want array"}},
		{"with an extraEnv entry without a name", base("webhook.extraEnv", []any{map[string]any{"value": "x"}}),
			[]string{"/webhook/extraEnv/0", "name"}},
		{"with an extraVolumeMount without a mountPath", base("webhook.extraVolumeMounts", []any{map[string]any{"name": "x"}}),
			[]string{"/webhook/extraVolumeMounts/0", "mountPath"}},
		{"with hostNetwork that is not a boolean", base("webhook.hostNetwork", "yes"),
			[]string{"/webhook/hostNetwork", "want boolean"}},
		{"with a misspelt tests key", base("tests.enable", false),
			[]string{"additional properties 'enable' not allowed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := helmTemplateErr(t, "dislock", "dislock-system", tc.vals)
			if err == nil {
				t.Fatal("helm template rendered the chart")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

// expected is what one rendering must show.
type expected struct {
	ns, cluster, agentImage, dbSecret string
	createdURL                        string // the database Secret the chart creates holds it
	timeout                           int32
	selfSigned, copier                bool
	excluded                          []string
}

// The rendered objects keep the promises of the issue and of DESIGN.md: an
// available, locked-down webhook whose configurations fail closed but reach
// only opted-in namespaces, a certificate for the Service's name in both
// modes, and every flag consistent with the objects it names.
func TestTheRenderedChartKeepsItsPromises(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, release string
		vals          map[string]any
		want          expected
	}{
		{"the defaults: own certificates, the database Secret copied", "dislock", base(), expected{
			ns: "dislock-system", cluster: "dc-a", agentImage: "ghcr.io/dislock/dislock-agent:" + appVersion(t),
			dbSecret: "dislock-db", timeout: 5, selfSigned: true, copier: true}},
		{"certificates from cert-manager", "dislock", base("certManager.enabled", true), expected{
			ns: "dislock-system", cluster: "dc-a", agentImage: "ghcr.io/dislock/dislock-agent:" + appVersion(t),
			dbSecret: "dislock-db", timeout: 5, copier: true}},
		{"another release and namespace, a database URL, no copies, a pinned agent image", "prod", values(
			"clusterName", "dc-b", "database.url", testURL, "database.copyToNamespaces", false,
			"webhook.timeoutSeconds", 9, "webhook.excludeNamespaces", []any{"monitoring"},
			"image.tag", "1.2.3", "agent.image.digest", "sha256:"+strings.Repeat("ab", 32)), expected{
			ns: "ops", cluster: "dc-b", agentImage: "ghcr.io/dislock/dislock-agent@sha256:" + strings.Repeat("ab", 32),
			dbSecret: "prod-dislock-db", createdURL: testURL, timeout: 9, selfSigned: true, excluded: []string{"monitoring"}}},
		{"images from a private registry: the sidecar's tag follows the webhook's", "dislock", base(
			"image.repository", "registry.example.com/dislock", "image.tag", "v0.2.0",
			"agent.image.repository", "registry.example.com/dislock-agent"), expected{
			ns: "dislock-system", cluster: "dc-a", agentImage: "registry.example.com/dislock-agent:v0.2.0",
			dbSecret: "dislock-db", timeout: 5, selfSigned: true, copier: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkContract(t, helmTemplate(t, tc.release, tc.want.ns, tc.vals), tc.want)
		})
	}
}

func checkContract(t *testing.T, m manifest, w expected) {
	dep := typed[appsv1.Deployment](t, m.one(t, "Deployment"))
	pod := dep.Spec.Template.Spec
	podLabels := dep.Spec.Template.Labels
	if len(pod.Containers) != 1 {
		t.Fatalf("containers: %+v", pod.Containers)
	}
	c := pod.Containers[0]
	flags := parseFlags(t, c.Args)

	t.Run("highly available", func(t *testing.T) {
		if dep.Namespace != w.ns || dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
			t.Errorf("deployment %s/%s replicas %v: want at least 2 in %s", dep.Namespace, dep.Name, dep.Spec.Replicas, w.ns)
		}
		if ru := dep.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
			t.Errorf("a rolling update may take a replica down first: %+v", dep.Spec.Strategy)
		}
		aa := pod.Affinity
		if aa == nil || aa.PodAntiAffinity == nil || len(aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
			t.Fatalf("no pod anti-affinity: %+v", aa)
		}
		term := aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
		if term.TopologyKey != corev1.LabelHostname || !selects(term.LabelSelector, podLabels) {
			t.Errorf("anti-affinity %+v does not spread the webhook's pods over nodes", term)
		}
		pdb := typed[policyv1.PodDisruptionBudget](t, m.one(t, "PodDisruptionBudget"))
		if !selects(pdb.Spec.Selector, podLabels) || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
			t.Errorf("PodDisruptionBudget %+v", pdb.Spec)
		}
		if !flags.set("leader-elect") {
			t.Error("no --leader-elect: every replica would run the copier and the retention")
		}
	})

	t.Run("probes and resources", func(t *testing.T) {
		health := portNamed(t, c, "health")
		if got := flags.value("health-probe-bind-address"); got != fmt.Sprintf(":%d", health) {
			t.Errorf("--health-probe-bind-address %q, the port named health is %d", got, health)
		}
		for _, p := range []struct {
			probe *corev1.Probe
			path  string
		}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
			if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "health" {
				t.Errorf("no %s probe on the health port: %+v", p.path, p.probe)
			}
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("resources %+v: want CPU and memory requests and a memory limit", c.Resources)
		}
	})

	t.Run("non-root with a read-only root filesystem", func(t *testing.T) {
		psc, sc := pod.SecurityContext, c.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("pod security context %+v", psc)
		}
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("container security context %+v", sc)
		}
	})

	svc := typed[corev1.Service](t, m.one(t, "Service"))
	mwc := typed[admissionregistrationv1.MutatingWebhookConfiguration](t, m.one(t, "MutatingWebhookConfiguration"))
	vwc := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, m.one(t, "ValidatingWebhookConfiguration"))

	t.Run("the certificate is mounted at --cert-dir and names the Service", func(t *testing.T) {
		certSecret := ""
		if w.selfSigned {
			certSecret = flags.value("cert-secret-name")
			m.get(t, "Secret", certSecret)
			// The rotator issues the certificate for <service-name>.<its namespace>.svc.
			if flags.value("service-name") != svc.Name || dep.Namespace != svc.Namespace {
				t.Errorf("--service-name %q in %s, the Service is %s/%s", flags.value("service-name"), dep.Namespace, svc.Namespace, svc.Name)
			}
			if flags.value("mutating-webhook-configuration") != mwc.Name || flags.value("validating-webhook-configuration") != vwc.Name {
				t.Errorf("the rotator would update %q and %q, the configurations are %q and %q",
					flags.value("mutating-webhook-configuration"), flags.value("validating-webhook-configuration"), mwc.Name, vwc.Name)
			}
		} else {
			if flags.set("self-signed-certs") {
				t.Error("--self-signed-certs with cert-manager")
			}
			cert := m.get(t, "Certificate", mwc.Name)
			certSecret, _, _ = unstructured.NestedString(cert.Object, "spec", "secretName")
			dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
			if !slices.Contains(dns, svc.Name+"."+svc.Namespace+".svc") {
				t.Errorf("certificate DNS names %v do not name the Service %s/%s", dns, svc.Namespace, svc.Name)
			}
			// The serving certificate is signed by the chart's CA, and the CA
			// injector copies that CA: a renewed serving certificate leaves
			// the caBundle as it is.
			ca := caChain(t, m, cert)
			for _, o := range []metav1.Object{mwc, vwc} {
				if got := o.GetAnnotations()["cert-manager.io/inject-ca-from"]; got != ca.GetNamespace()+"/"+ca.GetName() {
					t.Errorf("%s: inject-ca-from %q, the chart's CA Certificate is %s/%s", o.GetName(), got, ca.GetNamespace(), ca.GetName())
				}
			}
			if m.find("Secret", certSecret) != nil {
				t.Errorf("the chart renders the Secret %s that cert-manager writes", certSecret)
			}
		}
		var mounted string
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == flags.value("cert-dir") {
				mounted = vm.Name
			}
		}
		var from string
		for _, v := range pod.Volumes {
			if v.Name == mounted && v.Secret != nil {
				from = v.Secret.SecretName
			}
		}
		if mounted == "" || from != certSecret {
			t.Errorf("--cert-dir %s: mounted volume %q from Secret %q, want Secret %q", flags.value("cert-dir"), mounted, from, certSecret)
		}
	})

	t.Run("the Service reaches the webhook port", func(t *testing.T) {
		if !selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, podLabels) {
			t.Errorf("Service selector %v does not select %v", svc.Spec.Selector, podLabels)
		}
		port := portNamed(t, c, "webhook")
		if flags.value("port") != fmt.Sprint(port) {
			t.Errorf("--port %s, the container port named webhook is %d", flags.value("port"), port)
		}
		found := false
		for _, p := range svc.Spec.Ports {
			found = found || p.Port == 443 && p.TargetPort.String() == "webhook"
		}
		if !found {
			t.Errorf("Service ports %+v: want 443 to the webhook port", svc.Spec.Ports)
		}
	})

	t.Run("the configurations fail closed on opted-in namespaces only", func(t *testing.T) {
		if len(mwc.Webhooks) != 1 || len(vwc.Webhooks) != 1 {
			t.Fatalf("webhooks: %d mutating, %d validating", len(mwc.Webhooks), len(vwc.Webhooks))
		}
		mw, vw := mwc.Webhooks[0], vwc.Webhooks[0]
		type common struct {
			name        string
			cc          admissionregistrationv1.WebhookClientConfig
			path        string
			failure     *admissionregistrationv1.FailurePolicyType
			sideEffects *admissionregistrationv1.SideEffectClass
			timeout     *int32
			ns          *metav1.LabelSelector
			rules       []admissionregistrationv1.RuleWithOperations
			resource    string
			ops         []admissionregistrationv1.OperationType
			conditions  int
		}
		for _, h := range []common{
			{mw.Name, mw.ClientConfig, webhook.MutateJobPath, mw.FailurePolicy, mw.SideEffects, mw.TimeoutSeconds, mw.NamespaceSelector, mw.Rules,
				"jobs", []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, len(mw.MatchConditions)},
			{vw.Name, vw.ClientConfig, webhook.ValidateCronJobPath, vw.FailurePolicy, vw.SideEffects, vw.TimeoutSeconds, vw.NamespaceSelector, vw.Rules,
				"cronjobs", []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, len(vw.MatchConditions)},
		} {
			s := h.cc.Service
			if s == nil || s.Name != svc.Name || s.Namespace != svc.Namespace || s.Path == nil || *s.Path != h.path || s.Port == nil || *s.Port != 443 {
				t.Errorf("%s: clientConfig %+v, want Service %s/%s:443%s", h.name, s, svc.Namespace, svc.Name, h.path)
			}
			if len(h.cc.CABundle) != 0 {
				t.Errorf("%s: the chart sets a caBundle", h.name)
			}
			if h.failure == nil || *h.failure != admissionregistrationv1.Fail || h.sideEffects == nil || *h.sideEffects != admissionregistrationv1.SideEffectClassNone {
				t.Errorf("%s: failurePolicy %v, sideEffects %v", h.name, h.failure, h.sideEffects)
			}
			if h.timeout == nil || *h.timeout != w.timeout {
				t.Errorf("%s: timeoutSeconds %v, want %d", h.name, h.timeout, w.timeout)
			}
			if len(h.rules) != 1 || !reflect.DeepEqual(h.rules[0].Resources, []string{h.resource}) || !reflect.DeepEqual(h.rules[0].APIGroups, []string{"batch"}) ||
				!reflect.DeepEqual(h.rules[0].APIVersions, []string{"v1"}) || !reflect.DeepEqual(h.rules[0].Operations, h.ops) {
				t.Errorf("%s: rules %+v, want batch/v1 %s %v", h.name, h.rules, h.resource, h.ops)
			}
			if h.conditions == 0 {
				t.Errorf("%s: no matchConditions", h.name)
			}
			wantExcluded := append([]string{w.ns, "kube-system"}, w.excluded...)
			if h.ns == nil || h.ns.MatchLabels[contract.LabelInjection] != contract.LabelInjectionEnabled || len(h.ns.MatchExpressions) != 1 ||
				h.ns.MatchExpressions[0].Key != corev1.LabelMetadataName || h.ns.MatchExpressions[0].Operator != metav1.LabelSelectorOpNotIn ||
				!sameSet(h.ns.MatchExpressions[0].Values, wantExcluded) {
				t.Errorf("%s: namespaceSelector %+v, want %s=%s and not in %v", h.name, h.ns, contract.LabelInjection, contract.LabelInjectionEnabled, wantExcluded)
			}
		}
		if p := mw.ReinvocationPolicy; p == nil || *p != admissionregistrationv1.IfNeededReinvocationPolicy {
			t.Errorf("%s: reinvocationPolicy %v, want IfNeeded", mw.Name, p)
		}
	})

	t.Run("flags", func(t *testing.T) {
		// Where the Dockerfile installs the binary.
		if !slices.Equal(c.Command, []string{"/usr/local/bin/dislock"}) {
			t.Errorf("command %v, want the image's /usr/local/bin/dislock", c.Command)
		}
		if c.Args[0] != "webhook" || flags.value("cluster-name") != w.cluster || flags.value("agent-image") != w.agentImage {
			t.Errorf("args %v: want webhook --cluster-name=%s --agent-image=%s", c.Args, w.cluster, w.agentImage)
		}
		// With copyToNamespaces the webhook gives each opted-in namespace a
		// role of its own (its default); it never copies the owner's URL.
		if tenantRoles := flags.value("tenant-roles") != "false"; flags.set("copy-db-secret") || tenantRoles != w.copier {
			t.Errorf("--copy-db-secret %v, tenant roles %v; want no copy, and tenant roles exactly with copyToNamespaces (%v)",
				flags.set("copy-db-secret"), tenantRoles, w.copier)
		}
		if flags.set("self-signed-certs") != w.selfSigned {
			t.Errorf("--self-signed-certs %v, want %v", flags.set("self-signed-certs"), w.selfSigned)
		}
	})

	t.Run("the database URL comes from the Secret the sidecars read", func(t *testing.T) {
		env := map[string]corev1.EnvVar{}
		for _, e := range c.Env {
			env[e.Name] = e
		}
		if f := env["POD_NAMESPACE"].ValueFrom; f == nil || f.FieldRef == nil || f.FieldRef.FieldPath != "metadata.namespace" {
			t.Errorf("POD_NAMESPACE %+v", env["POD_NAMESPACE"])
		}
		ref := env[contract.EnvDatabaseURL].ValueFrom
		if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != w.dbSecret || ref.SecretKeyRef.Key != flags.value("db-secret-key") ||
			flags.value("db-secret-name") != w.dbSecret {
			t.Fatalf("%s %+v, --db-secret-name %s: want Secret %s", contract.EnvDatabaseURL, ref, flags.value("db-secret-name"), w.dbSecret)
		}
		created := m.find("Secret", w.dbSecret)
		if w.createdURL == "" {
			if created != nil {
				t.Errorf("the chart renders the database Secret %s the user manages", w.dbSecret)
			}
			return
		}
		if created == nil {
			t.Fatalf("no database Secret %s; the manifest has %s", w.dbSecret, m.ids())
		}
		if got := typed[corev1.Secret](t, created).StringData[ref.SecretKeyRef.Key]; got != w.createdURL {
			t.Errorf("database Secret holds %q, want %q", got, w.createdURL)
		}
	})

	t.Run("the ServiceAccount is the one the RBAC binds", func(t *testing.T) {
		sa := m.one(t, "ServiceAccount")
		if pod.ServiceAccountName != sa.GetName() || sa.GetNamespace() != w.ns {
			t.Errorf("pod runs as %q, the ServiceAccount is %s", pod.ServiceAccountName, id(sa))
		}
		// kubectl dislock's RoleBinding binds the plugin's users, not the
		// webhook (TestTheChartOpensOnlyThePluginPortToAuthenticatedUsersThroughTheProxy).
		for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
			b := typed[rbacv1.RoleBinding](t, m.named(t, kind, sa.GetName()))
			if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != sa.GetName() || b.Subjects[0].Namespace != w.ns {
				t.Errorf("%s subjects %+v", kind, b.Subjects)
			}
		}
	})
}

// flagSet is a container's args as --name=value (a bare --name is "true").
type flagSet map[string]string

func parseFlags(t *testing.T, args []string) flagSet {
	t.Helper()
	out := flagSet{}
	for _, a := range args[1:] {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") {
			t.Fatalf("argument %q is not a --flag", a)
		}
		if _, dup := out[name]; dup {
			t.Errorf("--%s given twice", name)
		}
		if !ok {
			value = "true"
		}
		out[name] = value
	}
	return out
}

func (f flagSet) value(name string) string { return f[name] }
func (f flagSet) set(name string) bool     { return f[name] == "true" }

func portNamed(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %s: %+v", c.Name, name, c.Ports)
	return 0
}

// selects reports whether the selector's matchLabels are all in labels.
func selects(sel *metav1.LabelSelector, labels map[string]string) bool {
	if sel == nil || len(sel.MatchLabels) == 0 || len(sel.MatchExpressions) > 0 {
		return false
	}
	for k, v := range sel.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	sort.Strings(a)
	sort.Strings(b)
	return slices.Equal(a, b)
}

func appVersion(t *testing.T) string {
	t.Helper()
	out, err := run(nil, tool(t, "helm"), "show", "chart", chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "appVersion: "); ok {
			return strings.Trim(v, `"'`)
		}
	}
	t.Fatalf("no appVersion in\n%s", out)
	return ""
}

// The notes printed after `helm install` tell how to opt a namespace and a
// CronJob in, and which namespaces never are.
func TestTheInstallNotesSayHowToOptIn(t *testing.T) {
	t.Parallel()
	out, err := run(nil, tool(t, "helm"), "install", "dislock", chartDir, "--namespace", "ops", "--dry-run=client",
		"--values", valuesFile(t, base()))
	if err != nil {
		t.Fatal(err)
	}
	_, notes, ok := strings.Cut(string(out), "NOTES:")
	if !ok {
		t.Fatalf("no NOTES in\n%s", out)
	}
	for _, want := range []string{
		"kubectl label namespace NAMESPACE " + contract.LabelInjection + "=" + contract.LabelInjectionEnabled,
		"kubectl annotate cronjob/NAME -n NAMESPACE " + contract.AnnotationMode + "=schedule",
		"never intercepts ops or kube-system",
		`cluster "dc-a"`,
		"helm test dislock -n ops --logs",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("the notes do not say %q:\n%s", want, notes)
		}
	}
}

// caChain checks that the serving certificate's Issuer is a CA Issuer whose
// CA is a Certificate of the chart's, a long-lived CA that keeps its key,
// signed by a self-signed Issuer; it returns that CA Certificate.
func caChain(t *testing.T, m manifest, serving *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	str := func(o *unstructured.Unstructured, path ...string) string {
		v, _, _ := unstructured.NestedString(o.Object, path...)
		return v
	}
	issuer := m.get(t, "Issuer", str(serving, "spec", "issuerRef", "name"))
	caSecret := str(issuer, "spec", "ca", "secretName")
	var ca *unstructured.Unstructured
	for _, o := range m {
		if o.GetKind() == "Certificate" && str(o, "spec", "secretName") == caSecret {
			ca = o
		}
	}
	if caSecret == "" || ca == nil {
		t.Fatalf("the serving certificate's Issuer %s is not a CA Issuer of a Certificate the chart renders (ca.secretName %q)", issuer.GetName(), caSecret)
	}
	if isCA, _, _ := unstructured.NestedBool(ca.Object, "spec", "isCA"); !isCA || str(ca, "spec", "privateKey", "rotationPolicy") != "Never" {
		t.Errorf("the CA Certificate %s: isCA %v, key rotation %q; want a CA that keeps its key", ca.GetName(), isCA, str(ca, "spec", "privateKey", "rotationPolicy"))
	}
	if root := m.get(t, "Issuer", str(ca, "spec", "issuerRef", "name")); !hasField(root, "spec", "selfSigned") {
		t.Errorf("the CA Certificate %s is signed by Issuer %s, which is not self-signed", ca.GetName(), root.GetName())
	}
	return ca
}

func hasField(o *unstructured.Unstructured, path ...string) bool {
	_, found, _ := unstructured.NestedFieldNoCopy(o.Object, path...)
	return found
}

// The registry bounds reach the webhook as its flags, each list once,
// comma-joined, with byte sizes as plain integers; so do the sidecar's
// sizes and ceilings, each only when set.
func TestTheRegistryBoundsAndSidecarSizesBecomeTheWebhooksFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		vals map[string]any
		want map[string]string // flag -> value; "" = absent
	}{
		{"by default, only the bounds", base(), map[string]string{
			"registry-timeout": "3s", "registry-review-budget": "4s",
			"registry-max-manifest-bytes": "4194304", "registry-max-config-bytes": "1048576", "registry-max-concurrent-lookups": "8",
			"registry-allow": "", "registry-deny": "", "registry-insecure": "", "registry-private": "", "insecure-registry": "",
		}},
		{"with lists", base(
			"webhook.registry.allow", []any{"ghcr.io", "*.dkr.ecr.eu-west-1.amazonaws.com"},
			"webhook.registry.deny", []any{"evil.example.com"},
			"webhook.registry.insecure", []any{"registry.registry.svc:5000"},
			"webhook.registry.private", []any{"registry.registry.svc:5000"},
			"webhook.registry.maxConfigBytes", 2097152), map[string]string{
			"registry-allow":            "ghcr.io,*.dkr.ecr.eu-west-1.amazonaws.com",
			"registry-deny":             "evil.example.com",
			"registry-insecure":         "registry.registry.svc:5000",
			"registry-private":          "registry.registry.svc:5000",
			"registry-max-config-bytes": "2097152",
		}},
		{"sidecar sizes by default: the webhook's", base(), map[string]string{
			"agent-cpu-request": "", "agent-cpu-limit": "", "agent-memory-request": "", "agent-memory-limit": "",
			"agent-max-cpu": "", "agent-max-memory": "",
		}},
		{"sidecar sizes and ceilings set", base("agent.cpuRequest", "50m", "agent.cpuLimit", "200m", "agent.memoryRequest", "32Mi",
			"agent.memoryLimit", "96Mi", "agent.maxCPU", "2", "agent.maxMemory", "512Mi"), map[string]string{
			"agent-cpu-request": "50m", "agent-cpu-limit": "200m", "agent-memory-request": "32Mi", "agent-memory-limit": "96Mi",
			"agent-max-cpu": "2", "agent-max-memory": "512Mi",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dep := typed[appsv1.Deployment](t, helmTemplate(t, "dislock", "dislock-system", tc.vals).one(t, "Deployment"))
			flags := parseFlags(t, dep.Spec.Template.Spec.Containers[0].Args)
			for name, want := range tc.want {
				if want == "" {
					if flags.set(name) {
						t.Errorf("--%s=%s rendered, want it absent", name, flags.value(name))
					}
					continue
				}
				if got := flags.value(name); got != want {
					t.Errorf("--%s=%q, want %q", name, got, want)
				}
			}
		})
	}
}

// A deleted webhook pod keeps serving for webhook.shutdownDelaySeconds (a
// preStop sleep, added to the termination grace period) while its removal
// from the Service reaches the API server; 0 leaves the hook out.
func TestADeletedWebhookPodKeepsServingForTheShutdownDelay(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		vals  map[string]any
		sleep int64 // 0: no preStop hook
		grace int64
	}{
		{"by default", base(), 5, 35},
		{"longer", base("webhook.shutdownDelaySeconds", 15), 15, 45},
		{"none", base("webhook.shutdownDelaySeconds", 0), 0, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := helmTemplate(t, "dislock", "dislock-system", tc.vals)
			pod := typed[appsv1.Deployment](t, m.one(t, "Deployment")).Spec.Template.Spec
			var sleep int64
			if l := pod.Containers[0].Lifecycle; l != nil && l.PreStop != nil && l.PreStop.Sleep != nil {
				sleep = l.PreStop.Sleep.Seconds
			} else if l != nil {
				t.Errorf("lifecycle %+v: want a preStop sleep or none", l)
			}
			if sleep != tc.sleep || pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds != tc.grace {
				t.Errorf("preStop sleep %d s, grace period %v; want %d s and %d s", sleep, pod.TerminationGracePeriodSeconds, tc.sleep, tc.grace)
			}
		})
	}
}
