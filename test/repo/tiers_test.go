package repo

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// `make test` runs the tiers hack/test-packages.sh lists, plus the fault
// schedules: a package with tests that no tier lists would silently never
// run, and one listed twice would run twice.
func TestEveryPackageWithTestsIsInExactlyOneTier(t *testing.T) {
	tierOf := map[string]string{}
	for _, tier := range []string{"unit", "db", "kube", "e2e"} {
		out, err := exec.Command(filepath.Join(root, "hack/test-packages.sh"), tier).Output()
		if err != nil {
			t.Fatalf("hack/test-packages.sh %s: %v", tier, err)
		}
		for _, pkg := range strings.Fields(string(out)) {
			if prev, ok := tierOf[pkg]; ok {
				t.Errorf("%s is in tier %s and in tier %s", pkg, prev, tier)
			}
			tierOf[pkg] = tier
		}
	}
	cmd := exec.Command("go", "list", "-f", "{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	withTests := strings.Fields(string(out))
	for _, pkg := range withTests {
		if _, ok := tierOf[pkg]; !ok && !strings.HasSuffix(pkg, "/test/chaos") {
			t.Errorf("%s has tests but no tier lists it: make test never runs them", pkg)
		}
	}
	for pkg := range tierOf {
		if !slices.Contains(withTests, pkg) {
			t.Errorf("tier %s lists %s, which has no tests", tierOf[pkg], pkg)
		}
	}
	if len(tierOf) < 20 {
		t.Errorf("the tiers list %d packages, want the 20 or more with tests", len(tierOf))
	}
}
