package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/internal/db"
)

// Bounds of each statement of retention, on the server. Retention skips
// the rows another session holds locked, so it waits for no row; these
// bound what is left: a table lock (an operator's DDL) and a statement
// slowed by anything else. A client whose context ends closes its
// connection and sends no cancel request (see db.Dial), and the
// server's statement would go on without them, holding the locks it took.
const (
	RetentionLockTimeout      = 2 * time.Second
	RetentionStatementTimeout = 30 * time.Second
	// retentionBatch bounds the rows one statement deletes: each holds its
	// rows locked until it commits, and must end within
	// RetentionStatementTimeout however far behind retention is.
	retentionBatch = 1000
)

// DeleteOldWindows removes windows that started more than retention ago (by
// database time), except ones whose owner is still alive; and the ledger's
// rows, missed windows and statistics of the same age. It returns how many
// windows it deleted.
//
// A row another session holds locked (a tenant may lock its own rows for
// as long as it likes) is skipped, and deleted at a later run; nothing one
// namespace holds delays another's retention. Each table is deleted from in
// batches, each statement bounded on the server (RetentionLockTimeout,
// RetentionStatementTimeout); a table whose statement fails does not keep
// the next from being cleaned, and the error names each that failed.
func DeleteOldWindows(ctx context.Context, s *store.Store, retention time.Duration) (int64, error) {
	h := s.Handle()
	if retention < store.MinRetention {
		return 0, fmt.Errorf("retention %s is shorter than %s: a late pod could claim and run a deleted window again", retention, store.MinRetention)
	}
	deleteOld := func(query string) (int64, error) {
		var deleted int64
		for {
			batch := &pgx.Batch{}
			batch.Queue(qStatementBounds, fmt.Sprint(RetentionLockTimeout.Milliseconds()), fmt.Sprint(RetentionStatementTimeout.Milliseconds()))
			batch.Queue(query, db.Micros(retention), retentionBatch)
			br := h.Pool.SendBatch(ctx, batch)
			_, err := br.Exec()
			var n int64
			if err == nil {
				tag, execErr := br.Exec()
				n, err = tag.RowsAffected(), execErr
			}
			if closeErr := br.Close(); err == nil {
				err = closeErr
			}
			if err != nil {
				return deleted, err
			}
			if deleted += n; n < retentionBatch {
				return deleted, nil
			}
		}
	}
	var windows int64
	var errs []error
	for _, step := range []struct{ what, query string }{
		{"old windows", qDeleteOldWindows},
		{"the shapes of old windows", qDeleteOldWindowUnits},
		{"old job views", qDeleteOldViews},
		{"old ledger rows", qDeleteOldDecisions},
		{"old missed windows", qDeleteOldMissed},
		{"the decision counts of keys silent for the retention", qDeleteOldCounts},
		{"the statistics of keys silent for the retention", qDeleteOldKeyStats},
	} {
		if ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", step.what, ctx.Err()))
			break
		}
		n, err := deleteOld(step.query)
		if step.query == qDeleteOldWindows {
			windows = n
		}
		if err != nil {
			errs = append(errs, h.Classify("deleting "+step.what, err))
		}
	}
	return windows, errors.Join(errs...)
}
