package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A stream with a passing, a failing and a skipped test in one package, a
// package whose TestMain died, and a package without tests.
const stream = `{"Action":"start","Package":"m/a"}
{"Action":"run","Package":"m/a","Test":"TestPass"}
{"Action":"output","Package":"m/a","Test":"TestPass","Output":"=== RUN   TestPass\n"}
{"Action":"output","Package":"m/a","Test":"TestPass","Output":"    a_test.go:9: quiet when it passes\n"}
{"Action":"pass","Package":"m/a","Test":"TestPass","Elapsed":0.1}
{"Action":"run","Package":"m/a","Test":"TestFail"}
{"Action":"output","Package":"m/a","Test":"TestFail","Output":"    node.go:405: node Ready in 2.3s\n"}
{"Action":"output","Package":"m/a","Test":"TestFail","Output":"    a_test.go:12: the window ran twice\n"}
{"Action":"output","Package":"m/a","Test":"TestFail","Output":"        KEY  WINDOW  TOKEN\n"}
{"Action":"output","Package":"m/a","Test":"TestFail","Output":"--- FAIL: TestFail (0.20s)\n"}
{"Action":"fail","Package":"m/a","Test":"TestFail","Elapsed":0.2}
{"Action":"run","Package":"m/a","Test":"TestSkip"}
{"Action":"output","Package":"m/a","Test":"TestSkip","Output":"    a_test.go:20: PostgreSQL is not installed\n"}
{"Action":"output","Package":"m/a","Test":"TestSkip","Output":"--- SKIP: TestSkip (0.00s)\n"}
{"Action":"skip","Package":"m/a","Test":"TestSkip","Elapsed":0}
{"Action":"output","Package":"m/a","Output":"FAIL\tm/a\t12.5s\n"}
{"Action":"fail","Package":"m/a","Elapsed":12.5}
{"Action":"start","Package":"m/b"}
{"Action":"run","Package":"m/b","Test":"TestHangs"}
{"Action":"output","Package":"m/b","Test":"TestHangs","Output":"panic: test timed out after 1m0s\n"}
{"Action":"output","Package":"m/b","Output":"FAIL\tm/b\t60.0s\n"}
{"Action":"fail","Package":"m/b","Elapsed":60}
{"Action":"output","Package":"m/c","Output":"?   \tm/c\t[no test files]\n"}
{"Action":"skip","Package":"m/c","Elapsed":0}
`

func TestTheReportShowsFailuresAndSkipsAndHidesPassingOutput(t *testing.T) {
	var out strings.Builder
	rows, err := report(strings.NewReader(stream), &out)
	if err == nil || !strings.Contains(err.Error(), "m/a TestFail") || !strings.Contains(err.Error(), "m/b") {
		t.Errorf("error = %v, want it to name m/a TestFail and the package m/b that died", err)
	}
	// The summary, the end of a long run's output, says why the test
	// failed: its own lines, not a helper's log or a dump.
	if err != nil && (!strings.Contains(err.Error(), "m/a TestFail\n      a_test.go:12: the window ran twice") ||
		strings.Contains(err.Error(), "node Ready") || strings.Contains(err.Error(), "KEY  WINDOW")) {
		t.Errorf("error = %v, want the failing test's own line under its name and nothing else of its output", err)
	}
	got := out.String()
	for _, want := range []string{"the window ran twice", "panic: test timed out", "SKIP m/a TestSkip: a_test.go:20: PostgreSQL is not installed", "FAIL\tm/a\t12.5s"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet when it passes") {
		t.Errorf("report prints a passing test's output:\n%s", got)
	}
	want := []Row{
		{Package: "m/a", Result: "fail", Seconds: 12.5, Passed: 1, Failed: 1, Skipped: 1},
		{Package: "m/b", Result: "fail", Seconds: 60},
		{Package: "m/c", Result: "skip"},
	}
	if len(rows) != len(want) {
		t.Fatalf("rows = %+v, want %+v", rows, want)
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d = %+v, want %+v", i, rows[i], want[i])
		}
	}
}

func TestTheTableListsEachPackageSlowestFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "times.jsonl")
	if err := appendRows(path, []Row{{Package: "m/quick", Result: "pass", Seconds: 2, Passed: 3, Step: "unit"}}); err != nil {
		t.Fatal(err)
	}
	if err := appendRows(path, []Row{{Package: "m/slow", Result: "pass", Seconds: 426, Passed: 40, Skipped: 2, Step: "kube"}, {Package: "m/none", Result: "skip"}}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := printTable(&out, path); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	slow, quick := strings.Index(got, "m/slow"), strings.Index(got, "m/quick")
	if slow < 0 || quick < 0 || slow > quick {
		t.Errorf("want m/slow listed before m/quick:\n%s", got)
	}
	for _, want := range []string{"7m6s", "7m8s", "2 tests skipped"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "m/none") {
		t.Errorf("table lists a package without tests:\n%s", got)
	}
}

func TestAnEmptyStreamIsAFailure(t *testing.T) {
	if _, err := report(strings.NewReader(""), os.Stdout); err == nil {
		t.Error("no error for a stream without packages")
	}
}

func TestTheSummaryKeepsTheLastLinesOfATestThatLoggedMany(t *testing.T) {
	var lines []string
	for i := range 20 {
		lines = append(lines, fmt.Sprintf("    a_test.go:%d: line %d\n", i+1, i))
	}
	got := testFileLines(lines)
	if !strings.HasPrefix(got, "\n      (8 earlier lines)\n      a_test.go:9: line 8") || !strings.HasSuffix(got, "a_test.go:20: line 19") {
		t.Errorf("summary = %q, want the last %d lines after a count of the earlier ones", got, summaryLines)
	}
}
