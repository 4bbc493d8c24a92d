package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

var (
	// ErrWindowTaken: another owner holds the window, or it already finished.
	ErrWindowTaken = errors.New("window already claimed")
	// ErrWindowStale: the window started longer ago than the claim's
	// MaxLate allows, by the database's clock; nothing was claimed.
	ErrWindowStale = errors.New("window too old to claim")
	// ErrWindowLost: the caller's claim is gone (taken over, finished, or deleted).
	ErrWindowLost = errors.New("window claim lost")
	// ErrLeaseHeld: another owner holds a live lease.
	ErrLeaseHeld = errors.New("lease held by another owner")
	// ErrLeaseLost: the caller's lease expired at database time or was taken over.
	ErrLeaseLost = errors.New("lease lost")
	// ErrUnavailable: the database (or the pooler in front of it) could not be
	// reached or refused to serve. Callers retry or fail closed.
	ErrUnavailable = errors.New("database unavailable")
	// ErrCompletionModesDisagree: the window was first claimed in the other
	// completion mode (a plain Job's window claimed per index, or the other
	// way round), or a lease of the key's other shape is live ("key" while
	// "key#i" is held, or the other way round). The clusters, or one
	// cluster across an edit, disagree on the Job's completionMode; running
	// both shapes would run the window twice. The error names the holder.
	ErrCompletionModesDisagree = errors.New("clusters disagree on completionMode")
	// ErrTokensHeld: the database hands out no fencing token until the owner
	// confirms the token epoch (migration 9): it is another PostgreSQL
	// cluster, or was restored. It also matches ErrUnavailable: callers
	// retry, since the webhook's elected replica confirms within seconds.
	ErrTokensHeld = errors.New("fencing tokens held until the owner confirms their epoch")
	// ErrTokensExhausted: the token epoch or the counter's offset in it
	// reached its bound; an operator moves to a new epoch.
	ErrTokensExhausted = errors.New("fencing tokens exhausted")
	// ErrKeyPaused: an operator paused the key everywhere (dislock pause):
	// no run of it starts until it is resumed or the pause ends. The error
	// names who paused it, until when and why.
	ErrKeyPaused = errors.New("paused everywhere")
	// ErrNotFound: no such window or lease.
	ErrNotFound = errors.New("not found")
	// ErrForbidden: the database refused the statement to this role: a
	// tenant role reaching outside its namespace (row-level security) or
	// beyond its rights. Retrying does not help.
	ErrForbidden = errors.New("not permitted to this database role")
)

// classify maps driver errors onto the package's sentinels at the database
// boundary, so that callers branch with errors.Is and never on error text.
func (s *Store) classify(op string, err error) error {
	if err == nil {
		return nil
	}
	if unavailable(err) {
		return fmt.Errorf("%s: %w at %s: %w", op, ErrUnavailable, s.h.Addr, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" && !errors.Is(err, ErrForbidden) { // insufficient_privilege
		return fmt.Errorf("%s: %w: %w", op, ErrForbidden, err)
	}
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case sqlstateShapesDisagree:
			return fmt.Errorf("%s: %w: %s", op, ErrCompletionModesDisagree, pgErr.Message)
		case sqlstatePausedMeanwhile:
			return fmt.Errorf("%s: %w", op, pausedMeanwhile(pgErr))
		case sqlstateTokensHeld:
			return fmt.Errorf("%s: %w (%w): %s", op, ErrTokensHeld, ErrUnavailable, pgErr.Message)
		case sqlstateTokensExhausted:
			return fmt.Errorf("%s: %w: %s (%s)", op, ErrTokensExhausted, pgErr.Message, pgErr.Hint)
		case sqlstateAboveReadCommitted:
			// The fix is the operator's: say it where the pod says why it
			// decided error.
			return fmt.Errorf("%s: %s (%s)", op, pgErr.Message, pgErr.Hint)
		case sqlstateUndefinedFunction:
			if strings.Contains(pgErr.Message, "dislock.") {
				// This dislock is newer than the schema: the webhook of
				// its release migrates it before it injects this agent,
				// so wait for that rather than fail the Job.
				return fmt.Errorf("%s: %w: schema dislock is older than this dislock needs (%s): run dislock migrate with the owner's URL, or let this release's webhook start", op, ErrUnavailable, pgErr.Message)
			}
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// sqlstateShapesDisagree is raised by the schema's triggers (migration 7)
// when a claim or lease would give a window or key a second shape.
const sqlstateShapesDisagree = "DL001"

// sqlstatePausedMeanwhile is raised by claim_window (migration 16) when the
// key was paused while the claim waited for its row: the claim is undone.
const sqlstatePausedMeanwhile = "DL004"

// sqlstateAboveReadCommitted (invalid_transaction_state) is raised by
// require_read_committed (migration 17): a claim or lease grant that would
// start a run at a stricter isolation level than read committed.
const sqlstateAboveReadCommitted = "25000"

// sqlstateUndefinedFunction: a function the statement calls does not exist.
const sqlstateUndefinedFunction = "42883"

// undefinedFunction reports whether err says that function (a prefix of
// its signature as the server prints it, "dislock.renew(") does not exist.
func undefinedFunction(err error, function string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == sqlstateUndefinedFunction && strings.Contains(pgErr.Message, function)
}

// beforePauses reports whether err says the database knows no pause: it
// has no claim_unless_paused or pause_of (schemas before 16).
func beforePauses(err error) bool {
	return undefinedFunction(err, "dislock.claim_unless_paused(") || undefinedFunction(err, "dislock.pause_of(")
}

// sqlstateTokensHeld and sqlstateTokensExhausted are raised by
// dislock.next_token() (migration 9).
const (
	sqlstateTokensHeld      = "DL002"
	sqlstateTokensExhausted = "DL003"
)

func unavailable(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception (also PgBouncer's own errors)
			strings.HasPrefix(pgErr.Code, "57P"), // admin shutdown, crash shutdown, cannot connect now
			pgErr.Code == "53300",                // too many connections
			// a read-only node: a standby, or a demoted primary a pooler
			// still holds connections to during a failover
			pgErr.Code == "25006":
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) || pgconn.Timeout(err)
}
