package kube

import "path/filepath"

// FindBinary returns the path of a binary `make tools` builds into
// <repo root>/bin (kubectl, helm, ...), for tests that need one without a
// running cluster. If it is missing the error wraps ErrMissingBinary and says
// to run `make tools` (see Missing).
func FindBinary(name string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	bins, err := findBinaries(filepath.Join(root, "bin"), []string{name})
	if err != nil {
		return "", err
	}
	return bins[name], nil
}
