package chart

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dislock/dislock/lockagent/contract"
)

// databaseCAFile is where the chart mounts database.tls's CA bundle; the
// webhook's --database-ca-file names it.
const databaseCAFile = "/etc/dislock/database-ca/ca.crt"

// webhookPod renders the chart and returns the webhook's pod spec and its
// one container.
func webhookPod(t *testing.T, m manifest) (corev1.PodSpec, corev1.Container) {
	t.Helper()
	pod := typed[appsv1.Deployment](t, m.one(t, "Deployment")).Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("containers: %+v", pod.Containers)
	}
	return pod, pod.Containers[0]
}

func envNamed(env []corev1.EnvVar, name string) *corev1.EnvVar {
	for i := range env {
		if env[i].Name == name {
			return &env[i]
		}
	}
	return nil
}

func mountAt(c corev1.Container, path string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == path {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func volumeNamed(pod corev1.PodSpec, name string) *corev1.Volume {
	for i := range pod.Volumes {
		if pod.Volumes[i].Name == name {
			return &pod.Volumes[i]
		}
	}
	return nil
}

// An operator's extra env, args, volumes and mounts reach the webhook's
// container as given, after the chart's own; a flag repeated in extraArgs
// comes last, so the webhook (Go's flag package) takes the operator's value.
func TestTheEscapeHatchesReachTheWebhookAfterTheChartsOwn(t *testing.T) {
	t.Parallel()
	pod, c := webhookPod(t, helmTemplate(t, "dislock", "dislock-system", base(
		"webhook.extraEnv", []any{
			map[string]any{"name": "HTTPS_PROXY", "value": "http://proxy.corp:3128"},
			map[string]any{"name": "GOMEMLIMIT", "valueFrom": map[string]any{"resourceFieldRef": map[string]any{"resource": "limits.memory"}}},
		},
		"webhook.extraArgs", []any{"--zap-devel", "--zap-log-level=debug"},
		"webhook.extraVolumes", []any{map[string]any{"name": "corp-proxy-ca", "configMap": map[string]any{"name": "corp-proxy-ca"}}},
		"webhook.extraVolumeMounts", []any{map[string]any{"name": "corp-proxy-ca", "mountPath": "/etc/ssl/certs/corp", "readOnly": true}},
	)))

	t.Run("env", func(t *testing.T) {
		n := len(c.Env)
		if n < 3 || c.Env[n-2].Name != "HTTPS_PROXY" || c.Env[n-2].Value != "http://proxy.corp:3128" ||
			c.Env[n-1].Name != "GOMEMLIMIT" || c.Env[n-1].ValueFrom == nil || c.Env[n-1].ValueFrom.ResourceFieldRef == nil {
			t.Errorf("env %+v: want HTTPS_PROXY and GOMEMLIMIT last", c.Env)
		}
		if envNamed(c.Env, contract.EnvDatabaseURL) == nil {
			t.Errorf("env %+v lost %s", c.Env, contract.EnvDatabaseURL)
		}
	})
	t.Run("args, a repeated flag last", func(t *testing.T) {
		if got := c.Args[len(c.Args)-2:]; !slices.Equal(got, []string{"--zap-devel", "--zap-log-level=debug"}) {
			t.Errorf("args end %v, want the extraArgs", got)
		}
		if i := slices.Index(c.Args, "--zap-log-level=info"); i < 0 || i > slices.Index(c.Args, "--zap-log-level=debug") {
			t.Errorf("args %v: want the chart's --zap-log-level=info before the operator's", c.Args)
		}
	})
	t.Run("volumes and mounts", func(t *testing.T) {
		v := volumeNamed(pod, "corp-proxy-ca")
		if v == nil || v.ConfigMap == nil || v.ConfigMap.Name != "corp-proxy-ca" || volumeNamed(pod, "cert") == nil {
			t.Errorf("volumes %+v: want the chart's cert and corp-proxy-ca", pod.Volumes)
		}
		if m := mountAt(c, "/etc/ssl/certs/corp"); m == nil || m.Name != "corp-proxy-ca" || !m.ReadOnly {
			t.Errorf("mounts %+v: want corp-proxy-ca at /etc/ssl/certs/corp", c.VolumeMounts)
		}
	})
}

// On the node's network (GKE private clusters, EKS with a custom CNI) the
// webhook still resolves Services, and every place a port is named agrees
// with the host-unique ports the operator picked: the container's ports,
// the flags the webhook listens on, the probes and the Service's target.
// There it listens on the node's own address (the pod's IP) only, not on
// every interface of the node.
func TestOnTheNodesNetworkEveryPortIsTheOneChosen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                         string
		vals                         map[string]any
		hostNetwork                  bool
		dnsPolicy                    corev1.DNSPolicy
		webhook, metrics, hp, plugin int32
		host, hostPort               string // --host, and the host part of the other two addresses
	}{
		{"by default, the pod network and the usual ports", base(), false, "", 9443, 8080, 8081, 9446, "", ""},
		{"hostNetwork with ports of its own", base("webhook.hostNetwork", true, "webhook.port", 10443,
			"webhook.metricsPort", 10480, "webhook.healthPort", 10481, "kubectlPlugin.port", 10446), true, corev1.DNSClusterFirstWithHostNet,
			10443, 10480, 10481, 10446, "$(POD_IP)", "[$(POD_IP)]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := helmTemplate(t, "dislock", "dislock-system", tc.vals)
			pod, c := webhookPod(t, m)
			if pod.HostNetwork != tc.hostNetwork || pod.DNSPolicy != tc.dnsPolicy {
				t.Errorf("hostNetwork %v, dnsPolicy %q; want %v, %q", pod.HostNetwork, pod.DNSPolicy, tc.hostNetwork, tc.dnsPolicy)
			}
			flags := parseFlags(t, c.Args)
			for _, p := range []struct {
				name, flag, value string
				port              int32
			}{
				{"webhook", "port", fmt.Sprint(tc.webhook), tc.webhook},
				{"metrics", "metrics-bind-address", fmt.Sprintf("%s:%d", tc.hostPort, tc.metrics), tc.metrics},
				{"health", "health-probe-bind-address", fmt.Sprintf("%s:%d", tc.hostPort, tc.hp), tc.hp},
			} {
				if got := portNamed(t, c, p.name); got != p.port {
					t.Errorf("container port %s is %d, want %d", p.name, got, p.port)
				}
				if got := flags.value(p.flag); got != p.value {
					t.Errorf("--%s=%s, want %s", p.flag, got, p.value)
				}
			}
			if got := flags.value("host"); got != tc.host {
				t.Errorf("--host=%s, want %q", got, tc.host)
			}
			podIP := slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
				return e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP"
			})
			if podIP != tc.hostNetwork {
				t.Errorf("env POD_IP from status.podIP: %t, want %t", podIP, tc.hostNetwork)
			}
			// On the host's network a replacement waits for its
			// predecessor's ports before the kubelet probes it.
			var waits []string
			for _, ic := range pod.InitContainers {
				if ic.Name == "wait-for-ports" {
					waits = append(slices.Clone(ic.Command[1:]), ic.Args...)
				}
			}
			var want []string
			if tc.hostNetwork {
				want = []string{"wait-for-ports"}
				for _, port := range []int32{tc.webhook, tc.metrics, tc.hp, tc.plugin} {
					want = append(want, fmt.Sprintf("%s:%d", tc.hostPort, port))
				}
			}
			if !slices.Equal(waits, want) {
				t.Errorf("init container wait-for-ports runs %q, want %q", waits, want)
			}
			for _, probe := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
				if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Port.String() != "health" {
					t.Errorf("probe %+v does not use the port named health", probe)
				}
			}
			svc := typed[corev1.Service](t, m.one(t, "Service"))
			for _, p := range svc.Spec.Ports {
				if p.TargetPort.String() != p.Name || (p.Name == "metrics" && p.Port != tc.metrics) {
					t.Errorf("Service port %+v: want it to target the container port of its name", p)
				}
			}
		})
	}
}

