// Command release builds every artefact of a dislock release into one
// directory, signs each and verifies each, offline (make release
// VERSION=x.y.z). Pushing is left to the commands docs/release.md lists.
//
//	images/<image>/            an OCI image layout per image, one index of linux/amd64 and linux/arm64
//	cli/dislock-<os>-<arch>    the static CLI for linux and darwin, amd64 and arm64
//	cli/kubectl-dislock-<os>-<arch>.tar.gz  the same CLI as kubectl-dislock, for krew
//	cli/SHA256SUMS             their checksums
//	krew/dislock.yaml          the krew plugin manifest naming those archives at -download-url
//	charts/dislock-<v>.tgz     the chart, version and appVersion <v>, and the repository's index.yaml
//	sbom/<artefact>.cdx.json   a CycloneDX SBOM per binary, in an image or not (cyclonedx-gomod)
//	*.sig                      a cosign signature beside every file; the images are signed in a
//	                           registry on loopback, where verification runs too
//	cosign.pub                 the public key that verifies them all
//
// Without -key it signs with a key pair it generates for the run: a dry
// run, as CI on a tag runs with the project's key.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/dislock/dislock/internal/image"
)

// Platforms are the images' and the CLI's targets.
var (
	imageArchs = []string{"amd64", "arm64"}
	cliOSes    = []string{"linux", "darwin"}
)

type config struct {
	version, commit string
	out             string
	helm, cosign    string
	cyclonedx       string
	key             string // cosign private key; "" generates one
	repoURL         string
	downloadURL     string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var c config
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.StringVar(&c.version, "version", "", "the release's version, x.y.z (required)")
	fs.StringVar(&c.commit, "commit", "unknown", "the commit stamped into the binaries and the images' labels")
	fs.StringVar(&c.out, "o", "dist", "directory for the artefacts (emptied first)")
	fs.StringVar(&c.helm, "helm", "bin/helm", "helm binary")
	fs.StringVar(&c.cosign, "cosign", "bin/cosign", "cosign binary")
	fs.StringVar(&c.cyclonedx, "cyclonedx-gomod", "bin/cyclonedx-gomod", "cyclonedx-gomod binary")
	fs.StringVar(&c.key, "key", "", "cosign private key (COSIGN_PASSWORD holds its password); empty: a key pair generated for this run")
	fs.StringVar(&c.repoURL, "chart-repo-url", "https://dislock.github.io/dislock/charts", "the URL the chart repository's index.yaml names")
	fs.StringVar(&c.downloadURL, "download-url", "", "where the forge's release serves the CLI's files, which the krew manifest names (default: https://github.com/dislock/dislock/releases/download/v<version>)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) error {
	if !semver(c.version) {
		return fmt.Errorf("-version %q is not x.y.z (e.g. 0.3.0; no leading v)", c.version)
	}
	for _, tool := range []string{c.helm, c.cosign, c.cyclonedx} {
		if _, err := os.Stat(tool); err != nil {
			return fmt.Errorf("%w (make release-tools builds it)", err)
		}
	}
	if err := os.RemoveAll(c.out); err != nil {
		return err
	}
	if c.downloadURL == "" {
		c.downloadURL = "https://github.com/dislock/dislock/releases/download/v" + c.version
	}
	for _, d := range []string{"images", "cli", "charts", "sbom", "krew"} {
		if err := os.MkdirAll(filepath.Join(c.out, d), 0o755); err != nil {
			return err
		}
	}
	images, err := buildImages(ctx, c)
	if err != nil {
		return err
	}
	if err := buildCLI(ctx, c); err != nil {
		return err
	}
	if err := packageChart(ctx, c); err != nil {
		return err
	}
	key, pub, err := signingKey(ctx, c)
	if err != nil {
		return err
	}
	files, err := artefactFiles(c.out)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := cmd(ctx, c.cosign, "sign-blob", "--yes", "--key", key, "--tlog-upload=false", "--output-signature", f+".sig", f); err != nil {
			return err
		}
	}
	host, stopRegistry, err := loopbackRegistry()
	if err != nil {
		return err
	}
	defer stopRegistry()
	if err := signImages(ctx, c, key, host, images); err != nil {
		return err
	}
	if err := verify(ctx, c, pub, host, images); err != nil {
		return fmt.Errorf("verifying: %w", err)
	}
	fmt.Printf("release %s: %d files signed and verified, %d images, in %s\n", c.version, len(files), len(images), c.out)
	return nil
}

// builtImage is one image's layout and what verification expects of it.
type builtImage struct {
	image    image.Image
	dir      string
	digest   v1.Hash
	binaries map[string]string // arch -> the binary in the image
}

