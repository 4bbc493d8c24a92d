package skew_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// previousRelease is the commit the previous release landed as:
// its dislock knows schema version 5. Move it forward when a release is cut.
const previousRelease = "845a3c5854ff13b40f67990b5f51fe7f591c4efd"

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

// buildRelease builds commit's dislock and dislock-agent, from a copy
// `git archive` makes, into bin/skew/<commit>/ (git-ignored), which a later
// run reuses. The module cache is the caller's.
func buildRelease(t *testing.T, root, commit string) binaries {
	t.Helper()
	dir := filepath.Join(root, "bin", "skew", commit)
	bins := binaries{dislock: filepath.Join(dir, "dislock"), agent: filepath.Join(dir, "dislock-agent")}
	if exists(bins.dislock) && exists(bins.agent) {
		return bins
	}
	// A shallow clone lacks the previous release: that is a setup to
	// mend, never a reason to test less.
	if err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		t.Fatalf("commit %s (the previous release) is not in the repository at %s, probably a shallow clone: run `git fetch --unshallow` and test again", commit, root)
	}
	src := t.TempDir()
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("extracting %s: %v\n%s", commit, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	goBuild(t, src, dir, bins)
	return bins
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

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
