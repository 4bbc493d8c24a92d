// Package images builds the container images the node and end-to-end tests
// run, without a registry: static binaries go into single-layer images that
// are written, together, to one image tarball, which each test node imports
// into its containerd (`ctr -n k8s.io images import`). Pods name them by
// their local tags with imagePullPolicy Never.
//
// The images:
//   - Pause, the nodes' pod sandbox image (test/images/pause);
//   - Dislock and Agent, the published webhook and agent-only images, built
//     by the recipe that builds them for release and that the Dockerfile
//     runs (internal/image), stamped with Version: the sidecars the e2e
//     tests inject run the agent image (the webhook's --agent-image), and
//     the webhook they run as a host process is the webhook image's binary;
//   - Ledger, the end-to-end CronJobs' app (test/images/ledger-app), which
//     records each run in the e2e.ledger table (LedgerSchema);
//   - Busybox, a shell and the usual tools from Debian's busybox-static, for
//     pods that only need to sleep, touch or test files;
//   - MeshProxy, a classic mesh sidecar's stand-in (test/images/mesh-proxy):
//     it runs until POST /quitquitquit.
package images

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/dislock/dislock/internal/image"
)

// Local tags. The registry name is one that never resolves, so a pod that
// asks to pull one fails at once instead of reaching out.
const (
	PauseRef   = "e2e.local/pause:test"
	DislockRef = "e2e.local/dislock:test"
	AgentRef   = "e2e.local/dislock-agent:test"
	LedgerRef  = "e2e.local/ledger-app:test"
	BusyboxRef = "e2e.local/busybox:test"
	MeshRef    = "e2e.local/mesh-proxy:test"
)

// ErrMissing is returned (wrapped) when a file an image needs is not on this
// machine; the wrapping error says how to get it.
var ErrMissing = errors.New("images: missing input")

// busyboxPath is where Debian's busybox-static installs its static binary.
const busyboxPath = "/bin/busybox"

// busyboxApplets are linked to busybox in /bin, so that `sh -c` scripts find
// them whatever the build's applet-lookup settings.
var busyboxApplets = []string{"sh", "sleep", "touch", "test", "cat", "echo", "true", "false", "ls", "rm", "date"}

// binPath is where the images keep their programs, on the PATH the image
// config sets.
const binPath = image.BinDir

// LedgerSchema creates the table ledger-app writes: one row per run, with
// database times, so that runs of different clusters compare on one clock,
// and the completion index of an Indexed Job's run (NULL otherwise).
const LedgerSchema = `CREATE SCHEMA IF NOT EXISTS e2e;
CREATE TABLE IF NOT EXISTS e2e.ledger (
  id bigserial PRIMARY KEY,
  window_start text NOT NULL,
  job_index int,
  token bigint NOT NULL,
  cluster text NOT NULL,
  namespace text NOT NULL,
  pod text NOT NULL,
  started_at timestamptz NOT NULL,
  finished_at timestamptz,
  exit_code int)`

// Set is the built images, all in one tarball.
type Set struct {
	// Tarball holds every image, tagged with the refs above.
	Tarball string
	// Refs lists the tags in the tarball.
	Refs []string
	// Binaries is the directory with the static binaries the images hold
	// (dislock, dislock-agent, ledger-app, mesh-proxy, pause), for tests that run them
	// as host processes too: the very files the images were made of.
	Binaries string
	// Commit is what the binaries are stamped with beside Version.
	Commit string
}

// Version is what the images' binaries are stamped with (`dislock
// version`, the image's org.opencontainers.image.version label).
const Version = "v0.0.0-e2e"

// recipe is the published images' build, at this checkout's commit.
func recipe() image.Build {
	commit := image.DefaultCommit
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(out))
	}
	return image.Build{Version: Version, Commit: commit}.WithDefaults()
}

