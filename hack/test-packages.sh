#!/usr/bin/env bash
# Lists the Go packages of one test tier, found from what each package's
# tests import (so a new package lands in its tier without a list to edit):
#   unit   tests that start no server: no PostgreSQL, API server or node
#   db     tests that start PostgreSQL and PgBouncer (test/pgtest), nothing more
#   kube   tests that start a kube-apiserver (test/kube) or Patroni (test/hapg)
#   e2e    tests that run real kubelets (test/node)
# The fault schedules (test/chaos) are a tier of their own: `make chaos`.
set -euo pipefail
tier=${1:?usage: hack/test-packages.sh unit|db|kube|e2e}
cd "$(dirname "$0")/.."
mod=$(go list -m)
go list -test -f '{{if .ForTest}}{{.ForTest}} {{join .Deps " "}}{{end}}' ./... |
	awk -v tier="$tier" -v mod="$mod" '
	{
		pkg = $1; t = "unit"
		if (pkg == mod "/test/chaos") next
		# A package counts as its own import: the tests of test/pgtest start PostgreSQL.
		for (i = 1; i <= NF; i++) {
			if ($i == mod "/test/node") { t = "e2e"; break }
			if ($i == mod "/test/kube" || $i == mod "/test/hapg") t = "kube"
			else if ($i == mod "/test/pgtest" && t == "unit") t = "db"
		}
		# A package with internal and external tests is listed twice; the
		# heavier tier wins.
		rank["unit"] = 0; rank["db"] = 1; rank["kube"] = 2; rank["e2e"] = 3
		if (!(pkg in got) || rank[t] > rank[got[pkg]]) got[pkg] = t
	}
	END { for (p in got) if (got[p] == tier) print p }' | sort
