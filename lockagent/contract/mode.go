package contract

import (
	"errors"
	"fmt"
	"strings"
)

// Mode says which locks a run takes.
type Mode struct {
	// Schedule: one run per (key, window) across all clusters.
	Schedule bool
	// Lease: no two runs of the key at once.
	Lease bool
}

// wantModes is the allowed-values hint in mode errors.
const wantModes = `(want "schedule", "lease" or "schedule,lease")`

// String returns "schedule", "lease", "schedule,lease", or "" for no mode.
func (m Mode) String() string {
	switch {
	case m.Schedule && m.Lease:
		return "schedule,lease"
	case m.Schedule:
		return "schedule"
	case m.Lease:
		return "lease"
	}
	return ""
}

// IsZero reports whether the mode takes no lock, which no valid Spec has.
func (m Mode) IsZero() bool { return !m.Schedule && !m.Lease }

// ParseMode parses a comma-separated mode: "schedule", "lease",
// "schedule,lease" or "lease,schedule". Spaces around items are ignored;
// empty, unknown and repeated items are errors.
func ParseMode(v string) (Mode, error) {
	m, problem := parseMode(v)
	if problem == "" {
		return m, nil
	}
	if strings.TrimSpace(v) == "" {
		return Mode{}, errors.New("mode " + problem)
	}
	return Mode{}, fmt.Errorf("mode %q %s", v, problem)
}

// parseMode returns the mode or a problem phrase that reads after the value.
func parseMode(v string) (Mode, string) {
	if strings.TrimSpace(v) == "" {
		return Mode{}, "is empty " + wantModes
	}
	var m Mode
	for item := range strings.SplitSeq(v, ",") {
		var seen *bool
		switch strings.TrimSpace(item) {
		case "schedule":
			seen = &m.Schedule
		case "lease":
			seen = &m.Lease
		case "":
			return Mode{}, "has an empty item " + wantModes
		default:
			if !strings.Contains(v, ",") {
				return Mode{}, "is not a valid mode " + wantModes
			}
			return Mode{}, fmt.Sprintf("is not a valid mode: unknown item %q %s", strings.TrimSpace(item), wantModes)
		}
		if *seen {
			return Mode{}, fmt.Sprintf("names %q twice %s", strings.TrimSpace(item), wantModes)
		}
		*seen = true
	}
	return m, ""
}
