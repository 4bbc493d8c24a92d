package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
)

// table collects the human-readable form of a result.
type table struct {
	tw *tabwriter.Writer
}

func (t *table) row(cells ...string) { fmt.Fprintln(t.tw, strings.Join(cells, "\t")) }

func (t *table) line(format string, args ...any) { fmt.Fprintf(t.tw, format+"\n", args...) }

// print writes v as indented JSON for -o json, else the table human renders.
func (c *common) print(v any, human func(*table)) error {
	if c.output == "json" {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	t := &table{tw: tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)}
	human(t)
	return t.tw.Flush()
}
