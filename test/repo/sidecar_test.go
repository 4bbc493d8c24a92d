package repo

import (
	"os/exec"
	"strings"
	"testing"
)

// The sidecar binary is copied into every pod of every opted-in CronJob, and
// it runs with the namespace's database role: it links the lock primitives
// (lockagent/store) and nothing the owner alone runs. Migrations, role DDL,
// the preflight and missed-window detection live in lockagent/store's
// subpackages, which the agent must never import; Kubernetes client code
// and the webhook stay out too.
func TestTheSidecarLinksNoOwnerOnlyCode(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./lockagent/cmd/dislock-agent")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	const mod = "github.com/dislock/dislock/"
	// What the sidecar may link of this module: everything else is the
	// owner's or the webhook's.
	allowed := map[string]bool{
		"internal/version":            true,
		"lockagent/agent":             true,
		"lockagent/cmd/dislock-agent": true,
		"lockagent/contract":          true,
		// The lock gateway's client and wire, not its server.
		"lockagent/gateway/client":        true,
		"lockagent/gateway/internal/wire": true,
		"lockagent/protocol":              true,
		"lockagent/secret":                true,
		"lockagent/store":                 true,
		"lockagent/window":                true,
		"lockagent/wrapper":               true,
	}
	var linked []string
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(dep, mod):
			p := strings.TrimPrefix(dep, mod)
			linked = append(linked, p)
			if !allowed[p] && !strings.HasPrefix(p, "lockagent/store/internal/") {
				t.Errorf("the sidecar links %s: owner-only or webhook code in every pod (move what the agent needs into lockagent/store, or keep the agent from importing it)", p)
			}
		case strings.HasPrefix(dep, "k8s.io/"), strings.HasPrefix(dep, "sigs.k8s.io/"):
			t.Errorf("the sidecar links Kubernetes client code: %s", dep)
		}
	}
	for _, must := range []string{"lockagent/agent", "lockagent/store", "lockagent/wrapper"} {
		if !strings.Contains(" "+strings.Join(linked, " ")+" ", " "+must+" ") {
			t.Errorf("go list -deps does not show %s: the check looks at the wrong binary (%v)", must, linked)
		}
	}
}
