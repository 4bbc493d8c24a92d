package pgtest

import (
	"os"
	"testing"
	"time"
)

func TestStartBouncerFrontsAnUpstreamAndRemovesItsDirectory(t *testing.T) {
	t.Parallel()
	s := Need(t)
	if _, err := StartBouncer(BouncerOptions{Name: "no-upstream"}); err == nil {
		t.Error("StartBouncer without an upstream succeeded")
	}
	u, err := StartBouncer(BouncerOptions{Name: "upstream", Logf: t.Logf, Host: "127.0.0.1", Port: s.pgPort})
	if err != nil {
		t.Fatal(err)
	}
	dir := u.s.dir
	if err := selectOneWithin(u.DSN(), 5*time.Second); err != nil {
		t.Fatalf("query through the upstream bouncer: %v", err)
	}
	if err := u.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := dial(u.port); err == nil {
		t.Error("the stopped bouncer's port accepts connections")
	}
	if err := u.Start(); err != nil {
		t.Fatal(err)
	}
	if err := selectOneWithin(u.DSN(), 5*time.Second); err != nil {
		t.Errorf("query after Start: %v", err)
	}
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dial(u.port); err == nil {
		t.Error("the closed bouncer's port accepts connections")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after Close (%v)", dir, err)
	}
	if err := selectOneWithin(s.BouncerDSN(), 5*time.Second); err != nil {
		t.Errorf("the server's own bouncer stopped answering: %v", err)
	}
}
