// Package image is the one recipe for dislock's two published images: the
// webhook image (/usr/local/bin/dislock, the admission webhook and operator
// CLI) and the agent-only image (/usr/local/bin/dislock-agent, the sidecar
// the webhook injects). It owns everything that decides what is in them: the
// main package and build flags of each binary, the files beside it, the
// image config, the OS and architecture.
//
// Three consumers use it, so that what is published is what is tested:
//   - `make image` (cmd/dislock-image build) writes each image as a
//     docker-archive tarball, without a Docker daemon;
//   - the Dockerfile runs cmd/dislock-image rootfs in a build stage and
//     copies the root filesystem it lays out into a FROM scratch stage (a
//     test holds the Dockerfile's USER, ENTRYPOINT, ENV and labels to Config);
//   - test/images builds the images the node and end-to-end tests import
//     into containerd and run.
//
// The dislock and dislock-agent binaries must not import this package: it
// builds them.
package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const (
	// Module is the main module the binaries are built from.
	Module = "github.com/dislock/dislock"
	// Source is the repository the images' source label names.
	Source = "https://github.com/dislock/dislock"
	// BinDir holds each image's binary, on the image's PATH: the injected
	// sidecar runs `dislock-agent agent` from the PATH.
	BinDir = "/usr/local/bin"
	// UID and GID are distroless's nonroot user, the user both images run as
	// and the uid the injected sidecar's securityContext names.
	UID = 65532
	GID = 65532
	// CACertsPath is where Go's crypto/x509 looks first on Linux: the
	// sidecar and the webhook verify the database's and registries'
	// certificates against it.
	CACertsPath = "/etc/ssl/certs/ca-certificates.crt"
	// SharedDir is where the injection mounts the pod's shared volume.
	// Nothing may be there in an image: a binary would be shadowed by the
	// mount, a file would make the mount fail.
	SharedDir = "/dislock"
)

// Label keys of the OCI image annotations the config carries.
const (
	LabelVersion  = "org.opencontainers.image.version"
	LabelRevision = "org.opencontainers.image.revision"
	LabelSource   = "org.opencontainers.image.source"
)

// Defaults of Build.
const (
	DefaultVersion = "dev"
	DefaultCommit  = "unknown"
	DefaultOS      = "linux"
)

// Image is one published image: the Dockerfile stage of the same name
// builds it too.
type Image struct {
	// Target is the Dockerfile's stage name (docker build --target).
	Target string
	// Binary is the program's name, at BinDir/Binary.
	Binary string
	// Package is the main package go build compiles.
	Package string
}

var (
	// Webhook is the default target: `dislock webhook` and the operator CLI.
	Webhook = Image{Target: "webhook", Binary: "dislock", Package: Module}
	// Agent is the sidecar's image (the webhook's --agent-image). It runs in
	// every opted-in pod, where a tenant may exec into the sidecar, so it
	// holds dislock-agent only: not the operator CLI, which would work there
	// with the sidecar's database credential.
	Agent = Image{Target: "agent", Binary: "dislock-agent", Package: Module + "/lockagent/cmd/dislock-agent"}
)

// All is every published image, the webhook first.
func All() []Image { return []Image{Webhook, Agent} }

// ByTarget returns the image whose Dockerfile stage is target.
func ByTarget(target string) (Image, error) {
	for _, im := range All() {
		if im.Target == target {
			return im, nil
		}
	}
	var names []string
	for _, im := range All() {
		names = append(names, im.Target)
	}
	return Image{}, fmt.Errorf("image target %q is unknown (want one of %s)", target, strings.Join(names, ", "))
}

// Path is where the image holds its binary.
func (im Image) Path() string { return path.Join(BinDir, im.Binary) }

// Entrypoint is the image config's entrypoint: the binary alone, so that
// `docker run IMAGE version` and a container's args work.
func (im Image) Entrypoint() []string { return []string{im.Path()} }

// User is the image config's user, numeric so that runAsNonRoot can check it
// without reading /etc/passwd.
func User() string { return fmt.Sprintf("%d:%d", UID, GID) }

// Env is the image config's environment.
func Env() []string { return []string{"PATH=" + BinDir + ":/usr/bin:/bin"} }

