// Package previous builds the previous release of dislock from git, for the
// tests of an upgrade from it and a rollback to it: its two programs
// (test/skew runs them as processes) and its two published images
// (test/e2e installs them with that release's own chart).
//
// The images are made by this checkout's recipe (internal/image) from the
// previous release's source: the same layers, paths and flags its
// Dockerfile gave them. Everything goes into bin/previous/<commit>/
// (git-ignored), which later runs reuse.
package previous

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/dislock/dislock/internal/image"
)

// Commit is the commit the previous release landed as. Move it (and
// Schema) forward when a release is cut.
const Commit = "845a3c5854ff13b40f67990b5f51fe7f591c4efd"

// Schema is the schema version the previous release knows.
const Schema = 5

// The previous release's images, by local tags that differ from the
// working tree's (test/images), so that a node holds both.
const (
	DislockRef = "e2e.local/dislock:previous"
	AgentRef   = "e2e.local/dislock-agent:previous"
)

// ErrShallow is returned (wrapped) when the repository lacks Commit.
var ErrShallow = errors.New("previous: the previous release's commit is not in the repository")

// Release is the built previous release.
type Release struct {
	// Dislock and Agent are its programs, the very files its images hold.
	Dislock, Agent string
	// Images is the tarball holding DislockRef and AgentRef, for
	// `ctr images import`.
	Images string
	// Source is its source tree (its charts/dislock is its chart). It is
	// kept beside the build.
	Source string
}

// Build builds the previous release of the repository at root, or returns
// the one an earlier run built.
func Build(ctx context.Context, root string) (Release, error) {
	dir := filepath.Join(root, "bin", "previous", Commit)
	r := layout(dir)
	// Test binaries of several packages build it at once: one builds, the
	// others wait and find its build.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return Release{}, err
	}
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(dir), ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return Release{}, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return Release{}, fmt.Errorf("previous: locking %s: %w", lock.Name(), err)
	}
	if exists(r.Dislock) && exists(r.Agent) && exists(r.Images) && exists(r.Source) {
		return r, nil
	}
	// A shallow clone lacks the previous release: that is a setup to
	// mend, never a reason to test less.
	if err := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-e", Commit+"^{commit}").Run(); err != nil {
		return Release{}, fmt.Errorf("%w: commit %s is not in %s, probably a shallow clone: run `git fetch --unshallow` and test again", ErrShallow, Commit, root)
	}
	// Build beside the cache and rename, so that an interrupted build
	// never leaves a half that a later run would take for whole.
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".build-")
	if err != nil {
		return Release{}, err
	}
	defer os.RemoveAll(tmp)
	built := layout(tmp)
	if err := os.MkdirAll(built.Source, 0o755); err != nil {
		return Release{}, err
	}
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, Commit, built.Source)
	if out, err := archive.CombinedOutput(); err != nil {
		return Release{}, fmt.Errorf("previous: extracting %s: %w\n%s", Commit, err, out)
	}
	b := image.Build{Version: "v0.0.0-previous", Commit: Commit[:7], Dir: built.Source}.WithDefaults()
	if err := b.Validate(); err != nil {
		return Release{}, fmt.Errorf("previous: %w", err)
	}
	refs := map[name.Reference]v1.Image{}
	for ref, im := range map[string]image.Image{DislockRef: image.Webhook, AgentRef: image.Agent} {
		img, _, err := b.Make(ctx, im, filepath.Dir(built.Dislock))
		if err != nil {
			return Release{}, fmt.Errorf("previous: %w", err)
		}
		tag, err := name.ParseReference(ref)
		if err != nil {
			return Release{}, err
		}
		refs[tag] = img
	}
	if err := tarball.MultiRefWriteToFile(built.Images, refs); err != nil {
		return Release{}, fmt.Errorf("previous: writing %s: %w", built.Images, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return Release{}, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return Release{}, err
	}
	return r, nil
}

// layout is where a build in dir keeps each part.
func layout(dir string) Release {
	return Release{
		Dislock: filepath.Join(dir, "bin", image.Webhook.Binary),
		Agent:   filepath.Join(dir, "bin", image.Agent.Binary),
		Images:  filepath.Join(dir, "images.tar"),
		Source:  filepath.Join(dir, "src"),
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
