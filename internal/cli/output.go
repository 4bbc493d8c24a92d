package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"

	"sigs.k8s.io/yaml"
)

// Output formats (-o). Each command lists the ones it supports.
const (
	formatTable = "table"
	formatWide  = "wide"
	formatJSON  = "json"
	formatYAML  = "yaml"
)

// table collects the human-readable form of a result.
type table struct {
	tw *tabwriter.Writer
}

func newTable(w io.Writer) *table { return &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)} }

// row writes one line of cells. A cell that holds anything unprintable (a
// newline, a tab, an escape sequence) is printed quoted, Go-style: rows of
// the lock tables carry what tenants wrote, and one must not forge lines or
// columns of another namespace's locks in an operator's terminal.
func (t *table) row(cells ...string) {
	shown := make([]string, len(cells))
	for i, c := range cells {
		shown[i] = printable(c)
	}
	fmt.Fprintln(t.tw, strings.Join(shown, "\t"))
}

func printable(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return s
	}
	return strconv.Quote(s)
}

// line writes one line of text, quoted as row quotes a cell when it holds
// anything unprintable.
func (t *table) line(format string, args ...any) {
	fmt.Fprintln(t.tw, printable(fmt.Sprintf(format, args...)))
}

// print writes v as indented JSON for -o json, as YAML for -o yaml, else
// the table human renders.
func (c *common) print(v any, human func(*table)) error {
	switch c.output {
	case formatJSON:
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case formatYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = c.stdout.Write(b)
		return err
	}
	t := newTable(c.stdout)
	human(t)
	return t.tw.Flush()
}

// machine reports whether the output is for programs (JSON or YAML).
func (c *common) machine() bool { return c.output == formatJSON || c.output == formatYAML }
