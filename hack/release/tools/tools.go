//go:build tools

// Module tools pins the release's tools (hack/release/tools/build.sh builds
// them): cosign signs, cyclonedx-gomod writes the SBOMs, crane pushes the
// images' layouts. It is a module of its own so that the main module does
// not inherit their dependency graphs.
package tools

import (
	_ "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod"
	_ "github.com/google/go-containerregistry/cmd/crane"
	_ "github.com/sigstore/cosign/v2/cmd/cosign"
)