// buildImages builds each image for every arch with the recipe of
// internal/image, into one OCI layout with an index, and an SBOM of each
// binary in it.
func buildImages(ctx context.Context, c config) ([]builtImage, error) {
	var out []builtImage
	for _, im := range image.All() {
		bi := builtImage{image: im, dir: filepath.Join(c.out, "images", im.Binary), binaries: map[string]string{}}
		var idx v1.ImageIndex = empty.Index
		for _, arch := range imageArchs {
			b := image.Build{Version: c.version, Commit: c.commit, Arch: arch}.WithDefaults()
			if err := b.Validate(); err != nil {
				return nil, err
			}
			img, binary, err := b.Make(ctx, im, filepath.Join(c.out, "build", b.OS+"-"+arch))
			if err != nil {
				return nil, err
			}
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img,
				Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: b.OS, Architecture: arch}}})
			bi.binaries[arch] = binary
			if err := sbom(ctx, c, binary, imageSBOM(c.out, im, arch)); err != nil {
				return nil, err
			}
		}
		p, err := layout.Write(bi.dir, empty.Index)
		if err != nil {
			return nil, err
		}
		if err := p.AppendIndex(idx); err != nil {
			return nil, err
		}
		if bi.digest, err = idx.Digest(); err != nil {
			return nil, err
		}
		fmt.Printf("image %s: index %s (%s)\n", im.Binary, bi.digest, strings.Join(imageArchs, ", "))
		out = append(out, bi)
	}
	return out, nil
}

// buildCLI builds the static dislock CLI for every OS and arch, its SBOM,
// and SHA256SUMS.
func buildCLI(ctx context.Context, c config) error {
	var sums []string
	var archives []krewArchive
	for _, goos := range cliOSes {
		for _, arch := range imageArchs {
			b := image.Build{Version: c.version, Commit: c.commit, OS: goos, Arch: arch}.WithDefaults()
			file := fmt.Sprintf("dislock-%s-%s", goos, arch)
			path := filepath.Join(c.out, "cli", file)
			if err := b.Compile(ctx, image.Webhook.Package, path); err != nil {
				return err
			}
			sum, err := sha256File(path)
			if err != nil {
				return err
			}
			sums = append(sums, sum+"  "+file)
			if err := sbom(ctx, c, path, filepath.Join(c.out, "sbom", file+".cdx.json")); err != nil {
				return err
			}
			a, err := writeKrewArchive(filepath.Join(c.out, "cli"), goos, arch, path, "LICENSE")
			if err != nil {
				return err
			}
			sums = append(sums, a.sha256+"  "+a.file)
			archives = append(archives, a)
		}
	}
	if err := os.WriteFile(filepath.Join(c.out, "krew", "dislock.yaml"), []byte(krewManifest(c.version, c.downloadURL, archives)), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.out, "cli", "SHA256SUMS"), []byte(strings.Join(sums, "\n")+"\n"), 0o644)
}

func packageChart(ctx context.Context, c config) error {
	dir := filepath.Join(c.out, "charts")
	if err := cmd(ctx, c.helm, "package", "charts/dislock", "--version", c.version, "--app-version", c.version, "-d", dir); err != nil {
		return err
	}
	return cmd(ctx, c.helm, "repo", "index", dir, "--url", c.repoURL)
}

// imageSBOM is where the SBOM of image im's binary for arch goes.
func imageSBOM(out string, im image.Image, arch string) string {
	return filepath.Join(out, "sbom", fmt.Sprintf("%s-image-linux-%s.cdx.json", im.Binary, arch))
}

func sbom(ctx context.Context, c config, binary, out string) error {
	return cmd(ctx, c.cyclonedx, "bin", "-json", "-version", "v"+c.version, "-output", out, binary)
}

// signingKey returns the private key and its public key, written to
// cosign.pub in the output: the given one, or a pair generated for the run.
func signingKey(ctx context.Context, c config) (key, pub string, err error) {
	pub = filepath.Join(c.out, "cosign.pub")
	if c.key != "" {
		out, err := exec.CommandContext(ctx, c.cosign, "public-key", "--key", c.key).Output()
		if err != nil {
			return "", "", fmt.Errorf("cosign public-key --key %s: %w", c.key, err)
		}
		return c.key, pub, os.WriteFile(pub, out, 0o644)
	}
	dir, err := os.MkdirTemp("", "dislock-release-key-")
	if err != nil {
		return "", "", err
	}
	// The throwaway key's password; cosign reads COSIGN_PASSWORD.
	if err := os.Setenv("COSIGN_PASSWORD", "dry-run"); err != nil {
		return "", "", err
	}
	gen := exec.CommandContext(ctx, c.cosign, "generate-key-pair")
	gen.Dir = dir
	if out, err := gen.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("cosign generate-key-pair: %w\n%s", err, out)
	}
	if err := os.Rename(filepath.Join(dir, "cosign.pub"), pub); err != nil {
		return "", "", err
	}
	fmt.Println("signing with a key pair generated for this run (a dry run: pass -key to sign a release)")
	return filepath.Join(dir, "cosign.key"), pub, nil
}