// Build compiles the static binaries into dir/bin with `go build` (from the
// main module the working directory belongs to) and writes dir/images.tar. A
// missing busybox yields an error wrapping ErrMissing that names the package.
func Build(dir string) (Set, error) {
	if _, err := os.Stat(busyboxPath); err != nil {
		return Set{}, fmt.Errorf("%w: %s not found: install Debian's busybox-static (hack/install-node-deps.sh)", ErrMissing, busyboxPath)
	}
	b := recipe()
	if err := b.Validate(); err != nil {
		return Set{}, fmt.Errorf("%w: %v", ErrMissing, err)
	}
	bin := filepath.Join(dir, "bin")
	set := Set{Tarball: filepath.Join(dir, "images.tar"), Binaries: bin, Commit: b.Commit}
	refs := make(map[name.Reference]v1.Image)
	add := func(r string, img v1.Image) error {
		ref, err := name.ParseReference(r)
		if err != nil {
			return fmt.Errorf("images: %w", err)
		}
		refs[ref] = img
		set.Refs = append(set.Refs, r)
		return nil
	}
	ctx := context.Background()
	for r, im := range map[string]image.Image{DislockRef: image.Webhook, AgentRef: image.Agent} {
		img, _, err := b.Make(ctx, im, bin)
		if err != nil {
			return Set{}, fmt.Errorf("images: %w", err)
		}
		if err := add(r, img); err != nil {
			return Set{}, err
		}
	}
	// The test programs are built with the same flags.
	for prog, pkg := range programs {
		if err := b.Compile(ctx, pkg, filepath.Join(bin, prog)); err != nil {
			return Set{}, fmt.Errorf("images: %w", err)
		}
	}
	inBin := func(names ...string) []image.File {
		var fs []image.File
		for _, n := range names {
			fs = append(fs, image.File{Path: path.Join(binPath, n), Mode: 0o755, Src: filepath.Join(bin, n)})
		}
		return fs
	}
	busybox := []image.File{{Path: busyboxPath, Mode: 0o755, Src: busyboxPath}}
	for _, a := range busyboxApplets {
		busybox = append(busybox, image.File{Path: "/bin/" + a, Link: "busybox"})
	}
	specs := []Spec{
		{Ref: PauseRef, Files: inBin("pause"), Entrypoint: []string{path.Join(binPath, "pause")}},
		{Ref: LedgerRef, Files: inBin("ledger-app"), Entrypoint: []string{path.Join(binPath, "ledger-app")}},
		{Ref: BusyboxRef, Files: busybox, Entrypoint: []string{"/bin/sh"}},
		{Ref: MeshRef, Files: inBin("mesh-proxy"), Entrypoint: []string{path.Join(binPath, "mesh-proxy")}},
	}
	for _, s := range specs {
		img, err := s.image(b)
		if err != nil {
			return Set{}, err
		}
		if err := add(s.Ref, img); err != nil {
			return Set{}, err
		}
	}
	if err := tarball.MultiRefWriteToFile(set.Tarball, refs); err != nil {
		return Set{}, fmt.Errorf("images: writing %s: %w", set.Tarball, err)
	}
	return set, nil
}

// programs are the test programs Build compiles, by binary name.
var programs = map[string]string{
	"ledger-app": "github.com/dislock/dislock/test/images/ledger-app",
	"mesh-proxy": "github.com/dislock/dislock/test/images/mesh-proxy",
	"pause":      "github.com/dislock/dislock/test/images/pause",
}

// Spec describes a test program's single-layer image.
type Spec struct {
	Ref        string
	Files      []image.File
	Entrypoint []string
}

// image builds the image in memory, for b's platform, with the published
// images' PATH.
func (s Spec) image(b image.Build) (v1.Image, error) {
	layer, err := image.Layer(s.Files)
	if err != nil {
		return nil, fmt.Errorf("images: layer of %s: %w", s.Ref, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w", s.Ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w", s.Ref, err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = b.OS, b.Arch
	cfg.Config.Entrypoint = s.Entrypoint
	cfg.Config.Env = image.Env()
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w", s.Ref, err)
	}
	return img, nil
}
