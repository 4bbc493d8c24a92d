package store

import (
	"context"
	"errors"
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
	// Waited: as Claim.Waited.
	Waited time.Duration `json:"-"`
}

// Renew extends, in one round trip and one commit, the liveness of the
// caller's running claim and its live lease by TTL from database time.
// ErrWindowLost when the claim is no longer the caller's (and then nothing
// is renewed), ErrLeaseLost when the lease expired or was taken over: the
// caller must stop.
//
// On a database still at schema 10 it renews with schema 10's functions,
// and keeps doing so for the Store's life (a pod's): they work on later
// schemas too, and a statement failing on every renewal would cost a
// round trip and a line in the server's log each time.
func (s *Store) Renew(ctx context.Context, r Renewal) (Renewed, error) {
	if s.schema10Renewals.Load() {
		return s.renewSchema10(ctx, r)
	}
	var window, leaseKey any
	if r.WindowToken != 0 {
		window = r.Window.UTC()
	}
	if r.LeaseToken != 0 {
		leaseKey = r.LeaseKey
	}
	var windowUntil, leaseUntil *time.Time
	var dbTime time.Time
	// A renewal that renewed nothing wrote nothing: its commit's
	// durability does not matter, and the loss is what the caller must
	// hear.
	renew := func(query string) error {
		return s.writeRowActing(ctx, func(row pgx.Row) error { return row.Scan(&windowUntil, &leaseUntil, &dbTime) },
			func() bool { return windowUntil != nil || leaseUntil != nil },
			query, r.Key, window, r.Index, r.WindowToken, leaseKey, r.LeaseToken, db.Micros(r.TTL))
	}
	var err error
	sent := false
	if !s.noGuardedCalls.now() {
		err = renew(qRenewGuarded)
		if sent = !undefinedFunction(err, "dislock.renew_guarded("); !sent {
			s.noGuardedCalls.found() // not migrated to schema 20 yet
		}
	}
	if !sent {
		err = renew(qRenew)
	}
	if undefinedFunction(err, "dislock.renew(") {
		s.schema10Renewals.Store(true)
		return s.renewSchema10(ctx, r)
	}
	if err != nil {
		return Renewed{}, s.classify("renewing "+renewalName(r), err)
	}
	return renewed(r, windowUntil, leaseUntil, dbTime)
}

// renewed is a renewal's answer, or the loss it reports.
func renewed(r Renewal, windowUntil, leaseUntil *time.Time, dbTime time.Time) (Renewed, error) {
	switch {
	case r.WindowToken != 0 && windowUntil == nil:
		return Renewed{}, fmt.Errorf("heartbeat of window %s of %s token %d: %w", formatWindow(r.Window), r.Key, r.WindowToken, ErrWindowLost)
	case r.LeaseToken != 0 && leaseUntil == nil:
		return Renewed{}, fmt.Errorf("renewing lease %s token %d: %w", r.LeaseKey, r.LeaseToken, ErrLeaseLost)
	}
	out := Renewed{DBTime: dbTime.UTC()}
	if windowUntil != nil {
		out.WindowUntil = windowUntil.UTC()
	}
	if leaseUntil != nil {
		out.LeaseUntil = leaseUntil.UTC()
	}
	return out, nil
}

// renewSchema10 is Renew against schema 10, whose renewals are two
// functions (renew_window, renew_lease): a database the operator has not
// migrated yet, whose claims this release's agents can already make
// (claim_window is schema 10's), so their renewals must work there too.
func (s *Store) renewSchema10(ctx context.Context, r Renewal) (Renewed, error) {
	var windowUntil, leaseUntil *time.Time
	var dbTime time.Time
	if r.WindowToken != 0 {
		err := s.writeRow(ctx, func(row pgx.Row) error { return row.Scan(&windowUntil, &dbTime) },
			qRenewWindowSchema10, r.Key, r.Window.UTC(), r.Index, r.WindowToken, db.Micros(r.TTL))
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return Renewed{}, s.classify("renewing "+renewalName(r), err)
		}
		if windowUntil == nil {
			return renewed(r, nil, nil, dbTime)
		}
	}
	if r.LeaseToken != 0 {
		err := s.writeRow(ctx, func(row pgx.Row) error { return row.Scan(&leaseUntil, &dbTime) },
			qRenewLeaseSchema10, r.LeaseKey, r.LeaseToken, db.Micros(r.TTL))
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return Renewed{}, s.classify("renewing "+renewalName(r), err)
		}
	}
	return renewed(r, windowUntil, leaseUntil, dbTime)
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