// artefactFiles are the files to sign: everything but the images' layouts
// (signed in a registry) and the build directory.
func artefactFiles(out string) ([]string, error) {
	var files []string
	for _, d := range []string{"cli", "charts", "sbom", "krew"} {
		entries, err := os.ReadDir(filepath.Join(out, d))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if !e.IsDir() && !strings.HasSuffix(e.Name(), ".sig") {
				files = append(files, filepath.Join(out, d, e.Name()))
			}
		}
	}
	sort.Strings(files)
	return files, nil
}

// verify checks every artefact as a user of the release would: the
// checksums, the stamped version of every binary, each image's index (both
// platforms, labels, the binary in it), the chart's version and appVersion,
// that each SBOM lists every Go module its binary was built with, and every
// signature with the public key; the images' in a registry on loopback.
func verify(ctx context.Context, c config, pub, host string, images []builtImage) error {
	var errs []error
	sums, err := os.ReadFile(filepath.Join(c.out, "cli", "SHA256SUMS"))
	if err != nil {
		return err
	}
	for l := range strings.Lines(string(sums)) {
		want, file, _ := strings.Cut(strings.TrimSpace(l), "  ")
		path := filepath.Join(c.out, "cli", file)
		if got, err := sha256File(path); err != nil || got != want {
			errs = append(errs, fmt.Errorf("%s: sha256 %s, SHA256SUMS says %s (%v)", file, got, want, err))
		}
		if strings.HasSuffix(file, ".tar.gz") {
			errs = append(errs, checkKrewArchive(path))
			continue
		}
		errs = append(errs, checkBinary(c, path), checkSBOM(path, filepath.Join(c.out, "sbom", file+".cdx.json")))
	}
	for _, bi := range images {
		errs = append(errs, checkImage(c, bi))
		for arch, binary := range bi.binaries {
			errs = append(errs, checkBinary(c, binary), checkSBOM(binary, imageSBOM(c.out, bi.image, arch)))
		}
	}
	errs = append(errs, checkChart(ctx, c))
	files, err := artefactFiles(c.out)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := cmd(ctx, c.cosign, "verify-blob", "--key", pub, "--signature", f+".sig", "--insecure-ignore-tlog=true", f); err != nil {
			errs = append(errs, err)
		}
	}
	for _, bi := range images {
		if err := cmd(ctx, c.cosign, "verify", "--key", pub, "--insecure-ignore-tlog=true", "--allow-http-registry", "--allow-insecure-registry", bi.ref(host)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkBinary checks the version and commit the binary was stamped with:
// -trimpath leaves -ldflags out of the build information, so the one this
// machine can run says them (dislock --version), and every binary must hold
// both strings.
func checkBinary(c config, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for _, want := range []string{c.version, c.commit} {
		if !strings.Contains(string(raw), want) {
			return fmt.Errorf("%s is not stamped with %q", path, want)
		}
	}
	if !strings.HasSuffix(path, "-"+runtime.GOOS+"-"+runtime.GOARCH) {
		return nil
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %w", path, err)
	}
	if want := fmt.Sprintf("dislock %s (commit %s,", c.version, c.commit); !strings.HasPrefix(string(out), want) {
		return fmt.Errorf("%s --version: %q, want %q...", path, out, want)
	}
	return nil
}

// checkSBOM checks that the SBOM lists every module the binary's build
// information names, at its version.
func checkSBOM(binary, sbomFile string) error {
	out, err := exec.Command("go", "version", "-m", binary).Output()
	if err != nil {
		return fmt.Errorf("go version -m %s: %w", binary, err)
	}
	raw, err := os.ReadFile(sbomFile)
	if err != nil {
		return err
	}
	var doc struct {
		Components []struct {
			Name    string `json:"name"`
			Version string `json:"version"`
			PURL    string `json:"purl"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("%s: %w", sbomFile, err)
	}
	listed := map[string]bool{}
	for _, comp := range doc.Components {
		listed[comp.Name+"@"+comp.Version] = true
	}
	var missing []string
	deps := 0
	for l := range strings.Lines(string(out)) {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == "dep" {
			deps++
			if !listed[f[1]+"@"+f[2]] {
				missing = append(missing, f[1]+"@"+f[2])
			}
		}
	}
	if deps == 0 || len(missing) > 0 {
		return fmt.Errorf("%s lists %d components; of the %d modules %s was built with it lacks %v", sbomFile, len(doc.Components), deps, binary, missing)
	}
	return nil
}

// index opens the image's layout, which must hold one entry: the index
// built, by its digest.
func (bi builtImage) index() (v1.ImageIndex, error) {
	p, err := layout.FromPath(bi.dir)
	if err != nil {
		return nil, err
	}
	outer, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	top, err := outer.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(top.Manifests) != 1 || top.Manifests[0].Digest != bi.digest {
		return nil, fmt.Errorf("%s: index.json holds %v, want the one index built, %s", bi.dir, top.Manifests, bi.digest)
	}
	return outer.ImageIndex(bi.digest)
}

func checkImage(c config, bi builtImage) error {
	inner, err := bi.index()
	if err != nil {
		return err
	}
	m, err := inner.IndexManifest()
	if err != nil {
		return err
	}
	var archs []string
	for _, d := range m.Manifests {
		img, err := inner.Image(d.Digest)
		if err != nil {
			return err
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			return err
		}
		if d.Platform == nil || cfg.OS != d.Platform.OS || cfg.Architecture != d.Platform.Architecture {
			return fmt.Errorf("%s: manifest %s says %v, its config %s/%s", bi.dir, d.Digest, d.Platform, cfg.OS, cfg.Architecture)
		}
		if got := cfg.Config.Labels[image.LabelVersion]; got != c.version {
			return fmt.Errorf("%s %s: label %s=%q, want %q", bi.dir, cfg.Architecture, image.LabelVersion, got, c.version)
		}
		archs = append(archs, cfg.Architecture)
	}
	slices.Sort(archs)
	if !slices.Equal(archs, imageArchs) {
		return fmt.Errorf("%s: platforms %v, want linux/%v", bi.dir, archs, imageArchs)
	}
	return nil
}

func checkChart(ctx context.Context, c config) error {
	tgz := filepath.Join(c.out, "charts", "dislock-"+c.version+".tgz")
	out, err := exec.CommandContext(ctx, c.helm, "show", "chart", tgz).Output()
	if err != nil {
		return fmt.Errorf("helm show chart %s: %w", tgz, err)
	}
	for _, want := range []string{"\nversion: " + c.version + "\n", "\nappVersion: " + c.version + "\n"} {
		if !strings.Contains("\n"+string(out), want) {
			return fmt.Errorf("%s: Chart.yaml lacks %q:\n%s", tgz, strings.TrimSpace(want), out)
		}
	}
	index, err := os.ReadFile(filepath.Join(c.out, "charts", "index.yaml"))
	if err != nil {
		return err
	}
	sum, err := sha256File(tgz)
	if err != nil {
		return err
	}
	if !strings.Contains(string(index), "digest: "+sum) || !strings.Contains(string(index), c.repoURL+"/dislock-"+c.version+".tgz") {
		return fmt.Errorf("index.yaml does not name %s with its digest %s", tgz, sum)
	}
	return nil
}

// loopbackRegistry serves an empty registry on loopback until stopped: the
// images are signed there by digest, as docs/release.md signs them in the
// real registry after pushing.
func loopbackRegistry() (host string, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	go func() { _ = srv.Serve(l) }()
	return l.Addr().String(), func() { _ = srv.Close() }, nil
}

// ref is the image's index by digest in the registry at host.
func (bi builtImage) ref(host string) string {
	return fmt.Sprintf("%s/dislock/%s@%s", host, bi.image.Binary, bi.digest)
}

// signImages pushes each image's index to the registry at host and signs it
// there by digest; the signature and its payload are kept beside the layout.
func signImages(ctx context.Context, c config, key, host string, images []builtImage) error {
	for _, bi := range images {
		idx, err := bi.index()
		if err != nil {
			return err
		}
		tag, err := name.ParseReference(fmt.Sprintf("%s/dislock/%s:%s", host, bi.image.Binary, c.version), name.Insecure)
		if err != nil {
			return err
		}
		if err := remote.WriteIndex(tag, idx, remote.WithContext(ctx)); err != nil {
			return fmt.Errorf("pushing %s: %w", tag, err)
		}
		if err := cmd(ctx, c.cosign, "sign", "--yes", "--key", key, "--tlog-upload=false", "--allow-http-registry", "--allow-insecure-registry",
			"--output-signature", bi.dir+".sig", "--output-payload", bi.dir+".payload.json", bi.ref(host)); err != nil {
			return err
		}
	}
	return nil
}

func cmd(ctx context.Context, bin string, args ...string) error {
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return nil
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func semver(v string) bool {
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return false
	}
	for _, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" || (len(p) > 1 && p[0] == '0') {
			return false
		}
	}
	return true
}
