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
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
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

// spawnRequests feeds the spawner goroutine.
var (
	spawnOnce     sync.Once
	spawnRequests chan spawnRequest
)

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan<- error
}

// spawn starts cmd from the spawner's OS thread. The children get SIGKILL as
// their parent-death signal, so that they die with the test process even when
// it is killed with SIGKILL and nothing of ours runs. Linux sends that signal
// when the *thread* that forked the child exits, not the process, and Go
// retires threads freely; so every child is forked by one goroutine that
// locks its thread and never returns, which keeps that thread alive exactly
// as long as the process.
func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnRequests = make(chan spawnRequest)
		go spawner()
	})
	done := make(chan error, 1)
	spawnRequests <- spawnRequest{cmd: cmd, done: done}
	return <-done
}

func spawner() {
	runtime.LockOSThread() // never unlocked: see spawn
	for r := range spawnRequests {
		r.done <- r.cmd.Start()
	}
}

// proc is one running component.
type proc struct {
	name string
	cmd  *exec.Cmd
	// exited is closed once the process has been reaped.
	exited chan struct{}
	// pidFile tells the watchdog whom to kill; removed once reaped.
	pidFile string
	logFile string
}

// startProc starts a component in dir with its output appended to
// dir/<name>.log.
func startProc(dir, name, path string, args []string) (*proc, error) {
	logFile := filepath.Join(dir, name+".log")
	out, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kube: starting %s: %w", name, err)
	}
	fmt.Fprintf(out, "--- kube: %s %s\n", path, strings.Join(args, " "))
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Env = childEnv()
	// Output goes straight to the file: no copying goroutine, and nothing is
	// lost if the component dies early.
	cmd.Stdout, cmd.Stderr = out, out
	// Own process group: a ^C aimed at `go test` must not reach the
	// components first; Close (or the parent-death signal) stops them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = spawn(cmd)
	out.Close()
	if err != nil {
		return nil, fmt.Errorf("kube: starting %s: %w", name, err)
	}
	p := &proc{
		name:    name,
		cmd:     cmd,
		exited:  make(chan struct{}),
		pidFile: filepath.Join(dir, name+".pid"),
		logFile: logFile,
	}
	_ = os.WriteFile(p.pidFile, fmt.Appendf(nil, "%d\n", cmd.Process.Pid), 0o644)
	go func() {
		_ = cmd.Wait()
		_ = os.Remove(p.pidFile)
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, then SIGKILL after stopGrace, and waits until the
// process has been reaped. Stopping an exited process is a no-op.
func (p *proc) stop() error {
	if !p.running() {
		return nil
	}
	pid := p.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(stopGrace):
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	select {
	case <-p.exited:
		return nil
	case <-time.After(stopGrace):
		return fmt.Errorf("kube: %s (pid %d) still running %v after SIGKILL", p.name, pid, stopGrace)
	}
}

// exitError describes how the process ended, once it has.
func (p *proc) exitError() error {
	return fmt.Errorf("%s %w (%v)", p.name, errExited, p.cmd.ProcessState)
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
		if !p.running() {
			return p.exitError()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %v: %w", p.name, readyTimeout, err)
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
