//go:build tools

// Package tools records the helm command that ../build.sh builds, so that
// go.mod and go.sum keep every module it needs.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
