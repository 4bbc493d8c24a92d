package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dislock/dislock/internal/version"
	"github.com/dislock/dislock/test/harness"
)

// completionScript writes what `dislock completion <shell>` prints to a
// file, and returns the file and the shell's binary.
func completionScript(t *testing.T, shell string) (script, bin string) {
	t.Helper()
	bin, err := exec.LookPath(shell)
	if err != nil {
		harness.Lacking(t, "%s is not installed (make deps installs it): %v", shell, err)
	}
	code, out, errOut := run(t, "completion", shell)
	if code != 0 {
		t.Fatalf("dislock completion %s: exit %d: %s", shell, code, errOut)
	}
	script = filepath.Join(t.TempDir(), "dislock."+shell)
	if err := os.WriteFile(script, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	return script, bin
}

func shell(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %q: %v\n%s", bin, args, err, out)
	}
	return string(out)
}

// The bash script completes commands, each command's own flags (as Main
// registers them) and -o's formats.
func TestBashCompletesCommandsFlagsAndOutputFormats(t *testing.T) {
	t.Parallel()
	script, bash := completionScript(t, "bash")
	complete := func(words ...string) string {
		t.Helper()
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = "'" + w + "'"
		}
		return strings.TrimSpace(shell(t, bash, "-c", `source "$0"; COMP_WORDS=(`+strings.Join(quoted, " ")+`); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _dislock; echo "${COMPREPLY[*]}"`, script))
	}
	for _, tc := range []struct {
		words []string
		want  string
	}{
		{[]string{"dislock", "ch"}, "check"},
		{[]string{"dislock", "co"}, "completion"},
		{[]string{"dislock", "we"}, "webhook"},
		{[]string{"dislock", "ga"}, "gateway"},
		{[]string{"dislock", "--ver"}, "--version"},
		{[]string{"dislock", "windows", "--li"}, "--limit"},
		{[]string{"dislock", "check", "--tenant"}, "--tenant-database-url"},
		{[]string{"dislock", "windows", "-o", ""}, "table wide json yaml"},
		{[]string{"dislock", "leases", "-o", ""}, "table json"},
		{[]string{"dislock", "leases", "--li"}, "--limit"},
		{[]string{"dislock", "release", "--li"}, ""},
		{[]string{"dislock", "completion", "f"}, "fish"},
	} {
		if got := complete(tc.words...); got != tc.want {
			t.Errorf("completing %q: %q, want %q", tc.words, got, tc.want)
		}
	}
}

// The zsh script loads through bashcompinit and registers the completion.
func TestZshLoadsTheCompletion(t *testing.T) {
	t.Parallel()
	script, zsh := completionScript(t, "zsh")
	got := strings.TrimSpace(shell(t, zsh, "-fc", `autoload -U compinit && compinit -u -d "$1" && source "$0" && print -r -- "${_comps[dislock]}"`,
		script, filepath.Join(t.TempDir(), "zcompdump")))
	if got != "_bash_complete -F _dislock" {
		t.Errorf("zsh registered %q for dislock, want the bash function through bashcompinit", got)
	}
}

// The fish script completes commands, flags and -o's formats, as fish's
// own completion engine runs it.
func TestFishCompletesCommandsFlagsAndOutputFormats(t *testing.T) {
	t.Parallel()
	script, fish := completionScript(t, "fish")
	complete := func(line string) []string {
		t.Helper()
		var words []string
		for l := range strings.Lines(shell(t, fish, "--no-config", "-c", `source $argv[1]; complete -C $argv[2]`, script, line)) {
			w, _, _ := strings.Cut(strings.TrimSpace(l), "\t")
			words = append(words, w)
		}
		return words
	}
	for _, tc := range []struct {
		line string
		want string
	}{
		{"dislock ch", "check"},
		{"dislock windows --li", "--limit"},
		{"dislock windows -o ", "json table wide yaml"},
		{"dislock completion ", "bash fish zsh"},
	} {
		if got := strings.Join(complete(tc.line), " "); got != tc.want {
			t.Errorf("completing %q: %q, want %q", tc.line, got, tc.want)
		}
	}
}

// dislock --version is dislock version: the version the build stamped.
func TestVersionFlagPrintsTheStampedVersion(t *testing.T) {
	// Not parallel: it sets the stamped version.
	defer func(v string) { version.Version = v }(version.Version)
	version.Version = "0.3.0"
	code, out, errOut := run(t, "--version")
	if code != 0 || !strings.HasPrefix(out, "dislock 0.3.0 (commit ") {
		t.Fatalf("dislock --version: exit %d, %q %q; want dislock 0.3.0 (commit ...)", code, out, errOut)
	}
}

// A command's -h lists its flags as the docs write them, --name.
func TestHelpWritesFlagsAsTheDocsDo(t *testing.T) {
	t.Parallel()
	code, _, errOut := run(t, "windows", "-h")
	if code != 0 || !strings.Contains(errOut, "\n  --database-url string\n") || !strings.Contains(errOut, "\n  -o string\n") || strings.Contains(errOut, "\n  -database-url") {
		t.Errorf("dislock windows -h: exit %d:\n%s", code, errOut)
	}
}

func TestCompletionRefusesAShellItHasNoScriptFor(t *testing.T) {
	t.Parallel()
	if code, _, errOut := run(t, "completion", "powershell"); code != 2 || !strings.Contains(errOut, "bash, zsh or fish") {
		t.Errorf("dislock completion powershell: exit %d, %q", code, errOut)
	}
}
