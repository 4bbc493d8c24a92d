// Package repo checks conventions of the repository itself.
package repo

import (
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// `make fuzz` runs exactly the fuzz targets the code has: a new
// `func Fuzz…` not listed in the Makefile's FUZZ_TARGETS would never run,
// and a listed one that is gone would fail the target.
func TestMakeFuzzListsEveryFuzzTarget(t *testing.T) {
	out, err := exec.Command("git", "-C", "../..", "grep", "-n", "^func Fuzz", "--", "*_test.go").Output()
	if err != nil {
		t.Fatalf("git grep: %v", err)
	}
	name := regexp.MustCompile(`^func (Fuzz\w+)\(`)
	var code []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		file, rest, _ := strings.Cut(line, ":")
		_, decl, _ := strings.Cut(rest, ":")
		if m := name.FindStringSubmatch(decl); m != nil {
			code = append(code, "./"+path.Dir(file)+":"+m[1])
		}
	}
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?m)^FUZZ_TARGETS := \\\n((?:\t.*\n)+)`).FindSubmatch(mk)
	if block == nil {
		t.Fatal("the Makefile has no FUZZ_TARGETS := \\ list")
	}
	var listed []string
	for _, l := range strings.Split(string(block[1]), "\n") {
		if l = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(l), "\\")); l != "" {
			listed = append(listed, l)
		}
	}
	slices.Sort(code)
	slices.Sort(listed)
	for _, c := range code {
		if !slices.Contains(listed, c) {
			t.Errorf("fuzz target %s is not in the Makefile's FUZZ_TARGETS: make fuzz never runs it", c)
		}
	}
	for _, l := range listed {
		if !slices.Contains(code, l) {
			t.Errorf("FUZZ_TARGETS lists %s, which is not a func Fuzz… of a _test.go file", l)
		}
	}
	if len(code) < 15 {
		t.Errorf("found %d fuzz targets, want at least the 15 the project has: %v", len(code), code)
	}
}
