// Package listenwait waits until a server's listening addresses are free.
//
// A host-network pod is given the node's ports. When such a pod is deleted,
// the scheduler counts its ports free at once, so its replacement can start
// on the same node while the old process still holds them for its graceful
// shutdown. Binding then fails, the process exits, and the kubelet's
// crash-loop back-off delays the replacement by tens of seconds more. A
// server that waits for its ports instead starts the moment they are free.
package listenwait

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"syscall"
	"time"
)

// poll is how often a busy address is tried again.
const poll = 250 * time.Millisecond

// Free returns nil once every address of addrs ("host:port" or ":port", as
// net.Listen takes them; "" and "0", a disabled listener, are skipped) could
// be bound, each at least once. busy is told, once per address, that it is
// in use. After timeout, or when ctx ends, it returns an error naming the
// addresses still in use. An address that fails for any other reason is not
// waited for: binding it for real reports that.
func Free(ctx context.Context, addrs []string, timeout time.Duration, busy func(addr string, err error)) error {
	left := slices.DeleteFunc(slices.Clone(addrs), func(a string) bool { return a == "" || a == "0" })
	told := map[string]bool{}
	deadline := time.Now().Add(timeout)
	for {
		left = slices.DeleteFunc(left, func(a string) bool {
			l, err := net.Listen("tcp", a)
			if err == nil {
				_ = l.Close()
				return true
			}
			if !errors.Is(err, syscall.EADDRINUSE) {
				return true
			}
			if !told[a] {
				told[a] = true
				busy(a, err)
			}
			return false
		})
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still in use after %v: %s", timeout, strings.Join(left, ", "))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still in use: %s: %w", strings.Join(left, ", "), ctx.Err())
		case <-time.After(poll):
		}
	}
}
