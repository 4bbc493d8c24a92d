package skew_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dislock/dislock/test/previous"
)

// binaries are one release's two programs.
type binaries struct {
	dislock, agent string
}

// repoRoot is the repository's top directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("finding the repository root (the test builds releases from git): %v", err)
	}
	return strings.TrimSpace(string(out))
}

// buildPrevious builds the previous release (test/previous), or finds the
// build an earlier run left in bin/previous/.
func buildPrevious(t *testing.T, root string) binaries {
	t.Helper()
	r, err := previous.Build(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	return binaries{dislock: r.Dislock, agent: r.Agent}
}

// buildWorkingTree builds the working tree's programs into a temporary
// directory: they change with every edit, so they are not cached.
func buildWorkingTree(t *testing.T, root string) binaries {
	t.Helper()
	dir := t.TempDir()
	bins := binaries{dislock: filepath.Join(dir, "dislock"), agent: filepath.Join(dir, "dislock-agent")}
	goBuild(t, root, dir, bins)
	return bins
}

// goBuild builds static binaries as the image does, each into a temporary
// name first so that an interrupted build never leaves a cached half.
func goBuild(t *testing.T, src, dir string, bins binaries) {
	t.Helper()
	for _, b := range []struct{ pkg, out string }{{".", bins.dislock}, {"./lockagent/cmd/dislock-agent", bins.agent}} {
		tmp := filepath.Join(dir, fmt.Sprintf(".%s.tmp", filepath.Base(b.out)))
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, b.pkg)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s in %s: %v\n%s", b.pkg, src, err, out)
		}
		if err := os.Rename(tmp, b.out); err != nil {
			t.Fatal(err)
		}
	}
}
