package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
)

// TokenState is the token epoch after the owner confirmed it.
type TokenState struct {
	// Epoch is the epoch of the next token; HighWater the largest token
	// that can have been handed out in it.
	Epoch, HighWater int64
	// Moved says why the epoch moved to a new one ("" when it did not).
	Moved string
	// SystemID and Timeline identify the PostgreSQL cluster and WAL
	// timeline the epoch was confirmed on.
	SystemID, Timeline int64
}

// Bounds of KeepTokens: its lock waits only on other owners' confirmations.
const (
	keepTokensLockTimeout      = 5 * time.Second
	keepTokensStatementTimeout = 30 * time.Second
)

// KeepTokens confirms the fencing token epoch, as the owner, in one short
// transaction. No token is drawn after a pg_upgrade, a restore into another
// cluster or a restore of the schema from a dump until this ran; it then
// moves to a new epoch, above every epoch used. It also moves to a new one
// when the database is behind floor (the highest token recorded outside
// it: the database was restored from a backup), or when newEpoch asks for
// one, which also starts the counter's offset again. Otherwise it records
// the epoch the WAL timeline gives as used, and moves nothing.
func KeepTokens(ctx context.Context, s *store.Store, floor int64, newEpoch bool) (TokenState, error) {
	h := s.Handle()
	var st TokenState
	err := pgx.BeginFunc(ctx, h.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qStatementBounds, fmt.Sprint(keepTokensLockTimeout.Milliseconds()),
			fmt.Sprint(keepTokensStatementTimeout.Milliseconds())); err != nil {
			return err
		}
		var moved *string
		if err := tx.QueryRow(ctx, qKeepTokens, floor, newEpoch).Scan(&st.Epoch, &st.HighWater, &moved, &st.SystemID, &st.Timeline); err != nil {
			return err
		}
		if moved != nil {
			st.Moved = *moved
		}
		return nil
	})
	return st, h.Classify("confirming the fencing token epoch", err)
}

const qKeepTokens = `
SELECT k.epoch, k.high_water, k.moved, (SELECT system_identifier FROM pg_catalog.pg_control_system()), dislock.wal_timeline()
FROM dislock.keep_token_epoch($1::bigint, $2::boolean) k`
