package db

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

// UnreadableRow is a row that scanned but holds values the Go types
// cannot: which table, whose key, and what.
type UnreadableRow struct {
	Table, Key string
	Problems   []string
}

func (e *UnreadableRow) Error() string {
	return fmt.Sprintf("a row of dislock.%s with key %q cannot be read: %s", e.Table, e.Key, strings.Join(e.Problems, ", "))
}

// FiniteTime scans a timestamptz column into T (or, for a nullable column,
// into Nullable) in UTC, and notes a non-finite value ('infinity',
// '-infinity'), which time.Time cannot hold, in Problems instead of
// failing: pgx ends the whole result at a failed scan, so the listing could
// not go past the row.
type FiniteTime struct {
	Column   string
	T        *time.Time
	Nullable **time.Time
	Problems *[]string
}

func (d *FiniteTime) ScanTimestamptz(v pgtype.Timestamptz) error {
	switch {
	case !v.Valid && d.Nullable != nil:
		*d.Nullable = nil
	case !v.Valid:
		return fmt.Errorf("column %s is NULL", d.Column)
	case v.InfinityModifier != pgtype.Finite:
		*d.Problems = append(*d.Problems, d.Column+" is "+v.InfinityModifier.String())
	case d.Nullable != nil:
		t := v.Time.UTC()
		*d.Nullable = &t
	default:
		*d.T = v.Time.UTC()
	}
	return nil
}
