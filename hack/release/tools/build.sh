#!/usr/bin/env bash
# Builds the release's tools into <repo>/bin from the versions pinned in this
# folder's go.mod and go.sum: cosign (signatures), cyclonedx-gomod (SBOMs)
# and crane (pushing the images' layouts). A binary already in bin/ that was
# built from the pinned version is kept. A cold build takes about 7 minutes on
# two cores, cosign most of it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=$(cd "$here/../../.." && pwd)/bin
cd "$here"
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=readonly"
mkdir -p "$bin"

for tool in \
	cosign:github.com/sigstore/cosign/v2:github.com/sigstore/cosign/v2/cmd/cosign \
	cyclonedx-gomod:github.com/CycloneDX/cyclonedx-gomod:github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod \
	crane:github.com/google/go-containerregistry:github.com/google/go-containerregistry/cmd/crane; do
	IFS=: read -r name module pkg <<<"$tool"
	version=$(go list -m -f '{{.Version}}' "$module")
	if [[ -x "$bin/$name" ]] && go version -m "$bin/$name" | grep -q "	mod	$module	$version"; then
		continue
	fi
	echo "release-tools: building $name $version into $bin" >&2
	go build -trimpath -o "$bin/$name" "$pkg" || { echo "release-tools: FAILED: go build $pkg (in $here)" >&2; exit 1; }
done
