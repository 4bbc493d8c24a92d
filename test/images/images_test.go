package images

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/dislock/dislock/internal/image"
	"github.com/dislock/dislock/test/harness"
)

// set is built once for the package's tests; setErr says why there is none.
var (
	set    Set
	setErr error
)

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "images-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		set, setErr = Build(dir)
		return m.Run()
	}())
}

func needSet(t *testing.T) Set {
	t.Helper()
	if errors.Is(setErr, ErrMissing) {
		harness.Missing(t, setErr, ErrMissing)
	}
	if setErr != nil {
		t.Fatal(setErr)
	}
	return set
}

// load reads ref's image from the tarball and its files, all layers in
// order, by path without the leading slash.
func load(t *testing.T, s Set, ref string) (v1.Image, map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(s.Tarball, &tag)
	if err != nil {
		t.Fatalf("%s is not in %s: %v", ref, s.Tarball, err)
	}
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	err = image.Walk(img, func(hdr *tar.Header, content io.Reader) error {
		hdrs[hdr.Name] = hdr
		if hdr.Typeflag == tar.TypeReg {
			var err error
			data[hdr.Name], err = io.ReadAll(content)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return img, hdrs, data
}

func TestEveryImageHoldsStaticProgramsOnItsPath(t *testing.T) {
	s := needSet(t)
	tests := []struct {
		ref        string
		entrypoint string
		files      []string
		// only: the image holds these files and their directories, nothing else.
		only bool
	}{
		{PauseRef, "/usr/local/bin/pause", []string{"usr/local/bin/pause"}, false},
		// The published images: the binary, the users, CA certificates.
		{DislockRef, "/usr/local/bin/dislock", []string{"usr/local/bin/dislock", "etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt"}, true},
		// The sidecar runs where a tenant can exec: no operator CLI in it.
		{AgentRef, "/usr/local/bin/dislock-agent", []string{"usr/local/bin/dislock-agent", "etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt"}, true},
		{LedgerRef, "/usr/local/bin/ledger-app", []string{"usr/local/bin/ledger-app"}, false},
		{BusyboxRef, "/bin/sh", []string{"bin/busybox", "bin/sh", "bin/sleep"}, false},
		{MeshRef, "/usr/local/bin/mesh-proxy", []string{"usr/local/bin/mesh-proxy"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.ref, func(t *testing.T) {
			img, got, data := load(t, s, tt.ref)
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Config.Entrypoint; !slices.Equal(got, []string{tt.entrypoint}) {
				t.Errorf("entrypoint = %q, want [%q]", got, tt.entrypoint)
			}
			if !slices.Contains(cfg.Config.Env, "PATH=/usr/local/bin:/usr/bin:/bin") {
				t.Errorf("env %q does not put /usr/local/bin on the PATH", cfg.Config.Env)
			}
			for _, f := range tt.files {
				hdr, ok := got[f]
				switch {
				case !ok:
					t.Errorf("image has no %s", f)
				case strings.Contains(f, "/bin/") && hdr.Typeflag == tar.TypeReg && hdr.Mode&0o111 == 0:
					t.Errorf("%s mode %o is not executable", f, hdr.Mode)
				}
			}
			if tt.only {
				for n, hdr := range got {
					if hdr.Typeflag != tar.TypeDir && !slices.Contains(tt.files, n) {
						t.Errorf("image holds %s too", n)
					}
				}
			}
			// The images have no C library and no loader: a dynamically
			// linked program would fail in the container with a bare "no
			// such file".
			if strings.HasPrefix(tt.entrypoint, "/usr/local/bin/") {
				f, err := elf.NewFile(bytes.NewReader(data[strings.TrimPrefix(tt.entrypoint, "/")]))
				if err != nil {
					t.Fatalf("%s: %v", tt.entrypoint, err)
				}
				for _, p := range f.Progs {
					if p.Type == elf.PT_INTERP {
						t.Errorf("%s is dynamically linked", tt.entrypoint)
					}
				}
			}
		})
	}
	if fi, err := os.Stat(s.Tarball); err == nil {
		t.Logf("%s: %d MiB, images %v", s.Tarball, fi.Size()>>20, s.Refs)
	}
}

// TestTheE2EImagesAreThePublishedImagesAndStart: what the node and e2e
// tests import is what `make image` and the Dockerfile build (the same
// recipe gives the same image digest from the same binary), the webhook
// they run as a host process is the image's own binary, and the binaries
// taken out of the images start with the version stamped in.
func TestTheE2EImagesAreThePublishedImagesAndStart(t *testing.T) {
	s := needSet(t)
	// The commit Build stamped: HEAD may have moved since.
	b := recipe()
	b.Commit = s.Commit
	for _, tt := range []struct {
		ref string
		im  image.Image
		// args make the binary print its version.
		args []string
		want string
	}{
		{DislockRef, image.Webhook, []string{"version"}, fmt.Sprintf("dislock %s (commit %s, schema version ", Version, s.Commit)},
		{AgentRef, image.Agent, []string{"version"}, fmt.Sprintf("dislock-agent %s (commit %s)", Version, s.Commit)},
	} {
		t.Run(tt.ref, func(t *testing.T) {
			img, files, data := load(t, s, tt.ref)
			hostBinary := filepath.Join(s.Binaries, tt.im.Binary)
			want, err := b.Image(tt.im, hostBinary)
			if err != nil {
				t.Fatal(err)
			}
			gotDigest, err := img.Digest()
			if err != nil {
				t.Fatal(err)
			}
			wantDigest, err := want.Digest()
			if err != nil {
				t.Fatal(err)
			}
			if gotDigest != wantDigest {
				t.Errorf("%s is %s, the recipe's image of %s is %s", tt.ref, gotDigest, hostBinary, wantDigest)
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Config.User != "65532:65532" || cfg.Config.Labels[image.LabelVersion] != Version || cfg.Config.Labels[image.LabelRevision] != s.Commit {
				t.Errorf("user %q labels %v, want 65532:65532 and version %s, revision %s", cfg.Config.User, cfg.Config.Labels, Version, s.Commit)
			}
			if _, ok := files["dislock"]; ok {
				t.Error("the image holds /dislock, where the pod's shared volume is mounted")
			}
			inImage := data[strings.TrimPrefix(tt.im.Path(), "/")]
			onHost, err := os.ReadFile(hostBinary)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(inImage, onHost) {
				t.Errorf("%s differs from the image's %s", hostBinary, tt.im.Path())
			}

			// A real start of the image's own binary, as a host process.
			bin := filepath.Join(t.TempDir(), tt.im.Binary)
			if err := os.WriteFile(bin, inImage, 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, tt.args...).CombinedOutput()
			if err != nil || !strings.HasPrefix(string(out), tt.want) {
				t.Errorf("%s %s = %q (%v), want it to start with %q", tt.im.Path(), strings.Join(tt.args, " "), out, err, tt.want)
			}
			if tt.im == image.Agent {
				// The sidecar's misuse exit code, the wrapper's contract.
				out, err := exec.Command(bin).CombinedOutput()
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() != 64 || !strings.Contains(string(out), "usage: dislock-agent") {
					t.Errorf("dislock-agent without a command = %q (%v), want the usage and exit 64", out, err)
				}
			}
		})
	}
}
