package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store/internal/db"
)

// Lease is one row of dislock.leases; times are database times in UTC.
type Lease struct {
	Key        string    `json:"key"`
	Owner      string    `json:"owner"`
	Token      int64     `json:"token"`
	AcquiredAt time.Time `json:"acquiredAt"`
	ExpireAt   time.Time `json:"expireAt"`
}

// LeaseGrant is the result of AcquireLease. On ErrLeaseHeld, Lease is the
// holder's row.
type LeaseGrant struct {
	Lease Lease
	// Reentered: the caller already held it (a restarted sidecar of the same
	// pod); the token is unchanged.
	Reentered bool
	// DBTime is now() of the statement that decided.
	DBTime time.Time
	// Waited: as Claim.Waited.
	Waited time.Duration `json:"-"`
}

// AcquireLease takes a free or expired lease, or re-enters the caller's own.
// A live lease of another owner is ErrLeaseHeld with the holder's row; a
// paused key ErrKeyPaused (see qAcquireLease).
func (s *Store) AcquireLease(ctx context.Context, key string, owner Owner, ttl time.Duration) (LeaseGrant, error) {
	if err := owner.Validate(); err != nil {
		return LeaseGrant{}, fmt.Errorf("acquiring lease %s: %w", key, err)
	}
	if key == "" || ttl <= 0 {
		return LeaseGrant{}, fmt.Errorf("acquiring lease %q: need a key and a positive ttl (got %s)", key, ttl)
	}
	for attempt := 0; attempt < 3; attempt++ {
		var g LeaseGrant
		var retry bool
		var err error
		old := s.noLeaseCall.now()
		if !old {
			g, retry, err = s.acquireLease(ctx, key, owner, ttl)
		}
		if old || undefinedFunction(err, "dislock.acquire_lease(") {
			// A database not migrated to schema 17 yet.
			if !old {
				s.noLeaseCall.found()
			}
			g, retry, err = s.acquireLeaseSchema16(ctx, key, owner, ttl)
		}
		if !retry {
			return g, err
		}
	}
	return LeaseGrant{}, fmt.Errorf("acquiring lease %s: the row kept disappearing", key)
}

// acquireLease is one call of dislock.acquire_lease (migration 17). retry:
// refused by a holder whose row was gone when read.
func (s *Store) acquireLease(ctx context.Context, key string, owner Owner, ttl time.Duration) (g LeaseGrant, retry bool, err error) {
	var outcome string
	var h holder
	var pause pauseColumns
	err = s.writeRowActing(ctx, func(row pgx.Row) error {
		return row.Scan(append(h.dest(), &outcome, &g.DBTime, &pause.by, &pause.reason, &pause.until)...)
	}, func() bool { return outcome == "granted" || outcome == "reentered" }, qAcquireLease, key, owner.LeaseOwner(), db.Micros(ttl))
	switch {
	case undefinedFunction(err, "dislock.acquire_lease("):
		return LeaseGrant{}, false, err // AcquireLease falls back
	case err != nil:
		return LeaseGrant{}, false, s.classify("acquiring lease "+key, err)
	}
	g.DBTime = g.DBTime.UTC()
	switch outcome {
	case "granted", "reentered":
		l, ok, err := h.lease(key)
		switch {
		case err != nil:
			return LeaseGrant{}, false, fmt.Errorf("acquiring lease %s: %w", key, err)
		case !ok:
			return LeaseGrant{}, false, fmt.Errorf("acquiring lease %s: the database granted it without a row", key)
		}
		g.Lease, g.Reentered = l, outcome == "reentered"
		return g, false, nil
	case "paused":
		return g, false, fmt.Errorf("lease %s: %w", key, pause.err())
	case "held":
		return h.refusal(g, key)
	}
	return LeaseGrant{}, false, fmt.Errorf("acquiring lease %s: the database answered %q, which this dislock does not know", key, outcome)
}

// acquireLeaseSchema16 acquires with the statements of schemas 15 and 16
// (qAcquireLeaseSchema16, and qLeaseRefusal to say why it was refused).
func (s *Store) acquireLeaseSchema16(ctx context.Context, key string, owner Owner, ttl time.Duration) (g LeaseGrant, retry bool, err error) {
	var inserted bool
	scan := func(row pgx.Row) error { return scanLease(row, &g.Lease, &inserted, &g.DBTime) }
	old := s.noPauses.now()
	if !old {
		err = s.writeRow(ctx, scan, qAcquireLeaseSchema16, key, owner.LeaseOwner(), db.Micros(ttl), PauseKey(key))
	}
	if old || beforePauses(err) {
		// A database not migrated to schema 16 yet: no pause to hear of.
		if !old {
			s.noPauses.found()
		}
		err = s.writeRow(ctx, scan, qAcquireLeaseSchema15, key, owner.LeaseOwner(), db.Micros(ttl))
	}
	switch {
	case err == nil:
		g.Reentered = !inserted && !g.Lease.AcquiredAt.Equal(g.DBTime)
		return g, false, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return LeaseGrant{}, false, s.classify("acquiring lease "+key, err)
	}
	var h holder
	var pause pauseColumns
	refusal, args, dest := qLeaseRefusal, []any{key, PauseKey(key)}, []any{&pause.by, &pause.reason, &pause.until}
	if old || s.noPauses.now() {
		refusal, args, dest = qLeaseRefusalSchema15, args[:1], nil
	}
	if err := s.h.Pool.QueryRow(ctx, refusal, args...).Scan(append(append(h.dest(), &g.DBTime), dest...)...); err != nil {
		return LeaseGrant{}, false, s.classify("reading holder of lease "+key, err)
	}
	g.DBTime = g.DBTime.UTC()
	live := h.owner != nil && h.expires != nil && h.expires.After(g.DBTime) && *h.owner != owner.LeaseOwner()
	if pause.by != nil && !live {
		// Another's live lease is answered as ever, paused or not:
		// another pod of its Job waits for the run to end (a pause stops
		// no run), anyone else skips.
		return g, false, fmt.Errorf("lease %s: %w", key, pause.err())
	}
	return h.refusal(g, key)
}

