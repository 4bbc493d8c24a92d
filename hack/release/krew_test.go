package main

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// What krew installs: an archive per platform holding the CLI as
// kubectl-dislock, executable, and the licence, named in the manifest with
// its checksum, for the platform its selector says.
func TestTheKrewManifestNamesEachPlatformsArchiveWithItsChecksum(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "dislock-linux-arm64")
	if err := os.WriteFile(bin, []byte("the cli"), 0o755); err != nil {
		t.Fatal(err)
	}
	a, err := writeKrewArchive(dir, "linux", "arm64", bin, filepath.Join("..", "..", "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, a.file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		got[h.Name] = string(body)
		if h.Name == pluginBinary && h.Mode&0o111 == 0 {
			t.Errorf("%s is not executable (mode %o)", h.Name, h.Mode)
		}
	}
	if got[pluginBinary] != "the cli" || !strings.Contains(got["LICENSE"], "License") {
		t.Fatalf("archive holds %v", keys(got))
	}
	sum, err := sha256File(filepath.Join(dir, a.file))
	if err != nil || sum != a.sha256 {
		t.Fatalf("checksum %s, archive's %s (%v)", a.sha256, sum, err)
	}
	if err := checkKrewArchive(filepath.Join(dir, a.file)); err != nil {
		t.Fatalf("the release's check of its own archive: %v", err)
	}
	if err := os.WriteFile(bin, []byte("another cli"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkKrewArchive(filepath.Join(dir, a.file)); err == nil || !strings.Contains(err.Error(), "is not dislock-linux-arm64") {
		t.Fatalf("an archive of another binary passed the check: %v", err)
	}

	var m struct {
		Kind string
		Spec struct {
			Version   string
			Platforms []struct {
				Selector struct{ MatchLabels map[string]string } `json:"selector"`
				URI      string                                  `json:"uri"`
				SHA256   string                                  `json:"sha256"`
				Bin      string                                  `json:"bin"`
			}
		}
	}
	other := krewArchive{os: "darwin", arch: "amd64", file: "kubectl-dislock-darwin-amd64.tar.gz", sha256: strings.Repeat("ab", 32)}
	if err := yaml.Unmarshal([]byte(krewManifest("1.2.3", "https://example.com/releases/v1.2.3/", []krewArchive{a, other})), &m); err != nil {
		t.Fatal(err)
	}
	if m.Kind != "Plugin" || m.Spec.Version != "v1.2.3" || len(m.Spec.Platforms) != 2 {
		t.Fatalf("manifest %+v", m)
	}
	p := m.Spec.Platforms[0]
	if p.Selector.MatchLabels["os"] != "linux" || p.Selector.MatchLabels["arch"] != "arm64" || p.SHA256 != a.sha256 ||
		p.URI != "https://example.com/releases/v1.2.3/"+a.file || p.Bin != pluginBinary {
		t.Fatalf("linux/arm64's platform: %+v", p)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
