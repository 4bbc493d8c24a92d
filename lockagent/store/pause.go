package store

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A key paused everywhere (migration 16) starts no run in any cluster: its
// claims and lease acquisitions are answered ErrKeyPaused until an
// operator resumes it or the pause's until passes, by database time. Only
// the owner pauses and resumes (lockagent/store/pause); the agents learn of
// a pause in the very call that would have started a run, so that no run
// starts after a pause committed.

// PauseKey is the key whose pause applies to lock key: the CronJob's key,
// "ns/name" for an Indexed Job's lease "ns/name#i".
func PauseKey(key string) string {
	k, _, _ := strings.Cut(key, "#")
	return k
}

// PauseText says who paused a key, until when and why, as every report of
// a pause spells it: `paused by alice until 2026-12-07T10:00:00Z ("bad
// release")`.
func PauseText(by, reason string, until *time.Time) string {
	s := "paused by " + by
	if until != nil {
		s += " until " + until.UTC().Format(time.RFC3339)
	} else {
		s += " until resumed"
	}
	if reason != "" {
		s += fmt.Sprintf(" (%q)", reason)
	}
	return s
}

// pauseColumns are a statement's pause columns: all NULL when the key is
// not paused.
type pauseColumns struct {
	by, reason *string
	until      *time.Time
}

// err is ErrKeyPaused, saying who paused the key, until when and why.
func (p pauseColumns) err() error {
	var e pausedError
	if p.by != nil {
		e.by = *p.by
	}
	if p.reason != nil {
		e.reason = *p.reason
	}
	e.until = p.until
	return e
}

// pausedError is ErrKeyPaused spelt as PauseText.
type pausedError struct {
	by, reason string
	until      *time.Time
}

func (e pausedError) Error() string        { return PauseText(e.by, e.reason, e.until) }
func (e pausedError) Is(target error) bool { return target == ErrKeyPaused }

// pausedMeanwhile is the pause claim_window found after its claim waited
// (sqlstatePausedMeanwhile): who in the error's detail, why in its hint,
// until when (RFC 3339, empty for until resumed) in its column name.
func pausedMeanwhile(e *pgconn.PgError) error {
	p := pausedError{by: e.Detail, reason: e.Hint}
	if t, err := time.Parse(time.RFC3339Nano, e.ColumnName); err == nil {
		p.until = &t
	}
	return p
}
