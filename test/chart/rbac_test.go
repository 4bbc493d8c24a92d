package chart

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/dislock/dislock/internal/tokenrecord"
	"github.com/dislock/dislock/test/kube"
)

// permission is one verb on one resource, as `kubectl auth can-i --list`
// names them (resource.group), on one object name or on all ("").
type permission struct{ resource, name, verb string }

func (p permission) String() string {
	if p.name == "" {
		return p.verb + " " + p.resource
	}
	return p.verb + " " + p.resource + "/" + p.name
}

// install is what decides the webhook's permissions.
type install struct {
	selfSigned, copier, leaderElection, plugin bool
	// Names the chart gives the objects the webhook touches by name.
	dbSecret, certSecret, configurations string
}

// need is one permission the webhook's code uses, where, and when.
type need struct {
	resource, name string // name: "db", "cert", "configurations", "lease", "record" or "" (all)
	verbs          []string
	releaseOnly    bool // granted in the release namespace only
	when           func(install) bool
	why            string
}

func always(install) bool           { return true }
func selfSigned(i install) bool     { return i.selfSigned }
func copier(i install) bool         { return i.copier }
func leaderElection(i install) bool { return i.leaderElection }
func plugin(i install) bool         { return i.plugin }

// objectName resolves n.name for an install.
func (n need) objectName(i install) string {
	switch n.name {
	case "db":
		return i.dbSecret
	case "cert":
		return i.certSecret
	case "configurations":
		return i.configurations
	case "lease":
		return "dislock-webhook" // LeaderElectionID in main.go
	case "record":
		return tokenrecord.Name
	}
	return ""
}

// needs is the permission list derived from the code (webhook/, main.go and
// the libraries they call); the chart must grant exactly these.
var needs = []need{
	{"cronjobs.batch", "", []string{"get", "list", "watch"}, false, always,
		"the manager's cache holds CronJobs (SetupWithManager starts the informer); jobMutator.cronJob reads a new one directly"},
	{"secrets", "", []string{"get"}, false, always,
		"jobMutator.pullSecrets reads a Job's image pull secrets directly; secretCopier reads an existing copy directly"},
	{"serviceaccounts", "", []string{"get"}, false, always,
		"jobMutator.pullSecrets reads the pod's service account directly for its image pull secrets, when the pod lists none"},
	{"events.events.k8s.io", "", []string{"create", "patch"}, false, always,
		"DislockInjected and DislockDenied events on the CronJob (mgr.GetEventRecorder: events.k8s.io/v1, series are patched); the outcome controller's and the ledger metrics' Events too"},
	{"pods", "", []string{"list", "watch", "patch"}, false, always,
		"outcomeRecorder: For(&Pod{}) through the cache (CacheOptions: pods of injected Jobs by label) and the outcome label on each finished one"},
	{"jobs.batch", "", []string{"get", "patch"}, false, always,
		"outcomeRecorder reads a finished pod's Job directly (its outcomes of every index, and its CronJob) and labels it with a merge patch"},
	{"namespaces", "", []string{"list", "watch"}, false, copier,
		"secretCopier: For(&Namespace{}) and the List of opted-in namespaces, both from the cache"},
	{"secrets", "", []string{"list", "watch", "create"}, false, copier,
		"CacheOptions caches the copies by label in every namespace; secretCopier creates them"},
	{"secrets", "db", []string{"update", "delete"}, false, copier,
		"secretCopier updates and deletes copies, which carry the database Secret's name"},
	{"mutatingwebhookconfigurations.admissionregistration.k8s.io", "", []string{"list", "watch"}, false, selfSigned,
		"cert-controller's rotator caches the webhook configurations"},
	{"validatingwebhookconfigurations.admissionregistration.k8s.io", "", []string{"list", "watch"}, false, selfSigned,
		"cert-controller's rotator caches the webhook configurations"},
	{"mutatingwebhookconfigurations.admissionregistration.k8s.io", "configurations", []string{"update"}, false, selfSigned,
		"the rotator writes the caBundle"},
	{"validatingwebhookconfigurations.admissionregistration.k8s.io", "configurations", []string{"update"}, false, selfSigned,
		"the rotator writes the caBundle"},
	{"secrets", "", []string{"list", "watch"}, true, selfSigned,
		"the rotator's cache of its namespace's Secrets"},
	{"secrets", "cert", []string{"update"}, true, selfSigned,
		"the rotator stores the CA and the serving certificate in its Secret"},
	{"tokenreviews.authentication.k8s.io", "", []string{"create"}, false, plugin,
		"pluginapi.Handler asks who sent a kubectl dislock request (TokenReview)"},
	{"subjectaccessreviews.authorization.k8s.io", "", []string{"create"}, false, plugin,
		"pluginapi.Handler asks whether the caller may get, list or patch the CronJobs (SubjectAccessReview)"},
	{"configmaps", "", []string{"create"}, true, always,
		"tokenKeeper creates the token record (tokenrecord.Raise) when there is none"},
	{"configmaps", "record", []string{"get", "update"}, true, always,
		"tokenKeeper reads the token record directly (mgr.GetAPIReader) and raises it"},
	{"leases.coordination.k8s.io", "", []string{"create"}, true, leaderElection,
		"controller-runtime's leader election creates the Lease dislock-webhook"},
	{"leases.coordination.k8s.io", "lease", []string{"get", "update"}, true, leaderElection,
		"leader election reads and renews it"},
	{"events", "", []string{"create", "patch"}, true, leaderElection,
		"leader election records who leads as core/v1 events in the Lease's namespace"},
}

