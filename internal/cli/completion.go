package cli

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/dislock/dislock/internal/flagusage"
)

const completionSummary = "print a shell completion script: bash, zsh or fish (e.g. source <(dislock completion bash))"

var completionShells = []string{"bash", "zsh", "fish"}

// completion prints the completion script for the shell args name. The
// scripts are built from the commands and their flag sets, so they complete
// exactly what Main accepts.
func completion(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
		fmt.Fprintf(stderr, "Usage: dislock completion bash|zsh|fish\n\n%s\n\n"+
			"  bash: source <(dislock completion bash), or save it in /etc/bash_completion.d/dislock\n"+
			"  zsh:  source <(dislock completion zsh), or save it as _dislock in a directory of $fpath\n"+
			"  fish: dislock completion fish > ~/.config/fish/completions/dislock.fish\n", completionSummary)
		return exitOK
	}
	if len(args) != 1 || !slices.Contains(completionShells, args[0]) {
		fmt.Fprintf(stderr, "dislock completion: want one shell, %s; got %q\n", orList(completionShells), args)
		return exitUsage
	}
	switch args[0] {
	case "bash":
		fmt.Fprint(stdout, bashCompletion())
	case "zsh":
		// zsh runs bash's completion functions through bashcompinit.
		fmt.Fprint(stdout, "#compdef dislock\nautoload -U +X bashcompinit && bashcompinit\n"+bashCompletion())
	case "fish":
		fmt.Fprint(stdout, fishCompletion())
	}
	return exitOK
}

// commandFlags are the flags of a command, as Main registers them.
func commandFlags(name string) []*flag.Flag {
	fs, _ := commands[name].flags(name, &common{}, io.Discard)
	var out []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { out = append(out, f) })
	return out
}

func bashCompletion() string {
	var b strings.Builder
	b.WriteString("# bash completion for dislock: dislock completion bash\n_dislock() {\n")
	b.WriteString("    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} words=\n")
	top := append(slices.Clone(commandOrder), "completion")
	for _, sv := range servers {
		top = append(top, sv[0])
	}
	fmt.Fprintf(&b, "    if [[ $COMP_CWORD -eq 1 ]]; then\n        words=%q\n", strings.Join(append(top, "--version", "--help"), " "))
	b.WriteString("    else\n        case ${COMP_WORDS[1]} in\n")
	for _, name := range commandOrder {
		var names []string
		for _, f := range commandFlags(name) {
			names = append(names, flagusage.Name(f.Name))
		}
		fmt.Fprintf(&b, "        %s)\n            if [[ $prev == -o ]]; then words=%q; else words=%q; fi ;;\n",
			name, strings.Join(commands[name].outputFormats(), " "), strings.Join(append(names, "--help"), " "))
	}
	fmt.Fprintf(&b, "        completion)\n            [[ $COMP_CWORD -eq 2 ]] && words=%q ;;\n", strings.Join(completionShells, " "))
	b.WriteString("        esac\n    fi\n")
	b.WriteString("    COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n}\ncomplete -F _dislock dislock\n")
	return b.String()
}

func fishCompletion() string {
	quote := func(s string) string {
		s, _, _ = strings.Cut(s, "\n")
		return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
	}
	var b strings.Builder
	b.WriteString("# fish completion for dislock: dislock completion fish\ncomplete -c dislock -f\n")
	for _, name := range commandOrder {
		fmt.Fprintf(&b, "complete -c dislock -n __fish_use_subcommand -a %s -d %s\n", name, quote(commands[name].summary))
	}
	fmt.Fprintf(&b, "complete -c dislock -n __fish_use_subcommand -a completion -d %s\n", quote(completionSummary))
	for _, sv := range servers {
		fmt.Fprintf(&b, "complete -c dislock -n __fish_use_subcommand -a %s -d %s\n", sv[0], quote(sv[1]))
	}
	b.WriteString("complete -c dislock -n __fish_use_subcommand -l version -d 'print the version'\n")
	for _, name := range commandOrder {
		cond := "'__fish_seen_subcommand_from " + name + "'"
		for _, f := range commandFlags(name) {
			typ, usage := flag.UnquoteUsage(f)
			switch {
			case f.Name == "o":
				fmt.Fprintf(&b, "complete -c dislock -n %s -s o -x -a %s -d %s\n", cond, quote(strings.Join(commands[name].outputFormats(), " ")), quote(usage))
			case len(f.Name) == 1:
				fmt.Fprintf(&b, "complete -c dislock -n %s -s %s -d %s\n", cond, f.Name, quote(usage))
			case typ == "":
				fmt.Fprintf(&b, "complete -c dislock -n %s -l %s -d %s\n", cond, f.Name, quote(usage))
			default:
				fmt.Fprintf(&b, "complete -c dislock -n %s -l %s -x -d %s\n", cond, f.Name, quote(usage))
			}
		}
	}
	fmt.Fprintf(&b, "complete -c dislock -n '__fish_seen_subcommand_from completion' -x -a %s\n", quote(strings.Join(completionShells, " ")))
	return b.String()
}
