package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/contract"
	"github.com/dislock/dislock/lockagent/protocol"
)

// The probe gates the app containers on the installed binary only:
// a decision is not needed (the wrapper waits for it), so a standby that
// waits for hours is never restarted by an exhausted probe.
func TestProbePassesOnceTheBinaryIsInstalled(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(contract.EnvSharedDir, dir)
	bin := filepath.Join(dir, protocol.BinPath)
	steps := []struct {
		name string
		do   func() error
		want int
	}{
		{"nothing installed yet", func() error { return nil }, 1},
		{"a directory where the binary goes", func() error { return os.MkdirAll(bin, 0o755) }, 1},
		{"a file that is not executable", func() error {
			if err := os.Remove(bin); err != nil {
				return err
			}
			return os.WriteFile(bin, []byte("#!/bin/true\n"), 0o444)
		}, 1},
		{"the installed binary, before any decision", func() error { return os.Chmod(bin, 0o555) }, 0},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if _, err := os.Stat(filepath.Join(dir, protocol.DecisionFile)); err == nil {
			t.Fatalf("%s: a decision exists", s.name)
		}
		if got := probe(nil, io.Discard); got != s.want {
			t.Errorf("%s: probe = %d, want %d", s.name, got, s.want)
		}
	}
}

// As the sidecar's postStart hook the probe waits for the install, so the
// kubelet starts the app containers as soon as it next looks at the pod;
// it passes the moment the binary is there, whenever the agent gets to it.
func TestProbeWaitPassesOnceTheAgentInstalls(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(contract.EnvSharedDir, dir)
	done := make(chan int)
	go func() { done <- probe([]string{"--wait=1m"}, io.Discard) }()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The agent installs by rename, as here.
	tmp := filepath.Join(dir, "bin", ".dislock-agent.tmp")
	if err := os.WriteFile(tmp, []byte("#!/bin/true\n"), 0o555); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, protocol.BinPath)); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-done:
		if got != 0 {
			t.Errorf("probe --wait=1m = %d once the binary is installed, want 0", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("probe --wait=1m still waits 30 s after the binary was installed")
	}
}

// The kubelet puts no limit on a postStart hook: a probe whose agent never
// installs gives up after --wait, naming the path, so the kubelet restarts
// the sidecar instead of holding the pod.
func TestProbeWaitGivesUpAfterItsBound(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(contract.EnvSharedDir, dir)
	var stderr bytes.Buffer
	begun := time.Now()
	if got := probe([]string{"--wait=50ms"}, &stderr); got != 1 {
		t.Errorf("probe --wait=50ms without an install = %d, want 1", got)
	}
	if took := time.Since(begun); took < 50*time.Millisecond {
		t.Errorf("probe --wait=50ms gave up after %v", took)
	}
	if want := filepath.Join(dir, protocol.BinPath); !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), "50ms") {
		t.Errorf("the probe's message %q should name %s and the bound", stderr.String(), want)
	}
	for _, bad := range [][]string{{"--wait=-1s"}, {"--wait=soon"}, {"extra"}} {
		stderr.Reset()
		if got := probe(bad, &stderr); got != 64 {
			t.Errorf("probe %q = %d, want 64 (misuse)", bad, got)
		}
	}
}