// The webhook is critical by default (with failurePolicy Fail an evicted
// webhook stops every opted-in CronJob), and an operator can pick another
// class or none.
func TestTheWebhooksPriorityClass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, set, want string
	}{
		{"by default system-cluster-critical", "-", "system-cluster-critical"},
		{"one of the operator's", "platform-high", "platform-high"},
		{"none when empty", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			vals := base()
			if tc.set != "-" {
				vals = base("webhook.priorityClassName", tc.set)
			}
			pod, _ := webhookPod(t, helmTemplate(t, "dislock", "dislock-system", vals))
			if pod.PriorityClassName != tc.want {
				t.Errorf("priorityClassName %q, want %q", pod.PriorityClassName, tc.want)
			}
		})
	}
}

// agent.podLabels and agent.podAnnotations reach the webhook as one flag
// each, sorted by key, so the Deployment does not change between renderings.
func TestTheSidecarsPodLabelsAndAnnotationsBecomeTheWebhooksFlags(t *testing.T) {
	t.Parallel()
	_, c := webhookPod(t, helmTemplate(t, "dislock", "dislock-system", base(
		"agent.podLabels", map[string]any{"team": "payments", "egress.corp/pgbouncer": "allow"},
		"agent.podAnnotations", map[string]any{"sidecar.istio.io/inject": "false", "a.example.com/note": "x=y"})))
	flags := parseFlags(t, c.Args)
	if got, want := flags.value("pod-labels"), "egress.corp/pgbouncer=allow,team=payments"; got != want {
		t.Errorf("--pod-labels=%q, want %q", got, want)
	}
	if got, want := flags.value("pod-annotations"), "a.example.com/note=x=y,sidecar.istio.io/inject=false"; got != want {
		t.Errorf("--pod-annotations=%q, want %q", got, want)
	}
	_, c = webhookPod(t, helmTemplate(t, "dislock", "dislock-system", base()))
	if flags := parseFlags(t, c.Args); flags.set("pod-labels") || flags.set("pod-annotations") || slices.ContainsFunc(c.Args, func(a string) bool {
		return strings.HasPrefix(a, "--pod-labels") || strings.HasPrefix(a, "--pod-annotations")
	}) {
		t.Errorf("args %v: by default no --pod-labels or --pod-annotations", c.Args)
	}
}

