package contract

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Every dislock.io key is a constant of this package: a key spelled out in
// another package is a second place to rename it in, and the one that gets
// forgotten. Tests may spell keys as users do (a renamed key should break
// them), and so may the helpers under test/.
func TestEveryDislockKeyIsDeclaredInThisPackage(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch {
			case path == root:
				return nil
			case path == here, path == filepath.Join(root, "test"), d.Name() == "testdata", d.Name() == "bin",
				strings.HasPrefix(d.Name(), "."), exists(filepath.Join(path, "go.mod")):
				// This package; test helpers; fixtures, build output,
				// hidden directories and nested modules, none dislock's own code.
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if v, err := strconv.Unquote(lit.Value); err == nil && strings.HasPrefix(v, Prefix) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d: %s is spelled out: use (or add) its constant in lockagent/contract/annotations.go",
					filepath.ToSlash(rel), fset.Position(lit.Pos()).Line, lit.Value)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Errorf("checked %d Go files below %s, want dislock's own code (50 or more)", checked, root)
	}
}

// moduleRoot is the directory of the go.mod above this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for !exists(filepath.Join(dir, "go.mod")) {
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the package")
		}
		dir = parent
	}
	return dir
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
