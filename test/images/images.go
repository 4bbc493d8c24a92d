// Package images builds the container images the node and end-to-end tests
// run, without a registry: static binaries go into single-layer images that
// are written, together, to one image tarball, which each test node imports
// into its containerd (`ctr -n k8s.io images import`). Pods name them by
// their local tags with imagePullPolicy Never.
//
// The images:
//   - Pause, the nodes' pod sandbox image (test/images/pause);
//   - Dislock, the webhook's image: /usr/local/bin/dislock (the webhook and
//     CLI), and /usr/local/bin/dislock-agent too, for suites that still
//     inject it as the sidecar;
//   - Agent, the sidecar's agent-only image, as the Dockerfile's agent
//     target builds it: /usr/local/bin/dislock-agent and nothing else (the
//     webhook's --agent-image);
//   - Ledger, the end-to-end CronJobs' app (test/images/ledger-app), which
//     records each run in the e2e.ledger table (LedgerSchema);
//   - Busybox, a shell and the usual tools from Debian's busybox-static, for
//     pods that only need to sleep, touch or test files;
//   - MeshProxy, a classic mesh sidecar's stand-in (test/images/mesh-proxy):
//     it runs until POST /quitquitquit.
package images

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
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
const binPath = "/usr/local/bin"

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
	// as host processes too.
	Binaries string
}

// Build compiles the static binaries into dir/bin with `go build` (from the
// main module the working directory belongs to) and writes dir/images.tar. A
// missing busybox yields an error wrapping ErrMissing that names the package.
func Build(dir string) (Set, error) {
	if _, err := os.Stat(busyboxPath); err != nil {
		return Set{}, fmt.Errorf("%w: %s not found: install Debian's busybox-static (hack/install-node-deps.sh)", ErrMissing, busyboxPath)
	}
	bin := filepath.Join(dir, "bin")
	if err := buildBinaries(bin); err != nil {
		return Set{}, err
	}
	inBin := func(names ...string) []File {
		var fs []File
		for _, n := range names {
			fs = append(fs, File{Path: path.Join(binPath, n), Src: filepath.Join(bin, n)})
		}
		return fs
	}
	busybox := []File{{Path: busyboxPath, Src: busyboxPath}}
	for _, a := range busyboxApplets {
		busybox = append(busybox, File{Path: "/bin/" + a, Link: "busybox"})
	}
	specs := []Spec{
		{Ref: PauseRef, Files: inBin("pause"), Entrypoint: []string{path.Join(binPath, "pause")}},
		{Ref: DislockRef, Files: inBin("dislock", "dislock-agent"), Entrypoint: []string{path.Join(binPath, "dislock")}},
		{Ref: AgentRef, Files: inBin("dislock-agent"), Entrypoint: []string{path.Join(binPath, "dislock-agent")}},
		{Ref: LedgerRef, Files: inBin("ledger-app"), Entrypoint: []string{path.Join(binPath, "ledger-app")}},
		{Ref: BusyboxRef, Files: busybox, Entrypoint: []string{"/bin/sh"}},
		{Ref: MeshRef, Files: inBin("mesh-proxy"), Entrypoint: []string{path.Join(binPath, "mesh-proxy")}},
	}
	set := Set{Tarball: filepath.Join(dir, "images.tar"), Binaries: bin}
	refs := make(map[name.Reference]v1.Image)
	for _, s := range specs {
		ref, img, err := s.image()
		if err != nil {
			return Set{}, err
		}
		refs[ref] = img
		set.Refs = append(set.Refs, s.Ref)
	}
	if err := tarball.MultiRefWriteToFile(set.Tarball, refs); err != nil {
		return Set{}, fmt.Errorf("images: writing %s: %w", set.Tarball, err)
	}
	return set, nil
}

// programs are the main packages Build compiles, by binary name.
var programs = map[string]string{
	"dislock":       "github.com/dislock/dislock",
	"dislock-agent": "github.com/dislock/dislock/lockagent/cmd/dislock-agent",
	"ledger-app":    "github.com/dislock/dislock/test/images/ledger-app",
	"mesh-proxy":    "github.com/dislock/dislock/test/images/mesh-proxy",
	"pause":         "github.com/dislock/dislock/test/images/pause",
}

// buildBinaries compiles every program, statically (no cgo: the images have
// no C library), into dir.
func buildBinaries(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	for bin, pkg := range programs {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, bin), pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("images: go build %s: %w\n%s", pkg, err, out)
		}
	}
	return nil
}

// File is one entry of an image's layer: a copy of the host file Src, or,
// when Link is set, a symbolic link to Link. Parent directories are added.
type File struct {
	Path string
	Src  string
	Link string
}

// Spec describes a single-layer image.
type Spec struct {
	Ref        string
	Files      []File
	Entrypoint []string
}

// image builds the image in memory: the layer is small (a few static
// binaries).
func (s Spec) image() (name.Reference, v1.Image, error) {
	ref, err := name.ParseReference(s.Ref)
	if err != nil {
		return nil, nil, fmt.Errorf("images: %w", err)
	}
	layerTar, err := layerBytes(s.Files)
	if err != nil {
		return nil, nil, fmt.Errorf("images: layer of %s: %w", s.Ref, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("images: layer of %s: %w", s.Ref, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, nil, fmt.Errorf("images: %s: %w", s.Ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, nil, fmt.Errorf("images: %s: %w", s.Ref, err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config.Entrypoint = s.Entrypoint
	cfg.Config.Env = []string{"PATH=" + binPath + ":/usr/bin:/bin"}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("images: %s: %w", s.Ref, err)
	}
	return ref, img, nil
}

// layerBytes writes files into a tar with their parent directories first.
// Times are fixed so that the same inputs give the same digest.
func layerBytes(files []File) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	for _, f := range files {
		var parents []string
		for d := path.Dir(f.Path); d != "/" && !dirs[d]; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
			dirs[d] = true
		}
		for _, d := range parents {
			hdr := &tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch}
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
		}
		name := strings.TrimPrefix(f.Path, "/")
		if f.Link != "" {
			hdr := &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: f.Link, Mode: 0o777, ModTime: epoch}
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			continue
		}
		data, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, err
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(data)), ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
