#!/usr/bin/env bash
# Lists every fuzz target of the repository as ./<package dir>:<FuzzName>,
# found in the _test.go files, so that `make fuzz` runs each one without a
# list to keep (test/repo checks this against the Go parser's view).
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files -co --exclude-standard -- '*_test.go' |
	xargs grep -HoE '^func Fuzz[A-Za-z0-9_]+\(' |
	sed -E 's#^(.*)/[^/]+:func (Fuzz[A-Za-z0-9_]+)\($#./\1:\2#' | sort -u