// A private CA for the database, from a Secret or a ConfigMap, is mounted
// read-only into the webhook as ca.crt and named by --database-ca-file;
// without one, neither the mount nor the flag is there.
func TestTheDatabaseCAIsMountedAndNamedByTheWebhooksFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		vals          map[string]any
		secret, cm    string
		key           string
		wantMountFlag bool
	}{
		{"none by default", base(), "", "", "", false},
		{"from a Secret, under its default key", base("database.tls.caSecret.name", "db-ca"), "db-ca", "", "ca.crt", true},
		{"from a ConfigMap trust-manager fills", base("database.tls.caConfigMap.name", "corp-bundle",
			"database.tls.caConfigMap.key", "bundle.pem"), "", "corp-bundle", "bundle.pem", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := helmTemplate(t, "dislock", "dislock-system", tc.vals)
			pod, c := webhookPod(t, m)
			flags := parseFlags(t, c.Args)
			mount := mountAt(c, "/etc/dislock/database-ca")
			if !tc.wantMountFlag {
				if mount != nil || flags.value("database-ca-file") != "" {
					t.Errorf("mount %+v, --database-ca-file=%q: want neither", mount, flags.value("database-ca-file"))
				}
				return
			}
			if flags.value("database-ca-file") != databaseCAFile {
				t.Errorf("--database-ca-file=%q, want %s", flags.value("database-ca-file"), databaseCAFile)
			}
			if mount == nil || !mount.ReadOnly {
				t.Fatalf("mounts %+v: want a read-only mount at /etc/dislock/database-ca", c.VolumeMounts)
			}
			checkCAVolume(t, pod, mount.Name, tc.secret, tc.cm, tc.key)
		})
	}
}

