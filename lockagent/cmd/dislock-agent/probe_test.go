package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/dislock/dislock/lockagent/protocol"
	"github.com/dislock/dislock/lockagent/spec"
)

// The startupProbe gates the app containers on the installed binary only:
// a decision is not needed (the wrapper waits for it), so a standby that
// waits for hours is never restarted by an exhausted probe.
func TestProbePassesOnceTheBinaryIsInstalled(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(spec.EnvSharedDir, dir)
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
		if got := probe(); got != s.want {
			t.Errorf("%s: probe() = %d, want %d", s.name, got, s.want)
		}
	}
}
