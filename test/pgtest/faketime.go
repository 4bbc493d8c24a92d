package pgtest

import (
	"fmt"
	"path/filepath"
	"time"
)

// FakeClockEnv returns the environment that runs postgres under libfaketime
// with its wall clock shifted by offset (whole seconds), for
// Options.PostgresEnv. Tests
// use it to show that no decision compares the local clock with the
// database's. Go programs read the clock through the vDSO and ignore
// libfaketime, which is why the database, not the test, gets the shift.
func FakeClockEnv(offset time.Duration) ([]string, error) {
	libs, _ := filepath.Glob("/usr/lib/*/faketime/libfaketime.so.1")
	if len(libs) == 0 {
		return nil, fmt.Errorf("%w: libfaketime (apt-get install -y libfaketime)", ErrMissingBinary)
	}
	return []string{
		"LD_PRELOAD=" + libs[0],
		fmt.Sprintf("FAKETIME=%+ds", int64(offset/time.Second)),
		// Timeouts and latches inside postgres keep real monotonic time.
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
	}, nil
}
