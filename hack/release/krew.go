package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// kubectl dislock is the CLI named kubectl-dislock: krew installs it from
// an archive per platform holding the binary under that name and the
// licence, and the manifest this writes names each archive with its
// checksum.

// krewArchive is one platform's plugin archive.
type krewArchive struct {
	os, arch string
	file     string // its name, kubectl-dislock-<os>-<arch>.tar.gz
	sha256   string
}

// pluginBinary is the name kubectl looks for on the PATH.
const pluginBinary = "kubectl-dislock"

// writeKrewArchive packs binary (the CLI of one platform) as pluginBinary,
// and licence, into dir/kubectl-dislock-<os>-<arch>.tar.gz.
func writeKrewArchive(dir, goos, arch, binary, licence string) (krewArchive, error) {
	a := krewArchive{os: goos, arch: arch, file: fmt.Sprintf("%s-%s-%s.tar.gz", pluginBinary, goos, arch)}
	f, err := os.Create(filepath.Join(dir, a.file))
	if err != nil {
		return a, err
	}
	defer f.Close()
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	for _, e := range []struct {
		name, path string
		mode       int64
	}{{pluginBinary, binary, 0o755}, {"LICENSE", licence, 0o644}} {
		if err := addFile(tw, e.name, e.path, e.mode); err != nil {
			return a, err
		}
	}
	if err := tw.Close(); err != nil {
		return a, err
	}
	if err := gz.Close(); err != nil {
		return a, err
	}
	if err := f.Close(); err != nil {
		return a, err
	}
	a.sha256, err = sha256File(filepath.Join(dir, a.file))
	return a, err
}

// addFile writes the file at path into tw as name, with a fixed time and
// owner, so that an archive is a function of its contents.
func addFile(tw *tar.Writer, name, path string, mode int64) error {
	src, err := os.Open(path)
	if err != nil {
		return err
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: st.Size(), Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err = io.Copy(tw, src)
	return err
}

// krewManifest is the krew plugin manifest of version, whose archives are
// downloaded from downloadURL (the forge's release of tag v<version>).
func krewManifest(version, downloadURL string, archives []krewArchive) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: dislock
spec:
  version: v%s
  homepage: https://github.com/dislock/dislock
  shortDescription: Read and pause dislock's CronJobs across clusters
  description: |
    Reads which cluster ran each window of a CronJob that dislock runs at most once
    across clusters, the windows that ran nowhere and the leases, and pauses or
    resumes a CronJob in every cluster at once. Asks the dislock webhook of the
    kubeconfig's cluster through the API server's service proxy, with your own
    credentials and Kubernetes RBAC (list or get cronjobs to read, patch to pause).
  platforms:
`, version)
	for _, a := range archives {
		fmt.Fprintf(&b, `    - selector:
        matchLabels:
          os: %s
          arch: %s
      uri: %s/%s
      sha256: %s
      files:
        - from: %s
          to: .
        - from: LICENSE
          to: .
      bin: %s
`, a.os, a.arch, strings.TrimSuffix(downloadURL, "/"), a.file, a.sha256, pluginBinary, pluginBinary)
	}
	return b.String()
}

// checkKrewArchive checks that the archive at path holds, as
// kubectl-dislock, the very CLI of its platform beside it
// (dislock-<os>-<arch>).
func checkKrewArchive(path string) error {
	platform := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), pluginBinary+"-"), ".tar.gz")
	want, err := sha256File(filepath.Join(filepath.Dir(path), "dislock-"+platform))
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err != nil {
			return fmt.Errorf("%s: no %s in it (%v)", path, pluginBinary, err)
		}
		if h.Name != pluginBinary {
			continue
		}
		sum := sha256.New()
		if _, err := io.Copy(sum, tr); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if got := hex.EncodeToString(sum.Sum(nil)); got != want {
			return fmt.Errorf("%s: %s is not dislock-%s (sha256 %s, want %s)", path, pluginBinary, platform, got, want)
		}
		return nil
	}
}
