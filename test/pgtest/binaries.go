package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrMissingBinary is returned (wrapped) by Start when a PostgreSQL or
// PgBouncer program is not installed. The wrapping error names the programs
// and the apt packages that provide them.
var ErrMissingBinary = errors.New("pgtest: required binary not installed")

// debianPGBinGlob is where Debian's postgresql-NN packages put the server
// programs; initdb, postgres and pg_ctl are not on PATH there.
const debianPGBinGlob = "/usr/lib/postgresql/*/bin"

// binaries holds absolute paths of the programs the harness runs.
type binaries struct {
	initdb, pgCtl, postgres, psql, pgbouncer string
	// pgbench is optional: only benchmarks need it.
	pgbench string
}

// lookPathFunc resolves a program name to a path, like exec.LookPath.
type lookPathFunc func(name string) (string, error)

// findBinaries looks for the programs on this machine.
func findBinaries() (binaries, error) {
	dirs, _ := filepath.Glob(debianPGBinGlob)
	// pgbouncer lives in /usr/sbin on Debian, which is not on every PATH.
	return lookupBinaries(newestFirst(dirs), []string{"/usr/sbin", "/usr/bin"}, exec.LookPath)
}

// lookupBinaries takes the PostgreSQL programs from the first of pgDirs that
// has initdb (falling back to lookPath), and pgbouncer from lookPath or
// sbinDirs. Every missing required program is named in one error.
func lookupBinaries(pgDirs, sbinDirs []string, lookPath lookPathFunc) (binaries, error) {
	var pgDir string
	for _, d := range pgDirs {
		if isExecutable(filepath.Join(d, "initdb")) {
			pgDir = d
			break
		}
	}
	find := func(name string, dirs ...string) string {
		for _, d := range dirs {
			if p := filepath.Join(d, name); d != "" && isExecutable(p) {
				return p
			}
		}
		if p, err := lookPath(name); err == nil {
			return p
		}
		return ""
	}
	b := binaries{
		initdb:    find("initdb", pgDir),
		pgCtl:     find("pg_ctl", pgDir),
		postgres:  find("postgres", pgDir),
		psql:      find("psql", pgDir),
		pgbench:   find("pgbench", pgDir),
		pgbouncer: find("pgbouncer", sbinDirs...),
	}

	required := []struct{ name, path, aptPackage string }{
		{"initdb", b.initdb, "postgresql"},
		{"pg_ctl", b.pgCtl, "postgresql"},
		{"postgres", b.postgres, "postgresql"},
		{"psql", b.psql, "postgresql-client"},
		{"pgbouncer", b.pgbouncer, "pgbouncer"},
	}
	var missing, packages []string
	for _, r := range required {
		if r.path != "" {
			continue
		}
		missing = append(missing, fmt.Sprintf("%s (apt package %s)", r.name, r.aptPackage))
		if !slices.Contains(packages, r.aptPackage) {
			packages = append(packages, r.aptPackage)
		}
	}
	if len(missing) > 0 {
		where := append(append([]string{debianPGBinGlob}, sbinDirs...), "$PATH")
		return binaries{}, fmt.Errorf("%w: %s not found in %s; install with: apt-get install -y %s",
			ErrMissingBinary, strings.Join(missing, ", "), strings.Join(where, ", "), strings.Join(packages, " "))
	}
	return b, nil
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// newestFirst orders Debian version directories (".../15/bin", ".../9.6/bin")
// by version, highest first, so the newest installed server is used.
func newestFirst(dirs []string) []string {
	out := slices.Clone(dirs)
	slices.SortStableFunc(out, func(a, b string) int {
		return slices.Compare(versionOf(b), versionOf(a))
	})
	return out
}

// versionOf extracts the numeric components of the version directory in
// ".../<version>/bin"; a non-numeric name yields nil, which sorts lowest.
func versionOf(binDir string) []int {
	name := filepath.Base(filepath.Dir(binDir))
	var v []int
	for _, part := range strings.Split(name, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return nil
		}
		v = append(v, n)
	}
	return v
}
