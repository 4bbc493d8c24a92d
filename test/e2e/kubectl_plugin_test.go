package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dislock/dislock/internal/kubectldislock"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/test/kube"
)

// pluginUser is a user of one data centre, as kubectl dislock runs for it:
// a kubeconfig with its own token, and kubectl with the plugin on its PATH.
type pluginUser struct {
	dc         *DC
	kubeconfig string
	path       string
}

// newPluginUser makes ServiceAccount name in Namespace of dc with
// ClusterRole role (Kubernetes' view or edit) there, and its kubeconfig.
func newPluginUser(t *testing.T, e *Env, dc *DC, name, role string) pluginUser {
	t.Helper()
	ctx := context.Background()
	cs := dc.Client
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name}}
	if _, err := cs.CoreV1().ServiceAccounts(Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: Namespace, Name: name}}}
	if _, err := cs.RbacV1().RoleBindings(Namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, name,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	config := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: %[1]s, cluster: {server: %[2]q, certificate-authority: %[3]q}}]
users: [{name: %[4]s, user: {token: %[5]q}}]
contexts: [{name: %[4]s@%[1]s, context: {cluster: %[1]s, user: %[4]s, namespace: %[6]s}}]
current-context: %[4]s@%[1]s
`, dc.Name, dc.Cluster.URL(), dc.Cluster.CAFile(), name, tr.Status.Token, Namespace)
	if err := os.WriteFile(kubeconfig, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	// kubectl finds the plugin on the PATH: the dislock binary, named as
	// krew installs it.
	plugins := filepath.Join(dir, "plugins")
	if err := os.Mkdir(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(e.dislock(), filepath.Join(plugins, kubectldislock.BinaryName)); err != nil {
		t.Fatal(err)
	}
	return pluginUser{dc: dc, kubeconfig: kubeconfig, path: plugins + string(os.PathListSeparator) + os.Getenv("PATH")}
}

// kubectl runs `kubectl args...` as the user and returns its output and
// exit code.
func (u pluginUser) kubectl(t *testing.T, args ...string) (string, int) {
	t.Helper()
	bin, err := kube.FindBinary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+u.kubeconfig, "PATH="+u.path,
		kubectldislock.EnvService+"="+WebhookNamespace+"/"+ReleaseName+"-webhook:plugin-api")
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// must runs kubectl and fails the test unless it succeeds.
func (u pluginUser) must(t *testing.T, args ...string) string {
	t.Helper()
	out, code := u.kubectl(t, args...)
	if code != 0 {
		t.Fatalf("%s: kubectl %s: exit %d\n%s", u.dc.Name, strings.Join(args, " "), code, out)
	}
	return out
}

// As users of the clusters, with no database credential: a viewer of the
// namespace lists its CronJob's windows, run in both clusters, through one
// cluster's webhook, and is refused another namespace and a pause; an
// editor pauses the CronJob through dc-b, and the next two windows' pods
// skip in both clusters, saying who paused it and why (in their
// termination message, which `kubectl get pod` shows, and in kubectl dislock
// windows -o wide); resumed through dc-a, the next window runs once.
func TestKubectlDislockReadsWindowsAndPausesEverywhereWithTheUsersOwnRBAC(t *testing.T) {
	e := Need(t)
	ctx := context.Background()
	a, b := e.DCs[0], e.DCs[1]
	viewer := newPluginUser(t, e, a, "plugin-viewer", "view")
	editorB := newPluginUser(t, e, b, "plugin-editor", "edit")
	editorA := newPluginUser(t, e, a, "plugin-editor", "edit")

	const name = "paused-report"
	cjs := suspendedEverywhereOn(t, e, name, hourly, "schedule", Ledger{})
	now := time.Now().UTC().Truncate(time.Minute)
	ticks := make([]time.Time, 5)
	for i := range ticks {
		ticks[i] = now.Add(time.Duration(i-len(ticks)+1) * time.Minute)
	}
	// One window run in dc-a, the next in dc-b.
	completeJob(t, a, createTickIn(t, a, cjs[a.Name], ticks[0], nil).Name)
	completeJob(t, b, createTickIn(t, b, cjs[b.Name], ticks[1], nil).Name)

	var rows []store.Window
	if err := json.Unmarshal([]byte(viewer.must(t, "dislock", "windows", name, "-o", "json")), &rows); err != nil {
		t.Fatal(err)
	}
	clusters := map[string]string{}
	for _, r := range rows {
		clusters[r.Start.UTC().Format(time.RFC3339)] = r.Cluster
	}
	if clusters[ticks[0].Format(time.RFC3339)] != a.Name || clusters[ticks[1].Format(time.RFC3339)] != b.Name {
		t.Fatalf("kubectl dislock windows %s in %s: %v, want window %s run in %s and %s in %s", name, a.Name, clusters,
			ticks[0].Format(time.TimeOnly), a.Name, ticks[1].Format(time.TimeOnly), b.Name)
	}
	table := viewer.must(t, "dislock", "windows", "-n", Namespace)
	if !strings.Contains(table, Namespace+"/"+name) {
		t.Errorf("kubectl dislock windows -n %s:\n%s", Namespace, table)
	}
	if out, code := viewer.kubectl(t, "dislock", "windows", "-n", OtherTeam); code == 0 || !strings.Contains(out, "may not list cronjobs in namespace "+OtherTeam) {
		t.Errorf("a viewer of %s listing %s's windows: exit %d\n%s", Namespace, OtherTeam, code, out)
	}
	if out, code := viewer.kubectl(t, "dislock", "pause", name); code == 0 || !strings.Contains(out, "may not patch cronjob "+name) {
		t.Errorf("a viewer pausing: exit %d\n%s", code, out)
	}

	out := editorB.must(t, "dislock", "pause", name, "--reason", "bad release", "--for", "1h")
	by := "system:serviceaccount:" + Namespace + ":plugin-editor"
	if !strings.Contains(out, "paused by "+by) {
		t.Fatalf("kubectl dislock pause in %s:\n%s", b.Name, out)
	}
	if out := viewer.must(t, "dislock", "paused"); !strings.Contains(out, Namespace+"/"+name) || !strings.Contains(out, "bad release") {
		t.Errorf("kubectl dislock paused in %s:\n%s", a.Name, out)
	}
	for _, tick := range ticks[2:4] {
		for _, dc := range []*DC{a, b} {
			job := createTickIn(t, dc, cjs[dc.Name], tick, nil)
			pod := completeJob(t, dc, job.Name)
			msg := AgentMessage(&pod)
			if !strings.Contains(msg, "paused by "+by) || !strings.Contains(msg, `("bad release")`) {
				t.Errorf("%s: the pod of window %s says %q, want the pause", dc.Name, tick.Format(time.TimeOnly), msg)
			}
			// What an operator sees with kubectl get pod.
			shown, err := dc.Kubectl(ctx, "--namespace", Namespace, "get", "pod", pod.Name, "-o",
				`jsonpath={.status.initContainerStatuses[?(@.name=="dislock-agent")].state.terminated.message}`)
			if err != nil || !strings.Contains(string(shown), "paused by "+by) {
				t.Errorf("%s: kubectl get pod %s: %v\n%s", dc.Name, pod.Name, err, shown)
			}
		}
	}
	wide := viewer.must(t, "dislock", "windows", name, "-o", "wide")
	for _, tick := range ticks[2:4] {
		if !strings.Contains(wide, tick.Format(time.RFC3339)) || strings.Count(wide, "paused by "+by) < 4 {
			t.Errorf("kubectl dislock windows %s -o wide does not show window %s skipped for the pause in both clusters:\n%s", name, tick.Format(time.TimeOnly), wide)
		}
	}

	if out := editorA.must(t, "dislock", "resume", name); !strings.Contains(out, "resumed "+Namespace+"/"+name) {
		t.Fatalf("kubectl dislock resume in %s:\n%s", a.Name, out)
	}
	job := createTickIn(t, a, cjs[a.Name], ticks[4], nil)
	createTickIn(t, b, cjs[b.Name], ticks[4], nil)
	completeJob(t, a, job.Name)
	completeJob(t, b, job.Name)
	var windows []string
	for _, r := range runsOf(t, e, name) {
		windows = append(windows, r.Window)
	}
	want := []string{ticks[0].Format(time.RFC3339), ticks[1].Format(time.RFC3339), ticks[4].Format(time.RFC3339)}
	if strings.Join(windows, " ") != strings.Join(want, " ") {
		t.Errorf("runs of windows %v, want %v: the two paused windows never, the others once", windows, want)
	}
}
