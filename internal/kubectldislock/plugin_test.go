package kubectldislock

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dislock/dislock/webhook/pluginapi"
)

// runPlugin runs kubectl dislock with a kubeconfig that leads nowhere.
func runPlugin(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: team-a}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := Main(context.Background(), append(args, "--kubeconfig", kubeconfig), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestBadInvocationsOfTheKubectlPluginSayWhatIsWrong(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"windowz"}, 2, `unknown command "windowz"`},
		{[]string{"pause"}, 2, "name the CronJob (kubectl dislock pause <cronjob> [-n namespace])"},
		{[]string{"windows", "a", "b"}, 2, "one CronJob at a time (got a, b)"},
		{[]string{"pause", "report", "--since", "2h"}, 2, "flag provided but not defined: -since"},
		{[]string{"windows", "--dislock-service", "dislock-webhook"}, 1, `--dislock-service "dislock-webhook" is not <namespace>/<service>:<port>`},
		// Flags after the CronJob, as kubectl takes them; the call then
		// fails for want of a cluster, naming where it went.
		{[]string{"windows", "report", "-n", "team-b", "-o", "json"}, 1, "asking dislock through dislock-system/https:dislock-webhook:plugin-api of cluster https://127.0.0.1:1"},
	} {
		code, _, errOut := runPlugin(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("kubectl dislock %s: exit %d, stderr %q; want exit %d saying %q", strings.Join(tc.args, " "), code, errOut, tc.code, tc.want)
		}
	}
}

// Every parameter the webhook takes is a flag of the plugin with a usage,
// and the plugin has no command the webhook does not serve.
func TestThePluginsFlagsAreTheWebhooksParameters(t *testing.T) {
	for _, table := range []map[string][]string{pluginapi.Reads, pluginapi.Writes} {
		for command, params := range table {
			for _, p := range params {
				if commandFlags[p] == "" {
					t.Errorf("parameter %q of %s has no flag usage in the plugin", p, command)
				}
			}
		}
	}
	code, _, errOut := runPlugin(t, "-h")
	if code != 0 {
		t.Fatalf("kubectl dislock -h: exit %d", code)
	}
	for command := range pluginapi.Reads {
		if !strings.Contains(errOut, "  "+command+" [cronjob]") {
			t.Errorf("usage does not list %s:\n%s", command, errOut)
		}
	}
	for command := range pluginapi.Writes {
		if !strings.Contains(errOut, "  "+command+" <cronjob>") {
			t.Errorf("usage does not list %s:\n%s", command, errOut)
		}
	}
}
