package harness

import (
	"io"
	"net"
	"testing"
)

// Forward listens on listen (host:port; port 0 picks a free one) and pipes
// every connection to target until the test ends, like a TCP proxy in
// front of a database. It returns the address it listens on.
func Forward(t testing.TB, listen, target string) string {
	t.Helper()
	l, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); up.Close() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	return l.Addr().String()
}
