#!/usr/bin/env bash
# Builds the real Kubernetes control-plane binaries that the integration tests
# start (test/kube) into <repo>/bin, from the versions pinned in this folder's
# go.mod and go.sum.
#
#   test/tools/build.sh                      # kube-apiserver etcd kube-controller-manager
#   test/tools/build.sh kube-scheduler kubelet
#   test/tools/build.sh kubectl helm
#
# A binary that is already in bin/ and reports the pinned version is kept, so
# a second run costs a second. A cold kube-apiserver build takes 10-14 minutes
# on an idle two-core machine (37 minutes measured while other builds shared
# the CPUs), and the Go build cache grows by about 2.5 GB.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=$(cd "$here/../.." && pwd)/bin
cd "$here"

# run prints a command and runs it; on failure it names the command, so a
# failing build says what failed rather than only "exit status 1".
run() {
	local cmd
	cmd=$(printf '%q ' "$@")
	echo "+ $cmd" >&2
	local rc=0
	"$@" || rc=$?
	if [[ $rc -ne 0 ]]; then
		echo "build.sh: FAILED (exit $rc): $cmd" >&2
		exit 1
	fi
}

die() {
	echo "build.sh: $*" >&2
	exit 1
}

# go.mod and go.sum are committed complete (go mod tidy in this folder):
# -mod=readonly makes a missing entry fail here instead of being "fixed" on
# the fly into a build nobody reviewed.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=readonly"

k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes) || die "FAILED: go list -m k8s.io/kubernetes (in $here)"
etcd_version=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3) || die "FAILED: go list -m go.etcd.io/etcd/server/v3 (in $here)"
helm_version=$(cd helm && go list -m -f '{{.Version}}' helm.sh/helm/v4) || die "FAILED: go list -m helm.sh/helm/v4 (in $here/helm)"

# Every staging module that kubernetes replaces with ./staging/src/... must be
# replaced here too: kubernetes requires them at v0.0.0, which does not exist,
# and a stale list after a version bump fails deep in the build. Compare the
# two lists before spending ten minutes.
check_replaces() {
	local k8s_mod want have
	k8s_mod=$(go list -m -f '{{.GoMod}}' k8s.io/kubernetes) || die "FAILED: go list -m -f {{.GoMod}} k8s.io/kubernetes"
	want=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$k8s_mod" | sort)
	have=$(awk '$2 == "=>" && $1 ~ /^k8s\.io\// {print $1}' go.mod | sort)
	if [[ "$want" != "$have" ]]; then
		echo "build.sh: test/tools/go.mod replace list differs from $k8s_mod (< missing here, > extra here):" >&2
		diff <(echo "$want") <(echo "$have") >&2 || true
		exit 1
	fi
}

# Without these the binaries report v0.0.0-master, which the API server also
# serves at /version and which kubelet uses for node version skew checks.
major=${k8s_version#v}
major=${major%%.*}
minor=${k8s_version#v*.}
minor=${minor%%.*}
k8s_ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor"

package_of() {
	case "$1" in
	etcd) echo go.etcd.io/etcd/server/v3 ;;
	kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kubectl) echo "k8s.io/kubernetes/cmd/$1" ;;
	helm) echo helm.sh/helm/v4/cmd/helm ;;
	*) die "unknown binary $1 (want kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kubelet, kubectl or helm)" ;;
	esac
}

# module_dir is the folder whose go.mod pins the binary: helm has its own
# module because it needs newer versions of modules that kubernetes pins.
module_dir() {
	case "$1" in
	helm) echo "$here/helm" ;;
	*) echo "$here" ;;
	esac
}

ldflags_of() {
	case "$1" in
	etcd) echo "" ;;
	helm) echo "-X helm.sh/helm/v4/internal/version.version=$helm_version" ;;
	*) echo "$k8s_ldflags" ;;
	esac
}

# reported_version prints what a binary in bin/ says its version is.
reported_version() {
	case "$1" in
	helm) "$bin/helm" version --short ;;
	kubectl) "$bin/kubectl" version --client ;;
	*) "$bin/$1" --version ;;
	esac
}

# expected_version is what reported_version must contain for a binary in bin/
# to be kept: a binary from an older pin is rebuilt.
expected_version() {
	case "$1" in
	etcd) echo "etcd Version: ${etcd_version#v}" ;;
	helm) echo "$helm_version" ;;
	kubectl) echo "Client Version: $k8s_version" ;;
	*) echo "Kubernetes $k8s_version" ;;
	esac
}

cold_time() {
	case "$1" in
	kube-apiserver) echo "~10-14 min cold" ;;
	kubelet) echo "~10 min cold, ~1 min after kube-apiserver" ;;
	kubectl | helm) echo "~3-5 min cold" ;;
	kube-controller-manager) echo "~3 min cold" ;;
	*) echo "under 1 min" ;;
	esac
}

up_to_date() {
	local out
	[[ -x "$bin/$1" ]] || return 1
	out=$(reported_version "$1" 2>&1) || return 1
	[[ "$out" == *"$(expected_version "$1")"* ]]
}

# main runs from the last line, with exit on the same line, so that bash has
# read the whole file before building: editing this script during a long build
# cannot change what the running build does next.
main() {
	if [[ $# -eq 0 ]]; then
		set -- kube-apiserver etcd kube-controller-manager
	fi
	for name in "$@"; do
		package_of "$name" >/dev/null
	done

	checked=
	mkdir -p "$bin"
	for name in "$@"; do
		if up_to_date "$name"; then
			echo "$name: up to date ($(expected_version "$name")) in $bin"
			continue
		fi
		if [[ -z "$checked" ]]; then
			check_replaces
			checked=1
		fi
		pkg=$(package_of "$name")
		ldflags=$(ldflags_of "$name")
		echo "building $name (first time only, $(cold_time "$name"))"
		start=$SECONDS
		# Build to a temporary name and rename, so an interrupted build never
		# leaves a half-written binary that looks present.
		run go -C "$(module_dir "$name")" build -trimpath -ldflags "$ldflags" -o "$bin/.$name.tmp" "$pkg"
		run mv -f "$bin/.$name.tmp" "$bin/$name"
		up_to_date "$name" || die "FAILED: $bin/$name does not report $(expected_version "$name")"
		echo "built $name in $((SECONDS - start))s"
	done
}

main "$@"; exit
