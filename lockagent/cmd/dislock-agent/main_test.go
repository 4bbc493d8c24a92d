package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The agent is copied into every pod: it must not drag in Kubernetes client
// libraries, and it must stay small.
func TestTheAgentLinksNoKubernetesPackages(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "k8s.io/") || strings.HasPrefix(pkg, "sigs.k8s.io/") {
			t.Errorf("dislock-agent depends on %s", pkg)
		}
	}
}

// MaxBinaryBytes is the size budget of the static agent binary.
const MaxBinaryBytes = 15 << 20

func TestTheStaticAgentBinaryFitsItsBudget(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "dislock-agent")
	build := exec.Command("go", "build", "-ldflags=-s -w", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dislock-agent: %.1f MiB", float64(fi.Size())/(1<<20))
	if fi.Size() > MaxBinaryBytes {
		t.Fatalf("dislock-agent is %d bytes, budget %d", fi.Size(), MaxBinaryBytes)
	}
	// Static: no dynamic loader needed in a distroless image.
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("dislock-agent is dynamically linked (it has an ELF interpreter)")
		}
	}
}
