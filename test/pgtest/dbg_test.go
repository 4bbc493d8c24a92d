package pgtest

import "testing"

func TestDebugSteal(t *testing.T) {
	stealCount = 0
	s := New(t, Options{Name: "steal"})
	mustQuery(t, s, s.BouncerDSN(), "select 1")
}
