#!/usr/bin/env bash
# Runs test tiers (hack/test-packages.sh) through hack/testreport: failing
# tests' output, every skipped test with its reason, and at the end the
# time each package took.
#   hack/test.sh unit|db|kube|e2e|chaos-slice ...   the tiers, in order
# Tiers joined by + run in one go test, their packages in parallel
# (make test: unit+db+kube chaos-slice e2e).
# Flags for go test come from the environment: CHAOS_FLAGS for the chaos
# slice. Stops at the first tier that fails; the table covers what ran.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
mkdir -p bin
$GO build -o bin/testreport ./hack/testreport || exit 1
times=$(mktemp)
trap 'bin/testreport -table "$times"; rm -f "$times"' EXIT

run() { # run <step> <go test args...>
	local step=$1
	shift
	echo "== $step: go test $*"
	$GO test -json "$@" | bin/testreport -record "$times" -step "$step"
}

for tier in "$@"; do
	case $tier in
	unit | db | kube | *+*)
		pkgs=
		for t in ${tier//+/ }; do
			case $t in unit | db | kube) ;; *)
				echo "hack/test.sh: only unit, db and kube join with + (got $t)" >&2
				exit 2
				;;
			esac
			pkgs+=" $(hack/test-packages.sh "$t")" || exit 1
		done
		# shellcheck disable=SC2086 # one word per package
		run "$tier" -count=1 -timeout 30m $pkgs || exit 1
		;;
	e2e)
		pkgs=$(hack/test-packages.sh e2e) || exit 1
		# One at a time: each starts real nodes as root.
		# shellcheck disable=SC2086
		run e2e -count=1 -p 1 -timeout 40m $pkgs || exit 1
		;;
	chaos-slice)
		# shellcheck disable=SC2086 # flags, one word each
		run chaos -count=1 -timeout 15m ./test/chaos/ -run '^TestChaos$' ${CHAOS_FLAGS:-} || exit 1
		;;
	*)
		echo "hack/test.sh: unknown tier $tier (want unit, db, kube, e2e or chaos-slice)" >&2
		exit 2
		;;
	esac
done