// want is the set of permissions needs grants in the release namespace
// (release true) or in any other.
func want(i install, release bool) map[permission]bool {
	out := map[permission]bool{}
	for _, n := range needs {
		if !n.when(i) || n.releaseOnly && !release {
			continue
		}
		for _, v := range n.verbs {
			out[permission{n.resource, n.objectName(i), v}] = true
		}
	}
	return out
}

// The ServiceAccount the chart binds may do what the webhook's code does,
// and nothing more: `kubectl auth can-i --list` impersonating it, minus what
// any authenticated ServiceAccount may do, equals the list derived from the
// code, in the release namespace and in any other, for each combination of
// features that changes the RBAC.
func TestTheServiceAccountMayDoWhatTheCodeNeedsAndNothingMore(t *testing.T) {
	c := kube.Need(t)
	for _, tc := range []struct {
		name, release string
		vals          map[string]any
		install       install
	}{
		{"own certificates, Secret copies, leader election, kubectl dislock (the defaults)", "rbac-defaults", base(),
			install{selfSigned: true, copier: true, leaderElection: true, plugin: true}},
		{"cert-manager", "rbac-certmanager", base("certManager.enabled", true),
			install{copier: true, leaderElection: true, plugin: true}},
		{"cert-manager, no Secret copies, no leader election, no kubectl dislock", "rbac-minimal",
			base("certManager.enabled", true, "database.copyToNamespaces", false, "webhook.leaderElection.enabled", false,
				"kubectlPlugin.enabled", false), install{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.release
			kubectl(t, c, nil, "create", "namespace", ns)
			m := helmTemplate(t, tc.release, ns, tc.vals)
			tc.install.dbSecret = "dislock-db"
			tc.install.certSecret = tc.release + "-dislock-webhook-cert"
			tc.install.configurations = tc.release + "-dislock-webhook"
			rbac := m.only("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
			kubectl(t, c, rbac.yaml(t), "apply", "--server-side", "-f", "-")
			t.Cleanup(func() { kubectl(t, c, rbac.yaml(t), "delete", "-f", "-") })
			sa := "system:serviceaccount:" + ns + ":" + m.one(t, "ServiceAccount").GetName()
			nobody := "system:serviceaccount:" + ns + ":nobody"
			for _, where := range []struct {
				ns      string
				release bool
			}{{ns, true}, {"default", false}} {
				granted := minus(canI(t, c, where.ns, sa), canI(t, c, where.ns, nobody))
				if extra, missing := compare(granted, want(tc.install, where.release)); len(extra)+len(missing) > 0 {
					t.Errorf("in namespace %s the ServiceAccount\n  may also: %v\n  may not: %v", where.ns, extra, missing)
				}
			}
		})
	}
}

// kubectl dislock comes through the API server's service proxy: the chart
// lets every authenticated user reach the plugin's port of the webhook's
// Service that way, and no other port (the admission port answers reviews
// for anyone who reaches it), and what they see there is what their own
// RBAC on CronJobs allows (test/integration, test/e2e).
func TestTheChartOpensOnlyThePluginPortToAuthenticatedUsersThroughTheProxy(t *testing.T) {
	c := kube.Need(t)
	const ns = "rbac-plugin"
	kubectl(t, c, nil, "create", "namespace", ns)
	m := helmTemplate(t, ns, ns, base())
	rbac := m.only("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
	kubectl(t, c, rbac.yaml(t), "apply", "--server-side", "-f", "-")
	t.Cleanup(func() { kubectl(t, c, rbac.yaml(t), "delete", "-f", "-") })
	svc := ns + "-dislock-webhook"
	anyone := "system:serviceaccount:default:anyone"
	for _, tc := range []struct {
		verb, name string
		want       string
	}{
		{"get", "https:" + svc + ":plugin-api", "yes"},
		{"create", "https:" + svc + ":plugin-api", "yes"},
		{"delete", "https:" + svc + ":plugin-api", "no"},
		{"get", "https:" + svc + ":webhook", "no"},
		{"create", "https:" + svc + ":webhook", "no"},
		{"get", "https:" + svc + ":metrics", "no"},
		{"get", svc, "no"},
	} {
		out, _ := run(nil, tool(t, "kubectl"), "--kubeconfig", c.Kubeconfig(), "auth", "can-i", tc.verb, "services/"+tc.name,
			"--subresource=proxy", "--namespace", ns, "--as", anyone)
		if got := strings.TrimSpace(string(out)); got != tc.want {
			t.Errorf("may an authenticated user %s services/%s/proxy in %s? %q, want %q", tc.verb, tc.name, ns, got, tc.want)
		}
	}
	// Turned off, nothing is opened.
	off := helmTemplate(t, ns, ns, base("kubectlPlugin.enabled", false))
	for _, o := range off.only("Role", "RoleBinding") {
		if strings.HasSuffix(o.GetName(), "-kubectl-plugin") {
			t.Errorf("kubectlPlugin.enabled=false still renders %s %s", o.GetKind(), o.GetName())
		}
	}
}

// only keeps the objects of these kinds.
func (m manifest) only(kinds ...string) manifest {
	var out manifest
	for _, o := range m {
		for _, k := range kinds {
			if o.GetKind() == k {
				out = append(out, o)
			}
		}
	}
	return out
}

// canI runs `kubectl auth can-i --list` as user in ns. Its table has no
// machine-readable form, so the columns are cut where the header's are.
func canI(t *testing.T, c *kube.Cluster, ns, user string) map[permission]bool {
	t.Helper()
	out := kubectl(t, c, nil, "auth", "can-i", "--list", "--namespace", ns, "--as", user)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := lines[0]
	cols := []int{0, strings.Index(header, "Non-Resource URLs"), strings.Index(header, "Resource Names"), strings.Index(header, "Verbs")}
	if !strings.HasPrefix(header, "Resources") || cols[1] < 0 || cols[2] < 0 || cols[3] < 0 {
		t.Fatalf("unexpected can-i header %q", header)
	}
	cell := func(line string, i int) string {
		end := len(line)
		if i+1 < len(cols) {
			end = min(cols[i+1], len(line))
		}
		if cols[i] >= end {
			return ""
		}
		return strings.TrimSpace(line[cols[i]:end])
	}
	list := func(s string) []string { return strings.Fields(strings.Trim(s, "[]")) }
	got := map[permission]bool{}
	for _, line := range lines[1:] {
		resource, urls, names, verbs := cell(line, 0), list(cell(line, 1)), list(cell(line, 2)), list(cell(line, 3))
		if resource == "" {
			for _, u := range urls {
				for _, v := range verbs {
					got[permission{"url:" + u, "", v}] = true
				}
			}
			continue
		}
		if len(names) == 0 {
			names = []string{""}
		}
		for _, n := range names {
			for _, v := range verbs {
				got[permission{resource, n, v}] = true
			}
		}
	}
	return got
}

func minus(a, b map[permission]bool) map[permission]bool {
	out := map[permission]bool{}
	for p := range a {
		if !b[p] {
			out[p] = true
		}
	}
	return out
}

// compare returns what got has beyond want, and what it lacks, sorted.
func compare(got, want map[permission]bool) (extra, missing []string) {
	for p := range got {
		if !want[p] {
			extra = append(extra, p.String())
		}
	}
	for p := range want {
		if !got[p] {
			missing = append(missing, fmt.Sprintf("%s (%s)", p, whyOf(p)))
		}
	}
	sort.Strings(extra)
	sort.Strings(missing)
	return extra, missing
}

func whyOf(p permission) string {
	for _, n := range needs {
		if n.resource == p.resource {
			for _, v := range n.verbs {
				if v == p.verb {
					return n.why
				}
			}
		}
	}
	return "?"
}
