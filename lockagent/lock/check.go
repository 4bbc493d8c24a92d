package lock

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Status grades one Finding.
type Status string

const (
	StatusOK Status = "ok"
	// StatusWarn: works, with a weakness the operator should know.
	StatusWarn Status = "warn"
	// StatusFail: claims can be lost or not written at all.
	StatusFail Status = "fail"
	// StatusAccepted: a failing replication setup the operator acknowledged
	// (CheckOptions.AllowAsync).
	StatusAccepted Status = "accepted"
)

// Finding is one thing CheckDatabase verified, with the fix when it is not ok.
type Finding struct {
	Check  string `json:"check"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// CheckOptions tune CheckDatabase.
type CheckOptions struct {
	// AllowAsync acknowledges a database whose failover may lose commits
	// (asynchronous replication, or a managed service whose replication
	// dislock cannot see): its findings become StatusAccepted.
	AllowAsync bool
}

// Failed reports whether any finding is StatusFail.
func Failed(fs []Finding) bool {
	for _, f := range fs {
		if f.Status == StatusFail {
			return true
		}
	}
	return false
}

// AllowAsyncFlag is the command-line flag that sets CheckOptions.AllowAsync;
// fixes name it.
const AllowAsyncFlag = "--allow-async-replication"

const fixSync = "make replication synchronous to a standby in another data centre: with Patroni, " +
	"`patronictl edit-config` and set `synchronous_mode: true`; without it, " +
	"synchronous_standby_names = 'FIRST 1 (<standby>)' and synchronous_commit = on. " +
	"A managed service whose failover loses no commit (its replication is invisible here): pass " + AllowAsyncFlag

// qTopology reads, in one round trip, what the replication checks need.
// pg_stat_replication shows a role without pg_read_all_stats (pg_monitor)
// only pids: sync_state is NULL then.
const qTopology = `
SELECT pg_is_in_recovery(),
       current_setting('synchronous_commit'),
       current_setting('synchronous_standby_names'),
       current_setting('server_version'),
       (SELECT count(*) FROM pg_stat_replication),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL),
       coalesce((SELECT string_agg(application_name, ',' ORDER BY application_name) FROM pg_stat_replication
                 WHERE sync_state IN ('sync', 'quorum') AND state = 'streaming'), '')`

// CheckDatabase verifies what dislock's promises rest on and can be seen
// from a connection: that it reaches a primary; that a commit is replicated
// synchronously before it is acknowledged (else a failover can lose a claim
// and the window runs twice); the schema version; and that fencing tokens
// cannot go back. It returns an error only when the database cannot be
// asked at all.
func (s *Store) CheckDatabase(ctx context.Context, opts CheckOptions) ([]Finding, error) {
	var (
		inRecovery                     bool
		syncCommit, syncNames, version string
		senders, hidden                int64
		syncStandbys                   string
	)
	err := s.pool.QueryRow(ctx, qTopology).Scan(&inRecovery, &syncCommit, &syncNames, &version, &senders, &hidden, &syncStandbys)
	if err != nil {
		return nil, s.classify("checking the database", err)
	}
	var out []Finding
	add := func(check string, st Status, fix, format string, args ...any) {
		if st == StatusFail && opts.AllowAsync && check != "primary" && check != "schema" && check != "tokens" {
			st, fix = StatusAccepted, ""
		}
		out = append(out, Finding{Check: check, Status: st, Detail: fmt.Sprintf(format, args...), Fix: fix})
	}
	if inRecovery {
		add("primary", StatusFail, "point the URL at the primary: HAProxy checking Patroni's GET /primary, or a multi-host URL "+
			"(host=a,b,c target_session_attrs=read-write)", "connected to a standby (PostgreSQL %s in recovery): claims cannot be written", version)
		return out, nil
	}
	add("primary", StatusOK, "", "connected to a primary (PostgreSQL %s) at %s", version, s.addr)

	switch strings.TrimSpace(syncNames) {
	case "":
		detail := "synchronous_standby_names is empty: replication is asynchronous or there is no standby, so a failover can lose acknowledged claims and a window then runs twice"
		if senders > 0 {
			detail = fmt.Sprintf("synchronous_standby_names is empty but %d standby(s) stream asynchronously: a failover to one of them can lose acknowledged claims and a window then runs twice", senders)
		}
		add("replication", StatusFail, fixSync, "%s", detail)
	default:
		switch {
		case syncStandbys != "":
			add("replication", StatusOK, "", "synchronous_standby_names = %q; synchronous standby streaming: %s", syncNames, syncStandbys)
		case hidden > 0:
			add("replication", StatusWarn, "grant the checking role pg_monitor to let dislock check see pg_stat_replication",
				"synchronous_standby_names = %q, but this role cannot see which of the %d standby(s) are synchronous", syncNames, hidden)
		default:
			add("replication", StatusFail, "start the synchronous standby, or let Patroni's synchronous_mode choose another",
				"synchronous_standby_names = %q but no synchronous standby is streaming: every commit waits, and agents fail closed", syncNames)
		}
	}
	switch syncCommit {
	case "on", "remote_apply":
		add("synchronous_commit", StatusOK, "", "synchronous_commit = %s", syncCommit)
	case "remote_write":
		add("synchronous_commit", StatusWarn, "set synchronous_commit = on",
			"synchronous_commit = remote_write: a claim is lost if the primary is lost together with the standby's operating system")
	default:
		add("synchronous_commit", StatusFail, "set synchronous_commit = on for the database or the role dislock uses (ALTER ROLE … SET synchronous_commit = on)",
			"synchronous_commit = %s: a commit is acknowledged before any standby has it", syncCommit)
	}
	return s.checkSchema(ctx, out)
}

// checkSchema appends the schema and token findings.
func (s *Store) checkSchema(ctx context.Context, out []Finding) ([]Finding, error) {
	var current int
	err := s.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM dislock.schema_migrations`).Scan(&current)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") { // undefined table or schema
		current, err = 0, nil
	}
	if err != nil {
		return nil, s.classify("checking the schema version", err)
	}
	switch want := SchemaVersion(); {
	case current == want:
		out = append(out, Finding{Check: "schema", Status: StatusOK, Detail: fmt.Sprintf("schema dislock is at version %d", current)})
	case current < want:
		out = append(out, Finding{Check: "schema", Status: StatusFail, Fix: "run `dislock migrate` (the webhook also migrates at start)",
			Detail: fmt.Sprintf("schema dislock is at version %d; this dislock needs %d", current, want)})
		return out, nil
	default:
		out = append(out, Finding{Check: "schema", Status: StatusFail, Fix: "upgrade dislock",
			Detail: fmt.Sprintf("schema dislock is at version %d, newer than this dislock knows (%d)", current, want)})
		return out, nil
	}
	var epoch, counter, highest int64
	if err := s.pool.QueryRow(ctx, qTokenEpoch).Scan(&epoch, &counter, &highest); err != nil {
		return nil, s.classify("checking fencing tokens", err)
	}
	if next := epoch<<tokenEpochShift + counter + 1; highest >= next {
		was, _ := TokenEpoch(highest)
		out = append(out, Finding{Check: "tokens", Status: StatusFail,
			Detail: fmt.Sprintf("token %d (epoch %d) was handed out, but the next token would be %d (epoch %d): the schema was restored into another PostgreSQL cluster, whose timelines start again", highest, was, next, epoch),
			Fix:    fmt.Sprintf("UPDATE dislock.token_epoch SET timeline_offset = timeline_offset + %d", was-epoch+1)})
		return out, nil
	}
	out = append(out, Finding{Check: "tokens", Status: StatusOK,
		Detail: fmt.Sprintf("fencing tokens are in epoch %d (WAL timeline plus offset); the highest recorded is %d", epoch, highest)})
	return out, nil
}

// tokenEpochShift: a token is epoch<<tokenEpochShift + counter (migration 3).
const tokenEpochShift = 40

const qTokenEpoch = `
SELECT dislock.token_epoch_now(), (SELECT last_value FROM dislock.token_counter),
       greatest(coalesce((SELECT max(token) FROM dislock.windows), 0), coalesce((SELECT max(token) FROM dislock.leases), 0))`

// TokenEpoch splits a fencing token into the epoch (WAL timeline plus
// offset) it was drawn in and the counter.
func TokenEpoch(token int64) (epoch, counter int64) {
	return token >> tokenEpochShift, token & (1<<tokenEpochShift - 1)
}
