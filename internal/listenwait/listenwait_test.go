package listenwait

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// A replacement whose port its predecessor still holds starts once the
// predecessor lets go, having said once that it waits; free addresses and
// disabled ones ("0") do not hold it up.
func TestAServerWaitsForThePortItsPredecessorStillHolds(t *testing.T) {
	t.Parallel()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	_ = free.Close()

	released := make(chan struct{})
	var told []string
	done := make(chan error, 1)
	go func() {
		done <- Free(context.Background(), []string{held.Addr().String(), freeAddr, "0"}, time.Minute, func(addr string, _ error) {
			told = append(told, addr)
			if len(told) == 1 {
				close(released)
			}
		})
	}()
	<-released // told it waits for the held address: now the predecessor exits
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Free after the port was released: %v", err)
	}
	if len(told) != 1 || told[0] != held.Addr().String() {
		t.Errorf("told busy %v, want once, the held address %s", told, held.Addr())
	}
}

// A port that stays taken is named when the wait gives up, so the server's
// own bind error that follows is not the only word.
func TestAPortThatStaysTakenIsNamedAtTheTimeout(t *testing.T) {
	t.Parallel()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	err = Free(context.Background(), []string{held.Addr().String()}, 0, func(string, error) {})
	if err == nil || !strings.Contains(err.Error(), held.Addr().String()) {
		t.Fatalf("Free of a held port: %v, want an error naming %s", err, held.Addr())
	}
}