// Build says which build of the images to make.
type Build struct {
	// Version and Commit are stamped into internal/version and the labels.
	Version string
	Commit  string
	// OS and Arch are the target platform (GOOS, GOARCH).
	OS   string
	Arch string
	// Dir is the module directory go build runs in; empty: the working
	// directory. Another checkout (an older tag) builds with the same flags.
	Dir string
	// CACerts is the host's CA bundle copied to CACertsPath; empty: the
	// host's own CACertsPath (Debian's ca-certificates).
	CACerts string
}

// WithDefaults fills the empty fields.
func (b Build) WithDefaults() Build {
	if b.Version == "" {
		b.Version = DefaultVersion
	}
	if b.Commit == "" {
		b.Commit = DefaultCommit
	}
	if b.OS == "" {
		b.OS = DefaultOS
	}
	if b.Arch == "" {
		b.Arch = runtime.GOARCH
	}
	if b.CACerts == "" {
		b.CACerts = CACertsPath
	}
	return b
}

// Validate lists every problem of b (after WithDefaults).
func (b Build) Validate() error {
	var errs []error
	// The values end up inside one -ldflags argument, split at spaces by the
	// linker, and in labels.
	for _, f := range []struct{ name, v string }{{"version", b.Version}, {"commit", b.Commit}} {
		if f.v == "" || strings.ContainsAny(f.v, " \t\n'\"") {
			errs = append(errs, fmt.Errorf("%s %q: must be non-empty without spaces or quotes (e.g. v1.2.0, or `git describe --tags`)", f.name, f.v))
		}
	}
	if b.OS != "linux" {
		errs = append(errs, fmt.Errorf("os %q: the images are Linux images (want linux)", b.OS))
	}
	if !slices.Contains([]string{"amd64", "arm64"}, b.Arch) {
		errs = append(errs, fmt.Errorf("arch %q: want amd64 or arm64", b.Arch))
	}
	if _, err := os.Stat(b.CACerts); err != nil {
		errs = append(errs, fmt.Errorf("CA certificates %s: %w (install Debian's ca-certificates, or name a bundle)", b.CACerts, err))
	}
	return errors.Join(errs...)
}

// LDFlags are the linker flags: stripped (-s -w: the agent is copied into
// every pod and must stay under 15 MB) and stamped with the version.
func (b Build) LDFlags() string {
	return fmt.Sprintf("-s -w -X %s/internal/version.Version=%s -X %s/internal/version.Commit=%s", Module, b.Version, Module, b.Commit)
}

// GoBuild is the go build command line for pkg, written to out.
// -trimpath: no build machine paths in the binary, so the same source gives
// the same binary anywhere.
func (b Build) GoBuild(pkg, out string) []string {
	return []string{"go", "build", "-trimpath", "-ldflags", b.LDFlags(), "-o", out, pkg}
}

// GoEnv is the environment go build adds to the caller's: static (no cgo,
// so no C library or loader is needed in the image) for the target platform.
func (b Build) GoEnv() []string {
	return []string{"CGO_ENABLED=0", "GOOS=" + b.OS, "GOARCH=" + b.Arch}
}

// Compile builds the main package pkg into out.
func (b Build) Compile(ctx context.Context, pkg, out string) error {
	args := b.GoBuild(pkg, out)
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = b.Dir
	cmd.Env = append(os.Environ(), b.GoEnv()...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return nil
}

// Labels are the image config's labels.
func (b Build) Labels() map[string]string {
	return map[string]string{LabelVersion: b.Version, LabelRevision: b.Commit, LabelSource: Source}
}

// Config is the image config of im.
func (b Build) Config(im Image) v1.Config {
	return v1.Config{User: User(), Entrypoint: im.Entrypoint(), Env: Env(), Labels: b.Labels()}
}

// Base is what both images hold besides their binary, what they used to
// take from distroless/static:nonroot: the users (root owns the files,
// nonroot runs, nobody), CA certificates, a world-writable /tmp. No home
// directory: nothing writes one, and the Dockerfile's COPY could not keep
// its owner. It is one layer of its own, the same in both images, so a
// registry and containerd store it once.
func (b Build) Base() []File {
	return []File{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\n" +
			"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
			fmt.Sprintf("nonroot:x:%d:%d:nonroot:/nonexistent:/sbin/nologin\n", UID, GID))},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\n" + fmt.Sprintf("nonroot:x:%d:\n", GID))},
		{Path: CACertsPath, Mode: 0o644, Src: b.CACerts},
		{Path: "/tmp", Dir: true, Mode: os.ModeSticky | 0o777},
	}
}

