// Package previous builds the previous release of dislock from git, for the
// tests of an upgrade from it and a rollback to it: its two programs
// (test/skew runs them as processes), its two images (test/e2e installs
// them) and its chart.
//
// The images are made by this checkout's recipe (internal/image) from the
// previous release's source: the binaries at the paths that release's
// chart and webhook run them from (/usr/local/bin), built with the
// release's flags, as user 65532. The base layer, labels and stamped
// version are this recipe's, not that release's Dockerfile's (it built on
// a distroless image this machine cannot pull).
//
// Everything goes into bin/previous/<commit>-<recipe>/ (git-ignored), which
// later runs reuse; a change of the recipe builds anew.
package previous

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// Release is the built previous release.
type Release struct {
	// Dislock and Agent are its programs, the very files its images hold.
	Dislock, Agent string
	// Images is the tarball holding DislockRef and AgentRef, for
	// `ctr images import`.
	Images string
	// Chart is its chart's directory (charts/dislock at Commit).
	Chart string
}

// Build builds the previous release of the repository at root, or returns
// the one an earlier run built.
func Build(ctx context.Context, root string) (Release, error) {
	recipe, err := os.ReadFile(filepath.Join(root, "internal", "image", "image.go"))
	if err != nil {
		return Release{}, fmt.Errorf("previous: the image recipe: %w", err)
	}
	sum := sha256.Sum256(recipe)
	parent := filepath.Join(root, "bin", "previous")
	dir := filepath.Join(parent, Commit[:12]+"-"+hex.EncodeToString(sum[:6]))
	r := layout(dir)
	// Test binaries of several packages build it at once: one builds, the
	// others wait and find its build.
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return Release{}, err
	}
	lock, err := os.OpenFile(filepath.Join(parent, ".lock"), os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return Release{}, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return Release{}, fmt.Errorf("previous: locking %s: %w", lock.Name(), err)
	}
	if exists(r.Dislock) && exists(r.Agent) && exists(r.Images) && exists(r.Chart) {
		return r, nil
	}
	// Builds a killed process left behind: no one else builds now.
	if stale, err := filepath.Glob(filepath.Join(parent, ".build-*")); err == nil {
		for _, s := range stale {
			os.RemoveAll(s)
		}
	}
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-e", Commit+"^{commit}").CombinedOutput(); err != nil {
		// A shallow clone lacks the previous release: that is a setup to
		// mend, never a reason to test less.
		return Release{}, fmt.Errorf("previous: commit %s (the previous release) is not readable in %s: %v: %s; in a shallow clone, run `git fetch --unshallow` and test again",
			Commit, root, err, strings.TrimSpace(string(out)))
	}
	// Build beside the cache and rename, so that an interrupted build
	// never leaves a half that a later run would take for whole.
	tmp, err := os.MkdirTemp(parent, ".build-")
	if err != nil {
		return Release{}, err
	}
	defer os.RemoveAll(tmp)
	if err := build(ctx, root, layout(tmp)); err != nil {
		return Release{}, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil { // MkdirTemp's 0700 would keep others out
		return Release{}, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return Release{}, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return Release{}, err
	}
	return r, nil
}

// build writes the release into r's paths. The source is extracted outside
// the repository, so that go build there finds neither this repository's
// git metadata nor a go.work above it.
func build(ctx context.Context, root string, r Release) error {
	src, err := os.MkdirTemp("", "dislock-previous-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	if err := extract(ctx, root, src, "."); err != nil {
		return err
	}
	if err := extract(ctx, root, filepath.Dir(filepath.Dir(r.Chart)), "charts/dislock"); err != nil {
		return err
	}
	b := image.Build{Version: "v0.0.0-previous", Commit: Commit[:7], Dir: src}.WithDefaults()
	if err := b.Validate(); err != nil {
		return fmt.Errorf("previous: %w", err)
	}
	refs := map[name.Reference]v1.Image{}
	for ref, im := range map[string]image.Image{DislockRef: image.Webhook, AgentRef: image.Agent} {
		img, _, err := b.Make(ctx, im, filepath.Dir(r.Dislock))
		if err != nil {
			return fmt.Errorf("previous: %w", err)
		}
		tag, err := name.ParseReference(ref)
		if err != nil {
			return err
		}
		refs[tag] = img
	}
	if err := tarball.MultiRefWriteToFile(r.Images, refs); err != nil {
		return fmt.Errorf("previous: writing %s: %w", r.Images, err)
	}
	return nil
}

// extract writes path of Commit's tree under dir.
func extract(ctx context.Context, root, dir, path string) error {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" "$3" | tar -x -C "$4"`, "sh", root, Commit, path, dir)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("previous: extracting %s of %s: %w: %s", path, Commit, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// layout is where a build in dir keeps each part.
func layout(dir string) Release {
	return Release{
		Dislock: filepath.Join(dir, "bin", image.Webhook.Binary),
		Agent:   filepath.Join(dir, "bin", image.Agent.Binary),
		Images:  filepath.Join(dir, "images.tar"),
		Chart:   filepath.Join(dir, "charts", "dislock"),
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
