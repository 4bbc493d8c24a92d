package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store/internal/db"
)

// Renewal is what one pod holds and renews: its claim of a window (a zero
// WindowToken when none) and its lease (a zero LeaseToken when none), each
// by the token it was granted.
type Renewal struct {
	Key         string    // the window's key
	Window      time.Time // the window's start
	Index       int       // the window's job index: NotIndexed, or a completion index
	WindowToken int64
	LeaseKey    string
	LeaseToken  int64
	TTL         time.Duration
}

// Renewed is a renewal's answer: the new expiries (zero for what was not
// asked) and the database time.
type Renewed struct {
	WindowUntil, LeaseUntil, DBTime time.Time
}

// Renew extends, in one round trip and one commit, the liveness of the
// caller's running claim and its live lease by TTL from database time.
// ErrWindowLost when the claim is no longer the caller's, ErrLeaseLost when
// the lease expired or was taken over (the window's loss is reported when
// both are lost): the caller must stop. What is still the caller's is
// renewed even then.
func (s *Store) Renew(ctx context.Context, r Renewal) (Renewed, error) {
	var out Renewed
	var windowUntil, leaseUntil *time.Time
	var window, leaseKey any
	if r.WindowToken != 0 {
		window = r.Window.UTC()
	}
	if r.LeaseToken != 0 {
		leaseKey = r.LeaseKey
	}
	what := renewalName(r)
	err := s.writeRow(ctx, func(row pgx.Row) error { return row.Scan(&windowUntil, &leaseUntil, &out.DBTime) },
		qRenew, r.Key, window, r.Index, r.WindowToken, leaseKey, r.LeaseToken, db.Micros(r.TTL))
	if err != nil {
		return Renewed{}, s.classify("renewing "+what, err)
	}
	out.DBTime = out.DBTime.UTC()
	switch {
	case r.WindowToken != 0 && windowUntil == nil:
		return Renewed{}, fmt.Errorf("heartbeat of window %s of %s token %d: %w", formatWindow(r.Window), r.Key, r.WindowToken, ErrWindowLost)
	case r.LeaseToken != 0 && leaseUntil == nil:
		return Renewed{}, fmt.Errorf("renewing lease %s token %d: %w", r.LeaseKey, r.LeaseToken, ErrLeaseLost)
	}
	if windowUntil != nil {
		out.WindowUntil = windowUntil.UTC()
	}
	if leaseUntil != nil {
		out.LeaseUntil = leaseUntil.UTC()
	}
	return out, nil
}

// renewalName names what a renewal renews, for its errors.
func renewalName(r Renewal) string {
	switch {
	case r.WindowToken != 0 && r.LeaseToken != 0:
		return fmt.Sprintf("window %s of %s and lease %s", formatWindow(r.Window), r.Key, r.LeaseKey)
	case r.WindowToken != 0:
		return fmt.Sprintf("window %s of %s", formatWindow(r.Window), r.Key)
	default:
		return "lease " + r.LeaseKey
	}
}
