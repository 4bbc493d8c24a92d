package image

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// stage is one stage of the Dockerfile: its base, name and instructions.
type stage struct {
	base, name string
	lines      []instruction
}

type instruction struct{ cmd, args string }

// parseDockerfile reads the instructions of each stage (continuation lines
// joined, comments dropped) and the global ARGs before the first FROM.
func parseDockerfile(t *testing.T, file string) (args map[string]string, stages []stage) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	args = map[string]string{}
	var logical []string
	cur := ""
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur == "") {
			continue
		}
		if rest, ok := strings.CutSuffix(line, "\\"); ok {
			cur += rest + " "
			continue
		}
		logical = append(logical, cur+line)
		cur = ""
	}
	for _, l := range logical {
		cmd, rest, _ := strings.Cut(l, " ")
		cmd, rest = strings.ToUpper(cmd), strings.TrimSpace(rest)
		switch {
		case cmd == "FROM":
			f := strings.Fields(rest)
			f = slices.DeleteFunc(f, func(s string) bool { return strings.HasPrefix(s, "--") })
			st := stage{base: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
		case len(stages) == 0 && cmd == "ARG":
			k, v, _ := strings.Cut(rest, "=")
			args[k] = v
		case len(stages) > 0:
			stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, instruction{cmd, rest})
		}
	}
	return args, stages
}

