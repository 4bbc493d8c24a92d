// Package flagusage prints a flag set's flags as the docs write them:
// --name for every flag of more than one letter, -o for a one-letter one.
// Go's flag package accepts both forms; its own listing shows one dash.
package flagusage

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// Print writes every flag of fs, sorted by name: the flag with its value's
// type, then its usage and default indented below it.
func Print(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		fmt.Fprintf(w, "  %s", Name(f.Name))
		typ, usage := flag.UnquoteUsage(f)
		if typ != "" {
			fmt.Fprintf(w, " %s", typ)
		}
		fmt.Fprintf(w, "\n    \t%s", strings.ReplaceAll(usage, "\n", "\n    \t"))
		switch f.DefValue {
		case "", "false", "0", "0s", "[]":
		default:
			if typ == "string" {
				fmt.Fprintf(w, " (default %q)", f.DefValue)
			} else {
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
		}
		fmt.Fprintln(w)
	})
}

// Name is how a flag is written: -o, --database-url.
func Name(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}
