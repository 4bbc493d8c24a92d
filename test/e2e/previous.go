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
	"encoding/json"
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
// every team's namespace. When the test ends dc gets the working tree's
// release again, as the tests that follow expect.
func installPrevious(t *testing.T, e *Env, dc *DC, nodes ...*node.Node) {
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
	uninstall := func() error {
		_, err := dc.helm(ctx, "uninstall", ReleaseName, "--namespace", WebhookNamespace, "--wait", "--ignore-not-found")
		return err
	}
	// Whatever state the test leaves the release in (a failed install
	// among them), it goes and the working tree's comes.
	t.Cleanup(func() {
		t.Helper()
		if err := uninstall(); err != nil {
			t.Fatal(err)
		}
		if err := installRelease(ctx, dc, e.root, dc.BouncerDSN(), t.Logf); err != nil {
			t.Fatalf("installing %s again: %v", ReleaseName, err)
		}
		for _, team := range Teams {
			if err := awaitReady(ctx, dc, team); err != nil {
				t.Fatal(err)
			}
		}
	})
	if err := uninstall(); err != nil {
		t.Fatal(err)
	}
	values, err := userValues(dc, previous.DislockRef, previous.AgentRef, dc.BouncerDSN())
	if err != nil {
		t.Fatal(err)
	}
	if out, err := dc.helmShown(ctx, t.Logf, e.root, dc.BouncerDSN(), append([]string{"install", ReleaseName, rel.Chart,
		"--namespace", WebhookNamespace, "--post-renderer", postRenderer, "--wait", "--timeout", installTimeout.String()}, values...)...); err != nil {
		t.Fatalf("%v\n%s%s", err, out, webhookRestarts(ctx, dc))
	}
	for _, team := range Teams {
		if err := awaitReady(ctx, dc, team); err != nil {
			t.Fatal(err)
		}
	}
}

// writePostRenderer installs the plugin where dc's helm finds it: its
// command is this test binary, given the environment webhook.extraEnv sets.
func writePostRenderer(dc *DC) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	env, err := apiServerEnv(dc)
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
			"platformCommand": []map[string]any{{"command": self, "args": []string{postRenderArg, env}}},
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

// postRenderMain is the plugin's program: its argument is the webhook
// container's extra environment, as JSON; the manifests come on stdin and
// go to stdout.
func postRenderMain(args []string) int {
	var env []any
	if len(args) != 1 || json.Unmarshal([]byte(args[0]), &env) != nil {
		fmt.Fprintf(os.Stderr, "%s: want the webhook's extra environment as a JSON list, got %q\n", postRenderer, args)
		return 2
	}
	if err := postRender(os.Stdin, os.Stdout, env); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", postRenderer, err)
		return 1
	}
	return 0
}

// postRender copies the manifests from in to out, the webhook Deployment
// put on the host network with env added to its webhook container's
// environment, as the current chart's webhook.hostNetwork and
// webhook.extraEnv render them. It fails unless it finds exactly one such
// Deployment and container, so that a chart that changed under it is not
// installed unchanged.
func postRender(in io.Reader, out io.Writer, env []any) error {
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
			if err := hostNetwork(obj, env); err != nil {
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
func hostNetwork(obj map[string]any, extra []any) error {
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
		c["env"] = append(env, extra...)
	}
	if found != 1 {
		return fmt.Errorf("the Deployment has %d containers named webhook, want 1", found)
	}
	return unstructured.SetNestedSlice(obj, containers, append(pod, "containers")...)
}
