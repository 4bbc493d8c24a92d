package e2e

// The previous release in a data centre, installed as its users installed
// it: its images (test/previous) imported into the data centre's nodes,
// then `helm install` of its own chart, from git.
//
// That chart has neither webhook.hostNetwork nor webhook.extraEnv, which
// this harness needs (release.go says why). A Helm post-renderer adds to its
// Deployment what those values render in the current chart, the way a user
// adds what a chart lacks: the plugin runs this test binary again, which
// Main hands to postRender. `helm rollback` applies the manifests Helm
// stored, which are the post-rendered ones.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/dislock/dislock/test/node"
	"github.com/dislock/dislock/test/previous"
)

const (
	// postRenderer is the Helm plugin's name.
	postRenderer = "e2e-host-network"
	// postRenderArg, as a test binary's first argument, makes Main
	// post-render instead of testing.
	postRenderArg = "e2e-post-render"
)

// installPrevious replaces dc's release with the previous release's,
// nodes holding its images, and waits until the previous webhook serves
// every team's namespace. When the test ends dc's release is upgraded to the
// working tree's chart again, as in the tests that follow.
func installPrevious(t *testing.T, e *Env, dc *DC, nodes ...*node.Node) previous.Release {
	t.Helper()
	ctx := context.Background()
	rel, err := previous.Build(ctx, e.root)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if _, err := n.Ctr("images", "import", rel.Images); err != nil {
			t.Fatal(err)
		}
	}
	if err := writePostRenderer(dc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		t.Helper()
		values, err := releaseValues(dc, dc.bouncer.DSN())
		if err != nil {
			t.Fatal(err)
		}
		if out, err := dc.helmShown(ctx, t.Logf, e.root, dc.bouncer.DSN(), append([]string{"upgrade", "--install", ReleaseName,
			filepath.Join(e.root, "charts", "dislock"), "--namespace", WebhookNamespace, "--wait", "--timeout", installTimeout.String()}, values...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, team := range Teams {
			if err := awaitReady(ctx, dc, team); err != nil {
				t.Fatal(err)
			}
		}
	})
	if out, err := dc.helm(ctx, "uninstall", ReleaseName, "--namespace", WebhookNamespace, "--wait"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	values, err := userValues(dc, previous.DislockRef, previous.AgentRef, dc.bouncer.DSN())
	if err != nil {
		t.Fatal(err)
	}
	if out, err := dc.helmShown(ctx, t.Logf, e.root, dc.bouncer.DSN(), append([]string{"install", ReleaseName,
		filepath.Join(rel.Source, "charts", "dislock"), "--namespace", WebhookNamespace, "--post-renderer", postRenderer,
		"--wait", "--timeout", installTimeout.String()}, values...)...); err != nil {
		t.Fatalf("%v\n%s%s", err, out, webhookRestarts(ctx, dc))
	}
	for _, team := range Teams {
		if err := awaitReady(ctx, dc, team); err != nil {
			t.Fatal(err)
		}
	}
	return rel
}

// writePostRenderer installs the plugin where dc's helm finds it: its
// command is this test binary, told dc's API server.
func writePostRenderer(dc *DC) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	host, port, err := apiServer(dc)
	if err != nil {
		return err
	}
	manifest, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1",
		"type":       "postrenderer/v1",
		"name":       postRenderer,
		"version":    "0.1.0",
		"runtime":    "subprocess",
		"runtimeConfig": map[string]any{
			"platformCommand": []map[string]any{{"command": self, "args": []string{postRenderArg, host, port}}},
		},
	})
	if err != nil {
		return err
	}
	dir := filepath.Join(dc.helmDataHome(), "plugins", postRenderer)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "plugin.yaml"), manifest, 0o644)
}

// postRenderMain is the plugin's program: args are the API server's host
// and port; the manifests come on stdin and go to stdout.
func postRenderMain(args []string) int {
	if len(args) != 2 {
		fmt.Fprintf(os.Stderr, "%s: want the API server's host and port, got %q\n", postRenderer, args)
		return 2
	}
	if err := postRender(os.Stdin, os.Stdout, args[0], args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", postRenderer, err)
		return 1
	}
	return 0
}

// postRender copies the manifests from in to out, the webhook Deployment
// put on the host network with the API server's address in its webhook
// container's environment, as the current chart's webhook.hostNetwork and
// webhook.extraEnv render them. It fails unless it finds exactly one such
// Deployment and container, so that a chart that changed under it is not
// installed unchanged.
func postRender(in io.Reader, out io.Writer, host, port string) error {
	dec := utilyaml.NewYAMLOrJSONDecoder(in, 4096)
	deployments := 0
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return err
		}
		if obj == nil {
			continue
		}
		if obj["kind"] == "Deployment" {
			deployments++
			if err := hostNetwork(obj, host, port); err != nil {
				return err
			}
		}
		b, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(out, "---\n%s", b); err != nil {
			return err
		}
	}
	if deployments != 1 {
		return fmt.Errorf("the manifests hold %d Deployments, want the webhook's alone", deployments)
	}
	return nil
}

// hostNetwork edits the webhook Deployment obj.
func hostNetwork(obj map[string]any, host, port string) error {
	pod := []string{"spec", "template", "spec"}
	if err := unstructured.SetNestedField(obj, true, append(pod, "hostNetwork")...); err != nil {
		return err
	}
	if err := unstructured.SetNestedField(obj, "ClusterFirstWithHostNet", append(pod, "dnsPolicy")...); err != nil {
		return err
	}
	containers, _, err := unstructured.NestedSlice(obj, append(pod, "containers")...)
	if err != nil {
		return err
	}
	found := 0
	for _, c := range containers {
		c, ok := c.(map[string]any)
		if !ok || c["name"] != "webhook" {
			continue
		}
		found++
		env, _ := c["env"].([]any)
		c["env"] = append(env,
			map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": host},
			map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": port})
	}
	if found != 1 {
		return fmt.Errorf("the Deployment has %d containers named webhook, want 1", found)
	}
	return unstructured.SetNestedSlice(obj, containers, append(pod, "containers")...)
}
