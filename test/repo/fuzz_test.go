// Package repo checks conventions of the repository itself.
package repo

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// root is the repository's top directory, seen from this package.
const root = "../.."

// `make fuzz` runs what hack/fuzz-targets.sh finds. A target it missed
// (another spelling of the declaration, a file it does not look at) would
// never run: the Go parser's list of fuzz targets must be the script's.
func TestMakeFuzzFindsEveryFuzzTarget(t *testing.T) {
	out, err := exec.Command(filepath.Join(root, "hack/fuzz-targets.sh")).Output()
	if err != nil {
		t.Fatalf("hack/fuzz-targets.sh: %v", err)
	}
	found := strings.Fields(string(out))
	declared := fuzzTargets(t)
	for _, d := range declared {
		if !slices.Contains(found, d) {
			t.Errorf("fuzz target %s is declared but hack/fuzz-targets.sh does not find it: make fuzz never runs it", d)
		}
	}
	for _, f := range found {
		if !slices.Contains(declared, f) {
			t.Errorf("hack/fuzz-targets.sh finds %s, which the Go parser does not see as a fuzz target", f)
		}
	}
	if len(declared) < 15 {
		t.Errorf("found %d fuzz targets, want at least the 15 the project has: %v", len(declared), declared)
	}
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
