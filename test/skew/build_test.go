package skew_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dislock/dislock/internal/image"
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
// directory, as the images' recipe builds them: they change with every
// edit, so they are not cached.
func buildWorkingTree(t *testing.T, root string) binaries {
	t.Helper()
	dir := t.TempDir()
	bins := binaries{dislock: filepath.Join(dir, image.Webhook.Binary), agent: filepath.Join(dir, image.Agent.Binary)}
	b := image.Build{Dir: root}.WithDefaults()
	for im, out := range map[image.Image]string{image.Webhook: bins.dislock, image.Agent: bins.agent} {
		if err := b.Compile(context.Background(), im.Package, out); err != nil {
			t.Fatal(err)
		}
	}
	return bins
}
