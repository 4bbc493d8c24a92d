package webhook

import (
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/lock"
)

// A namespace gets a new role generation at once the first time, then waits
// out the rest of the interval after each; other namespaces are not held
// back, and namespaces whose interval has passed are forgotten.
func TestEachNamespaceWaitsOutTheIntervalBetweenTwoNewGenerations(t *testing.T) {
	t.Parallel()
	p := &provisionPacer{interval: time.Minute}
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	steps := []struct {
		name      string
		at        time.Duration // after t0
		namespace string
		want      time.Duration
		provision bool
	}{
		{"the first generation is minted at once", 0, "team-a", 0, true},
		{"a Secret deleted 10s later waits the remaining 50s", 10 * time.Second, "team-a", 50 * time.Second, false},
		{"another namespace is not held back", 10 * time.Second, "team-b", 0, true},
		{"a minute after the last one team-a may have the next", time.Minute, "team-a", 0, true},
		{"and then waits again", time.Minute + time.Second, "team-a", 59 * time.Second, false},
	}
	for _, s := range steps {
		if got := p.wait(s.namespace, t0.Add(s.at)); got != s.want {
			t.Fatalf("%s: wait %s, want %s", s.name, got, s.want)
		}
		if s.provision {
			p.provisioned(s.namespace, t0.Add(s.at))
		}
	}
	// team-b's interval has passed, team-a's not yet.
	p.provisioned("team-c", t0.Add(90*time.Second))
	if _, ok := p.last["team-b"]; ok || len(p.last) != 2 {
		t.Errorf("the pacer remembers %v, want only team-a and team-c", p.last)
	}
}

// The Event a namespace gets when generations of its role go inside the
// grace says why, which generations, and what it means for its pods, within
// an Event note's 1 kB however many went.
func TestTheEarlyRetirementNoteSaysWhyWhichAndWhatFollows(t *testing.T) {
	t.Parallel()
	gens := func(g ...int) []lock.TenantRole {
		var out []lock.TenantRole
		for _, n := range g {
			out = append(out, lock.TenantRole{Role: "r", Generation: n})
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		early []lock.TenantRole
		want  []string
	}{
		{"one generation", gens(2), []string{"generation 2 retired early", "pods started with it can"}},
		{"a few", gens(2, 3, 4), []string{"generations 2, 3, 4 retired early", "pods started with them can"}},
		{"many from before the bound", gens(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), []string{"12 generations (1 to 12) retired early"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			note := earlyRetirementNote(tc.early, DefaultTenantGrace)
			for _, w := range append(tc.want, "replaced 4 or more times within the grace (168h0m0s)", "at most 4 live generations",
				"can no longer reach the database", "the Secret's new role") {
				if !strings.Contains(note, w) {
					t.Errorf("note %q lacks %q", note, w)
				}
			}
			if len(note) > 1024 {
				t.Errorf("note is %d bytes, more than an Event holds", len(note))
			}
		})
	}
}

// The interval may be left 0 (the default) but not be negative.
func TestANegativeTenantProvisionIntervalIsRefusedNamingTheDefault(t *testing.T) {
	t.Parallel()
	cfg := Config{Inject: testOptions(), Namespace: "dislock-system", DatabaseURL: "postgres://owner@db/dislock",
		Retention: lock.DefaultRetention, TenantRoles: true, TenantRotation: DefaultTenantRotation, TenantGrace: DefaultTenantGrace}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the interval left 0: %v", err)
	}
	cfg.TenantProvisionInterval = -time.Second
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "-1s") || !strings.Contains(err.Error(), "1m0s") {
		t.Errorf("interval -1s: %v, want an error naming it and the default", err)
	}
}
