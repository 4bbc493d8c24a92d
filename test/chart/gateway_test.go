package chart

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/dislock/dislock/internal/gatewaycmd"
	"github.com/dislock/dislock/webhook/flags"
)

// gatewayArgs are the rendered gateway container's arguments after
// "gateway", with the database URL its environment gives first.
func gatewayArgs(t *testing.T, m manifest, release string) []string {
	t.Helper()
	dep := typed[appsv1.Deployment](t, m.get(t, "Deployment", release+"-gateway"))
	c := dep.Spec.Template.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "gateway" {
		t.Fatalf("the gateway container's arguments do not start with gateway: %q", c.Args)
	}
	if dep.Spec.Template.Spec.AutomountServiceAccountToken == nil || *dep.Spec.Template.Spec.AutomountServiceAccountToken {
		t.Error("the gateway's pods get a service account token, and call no Kubernetes API")
	}
	return append([]string{"--database-url=" + testURL}, c.Args[1:]...)
}

// With a ServiceMonitor asked for, Prometheus scrapes the gateway's
// metrics as it does the webhook's: each monitor selects its own Service's
// labels, and the port it scrapes is one that Service has.
func TestTheGatewaysMetricsAreScrapedWithTheWebhooks(t *testing.T) {
	t.Parallel()
	m := helmTemplate(t, "dislock", "dislock-system", base("gateway.enabled", true, "serviceMonitor.enabled", true))
	for _, name := range []string{"dislock-webhook", "dislock-gateway"} {
		mon := m.get(t, "ServiceMonitor", name)
		sel, _, _ := unstructured.NestedStringMap(mon.Object, "spec", "selector", "matchLabels")
		svc := m.get(t, "Service", name)
		labels := svc.GetLabels()
		for k, v := range sel {
			if labels[k] != v {
				t.Errorf("ServiceMonitor %s selects %s=%s; Service %s has %q", name, k, v, name, labels[k])
			}
		}
		endpoints, _, _ := unstructured.NestedSlice(mon.Object, "spec", "endpoints")
		ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
		for _, e := range endpoints {
			port := e.(map[string]any)["port"]
			if !slices.ContainsFunc(ports, func(p any) bool { return p.(map[string]any)["name"] == port }) {
				t.Errorf("ServiceMonitor %s scrapes port %v, which Service %s does not have", name, port, name)
			}
		}
	}
	if mon := helmTemplate(t, "dislock", "dislock-system", base("serviceMonitor.enabled", true)).find("ServiceMonitor", "dislock-gateway"); mon != nil {
		t.Error("without the gateway, a ServiceMonitor for it is rendered")
	}
}

