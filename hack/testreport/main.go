// Command testreport reads `go test -json` and prints what a reader of a
// long test run needs: each package's result line as it ends, the output
// of every failing test, every package-level line (a TestMain saying a
// component is missing), and a note of each skipped test with its reason.
// With -record it appends one line per package to a file, and with -table
// it prints those lines as the time each package took, so `make test`
// shows its cost at its end.
//
//	go test -json ./... | testreport -record times.jsonl
//	testreport -table times.jsonl
//
// It exits 1 when a test or a package failed, or when the stream held no
// package at all (a go test that could not start).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Elapsed    float64
	Output     string
	ImportPath string
}

// Row is what -record keeps of one package.
type Row struct {
	Package string  `json:"package"`
	Result  string  `json:"result"` // pass, fail, or skip (no test files)
	Seconds float64 `json:"seconds"`
	Passed  int     `json:"passed"`
	Failed  int     `json:"failed"`
	Skipped int     `json:"skipped"`
	// Step names the go test invocation the package ran in.
	Step string `json:"step,omitempty"`
}

func main() {
	record := flag.String("record", "", "append one JSON line per package to this `file`")
	step := flag.String("step", "", "name of this go test invocation, kept with each recorded package")
	table := flag.String("table", "", "print the packages recorded in this `file` with their times, and exit")
	flag.Parse()
	if *table != "" {
		if err := printTable(os.Stdout, *table); err != nil {
			fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
			os.Exit(1)
		}
		return
	}
	rows, err := report(os.Stdin, os.Stdout)
	for i := range rows {
		rows[i].Step = *step
	}
	if *record != "" {
		if werr := appendRows(*record, rows); werr != nil {
			fmt.Fprintf(os.Stderr, "testreport: %v\n", werr)
			os.Exit(1)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
		os.Exit(1)
	}
}

// pkgState collects one package's events until its result.
type pkgState struct {
	row Row
	// out holds each running test's lines until it ends: printed if it
	// fails, dropped if it passes.
	out map[string][]string
	// skips are the skipped tests with the last line they printed.
	skips []string
}

// report copies the readable part of the go test -json stream r to w and
// returns one row per package. The error says what failed.
func report(r io.Reader, w io.Writer) ([]Row, error) {
	pkgs := map[string]*pkgState{}
	var rows []Row
	var failed []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// Not test2json: a build error printed by the go command.
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		switch e.Action {
		case "build-output":
			fmt.Fprint(w, e.Output)
			continue
		case "build-fail":
			failed = append(failed, e.ImportPath+" (build failed)")
			continue
		}
		p := pkgs[e.Package]
		if p == nil {
			p = &pkgState{row: Row{Package: e.Package}, out: map[string][]string{}}
			pkgs[e.Package] = p
		}
		if e.Test == "" {
			switch e.Action {
			case "output":
				// The bare PASS before a package's ok line says nothing more.
				if e.Output != "PASS\n" {
					fmt.Fprint(w, e.Output)
				}
			case "pass", "fail", "skip":
				p.row.Result, p.row.Seconds = e.Action, e.Elapsed
				if e.Action == "fail" {
					// A package that died (timeout, panic, TestMain) leaves
					// tests that never ended: their lines say why.
					for _, name := range sortedKeys(p.out) {
						fmt.Fprint(w, strings.Join(p.out[name], ""))
					}
					if p.row.Failed == 0 {
						failed = append(failed, e.Package)
					}
				}
				for _, s := range p.skips {
					fmt.Fprintf(w, "SKIP %s %s\n", e.Package, s)
				}
				rows = append(rows, p.row)
				delete(pkgs, e.Package)
			}
			continue
		}
		switch e.Action {
		case "output":
			p.out[e.Test] = append(p.out[e.Test], e.Output)
		case "pass":
			p.row.Passed++
			delete(p.out, e.Test)
		case "skip":
			p.row.Skipped++
			p.skips = append(p.skips, e.Test+": "+skipReason(p.out[e.Test]))
			delete(p.out, e.Test)
		case "fail":
			p.row.Failed++
			failed = append(failed, e.Package+" "+e.Test+testFileLines(p.out[e.Test]))
			fmt.Fprint(w, strings.Join(p.out[e.Test], ""))
			delete(p.out, e.Test)
		}
	}
	if err := sc.Err(); err != nil {
		return rows, fmt.Errorf("reading go test -json: %w", err)
	}
	for _, name := range sortedKeys(pkgs) {
		// The stream ended before the package's result: go test was killed.
		failed = append(failed, name+" (no result)")
	}
	switch {
	case len(failed) > 0:
		return rows, fmt.Errorf("%d failed:\n  %s", len(failed), strings.Join(failed, "\n  "))
	case len(rows) == 0:
		return rows, errors.New("go test reported no package")
	}
	return rows, nil
}

// summaryLines bounds the lines of one failing test in the summary.
const summaryLines = 12

// testLine is a line a test's own code logged or failed with (t.Log,
// t.Error, t.Fatal, attributed to a _test.go file): not a helper package's
// log, nor a dump. A failing test's output can run to hundreds of lines, and
// a reader who sees only the end of a long run still learns from these why
// it failed.
var testLine = regexp.MustCompile(`^\s+[\w.-]+_test\.go:\d+: `)

// testFileLines is the last summaryLines of lines that testLine matches,
// each on a line of its own, indented under the test's name; a message's
// continuation lines are left out.
func testFileLines(lines []string) string {
	var keep []string
	for _, l := range lines {
		if testLine.MatchString(l) {
			keep = append(keep, "\n      "+strings.TrimSpace(l))
		}
	}
	if len(keep) > summaryLines {
		keep = append([]string{fmt.Sprintf("\n      (%d earlier lines)", len(keep)-summaryLines)}, keep[len(keep)-summaryLines:]...)
	}
	return strings.Join(keep, "")
}

// skipReason is the last line a skipped test printed before "--- SKIP".
func skipReason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.HasPrefix(l, "--- SKIP") && !strings.HasPrefix(l, "=== ") {
			return l
		}
	}
	return "(no reason printed)"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func appendRows(path string, rows []Row) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// printTable prints the recorded packages, slowest first, with the tests
// each passed, failed and skipped, and the sum.
func printTable(w io.Writer, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rows []Row
	for i, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var r Row
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return fmt.Errorf("%s line %d: %w", path, i+1, err)
		}
		if r.Result != "skip" {
			rows = append(rows, r)
		}
	}
	slices.SortStableFunc(rows, func(a, b Row) int { return int(b.Seconds*1000) - int(a.Seconds*1000) })
	var total float64
	var skipped int
	fmt.Fprintf(w, "\n%-52s %-8s %9s %6s %6s %7s  %s\n", "package", "result", "time", "passed", "failed", "skipped", "step")
	for _, r := range rows {
		total += r.Seconds
		skipped += r.Skipped
		fmt.Fprintf(w, "%-52s %-8s %9s %6d %6d %7d  %s\n", strings.TrimPrefix(r.Package, "github.com/dislock/dislock/"),
			r.Result, (time.Duration(r.Seconds * float64(time.Second))).Round(time.Second), r.Passed, r.Failed, r.Skipped, r.Step)
	}
	fmt.Fprintf(w, "%-52s %-8s %9s  (packages run in parallel within a step: the sum exceeds the wall time)\n", "sum", "", time.Duration(total*float64(time.Second)).Round(time.Second))
	if skipped > 0 {
		fmt.Fprintf(w, "%d tests skipped: each is listed above as SKIP with its reason\n", skipped)
	}
	return nil
}
