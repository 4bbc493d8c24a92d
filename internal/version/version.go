// Package version holds the build's version, stamped by the Makefile with
// -ldflags "-X github.com/dislock/dislock/internal/version.Version=...".
package version

// Version and Commit are set at link time; a plain `go build` reports "dev".
var (
	Version = "dev"
	Commit  = "unknown"
)
