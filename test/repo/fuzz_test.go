// Package repo checks conventions of the repository itself.
package repo

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// root is the repository's top directory, seen from this package.
const root = "../.."

// `make fuzz` runs the Makefile's FUZZ_TARGETS. A target missing from it
// (added since, or misspelt) would never be fuzzed: the list must be the Go
// parser's list of fuzz targets, no more and no less.
func TestMakeFuzzRunsEveryFuzzTarget(t *testing.T) {
	listed := makefileFuzzTargets(t)
	declared := fuzzTargets(t)
	for _, d := range declared {
		if !slices.Contains(listed, d) {
			t.Errorf("fuzz target %s is declared but not in the Makefile's FUZZ_TARGETS: make fuzz never runs it", d)
		}
	}
	for _, l := range listed {
		if !slices.Contains(declared, l) {
			t.Errorf("the Makefile's FUZZ_TARGETS lists %s, which the Go parser does not see as a fuzz target", l)
		}
	}
	if len(declared) < 15 {
		t.Errorf("found %d fuzz targets, want at least the 15 the project has: %v", len(declared), declared)
	}
}

// makefileFuzzTargets reads FUZZ_TARGETS, with its continuation lines, from
// the Makefile.
func makefileFuzzTargets(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\nFUZZ_TARGETS =")
	if !ok {
		t.Fatal("the Makefile has no FUZZ_TARGETS")
	}
	var targets []string
	for line := range strings.Lines(rest) {
		line = strings.TrimSpace(line)
		more := strings.HasSuffix(line, "\\")
		targets = append(targets, strings.Fields(strings.TrimSuffix(line, "\\"))...)
		if !more {
			break
		}
	}
	return targets
}

// fuzzTargets parses every _test.go file of the main module and returns its
// fuzz targets (func FuzzX(*testing.F)) as ./<dir>:<name>.
func fuzzTargets(t *testing.T) []string {
	t.Helper()
	var targets []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// Ignored build output and nested modules are not the main module's.
			if path != root && (d.Name() == "bin" || d.Name() == ".git" || exists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Fuzz") || !takesF(fn) {
				continue
			}
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			targets = append(targets, "./"+filepath.ToSlash(rel)+":"+fn.Name.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(targets)
	return targets
}

// takesF reports whether fn's only parameter is a *testing.F.
func takesF(fn *ast.FuncDecl) bool {
	params := fn.Type.Params.List
	if len(params) != 1 || len(params[0].Names) > 1 {
		return false
	}
	star, ok := params[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "F" && isIdent(sel.X, "testing")
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
