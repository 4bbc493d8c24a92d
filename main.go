// Command dislock is the operator CLI (migrate, windows, leases, release,
// version) and, in later releases, the admission webhook server.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/dislock/dislock/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
