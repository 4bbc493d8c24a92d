package main

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/e2e"
)

func TestATableRowSaysWhoRanAndWhyTheOthersSkippedInAHundredColumns(t *testing.T) {
	t.Parallel()
	w := time.Date(2026, 12, 2, 17, 48, 0, 0, time.UTC)
	started := w.Add(3 * time.Second)
	finished := started.Add(2 * time.Second)
	o := outcome{
		window: w,
		runs:   1,
		row:    &store.Window{Cluster: "dc-b"},
		dcs: []dcOutcome{
			{dc: "dc-b", job: &batchv1.Job{}, complete: true, decided: 1500 * time.Millisecond,
				ran:     &e2e.Run{Token: 1099511627817, Cluster: "dc-b", Started: started, Finished: &finished},
				message: "ran window 2026-12-02T17:48:00Z of e2e/report with token 1099511627817: succeeded (1 container(s), exit code 0)"},
			{dc: "dc-a", job: &batchv1.Job{}, complete: true, decided: 1700 * time.Millisecond,
				message: "skip: window 2026-12-02T17:48:00Z already claimed by cluster dc-b (dc-b/e2e/report-29937228/e3e837e0-15a9-44a2-a73c-4154704e1b44, state running)"},
			{dc: "dc-c", job: &batchv1.Job{}, complete: true,
				message: "skip: lease e2e/report held by dc-b/e2e/report-29937227/0c0e2a6d-0000-4000-8000-000000000000/report-29937227-x7k2p until 2026-12-02T17:48:31Z: an earlier run is still going"},
		},
	}
	if !o.ok() {
		t.Fatal("one run, its row naming the data centre that ran it, every Job Complete: want ok")
	}
	got := strings.Split(strings.TrimSuffix(o.rows(), "\n"), "\n")
	want := []string{
		"17:48   dc-b  ran      1099511627817   2.0s     1.5s  succeeded (1 container(s), exit code 0)",
		"        dc-a  skipped              -      -     1.7s  already claimed by cluster dc-b (state",
		"                                                      running)",
		"        dc-c  skipped              -      -        -  lease e2e/report held by dc-b until",
		"                                                      2026-12-02T17:48:31Z: an earlier run is still",
		"                                                      going",
	}
	if len(got) != len(want) {
		t.Fatalf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d:\n got %q\nwant %q", i, got[i], want[i])
		}
		if len(got[i]) > width {
			t.Errorf("row %d is %d columns wide, want at most %d", i, len(got[i]), width)
		}
	}
	if h := header(); len(h)-1 > width {
		t.Errorf("header is %d columns wide, want at most %d", len(h)-1, width)
	}
}

func TestAWindowThatRanTwiceOrNeverFailsTheDemo(t *testing.T) {
	t.Parallel()
	complete := dcOutcome{dc: "dc-a", job: &batchv1.Job{}, complete: true}
	for _, tc := range []struct {
		name string
		o    outcome
		mark string
	}{
		{"ran twice", outcome{runs: 2, row: &store.Window{Cluster: "dc-a"}, dcs: []dcOutcome{complete, complete}}, "RAN 2 TIMES"},
		{"never ran", outcome{runs: 0, row: &store.Window{Cluster: "dc-a"}, dcs: []dcOutcome{complete, complete}}, "DID NOT RUN"},
		{"no lock row", outcome{runs: 1, dcs: []dcOutcome{complete, complete}}, "no row in dislock.windows"},
		{"a Job failed", outcome{runs: 1, row: &store.Window{Cluster: "dc-a"}, dcs: []dcOutcome{complete, {dc: "dc-b", job: &batchv1.Job{}}}}, "failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.o.ok() {
				t.Error("ok, want not ok")
			}
			if rows := tc.o.rows(); !strings.Contains(rows, tc.mark) {
				t.Errorf("rows do not say %q:\n%s", tc.mark, rows)
			}
		})
	}
}
