// Package harness is the shared plumbing of the test harnesses (pgtest,
// hapg and kube): the lifecycle of a per-test or per-binary instance (New,
// SetUp, Main, Need, Missing), the watchdog that cleans up after a test
// process that died, the OS account servers run as, programs that die with
// the test process (StartProc), and free ports.
package harness

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
)

// InCI reports whether missing components must fail tests rather than skip
// them: CI installs everything first, so a missing one there is a broken
// pipeline.
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing ends a test that cannot get an instance: an error wrapping missing
// skips it, except under CI=true, where it fails; any other error fails it.
func Missing(t testing.TB, err, missing error) {
	t.Helper()
	if errors.Is(err, missing) && !InCI() {
		t.Skipf("%v", err)
	}
	t.Fatalf("%v", err)
}

// Lacking ends a test that cannot run on this machine (no PID namespaces,
// not root): it skips, except under CI=true, where the machine must have it
// and the test fails.
func Lacking(t testing.TB, format string, args ...any) {
	t.Helper()
	if !InCI() {
		t.Skipf(format, args...)
	}
	t.Fatalf("CI=true but "+format, args...)
}

// New starts an instance for one test and closes it when the test ends; if
// the test failed, tails(instance) is logged first. A start error ends the
// test through Missing.
func New[T io.Closer](t testing.TB, start func() (T, error), missing error, tails func(T) string) T {
	t.Helper()
	v, err := start()
	if err != nil {
		Missing(t, err, missing)
	}
	t.Cleanup(func() {
		t.Helper() // a failure here is the test's, in the summary of a long run
		if t.Failed() {
			t.Logf("%s", tails(v))
		}
		if err := v.Close(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return v
}

// SetUp finishes starting the instance v: it runs setUp and, should that
// fail, closes v and returns setUp's error, followed by tails(v) unless tails
// is nil.
func SetUp[T io.Closer](v T, setUp func() error, tails func(T) string) (T, error) {
	if err := setUp(); err != nil {
		if tails != nil {
			err = fmt.Errorf("%w\n%s", err, tails(v))
		}
		_ = v.Close()
		var zero T
		return zero, err
	}
	return v, nil
}

// Label turns an instance's name into a short, path-safe label (fallback if
// nothing is left of it): unix socket paths in a temp directory named after
// it must stay under the kernel's 107-byte limit.
func Label(name, fallback string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if b.Len() >= 20 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteRune('-')
		}
	}
	if b.Len() == 0 {
		return fallback
	}
	return b.String()
}

// Logf sends a progress line, prefixed "<prefix>[<label>]: ", to logf; nil
// logf is silent.
func Logf(logf func(format string, args ...any), prefix, label, format string, args ...any) {
	if logf != nil {
		logf(prefix+"[%s]: "+format, append([]any{label}, args...)...)
	}
}

// Shared is the instance a test binary shares, set up by Main. The fields
// configure it and are set once, before Main.
type Shared[T io.Closer] struct {
	// Prefix starts the lines Main prints, e.g. "pgtest".
	Prefix string
	// What names the instance in Main's skip notice, e.g. "PostgreSQL".
	What string
	// Unwired is Need's failure message when Main was never called.
	Unwired string
	// MissingErr marks start errors that skip tests rather than fail them.
	MissingErr error

	v  T
	ok bool
	// err says why there is no instance although Main ran.
	err    error
	called bool
}

// Main is for TestMain: it starts the shared instance, runs the tests, closes
// the instance and returns the exit code. If start fails with MissingErr it
// still runs the tests (Need skips the ones that need the instance), except
// under CI=true, where it prints why and returns 1. If tails is not nil and
// the tests fail, tails(instance) is printed.
func (s *Shared[T]) Main(m *testing.M, start func() (T, error), tails func(T) string) int {
	s.called = true
	v, err := start()
	switch {
	case err == nil:
		s.v, s.ok = v, true
	case errors.Is(err, s.MissingErr) && !InCI():
		s.err = err
		fmt.Fprintf(os.Stderr, "%v\n%s: tests that need %s will be skipped\n", err, s.Prefix, s.What)
	case errors.Is(err, s.MissingErr):
		fmt.Fprintf(os.Stderr, "%v\n%s: failing because CI=true\n", err, s.Prefix)
		return 1
	default:
		fmt.Fprintf(os.Stderr, "%v\n", err)
		return 1
	}

	code := m.Run()
	if s.ok {
		if code != 0 && tails != nil {
			fmt.Fprintf(os.Stderr, "%s", tails(s.v))
		}
		if err := s.v.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "%v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Get returns the instance started by Main; ok is false if there is none.
func (s *Shared[T]) Get() (v T, ok bool) { return s.v, s.ok }

// Need returns the shared instance. Without one it skips the test, or fails
// it under CI=true or when Main was never called (a wiring mistake, not a
// missing component).
func (s *Shared[T]) Need(t testing.TB) T {
	t.Helper()
	if s.ok {
		return s.v
	}
	if !s.called {
		t.Fatalf("%s", s.Unwired)
	}
	Missing(t, s.err, s.MissingErr)
	var zero T
	return zero
}
