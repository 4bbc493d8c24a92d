package check

import (
	"context"
	"fmt"

	"github.com/dislock/dislock/lockagent/store"
)

// qTokenEpoch reads what check judges the tokens by: the epoch the timeline
// gives, the counter's offset in it, the highest token in any row, and why
// tokens are held (NULL when they are not).
const qTokenEpoch = `
SELECT dislock.token_epoch_now(), dislock.token_counter_drawn() - e.counter_base,
       greatest(coalesce((SELECT max(token) FROM dislock.windows), 0), coalesce((SELECT max(token) FROM dislock.leases), 0)),
       dislock.token_epoch_held()
FROM dislock.token_epoch e`

// fixTokensHeld is what an operator does while tokens are held.
const fixTokensHeld = "the webhook's elected replica confirms the epoch within seconds of its start; " +
	"if it does not run, run dislock tokens with the owner's URL (the webhook's --database-url) and the highest token recorded " +
	"(--token-floor or --token-record, from the token record of each cluster: docs/operations.md, \"Fencing tokens\")"

// tokenFindings judges the fencing tokens: whether they can be drawn, whether
// one handed out already lies above the next, whether the database is
// behind the high water recorded outside it, and how full the counter is.
func (s checker) tokenFindings(ctx context.Context, opts Options) []Finding {
	var epoch, offset, highest int64
	var held *string
	if err := s.h.Pool.QueryRow(ctx, qTokenEpoch).Scan(&epoch, &offset, &highest, &held); err != nil {
		return []Finding{{Check: "tokens", Status: StatusFail, Detail: "cannot compute the next fencing token: " + err.Error(),
			Fix: "dislock needs pg_walfile_name(pg_current_wal_lsn()) on the primary (not available on some managed services)"}}
	}
	water := store.Token(epoch, offset)
	var out []Finding
	switch {
	case held != nil:
		out = append(out, Finding{Check: "tokens", Status: StatusFail, Fix: fixTokensHeld,
			Detail: "no fencing token can be drawn, so every claim and lease waits: " + *held})
	case highest > water:
		was, _ := store.TokenEpoch(highest)
		// The fix moves every later token above the highest row's: right
		// when next_token() handed that token out, wrong when someone wrote
		// it by hand (tenants cannot: the policies hold their tokens to the
		// high water; the owner can), which would make the epoch jump for
		// nothing. The rows are named so that the operator looks first.
		rows := s.tokensAbove(ctx, water+1)
		out = append(out, Finding{Check: "tokens", Status: StatusFail,
			Detail: fmt.Sprintf("token %d (epoch %d) was handed out, but the next token would be %d (epoch %d): the database lost the record of its epochs (an asynchronous failover, or a restore of part of the schema). "+
				"Rows above it: %s. Check them before applying the fix: a token written by hand rather than drawn by dislock is mended in its row (or the row deleted), not with the epoch", highest, was, water+1, epoch, rows),
			Fix: fmt.Sprintf("dislock tokens --token-floor %d", highest)})
	case opts.TokenFloor > water:
		out = append(out, Finding{Check: "tokens", Status: StatusFail,
			Detail: fmt.Sprintf("the database is behind the high water recorded in %s: token %d was handed out, but the next token would be %d: it was restored from a backup, or lost commits, and nothing has moved the epoch past the record yet",
				opts.TokenRecord, opts.TokenFloor, water+1),
			Fix: fmt.Sprintf("dislock tokens --token-floor %d (the webhook's elected replica does it within seconds while it runs)", opts.TokenFloor)})
	default:
		compared := "not compared with a token record kept outside the database (--token-record)"
		if opts.TokenRecord != "" {
			compared = fmt.Sprintf("at or above the high water %d recorded in %s", opts.TokenFloor, opts.TokenRecord)
		}
		out = append(out, Finding{Check: "tokens", Status: StatusOK,
			Detail: fmt.Sprintf("fencing tokens are in epoch %d (it follows the WAL timeline); the highest recorded in a row is %d; %s", epoch, highest, compared)})
	}
	return append(out, counterFinding(offset))
}

// The token counter's used fractions at which check warns and fails.
const (
	counterWarnAbove = 0.5
	counterFailAbove = 0.9
)

// fixCounter is what an operator does about a counter filling up. Every
// namespace shares the counter, and each grant draws from it.
const fixCounter = "find the role that draws: with pg_stat_statements, " +
	"SELECT r.rolname, s.calls FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid WHERE s.query LIKE '%next_token%' ORDER BY s.calls DESC " +
	"(a tenant role's namespace is in dislock.tenants: SELECT namespace FROM dislock.tenants WHERE role_name = '…'); " +
	"stop it (remove the namespace's opt-in label, or ALTER ROLE … NOLOGIN and end its sessions with pg_terminate_backend); " +
	"then move to a new epoch, which starts the counter again: dislock tokens --new-epoch (docs/operations.md, \"Fencing tokens\")"

// counterFinding grades how much of the counter's offset in the epoch is
// spent: when it is full, next_token() fails and every claim and lease of
// every namespace with it.
func counterFinding(offset int64) Finding {
	used := float64(offset) / float64(store.MaxTokenOffset)
	detail := fmt.Sprintf("the token counter is at %d of %d in this epoch (%.1f %% used); every namespace draws from it, and when it is full every claim fails", offset, int64(store.MaxTokenOffset), 100*used)
	switch {
	case used > counterFailAbove:
		return Finding{Check: "token counter", Status: StatusFail, Detail: detail, Fix: fixCounter}
	case used > counterWarnAbove:
		return Finding{Check: "token counter", Status: StatusWarn, Detail: detail, Fix: fixCounter}
	}
	return Finding{Check: "token counter", Status: StatusOK, Detail: detail}
}