func (s stage) all(cmd string) []string {
	var out []string
	for _, in := range s.lines {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

// TestTheDockerfileBuildsWhatTheRecipeDescribes holds the Dockerfile, which
// people with Docker build the published images from, to the recipe that
// `make image` and the e2e tests use: per image a rootfs stage running the
// recipe for that target, and a FROM scratch stage of the target's name
// copying it with the recipe's user, entrypoint, environment and labels.
func TestTheDockerfileBuildsWhatTheRecipeDescribes(t *testing.T) {
	args, stages := parseDockerfile(t, filepath.Join("..", "..", "Dockerfile"))
	byName := map[string]stage{}
	for _, s := range stages {
		byName[s.name] = s
	}
	if last := stages[len(stages)-1].name; last != Webhook.Target {
		t.Errorf("the last stage (docker build's default target) is %q, want %q", last, Webhook.Target)
	}
	dockerBuild := Build{Version: "${VERSION}", Commit: "${COMMIT}"}
	for _, im := range All() {
		t.Run(im.Target, func(t *testing.T) {
			s, ok := byName[im.Target]
			if !ok {
				t.Fatalf("no stage %q (docker build --target %s)", im.Target, im.Target)
			}
			if s.base != "scratch" {
				t.Errorf("stage %s is FROM %s, want scratch: every file comes from the recipe's rootfs", im.Target, s.base)
			}
			rootfsStage := "rootfs-" + im.Target
			if got, want := s.all("COPY"), []string{"--from=" + rootfsStage + " /rootfs/ /"}; !slices.Equal(got, want) {
				t.Errorf("stage %s copies %q, want %q", im.Target, got, want)
			}
			rs, ok := byName[rootfsStage]
			if !ok {
				t.Fatalf("no stage %s", rootfsStage)
			}
			if run := strings.Join(rs.all("RUN"), " "); !strings.Contains(run, "$RECIPE -target="+im.Target+" /rootfs") {
				t.Errorf("stage %s runs %q, want the recipe for -target=%s into /rootfs", rootfsStage, run, im.Target)
			}
			if got := s.all("USER"); !slices.Equal(got, []string{User()}) {
				t.Errorf("USER %q, want %q", got, User())
			}
			var entry []string
			if e := s.all("ENTRYPOINT"); len(e) != 1 || json.Unmarshal([]byte(e[0]), &entry) != nil {
				t.Errorf("ENTRYPOINT %q is not one JSON array", e)
			}
			if !slices.Equal(entry, im.Entrypoint()) {
				t.Errorf("ENTRYPOINT %q, want %q", entry, im.Entrypoint())
			}
			if got := s.all("ENV"); !slices.Equal(got, Env()) {
				t.Errorf("ENV %q, want %q", got, Env())
			}
			labels := map[string]string{}
			for _, l := range s.all("LABEL") {
				for _, kv := range strings.Fields(l) {
					k, v, _ := strings.Cut(kv, "=")
					labels[k] = v
				}
			}
			if want := dockerBuild.Labels(); !maps.Equal(labels, want) {
				t.Errorf("LABEL %v, want %v", labels, want)
			}
			for _, a := range []string{"ARG VERSION=" + DefaultVersion, "ARG COMMIT=" + DefaultCommit} {
				if !slices.Contains(s.all("ARG"), strings.TrimPrefix(a, "ARG ")) {
					t.Errorf("stage %s lacks %q: its labels would be empty", im.Target, a)
				}
			}
		})
	}
	// The build stage runs cmd/dislock-image from the build context: the
	// Dockerfile copies internal/ and .dockerignore lets it through.
	if !slices.Contains(byName["source"].all("COPY"), "internal/ internal/") {
		t.Error("the source stage does not COPY internal/, where the recipe lives")
	}
	ignore, err := os.ReadFile(filepath.Join("..", "..", ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Split(string(ignore), "\n"), "!internal/") {
		t.Error(".dockerignore keeps internal/ out of the build context")
	}
	// The same Go as the module asks for.
	mod, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "go " + args["GO_VERSION"]; !strings.Contains(string(mod), "\n"+want+"\n") {
		t.Errorf("Dockerfile GO_VERSION=%s, but go.mod does not say %q", args["GO_VERSION"], want)
	}
}

// standIn is a file to put where a binary goes: the tests here check the
// assembly, test/images runs real binaries.
func standIn(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(p, []byte("\x7fELF stand-in"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func testBuild() Build {
	return Build{Version: "v1.2.3", Commit: "abc1234"}.WithDefaults()
}

// entry is what an image or a rootfs holds at one path.
type entry struct {
	typ  string // dir, file, link
	mode fs.FileMode
	data string
}

// imageTree reads every layer of the image in order.
func imageTree(t *testing.T, b Build, im Image, binary string) map[string]entry {
	t.Helper()
	img, err := b.Image(im, binary)
	if err != nil {
		t.Fatal(err)
	}
	tree := map[string]entry{}
	err = Walk(img, func(hdr *tar.Header, content io.Reader) error {
		if hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("%s is owned by %d:%d, want root: the nonroot user must not be able to change it", hdr.Name, hdr.Uid, hdr.Gid)
		}
		p := "/" + strings.TrimSuffix(hdr.Name, "/")
		switch hdr.Typeflag {
		case tar.TypeDir:
			tree[p] = entry{typ: "dir", mode: hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSticky)}
		case tar.TypeSymlink:
			tree[p] = entry{typ: "link", data: hdr.Linkname}
		default:
			data, err := io.ReadAll(content)
			if err != nil {
				return err
			}
			tree[p] = entry{typ: "file", mode: hdr.FileInfo().Mode().Perm(), data: string(data)}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

func TestEachImageHoldsItsBinaryTheUsersAndCACertificatesAndNothingElse(t *testing.T) {
	b, binary := testBuild(), standIn(t)
	certs, err := os.ReadFile(b.CACerts)
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range All() {
		t.Run(im.Target, func(t *testing.T) {
			tree := imageTree(t, b, im, binary)
			var files []string
			for p, e := range tree {
				if e.typ != "dir" {
					files = append(files, p)
				}
			}
			slices.Sort(files)
			want := []string{"/etc/group", "/etc/passwd", CACertsPath, im.Path()}
			slices.Sort(want)
			// The agent image in particular: no operator CLI where a tenant
			// can exec, and nothing where the shared volume is mounted.
			if !slices.Equal(files, want) {
				t.Errorf("files %q, want %q", files, want)
			}
			if e := tree[im.Path()]; e.mode != 0o755 || e.data != "\x7fELF stand-in" {
				t.Errorf("%s: mode %v, %d bytes: not the binary, executable", im.Path(), e.mode, len(e.data))
			}
			if tree[CACertsPath].data != string(certs) {
				t.Errorf("%s is not the host's %s", CACertsPath, b.CACerts)
			}
			if !strings.Contains(tree["/etc/passwd"].data, "nonroot:x:65532:65532:") || !strings.Contains(tree["/etc/group"].data, "nonroot:x:65532:") {
				t.Errorf("no nonroot 65532 in /etc/passwd %q or /etc/group %q", tree["/etc/passwd"].data, tree["/etc/group"].data)
			}
			if e := tree["/tmp"]; e.typ != "dir" || e.mode != fs.ModeSticky|0o777 {
				t.Errorf("/tmp is %+v, want a directory with mode 1777", e)
			}
			for p := range tree {
				if p == SharedDir || strings.HasPrefix(p, SharedDir+"/") {
					t.Errorf("the image holds %s: the pod's shared volume is mounted at %s", p, SharedDir)
				}
			}

			img, err := b.Image(im, binary)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
				t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
			}
			c := cfg.Config
			if c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/" + im.Binary}) || len(c.Cmd) != 0 {
				t.Errorf("user %q entrypoint %q cmd %q, want 65532:65532, [/usr/local/bin/%s], none", c.User, c.Entrypoint, c.Cmd, im.Binary)
			}
			if !slices.Contains(c.Env, "PATH=/usr/local/bin:/usr/bin:/bin") {
				t.Errorf("env %q does not put /usr/local/bin on the PATH", c.Env)
			}
			labels := map[string]string{LabelVersion: "v1.2.3", LabelRevision: "abc1234", LabelSource: Source}
			if !maps.Equal(c.Labels, labels) {
				t.Errorf("labels %v, want %v", c.Labels, labels)
			}
		})
	}
	// The base layer is the same blob in both images: stored once.
	var bases []string
	for _, im := range All() {
		img, err := b.Image(im, binary)
		if err != nil {
			t.Fatal(err)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 2 {
			t.Fatalf("%s: %d layers (%v), want 2", im.Target, len(layers), err)
		}
		d, err := layers[0].Digest()
		if err != nil {
			t.Fatal(err)
		}
		bases = append(bases, d.String())
	}
	if bases[0] != bases[1] {
		t.Errorf("base layers differ: %q", bases)
	}
}

// The Dockerfile's images are the rootfs the recipe lays out: it must hold
// exactly what the tarball images hold, with the same modes.
func TestTheRootfsHoldsWhatTheImageHolds(t *testing.T) {
	b, binary := testBuild(), standIn(t)
	for _, im := range All() {
		t.Run(im.Target, func(t *testing.T) {
			dir := t.TempDir()
			if err := b.Rootfs(im, binary, dir); err != nil {
				t.Fatal(err)
			}
			got := map[string]entry{}
			err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
				if err != nil || p == dir {
					return err
				}
				fi, err := d.Info()
				if err != nil {
					return err
				}
				rel := "/" + filepath.ToSlash(strings.TrimPrefix(p, dir+"/"))
				if d.IsDir() {
					got[rel] = entry{typ: "dir", mode: fi.Mode() & (fs.ModePerm | fs.ModeSticky)}
					return nil
				}
				data, err := os.ReadFile(p)
				got[rel] = entry{typ: "file", mode: fi.Mode().Perm(), data: string(data)}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			want := imageTree(t, b, im, binary)
			for p, w := range want {
				if g, ok := got[p]; !ok || g.typ != w.typ || g.mode != w.mode || g.data != w.data {
					t.Errorf("rootfs %s = %s %v (%d bytes), image has %s %v (%d bytes)", p, g.typ, g.mode, len(g.data), w.typ, w.mode, len(w.data))
				}
			}
			for p := range got {
				if _, ok := want[p]; !ok {
					t.Errorf("rootfs holds %s, the image does not", p)
				}
			}
		})
	}
}

func TestBadBuildOptionsNameTheFieldAndTheFix(t *testing.T) {
	b := Build{Version: "v1 2", Commit: `a"b`, OS: "windows", Arch: "s390x", CACerts: "/nonexistent/ca.crt"}.WithDefaults()
	err := b.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`version "v1 2"`, `commit "a\"b"`, `os "windows"`, "want linux", `arch "s390x"`, "want amd64 or arm64", "/nonexistent/ca.crt", "ca-certificates"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := ByTarget("sidecar"); err == nil || !strings.Contains(err.Error(), "webhook, agent") {
		t.Errorf("ByTarget(sidecar) = %v, want the known targets named", err)
	}
	if err := testBuild().Validate(); err != nil {
		t.Errorf("defaults with a version: %v", err)
	}
}

// The recipe builds the binaries; linked into them it would only add size
// (go-containerregistry's writers) to the agent copied into every pod.
func TestTheBinariesDoNotLinkTheRecipe(t *testing.T) {
	for _, im := range All() {
		out, err := exec.Command("go", "list", "-deps", im.Package).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", im.Package, err, out)
		}
		if slices.Contains(strings.Fields(string(out)), Module+"/internal/image") {
			t.Errorf("%s imports %s/internal/image", im.Package, Module)
		}
	}
}
