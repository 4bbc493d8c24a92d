package kube

// Process plumbing: starting components so that they die with the test
// process, stopping them, the watchdog that removes the temp directory after
// a test process that died, ports and waits.

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"time"

	"github.com/dislock/dislock/test/harness"
)

const (
	// readyTimeout bounds the wait for one component to become ready.
	readyTimeout = 60 * time.Second
	pollInterval = 100 * time.Millisecond
	// stopGrace is how long a component gets to exit after SIGTERM before it
	// is killed.
	stopGrace = 10 * time.Second
)

// errExited reports that a component exited while being waited for.
var errExited = errors.New("process exited")

// proc is one running component.
type proc = harness.Proc

// startProc starts a component in dir with its output appended to
// dir/<name>.log; it dies with the test process.
func startProc(dir, name, path string, args []string) (*proc, error) {
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Env = childEnv()
	return harness.StartProc("kube", dir, name, fmt.Sprintf("--- kube: %s %s", path, strings.Join(args, " ")), cmd)
}

// exitError describes how the process ended, once it has.
func exitError(p *proc) error {
	return fmt.Errorf("%s %w (%v)", p.Name(), errExited, p.State())
}

// childEnv is our environment without variables that would configure the
// components behind their flags' back: etcd reads ETCD_* as flags.
func childEnv() []string {
	return harness.ChildEnv(func(k string) bool { return strings.HasPrefix(k, "ETCD_") || k == "KUBECONFIG" })
}

// waitReady polls probe until it succeeds, p exits (an error wrapping
// errExited) or readyTimeout passes (the probe's last error).
func waitReady(p *proc, probe func() error) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		err := probe()
		if err == nil {
			return nil
		}
		if !p.Running() {
			return exitError(p)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %v: %w", p.Name(), readyTimeout, err)
		}
		time.Sleep(pollInterval)
	}
}

// httpOK GETs url and wants 200. pool (nil: system roots) verifies the
// server; token, if set, is sent as a bearer token.
func httpOK(pool *x509.CertPool, url, token string) error {
	client := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			DisableKeepAlives: true,
			Proxy:             nil,
		},
	}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// watchdogScript runs beside every Cluster. Its stdin is a pipe whose only
// writer is the test process, so `read` returns only when that process is gone
// without Close having dismissed the watchdog. The components normally die
// with the test process already (parent-death signal); the kill is a second
// line of defence. Then it removes the temp directory, which holds a 64 MB
// etcd WAL.
const watchdogScript = `
read -r _
dir="$1"
for f in "$dir"/*.pid; do [ -e "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
n=0
while [ "$n" -lt 50 ]; do
	alive=
	for f in "$dir"/*.pid; do [ -e "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && alive=1; done
	[ -z "$alive" ] && break
	sleep 0.1
	n=$((n+1))
done
rm -rf "$dir"
`

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// Another process may take one before the component binds it; Start then
// tries again with new ports.
func freePort() (int, error) { return harness.FreePort() }

// freePorts is harness.FreePorts: distinct ports.
func freePorts(n int) ([]int, error) { return harness.FreePorts(n) }

// logTail returns the last lines of a log file, for error messages.
func logTail(path string) string { return harness.LogTail(path, 30, 6144) }