// holder is a lease's row as a refusal reads it: every column NULL when
// there is none.
type holder struct {
	key, owner        *string
	token             *int64
	acquired, expires *time.Time
	problems          []string
}

// dest is where a row of leaseColumns scans into.
func (h *holder) dest() []any {
	return []any{&h.key, &h.owner, &h.token,
		&db.FiniteTime{Column: "acquired_at", Nullable: &h.acquired, Problems: &h.problems},
		&db.FiniteTime{Column: "expire_at", Nullable: &h.expires, Problems: &h.problems}}
}

// lease is the row; ok false when there was none.
func (h *holder) lease(key string) (l Lease, ok bool, err error) {
	if len(h.problems) > 0 {
		return Lease{}, false, &db.UnreadableRow{Table: "leases", Key: key, Problems: h.problems}
	}
	if h.key == nil || h.owner == nil || h.token == nil || h.acquired == nil || h.expires == nil {
		return Lease{}, false, nil
	}
	return Lease{Key: *h.key, Owner: *h.owner, Token: *h.token, AcquiredAt: h.acquired.UTC(), ExpireAt: h.expires.UTC()}, true, nil
}

// refusal is ErrLeaseHeld with the holder's row in g; retry when the row
// was gone when read.
func (h *holder) refusal(g LeaseGrant, key string) (LeaseGrant, bool, error) {
	l, ok, err := h.lease(key)
	switch {
	case err != nil:
		return LeaseGrant{}, false, fmt.Errorf("reading holder of lease %s: %w", key, err)
	case !ok:
		return LeaseGrant{}, true, nil
	}
	g.Lease = l
	return g, false, fmt.Errorf("lease %s: %w: %s until %s", key, ErrLeaseHeld, l.Owner, l.ExpireAt.Format(time.RFC3339))
}

// RenewLease extends the caller's lease while it is still live at database
// time. ErrLeaseLost once it expired or was taken over: the caller must stop.
func (s *Store) RenewLease(ctx context.Context, key string, token int64, ttl time.Duration) (expireAt, dbTime time.Time, err error) {
	r, err := s.Renew(ctx, Renewal{LeaseKey: key, LeaseToken: token, TTL: ttl})
	return r.LeaseUntil, r.DBTime, err
}

// ReleaseLease gives the caller's lease up: it expires at once. It reports
// false when there was nothing of the caller's to release (it had expired,
// and perhaps someone else took it).
func (s *Store) ReleaseLease(ctx context.Context, key string, token int64) (bool, error) {
	tag, err := s.h.Pool.Exec(ctx, qReleaseLease, key, token)
	if err != nil {
		return false, s.classify("releasing lease "+key, err)
	}
	return tag.RowsAffected() > 0, nil
}

// ForceReleaseLease expires the lease of key whoever holds it: an operator's
// tool for a holder known to be gone. ErrNotFound when no live lease exists.
func (s *Store) ForceReleaseLease(ctx context.Context, key string) error {
	tag, err := s.h.Pool.Exec(ctx, qForceReleaseLease, key)
	if err != nil {
		return s.classify("releasing lease "+key, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("lease %s: %w", key, ErrNotFound)
	}
	return nil
}

// GetLease reads the lease of key (live or expired); ErrNotFound when none.
func (s *Store) GetLease(ctx context.Context, key string) (Lease, time.Time, error) {
	var l Lease
	var dbTime time.Time
	err := scanLease(s.h.Pool.QueryRow(ctx, qGetLease, key), &l, &dbTime)
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, time.Time{}, fmt.Errorf("lease %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return Lease{}, time.Time{}, s.classify("reading lease "+key, err)
	}
	return l, dbTime, nil
}

// ListLeases returns every lease row (expired ones too) and the database time.
func (s *Store) ListLeases(ctx context.Context) ([]Lease, time.Time, error) {
	return s.ListLeasesOf(ctx, LeaseFilter{})
}

// LeaseFilter selects leases for the operator's listings. Zero fields do
// not filter.
type LeaseFilter struct {
	// Namespace keeps the leases of one namespace's keys; Key those of one
	// CronJob's key ("key", and "key#i" of an Indexed Job).
	Namespace, Key string
	// Limit bounds the rows, by key.
	Limit int
}

// ListLeasesOf lists the leases f selects, by key, and the database time.
func (s *Store) ListLeasesOf(ctx context.Context, f LeaseFilter) ([]Lease, time.Time, error) {
	var limit *int
	if f.Limit > 0 {
		limit = &f.Limit
	}
	return db.List(ctx, &s.h, "listing leases", scanLease, qListLeases, f.Namespace, limit, f.Key)
}

// scanLease reads a row of leaseColumns and then extra; a row holding a
// time no time.Time can hold is an *db.UnreadableRow.
func scanLease(row pgx.Row, l *Lease, extra ...any) error {
	var problems []string
	dest := append([]any{&l.Key, &l.Owner, &l.Token,
		&db.FiniteTime{Column: "acquired_at", T: &l.AcquiredAt, Problems: &problems},
		&db.FiniteTime{Column: "expire_at", T: &l.ExpireAt, Problems: &problems}}, extra...)
	if err := row.Scan(dest...); err != nil {
		return err
	}
	db.UTC(extra)
	if len(problems) > 0 {
		return &db.UnreadableRow{Table: "leases", Key: l.Key, Problems: problems}
	}
	return nil
}
