package store

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// A row the owner's listings cannot represent (written by hand, or by a
// tenant into its own keys before a constraint refused it) is left out of
// the listing, logged and counted, so that one namespace's row cannot hide
// every other namespace's. Migration 4's CHECK constraints keep such rows
// out; this is what the listings do should one get in anyway.

// unreadableRow is a row that scanned but holds values the Go types
// cannot: which table, whose key, and what.
type unreadableRow struct {
	table, key string
	problems   []string
}

func (e *unreadableRow) Error() string {
	return fmt.Sprintf("a row of dislock.%s with key %q cannot be read: %s", e.table, e.key, strings.Join(e.problems, ", "))
}

// finiteTime scans a timestamptz column into t (or, for a nullable column,
// into nullable) in UTC, and notes a non-finite value ('infinity',
// '-infinity'), which time.Time cannot hold, in problems instead of
// failing: pgx ends the whole result at a failed scan, so the listing could
// not go past the row.
type finiteTime struct {
	column   string
	t        *time.Time
	nullable **time.Time
	problems *[]string
}

func (d *finiteTime) ScanTimestamptz(v pgtype.Timestamptz) error {
	switch {
	case !v.Valid && d.nullable != nil:
		*d.nullable = nil
	case !v.Valid:
		return fmt.Errorf("column %s is NULL", d.column)
	case v.InfinityModifier != pgtype.Finite:
		*d.problems = append(*d.problems, d.column+" is "+v.InfinityModifier.String())
	case d.nullable != nil:
		t := v.Time.UTC()
		*d.nullable = &t
	default:
		*d.t = v.Time.UTC()
	}
	return nil
}

// skipRow logs and counts a row a listing leaves out.
func (s *Store) skipRow(op string, r *unreadableRow) {
	s.skippedRows.Add(1)
	s.logger.Warn("left out a row that cannot be read", "op", op, "table", "dislock."+r.table, "key", r.key,
		"problems", r.problems)
}

// SkippedRows counts the rows this Store's listings left out because they
// could not be read (each is logged).
func (s *Store) SkippedRows() int64 { return s.skippedRows.Load() }