// App is im's own layer: its binary, built at binary on this machine.
func (im Image) App(binary string) []File {
	return []File{{Path: im.Path(), Mode: 0o755, Src: binary}}
}

// Layers are im's file layers in order: Base, then App.
func (b Build) Layers(im Image, binary string) [][]File {
	return [][]File{b.Base(), im.App(binary)}
}

// Image assembles im around binary (built by Compile for b's platform).
func (b Build) Image(im Image, binary string) (v1.Image, error) {
	img := empty.Image
	for _, files := range b.Layers(im, binary) {
		layer, err := Layer(files)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", im.Target, err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return nil, fmt.Errorf("image %s: %w", im.Target, err)
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", im.Target, err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = b.OS, b.Arch
	cfg.Config = b.Config(im)
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, fmt.Errorf("image %s: %w", im.Target, err)
	}
	return img, nil
}

// Make compiles im's binary into binDir and assembles the image around it.
// It returns the binary's path too: the very file in the image, for callers
// that also run it on the host.
func (b Build) Make(ctx context.Context, im Image, binDir string) (v1.Image, string, error) {
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return nil, "", fmt.Errorf("image %s: %w", im.Target, err)
	}
	binary := filepath.Join(binDir, im.Binary)
	if err := b.Compile(ctx, im.Package, binary); err != nil {
		return nil, "", fmt.Errorf("image %s: %w", im.Target, err)
	}
	img, err := b.Image(im, binary)
	return img, binary, err
}

// Rootfs lays out im's root filesystem in dir, the files of every layer,
// for the Dockerfile to COPY into a FROM scratch stage.
func (b Build) Rootfs(im Image, binary, dir string) error {
	for _, files := range b.Layers(im, binary) {
		for _, f := range files {
			if err := f.writeUnder(dir); err != nil {
				return fmt.Errorf("image %s: %w", im.Target, err)
			}
		}
	}
	return nil
}

// File is one entry of a layer, owned by root: a directory (Dir), a
// symbolic link to Link, a copy of the host file Src, or Data. Missing
// parent directories are added with mode 0755.
type File struct {
	Path string
	Mode os.FileMode
	Dir  bool
	Link string
	Src  string
	Data []byte
}

// epoch is every entry's modification time, so the same inputs give the same
// layer digest.
var epoch = time.Unix(0, 0)

// content returns the file's bytes.
func (f File) content() ([]byte, error) {
	if f.Src != "" {
		return os.ReadFile(f.Src)
	}
	return f.Data, nil
}

// mode is f's permission bits as tar numbers them (S_ISVTX for sticky).
func (f File) mode() int64 {
	m := int64(f.Mode.Perm())
	if f.Mode&os.ModeSticky != 0 {
		m |= 0o1000
	}
	return m
}

// Layer writes files into an uncompressed tar and returns it as a layer.
// Layers are small (a static binary or a few files), so the tar is kept in
// memory.
func Layer(files []File) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		var parents []string
		for d := path.Dir(f.Path); d != "/" && !dirs[d]; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
			dirs[d] = true
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
		name := strings.TrimPrefix(f.Path, "/")
		switch {
		case f.Dir:
			dirs[f.Path] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: f.mode(), ModTime: epoch}); err != nil {
				return nil, err
			}
		case f.Link != "":
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: f.Link, Mode: 0o777, ModTime: epoch}); err != nil {
				return nil, err
			}
		default:
			data, err := f.content()
			if err != nil {
				return nil, err
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: f.mode(), Size: int64(len(data)), ModTime: epoch}); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithCompressedCaching)
}

// writeUnder creates f below root.
func (f File) writeUnder(root string) error {
	p := filepath.Join(root, filepath.FromSlash(f.Path))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	switch {
	case f.Dir:
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	case f.Link != "":
		return os.Symlink(f.Link, p)
	default:
		data, err := f.content()
		if err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return err
		}
	}
	// By chmod, after the write: the umask would clear bits (/tmp's 1777).
	return os.Chmod(p, f.Mode)
}

// Walk reads every layer of img in order and calls fn for each entry, with
// a reader of the entry's content: what a container started from img sees,
// for tests and for inspecting a built image.
func Walk(img v1.Image, fn func(hdr *tar.Header, content io.Reader) error) error {
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		tr := tar.NewReader(rc)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err == nil {
				err = fn(hdr, tr)
			}
			if err != nil {
				rc.Close()
				return err
			}
		}
		rc.Close()
	}
	return nil
}
