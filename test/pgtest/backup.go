package pgtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Program is the path of a PostgreSQL program of the server's version
// (pg_dump, pg_restore, pg_basebackup), from the directory its initdb is in.
func (s *Server) Program(name string) string { return filepath.Join(filepath.Dir(s.bin.initdb), name) }

// SnapshotData stops postgres (fast), copies its data directory to dir (a
// cold physical backup: what a volume snapshot holds) and starts it again.
func (s *Server) SnapshotData(dir string) error {
	return s.whileStopped("fast", func() error {
		if out, err := s.run("/bin/cp", "-a", s.dataDir(), dir); err != nil {
			return fmt.Errorf("pgtest: copying the data directory: %w: %s", err, out)
		}
		return s.startPostgresLocked()
	})
}

// RestoreData stops postgres (immediate: the server is lost), replaces its
// data directory with a copy of dir (taken by SnapshotData) and starts it.
// With promote, the server first recovers as a restored backup or a lagging
// standby would (archive recovery, then a new WAL timeline), the way a
// standby is promoted; without, it starts where the copy stopped.
func (s *Server) RestoreData(dir string, promote bool) error {
	return s.whileStopped("immediate", func() error {
		if err := os.RemoveAll(s.dataDir()); err != nil {
			return err
		}
		if out, err := s.run("/bin/cp", "-a", dir, s.dataDir()); err != nil {
			return fmt.Errorf("pgtest: restoring the data directory: %w: %s", err, out)
		}
		return s.startWritableLocked(promote)
	})
}

// PromoteInPlace stops postgres (fast) and starts it through archive
// recovery, which ends on a new WAL timeline: the timeline a standby that
// had every commit gets when it is promoted.
func (s *Server) PromoteInPlace() error {
	return s.whileStopped("fast", func() error { return s.startWritableLocked(true) })
}

// whileStopped stops postgres (pg_ctl's mode) and runs then, which starts it
// again, under the server's lock.
func (s *Server) whileStopped(mode string, then func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	if err := s.stopPostgresLocked(mode); err != nil {
		return err
	}
	return then()
}

// startWritableLocked starts postgres, through a promotion when asked, and
// waits until its recovery ended (a promotion chose its timeline) and it
// takes writes.
func (s *Server) startWritableLocked(promote bool) error {
	if promote {
		if err := s.promoteOnStartLocked(); err != nil {
			return err
		}
	}
	if err := s.startPostgresLocked(); err != nil {
		return err
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		out, err := s.run(s.bin.psql, "-X", "-q", "-tA", "-h", s.dir, "-p", strconv.Itoa(s.pgPort), "-U", Superuser, "-d", "postgres",
			"-c", "SELECT pg_is_in_recovery()")
		if err == nil && strings.TrimSpace(out) == "f" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: postgres still in recovery after %s (%v): %s", readyTimeout, err, logTail(s.path("postgres.log")))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// promoteOnStartLocked makes the next start an archive recovery with no
// archive (every restore_command fails): it replays the WAL in pg_wal and
// then chooses a new timeline.
func (s *Server) promoteOnStartLocked() error {
	if _, err := s.run("/bin/sh", "-c", fmt.Sprintf("touch %s && echo \"restore_command = 'false'\" >> %s",
		filepath.Join(s.dataDir(), "recovery.signal"), filepath.Join(s.dataDir(), "postgresql.auto.conf"))); err != nil {
		return fmt.Errorf("pgtest: preparing the promotion: %w", err)
	}
	return nil
}

// BackupPath is a path in the server's own directory, which the server
// account may write (SnapshotData's copies go there), removed with it.
func (s *Server) BackupPath(name string) string { return s.path("backup-" + name) }
