// Package kubectldislock is `kubectl dislock`: the operator's listings and
// pauses, asked of the dislock webhook of the kubeconfig's cluster through
// the API server's service proxy, with the user's own credentials and RBAC
// (webhook/pluginapi serves it). It needs no database credential and no
// network path to the database. The same binary is `dislock`; named
// kubectl-dislock (krew installs it so) it is the plugin.
package kubectldislock

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dislock/dislock/internal/flagusage"
	"github.com/dislock/dislock/webhook/pluginapi"
)

// BinaryName is the plugin's file name: kubectl runs `kubectl dislock` as
// kubectl-dislock.
const BinaryName = "kubectl-dislock"

// DefaultService is where the chart's default release serves the plugin:
// namespace/service:port, the port by its name.
const DefaultService = "dislock-system/dislock-webhook:" + pluginapi.PortName

// EnvService overrides DefaultService (--dislock-service wins over it).
const EnvService = "KUBECTL_DISLOCK_SERVICE"

// Exit codes, as dislock's.
const (
	exitError = 1
	exitUsage = 2
)

// requestTimeout bounds one call.
const requestTimeout = 60 * time.Second

// options are the plugin's flags.
type options struct {
	namespace, context, kubeconfig, service string
	// params are the command's flags that were set, by name.
	params map[string]string
}

// commandFlags are the flags passed on to the webhook, with their usage.
var commandFlags = map[string]string{
	"o":              "output format: table, json or yaml (windows: wide too), as dislock prints",
	"limit":          "list at most this many, newest first",
	"since":          "only windows that started within this duration before now, e.g. 2h",
	"from":           "only windows that started at or after this time (RFC 3339 or a date-time in --tz)",
	"to":             "only windows that started before this time",
	"tz":             "print times in this IANA time zone, e.g. Europe/Berlin",
	"fail-on-missed": "exit 3 when a missed window or a silent key is listed (true or false)",
	"for":            "end the pause by itself after this duration of database time, e.g. 2h",
	"until":          "end the pause by itself at this RFC 3339 time",
	"reason":         "why you pause, shown in every skipped pod's reason",
}

