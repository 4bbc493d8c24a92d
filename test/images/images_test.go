package images

import (
	"archive/tar"
	"debug/elf"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/dislock/dislock/test/harness"
)

func TestEveryImageHoldsStaticProgramsOnItsPath(t *testing.T) {
	set, err := Build(t.TempDir())
	if errors.Is(err, ErrMissing) {
		harness.Missing(t, err, ErrMissing)
	}
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		ref        string
		entrypoint string
		files      []string
		// only: the layer holds these files and their directories, nothing else.
		only bool
	}{
		{PauseRef, "/usr/local/bin/pause", []string{"usr/local/bin/pause"}, false},
		{DislockRef, "/usr/local/bin/dislock", []string{"usr/local/bin/dislock", "usr/local/bin/dislock-agent"}, false},
		// The sidecar runs where a tenant can exec: no operator CLI in it.
		{AgentRef, "/usr/local/bin/dislock-agent", []string{"usr/local/bin/dislock-agent"}, true},
		{LedgerRef, "/usr/local/bin/ledger-app", []string{"usr/local/bin/ledger-app"}, false},
		{BusyboxRef, "/bin/sh", []string{"bin/busybox", "bin/sh", "bin/sleep"}, false},
		{MeshRef, "/usr/local/bin/mesh-proxy", []string{"usr/local/bin/mesh-proxy"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.ref, func(t *testing.T) {
			tag, err := name.NewTag(tt.ref)
			if err != nil {
				t.Fatal(err)
			}
			img, err := tarball.ImageFromPath(set.Tarball, &tag)
			if err != nil {
				t.Fatalf("%s is not in %s: %v", tt.ref, set.Tarball, err)
			}
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
			layers, err := img.Layers()
			if err != nil || len(layers) != 1 {
				t.Fatalf("layers = %d (%v), want 1", len(layers), err)
			}
			rc, err := layers[0].Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			got := map[string]*tar.Header{}
			tr := tar.NewReader(rc)
			for {
				hdr, err := tr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				got[hdr.Name] = hdr
			}
			for _, f := range tt.files {
				hdr, ok := got[f]
				switch {
				case !ok:
					t.Errorf("layer has no %s", f)
				case hdr.Typeflag == tar.TypeReg && hdr.Mode&0o111 == 0:
					t.Errorf("%s mode %o is not executable", f, hdr.Mode)
				}
			}
			if tt.only {
				for n, hdr := range got {
					if hdr.Typeflag != tar.TypeDir && !slices.Contains(tt.files, n) {
						t.Errorf("layer holds %s too", n)
					}
				}
			}
		})
	}
	// The images have no C library and no loader: a dynamically linked
	// program would fail in the container with a bare "no such file".
	for bin := range programs {
		f, err := elf.Open(filepath.Join(set.Binaries, bin))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked", bin)
			}
		}
		f.Close()
	}
	if fi, err := os.Stat(set.Tarball); err == nil {
		t.Logf("%s: %d MiB, images %v", set.Tarball, fi.Size()>>20, set.Refs)
	}
}