// With gateway.enabled the chart runs the lock gateway with arguments it
// starts with, and the webhook mints gateway credentials whose URL names
// the gateway's Service, trusting the CA of a certificate that names it
// too, in both certificate modes.
func TestTheGatewayRendersAsTheWebhookAndTheGatewayStart(t *testing.T) {
	t.Parallel()
	for _, certManager := range []bool{false, true} {
		t.Run(fmt.Sprintf("certManager=%t", certManager), func(t *testing.T) {
			t.Parallel()
			m := helmTemplate(t, "dislock", "dislock-system", base("gateway.enabled", true, "certManager.enabled", certManager,
				"database.tls.caSecret.name", "db-ca"))
			s, err := gatewaycmd.Parse(gatewayArgs(t, m, "dislock"), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Check(); err != nil {
				t.Fatalf("the rendered gateway does not start: %v", err)
			}
			if s.Cluster != "dc-a" || s.DatabaseCAFile == "" {
				t.Errorf("the gateway's cluster %q and database CA %q: want the release's", s.Cluster, s.DatabaseCAFile)
			}
			dep := typed[appsv1.Deployment](t, m.get(t, "Deployment", "dislock-webhook"))
			args := dep.Spec.Template.Spec.Containers[0].Args
			host := "dislock-gateway.dislock-system.svc"
			if !slices.Contains(args, "--tenant-gateway-url=https://"+host+":9445") ||
				!slices.Contains(args, "--tenant-gateway-ca-file=/tmp/k8s-webhook-server/serving-certs/ca.crt") {
				t.Errorf("the webhook's arguments do not name the gateway and its CA: %q", args)
			}
			if certManager {
				cert := m.get(t, "Certificate", "dislock-webhook")
				names, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
				if !slices.Contains(names, host) {
					t.Errorf("the Certificate names %q, not the gateway's %s", names, host)
				}
			} else if !slices.Contains(args, "--cert-extra-dns-name="+host) {
				t.Errorf("the self-signed certificate does not name the gateway: %q", args)
			}
			// The database CA's file exists only in the pod.
			args = slices.DeleteFunc(slices.Clone(args), func(a string) bool { return strings.HasPrefix(a, "--database-ca-file=") })
			fs, err := flags.Parse(append([]string{"--database-url=" + testURL, "--namespace=dislock-system"}, args[1:]...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if err := fs.Check(); err != nil {
				t.Fatalf("the webhook does not start with the gateway's flags: %v", err)
			}
			svc := m.get(t, "Service", "dislock-gateway")
			if sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector"); sel["app.kubernetes.io/component"] != "gateway" {
				t.Errorf("the gateway's Service selects %v", sel)
			}
			if sel, _, _ := unstructured.NestedStringMap(m.get(t, "Service", "dislock-webhook").Object, "spec", "selector"); sel["app.kubernetes.io/component"] != "webhook" {
				t.Errorf("the webhook's Service selects %v, which the gateway's pods could match", sel)
			}
		})
	}
}

// Every gateway value the gateway refuses at start the chart refuses at
// install, naming it; every other renders arguments it starts with.
func TestEveryGatewayValueTheGatewayRefusesTheChartRefuses(t *testing.T) {
	t.Parallel()
	for _, p := range []boundProbe{
		{"gateway.decisionConns", []any{-1, 0, 1, 1000, 1001}, nil},
		{"gateway.renewalConns", []any{0, 1, 1000, 1001}, nil},
		{"gateway.maxQueued", []any{-1, 0, 1, 20000}, nil},
		{"gateway.maxQueuedPerNamespace", []any{-1, 0, 5}, nil},
		{"gateway.port", []any{0, 1, 9445, 65535, 65536}, nil},
	} {
		for _, v := range p.values {
			t.Run(fmt.Sprintf("%s=%v", p.path, v), func(t *testing.T) {
				t.Parallel()
				m, chartErr := helmTemplateErr(t, "dislock", "dislock-system", base("gateway.enabled", true, p.path, v))
				flag := "--" + kebab(strings.TrimPrefix(p.path, "gateway."))
				if p.path == "gateway.port" {
					flag = "--bind-address"
					v = fmt.Sprintf(":%v", v)
				}
				s, err := gatewaycmd.Parse([]string{"--database-url=" + testURL, "--cluster-name=dc-a", fmt.Sprintf("%s=%v", flag, v)}, io.Discard)
				gatewayErr := err
				if err == nil {
					gatewayErr = s.Check()
				}
				switch {
				case chartErr == nil && gatewayErr != nil:
					t.Errorf("the chart renders %s=%v, which the gateway refuses: %v", p.path, v, gatewayErr)
				case chartErr != nil && gatewayErr == nil:
					t.Errorf("the chart refuses %s=%v, which the gateway starts with: %v", p.path, v, chartErr)
				case chartErr != nil && !strings.Contains(chartErr.Error(), strings.TrimPrefix(p.path, "gateway.")):
					t.Errorf("the chart refuses %s=%v without naming it: %v", p.path, v, chartErr)
				case chartErr == nil:
					s, err := gatewaycmd.Parse(gatewayArgs(t, m, "dislock"), io.Discard)
					if err == nil {
						err = s.Check()
					}
					if err != nil {
						t.Errorf("%s=%v renders arguments the gateway refuses: %v", p.path, v, err)
					}
				}
			})
		}
	}
}

// The gateway's credentials reach namespaces through the Secrets the
// webhook writes: without them the chart refuses, naming both values.
func TestTheGatewayNeedsTheNamespacesSecrets(t *testing.T) {
	t.Parallel()
	_, err := helmTemplateErr(t, "dislock", "dislock-system", base("gateway.enabled", true, "database.copyToNamespaces", false))
	if err == nil || !strings.Contains(err.Error(), "gateway.enabled") || !strings.Contains(err.Error(), "database.copyToNamespaces") {
		t.Fatalf("gateway.enabled without database.copyToNamespaces: %v, want a refusal naming both", err)
	}
}

// kebab turns a value's name into its flag's: maxQueuedPerNamespace →
// max-queued-per-namespace.
func kebab(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte('-')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Turning the gateway off in two steps: with gateway.drain the gateway keeps
// serving (and the certificate keeps its name) while the webhook gives
// namespaces roles again.
func TestADrainingGatewayServesWhileTheWebhookMintsRoles(t *testing.T) {
	t.Parallel()
	m := helmTemplate(t, "dislock", "dislock-system", base("gateway.drain", true))
	gatewayArgs(t, m, "dislock") // the gateway still runs
	args := typed[appsv1.Deployment](t, m.get(t, "Deployment", "dislock-webhook")).Spec.Template.Spec.Containers[0].Args
	for _, a := range args {
		if strings.HasPrefix(a, "--tenant-gateway-url") {
			t.Errorf("a draining gateway's webhook still mints gateway credentials: %s", a)
		}
	}
	if !slices.Contains(args, "--cert-extra-dns-name=dislock-gateway.dislock-system.svc") {
		t.Errorf("a draining gateway's certificate loses its name: %q", args)
	}
}