// checkCAVolume checks that the volume projects key of the Secret or
// ConfigMap as ca.crt.
func checkCAVolume(t *testing.T, pod corev1.PodSpec, name, secret, cm, key string) {
	t.Helper()
	v := volumeNamed(pod, name)
	if v == nil {
		t.Fatalf("no volume %q in %+v", name, pod.Volumes)
	}
	var items []corev1.KeyToPath
	switch {
	case secret != "" && v.Secret != nil && v.Secret.SecretName == secret && v.ConfigMap == nil:
		items = v.Secret.Items
	case cm != "" && v.ConfigMap != nil && v.ConfigMap.Name == cm && v.Secret == nil:
		items = v.ConfigMap.Items
	default:
		t.Fatalf("volume %q is %+v, want Secret %q / ConfigMap %q", name, v.VolumeSource, secret, cm)
	}
	if want := []corev1.KeyToPath{{Key: key, Path: "ca.crt"}}; !reflect.DeepEqual(items, want) {
		t.Errorf("volume %q items %+v, want %+v", name, items, want)
	}
}

// `helm test` runs `dislock check` as the webhook would connect: the same
// image, the same Secret and key, the same CA, the same locked-down
// security contexts and placement; it has no API access, never restarts,
// stays for `kubectl logs`, and is not one of the webhook's pods (the
// Service would send admission calls to it).
func TestTheHelmTestPodChecksTheDatabaseAsTheWebhookConnects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		vals map[string]any
		ca   bool
	}{
		{"the defaults", base(), false},
		{"a database CA, placement, pull secrets and extra labels", values("clusterName", "dc-b", "database.url", testURL,
			"database.tls.caSecret.name", "db-ca", "webhook.nodeSelector", map[string]any{"kubernetes.io/os": "linux"},
			"webhook.tolerations", []any{map[string]any{"key": "dedicated", "operator": "Exists"}},
			"webhook.podLabels", map[string]any{"egress.corp/pgbouncer": "allow"}, "imagePullSecrets", []any{map[string]any{"name": "registry"}},
			"tests.extraArgs", []any{"--allow-async-replication"}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := helmTemplate(t, "dislock", "dislock-system", tc.vals)
			dep := typed[appsv1.Deployment](t, m.one(t, "Deployment"))
			wpod, wc := dep.Spec.Template.Spec, dep.Spec.Template.Spec.Containers[0]
			p := typed[corev1.Pod](t, m.one(t, "Pod"))
			if len(p.Spec.Containers) != 1 {
				t.Fatalf("containers %+v", p.Spec.Containers)
			}
			c := p.Spec.Containers[0]

			if a := p.Annotations; a["helm.sh/hook"] != "test" || a["helm.sh/hook-delete-policy"] != "before-hook-creation" {
				t.Errorf("annotations %v: want a test hook replaced only by the next run", a)
			}
			wantArgs := []string{"check"}
			if tc.ca {
				wantArgs = append(wantArgs, "--allow-async-replication")
			}
			if c.Image != wc.Image || !slices.Equal(c.Command, wc.Command) || !slices.Equal(c.Args, wantArgs) {
				t.Errorf("runs %s %v %v, want %s %v %v", c.Image, c.Command, c.Args, wc.Image, wc.Command, wantArgs)
			}
			if got, want := envNamed(c.Env, contract.EnvDatabaseURL), envNamed(wc.Env, contract.EnvDatabaseURL); got == nil || !reflect.DeepEqual(got, want) {
				t.Errorf("%s %+v, the webhook's is %+v", contract.EnvDatabaseURL, got, want)
			}
			if !reflect.DeepEqual(c.SecurityContext, wc.SecurityContext) || !reflect.DeepEqual(p.Spec.SecurityContext, wpod.SecurityContext) {
				t.Errorf("security contexts %+v / %+v, the webhook's %+v / %+v", p.Spec.SecurityContext, c.SecurityContext, wpod.SecurityContext, wc.SecurityContext)
			}
			if c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
				t.Errorf("terminationMessagePolicy %q: want a failed check's fix in the pod's status", c.TerminationMessagePolicy)
			}
			if p.Spec.RestartPolicy != corev1.RestartPolicyNever || p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken ||
				p.Spec.ServiceAccountName != "" {
				t.Errorf("restartPolicy %q, automountServiceAccountToken %v, serviceAccountName %q: want Never, false and none",
					p.Spec.RestartPolicy, p.Spec.AutomountServiceAccountToken, p.Spec.ServiceAccountName)
			}
			if p.Spec.PriorityClassName != wpod.PriorityClassName || !reflect.DeepEqual(p.Spec.NodeSelector, wpod.NodeSelector) ||
				!reflect.DeepEqual(p.Spec.Tolerations, wpod.Tolerations) || !reflect.DeepEqual(p.Spec.ImagePullSecrets, wpod.ImagePullSecrets) {
				t.Errorf("placement %q %v %v %v, the webhook's %q %v %v %v", p.Spec.PriorityClassName, p.Spec.NodeSelector, p.Spec.Tolerations,
					p.Spec.ImagePullSecrets, wpod.PriorityClassName, wpod.NodeSelector, wpod.Tolerations, wpod.ImagePullSecrets)
			}
			svc := typed[corev1.Service](t, m.one(t, "Service"))
			if selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, p.Labels) {
				t.Errorf("the Service's selector %v selects the test pod's labels %v", svc.Spec.Selector, p.Labels)
			}
			for k, v := range dep.Spec.Template.Labels {
				if _, own := svc.Spec.Selector[k]; !own && p.Labels[k] != v {
					t.Errorf("the test pod lacks the webhook's label %s=%s (a NetworkPolicy may allow egress by it): %v", k, v, p.Labels)
				}
			}

			mount := mountAt(c, "/etc/dislock/database-ca")
			root, mode := envNamed(c.Env, "PGSSLROOTCERT"), envNamed(c.Env, "PGSSLMODE")
			if !tc.ca {
				if mount != nil || root != nil || mode != nil || len(p.Spec.Volumes) != 0 {
					t.Errorf("without a CA: mount %+v, PGSSLROOTCERT %+v, PGSSLMODE %+v, volumes %+v; want none", mount, root, mode, p.Spec.Volumes)
				}
				return
			}
			// dislock check has no --database-ca-file: the driver's libpq
			// variables apply where the URL sets no sslrootcert or sslmode.
			if root == nil || root.Value != databaseCAFile || mode == nil || mode.Value != "verify-full" {
				t.Errorf("PGSSLROOTCERT %+v, PGSSLMODE %+v: want %s and verify-full", root, mode, databaseCAFile)
			}
			if mount == nil || !mount.ReadOnly {
				t.Fatalf("mounts %+v: want the CA read-only at /etc/dislock/database-ca", c.VolumeMounts)
			}
			checkCAVolume(t, p.Spec, mount.Name, "db-ca", "", "ca.crt")
		})
	}
	t.Run("on the pod network unless tests.hostNetwork, whatever the webhook's", func(t *testing.T) {
		t.Parallel()
		for _, vals := range []map[string]any{base(), base("webhook.hostNetwork", true), base("tests.hostNetwork", true)} {
			p := typed[corev1.Pod](t, helmTemplate(t, "dislock", "dislock-system", vals).one(t, "Pod")).Spec
			want := vals["tests"] != nil
			if p.HostNetwork != want || (want && p.DNSPolicy != corev1.DNSClusterFirstWithHostNet) {
				t.Errorf("values %v: hostNetwork %t, dnsPolicy %q; want hostNetwork %t (with ClusterFirstWithHostNet)", vals, p.HostNetwork, p.DNSPolicy, want)
			}
		}
	})
	t.Run("none with tests.enabled false", func(t *testing.T) {
		t.Parallel()
		m := helmTemplate(t, "dislock", "dislock-system", base("tests.enabled", false))
		for _, o := range m {
			if o.GetKind() == "Pod" {
				t.Errorf("tests.enabled false renders %s", id(o))
			}
		}
	})
}
