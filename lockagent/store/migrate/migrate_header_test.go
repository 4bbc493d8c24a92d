package migrate

import (
	"strings"
	"testing"
)

// Every migration says which older dislock keeps working against it; one
// that does not is refused here, at build time, not in a cluster upgraded
// half way.
func TestEveryMigrationDeclaresItsCompatibility(t *testing.T) {
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.version >= firstDeclaredVersion && !compatHeader.MatchString(strings.SplitN(m.sql, "\n", 2)[0]) {
			t.Errorf("migration %s has no compatibility header", m.name)
		}
		if m.compatibleFrom < 1 || m.compatibleFrom > m.version {
			t.Errorf("migration %s: compatible from %d, want 1..%d", m.name, m.compatibleFrom, m.version)
		}
	}
	// Migration 6 only adds a column older code never reads.
	if got := ms[firstDeclaredVersion-1].compatibleFrom; got != firstDeclaredVersion-1 {
		t.Errorf("migration %d is compatible from %d, want %d", firstDeclaredVersion, got, firstDeclaredVersion-1)
	}
}

func TestParseCompatibleFrom(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		version int
		body    string
		want    int
		wantErr string
	}{
		{"an additive migration names the version before it", 7, "-- dislock: compatible-from 6\nALTER TABLE x;", 6, ""},
		{"a migration that changes statements names its own version", 7, "-- dislock: compatible-from 7\r\nALTER TABLE x;", 7, ""},
		{"a migration may stay compatible further back", 8, "-- dislock: compatible-from 5\n", 5, ""},
		{"a migration from before the rule counts as its own version", 3, "-- Version 3: tokens\n", 3, ""},
		{"a new migration without the header is refused", 7, "-- Version 7: more\nALTER TABLE x;", 0, `the first line must be "-- dislock: compatible-from N"`},
		{"an empty new migration is refused", 7, "", 0, "the first line must be"},
		{"the header in a later line does not count", 7, "-- Version 7\n-- dislock: compatible-from 6\n", 0, "the first line must be"},
		{"a misspelt header is refused", 7, "-- dislock: compatible_from 6\n", 0, "want exactly"},
		{"extra words are refused", 7, "-- dislock: compatible-from 6 (additive)\n", 0, "want exactly"},
		{"a leading zero is refused", 7, "-- dislock: compatible-from 06\n", 0, "want exactly"},
		{"zero is refused", 7, "-- dislock: compatible-from 0\n", 0, "want exactly"},
		{"a version after the migration's own is refused", 7, "-- dislock: compatible-from 8\n", 0, "between 1 and the migration's own version 7"},
		{"a malformed header is refused on an old migration too", 3, "-- dislock: compatible from 2\n", 0, "want exactly"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseCompatibleFrom("0007_x.sql", tc.version, tc.body)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "0007_x.sql") {
					t.Fatalf("got %d, %v; want an error naming the file and containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}