// Main runs `kubectl dislock args...` and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return 0
	}
	command := args[0]
	allowed, read := pluginapi.Reads[command]
	if !read {
		allowed = pluginapi.Writes[command]
	}
	if allowed == nil {
		fmt.Fprintf(stderr, "kubectl dislock: unknown command %q\n\n", command)
		usage(stderr)
		return exitUsage
	}
	o := options{params: map[string]string{}}
	fs := flag.NewFlagSet("kubectl dislock "+command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.namespace, "n", "", "namespace (default: the kubeconfig context's)")
	fs.StringVar(&o.namespace, "namespace", "", "namespace (default: the kubeconfig context's)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context (default: the current one)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	fs.StringVar(&o.service, "dislock-service", "", "the dislock webhook's namespace/service:port (default $"+EnvService+", else "+DefaultService+")")
	for _, name := range allowed {
		fs.Func(name, commandFlags[name], func(v string) error {
			o.params[name] = v
			return nil
		})
	}
	fs.Usage = func() {
		what := "[cronjob]"
		if !read {
			what = "<cronjob>"
		}
		fmt.Fprintf(stderr, "Usage: kubectl dislock %s %s [flags]\n\nFlags:\n", command, what)
		flagusage.Print(stderr, fs)
	}
	// Flags and the CronJob's name in any order, as kubectl takes them.
	var positional []string
	rest := args[1:]
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return exitUsage
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	var cronJob string
	switch {
	case len(positional) > 1:
		fmt.Fprintf(stderr, "kubectl dislock %s: one CronJob at a time (got %s)\n", command, strings.Join(positional, ", "))
		return exitUsage
	case len(positional) == 1:
		cronJob = positional[0]
	case !read:
		fmt.Fprintf(stderr, "kubectl dislock %s: name the CronJob (kubectl dislock %s <cronjob> [-n namespace])\n", command, command)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	reply, err := call(ctx, o, command, cronJob, read)
	if err != nil {
		fmt.Fprintf(stderr, "kubectl dislock %s: %v\n", command, err)
		return exitError
	}
	io.WriteString(stdout, reply.Stdout) //nolint:errcheck // a closed stdout has nowhere to say so
	io.WriteString(stderr, reply.Stderr) //nolint:errcheck
	return reply.ExitCode
}

func usage(w io.Writer) {
	fmt.Fprintf(w, `Usage: kubectl dislock <command> [cronjob] [flags]

Asks the dislock webhook of your kubeconfig's cluster, with your own credentials:
  windows [cronjob]   which cluster ran each window, and how it ended (needs get/list cronjobs)
  missed [cronjob]    the windows that ran nowhere (needs get/list cronjobs)
  leases [cronjob]    the leases and who holds them (needs get/list cronjobs)
  paused [cronjob]    the keys paused now (needs get/list cronjobs)
  pause <cronjob>     pause it in every cluster: its pods skip; a run already going goes on (needs patch cronjobs)
  resume <cronjob>    resume it in every cluster (needs patch cronjobs)

Run 'kubectl dislock <command> -h' for its flags.
`)
}

// service splits namespace/service:port.
func service(o options) (namespace, name string, err error) {
	s := o.service
	if s == "" {
		s = os.Getenv(EnvService)
	}
	if s == "" {
		s = DefaultService
	}
	ns, rest, ok := strings.Cut(s, "/")
	svc, port, okPort := strings.Cut(rest, ":")
	if !ok || !okPort || ns == "" || svc == "" || port == "" {
		return "", "", fmt.Errorf("--dislock-service %q is not <namespace>/<service>:<port> (e.g. %s)", s, DefaultService)
	}
	// The service proxy's name for an HTTPS port of a Service.
	return ns, "https:" + svc + ":" + port, nil
}

// call sends the request through the API server's service proxy.
func call(ctx context.Context, o options, command, cronJob string, read bool) (pluginapi.Reply, error) {
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	loading.ExplicitPath = o.kubeconfig
	kc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, &clientcmd.ConfigOverrides{CurrentContext: o.context})
	cfg, err := kc.ClientConfig()
	if err != nil {
		return pluginapi.Reply{}, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	ns := o.namespace
	if ns == "" {
		if ns, _, err = kc.Namespace(); err != nil {
			return pluginapi.Reply{}, fmt.Errorf("reading the kubeconfig's namespace: %w", err)
		}
	}
	svcNamespace, svcName, err := service(o)
	if err != nil {
		return pluginapi.Reply{}, err
	}
	token := &tokenCopier{}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(token.wrap)
	clients, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return pluginapi.Reply{}, err
	}
	var req *rest.Request
	if read {
		req = clients.CoreV1().RESTClient().Get()
	} else {
		req = clients.CoreV1().RESTClient().Post()
	}
	req = req.Namespace(svcNamespace).Resource("services").Name(svcName).SubResource("proxy")
	if read {
		req = req.Suffix("v1", "namespaces", ns, command)
		if cronJob != "" {
			req = req.Param("cronjob", cronJob)
		}
	} else {
		req = req.Suffix("v1", "namespaces", ns, "cronjobs", cronJob, command)
	}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range o.params {
			if !yield(k) {
				return
			}
		}
	}) {
		req = req.Param(name, o.params[name])
	}
	body, err := req.Do(ctx).Raw()
	var r pluginapi.Reply
	if jerr := json.Unmarshal(body, &r); jerr == nil && (r.Error != "" || err == nil) {
		if r.Error != "" {
			return r, errors.New(r.Error)
		}
		return r, nil
	}
	if err != nil {
		if token.missing() {
			return r, fmt.Errorf("%w (your kubeconfig's user signs in without a bearer token, e.g. with a client certificate, which the webhook cannot verify: use a token, e.g. from your OIDC login or kubectl create token)", err)
		}
		return r, fmt.Errorf("asking dislock through %s/%s of cluster %s: %w (is dislock installed with its plugin API, and may you get and create services/proxy there? see --dislock-service)",
			svcNamespace, svcName, cfg.Host, err)
	}
	return r, fmt.Errorf("the answer of %s/%s is not dislock's: %.200q", svcNamespace, svcName, body)
}

// tokenCopier sends the bearer token client-go authenticates with (a
// static one, a token file's, an exec plugin's) in pluginapi.TokenHeader
// too: the service proxy strips Authorization. It wraps the innermost
// transport, where the Authorization header is set.
type tokenCopier struct {
	sawNone bool
}

func (t *tokenCopier) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && tok != "" {
			r = r.Clone(r.Context())
			r.Header.Set(pluginapi.TokenHeader, tok)
		} else {
			t.sawNone = true
		}
		return rt.RoundTrip(r)
	})
}

func (t *tokenCopier) missing() bool { return t.sawNone }

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
