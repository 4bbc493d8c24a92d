// Package protocol is the file contract between the lock agent (the sidecar)
// and the wrapper in each app container. The two share an emptyDir and the
// node's kernel, nothing else: no network, no shared process namespace. So
// the agent publishes its decision, a monotonic deadline and a revocation as
// files, and the wrappers publish their results the same way. Every write is
// atomic (write a temp file, then rename), so a reader never sees half a file.
package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Paths relative to the shared directory.
const (
	BinPath      = "bin/dislock-agent"
	DecisionFile = "decision"
	DeadlineFile = "deadline"
	RevokedFile  = "revoked"
	RecordedFile = "recorded"
	ResultsDir   = "results"
	StartedDir   = "started"
)

// Action is what the app containers are told to do.
type Action string

const (
	ActionRun   Action = "run"
	ActionSkip  Action = "skip"
	ActionError Action = "error"
)

// Decision is the agent's verdict for this pod.
type Decision struct {
	Action Action `json:"action"`
	// Reason is one human sentence: why this pod runs, skips or failed.
	Reason string `json:"reason"`
	// Token is the fencing token (run only; 0 for an unlocked manual run).
	Token int64 `json:"token,omitempty"`
	// Window is the schedule window, RFC 3339 UTC, "" for a manual run.
	Window string `json:"window"`
	// Key is the effective lock key <namespace>/<name>.
	Key string `json:"key"`
	// Owner is who owns the window or lease: this pod's Job on run, the
	// other owner on skip.
	Owner string `json:"owner,omitempty"`
	// KillGrace is how long a wrapper waits between SIGTERM and SIGKILL when
	// the lease is lost; the agent sizes it to fit inside its safety margin.
	KillGrace Duration `json:"killGrace,omitempty"`
	// WindowToken and LeaseToken are the tokens of the claims behind a run
	// (0: none), so that a restarted agent can still finish them.
	WindowToken int64 `json:"windowToken,omitempty"`
	LeaseToken  int64 `json:"leaseToken,omitempty"`
	// TTL is the claim's TTL: no deadline lies further ahead than it.
	TTL Duration `json:"ttl,omitempty"`
	// DecidedAt is when the agent published a run (CLOCK_MONOTONIC ns): the
	// app-start timeout counts from it, across restarts of the agent.
	DecidedAt int64 `json:"decidedAt,omitempty"`
	// BootID is the node's boot when the agent decided. CLOCK_MONOTONIC
	// starts again at every boot while an emptyDir survives a node reboot,
	// so monotonic instants from another boot mean nothing.
	BootID string `json:"bootID,omitempty"`
	// AwaitRecord: the agent records the run's outcome as soon as every app
	// container reported, and then writes the recorded file. A wrapper whose
	// app succeeded waits for it before exiting, so that the pod does not
	// end — and the kubelet does not stop the sidecar — before the success
	// is in the database. Without it a sidecar restarted at the moment the
	// app ended could be stopped before it can handle a signal, and the
	// window lapse to a standby after it already ran.
	AwaitRecord bool `json:"awaitRecord,omitempty"`
	// Containers are the pod's app containers when AwaitRecord is set:
	// only the last of them to finish waits, so a container that finished
	// early ends (and is never restarted to run its app again).
	Containers []string `json:"containers,omitempty"`
}

// Duration marshals as a Go duration string.
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Result is what a wrapper reports about its app when it ends.
type Result struct {
	// Ran is false when the wrapper skipped or failed before starting the app.
	Ran      bool   `json:"ran"`
	ExitCode int    `json:"exitCode"`
	Signal   string `json:"signal,omitempty"`
	// Revoked: the wrapper stopped the app because the lease was lost.
	Revoked  bool      `json:"revoked,omitempty"`
	Started  time.Time `json:"started,omitzero"`
	Finished time.Time `json:"finished,omitzero"`
}

// Dir is the shared directory (DISLOCK_SHARED_DIR, /dislock in a pod).
type Dir string

// Path joins name onto the shared directory.
func (d Dir) Path(name string) string { return filepath.Join(string(d), name) }

// WriteDecision publishes the decision atomically.
func (d Dir) WriteDecision(dec Decision) error {
	b, err := json.Marshal(dec)
	if err != nil {
		return err
	}
	return writeAtomic(d.Path(DecisionFile), append(b, '\n'), 0o644)
}

// ReadDecision returns the decision, or ok=false when there is none yet.
func (d Dir) ReadDecision() (dec Decision, ok bool, err error) {
	b, err := os.ReadFile(d.Path(DecisionFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Decision{}, false, nil
	}
	if err != nil {
		return Decision{}, false, err
	}
	if err := json.Unmarshal(b, &dec); err != nil {
		return Decision{}, false, fmt.Errorf("decision file %s: %w", d.Path(DecisionFile), err)
	}
	switch dec.Action {
	case ActionRun, ActionSkip, ActionError:
		return dec, true, nil
	}
	return Decision{}, false, fmt.Errorf("decision file %s: unknown action %q", d.Path(DecisionFile), dec.Action)
}

// RemoveDecision withdraws the decision (an "error" that a restarted agent
// decides again). A missing file is not an error.
func (d Dir) RemoveDecision() error {
	if err := os.Remove(d.Path(DecisionFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// MarkStarted records, just before a wrapper starts its app, that it is about
// to: the agent's app-start timeout gives the claim up only while no wrapper
// has marked. The wrapper marks first and then checks revoked; the agent
// revokes first and then checks the marks. So either the agent sees the mark
// and keeps the claim, or the wrapper sees revoked and does not start.
func (d Dir) MarkStarted(name string, at time.Time) error {
	if !PlainName(name) {
		return fmt.Errorf("started name %q is not a plain file name (no '/', no leading '.')", name)
	}
	// A container restarted in the same pod (restartPolicy OnFailure)
	// starts anew: its earlier result must not pass for this run's.
	if err := os.Remove(filepath.Join(d.Path(ResultsDir), name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(d.Path(StartedDir), 0o755); err != nil {
		return err
	}
	b, err := json.Marshal(struct {
		Started time.Time `json:"started"`
	}{at.UTC()})
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(d.Path(StartedDir), name), append(b, '\n'), 0o644)
}

// Started lists the wrappers that marked they started their app.
func (d Dir) Started() ([]string, error) {
	entries, err := os.ReadDir(d.Path(StartedDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// WriteDeadline publishes the CLOCK_MONOTONIC instant (ns) until which the
// holder may act, with the boot it belongs to.
func (d Dir) WriteDeadline(monoNanos int64) error {
	line := strconv.FormatInt(monoNanos, 10)
	if id := BootID(); id != "" {
		line += " " + id
	}
	return writeAtomic(d.Path(DeadlineFile), []byte(line+"\n"), 0o644)
}

// ErrOtherBoot: the deadline was written before the node rebooted. The
// monotonic clock started again since, so the deadline must count as passed.
var ErrOtherBoot = errors.New("written before the node rebooted")

// ReadDeadline returns the deadline, or ok=false when none was written (the
// pod holds nothing that can expire). A deadline of an earlier boot is
// ErrOtherBoot.
func (d Dir) ReadDeadline() (monoNanos int64, ok bool, err error) {
	b, err := os.ReadFile(d.Path(DeadlineFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	num, boot, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("deadline file %s: %w", d.Path(DeadlineFile), err)
	}
	if boot != "" && boot != BootID() {
		return 0, false, fmt.Errorf("deadline file %s: %w", d.Path(DeadlineFile), ErrOtherBoot)
	}
	return v, true, nil
}

// bootIDPath is the kernel's random id of the current boot; containers can
// read it.
var bootIDPath = "/proc/sys/kernel/random/boot_id"

// BootID is the current boot's id, "" when it cannot be read (then boots are
// not told apart).
func BootID() string {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Revoke tells the wrappers the lease is lost; reason is kept for the logs.
func (d Dir) Revoke(reason string) error {
	return writeAtomic(d.Path(RevokedFile), []byte(reason+"\n"), 0o644)
}

// Revoked reports whether the lease was revoked, and why. A revoked file
// that exists but cannot be read counts as revoked: fail closed.
func (d Dir) Revoked() (bool, string) {
	b, err := os.ReadFile(d.Path(RevokedFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, ""
	case err != nil:
		return true, "revoked file unreadable: " + err.Error()
	}
	return true, strings.TrimSpace(string(b))
}

// MarkRecorded says the agent is done with the run's outcome: recorded, or
// left to lapse when it could not be (the summary says which).
func (d Dir) MarkRecorded(summary string) error {
	return writeAtomic(d.Path(RecordedFile), []byte(summary+"\n"), 0o644)
}

// Recorded reports whether the agent is done with the run's outcome. An
// unreadable file counts as not there: the wait it ends is bounded anyway.
func (d Dir) Recorded() bool {
	_, err := os.Stat(d.Path(RecordedFile))
	return err == nil
}

// WriteResult records one wrapper's result under results/<name>.
func (d Dir) WriteResult(name string, r Result) error {
	if !PlainName(name) {
		return fmt.Errorf("result name %q is not a plain file name (no '/', no leading '.')", name)
	}
	if err := os.MkdirAll(d.Path(ResultsDir), 0o755); err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(d.Path(ResultsDir), name), append(b, '\n'), 0o644)
}

// ReadResults returns every wrapper's result by name.
func (d Dir) ReadResults() (map[string]Result, error) {
	entries, err := os.ReadDir(d.Path(ResultsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]Result{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := make(map[string]Result, len(entries))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue // a write in progress
		}
		b, err := os.ReadFile(filepath.Join(d.Path(ResultsDir), e.Name()))
		if err != nil {
			return nil, err
		}
		var r Result
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("result file %s: %w", e.Name(), err)
		}
		out[e.Name()] = r
	}
	return out, nil
}

// PlainName is a file name without separators and not hidden (hidden names
// are writes in progress).
func PlainName(name string) bool {
	return name != "" && !strings.ContainsAny(name, `/\`) && !strings.HasPrefix(name, ".")
}

// MonotonicNow is CLOCK_MONOTONIC in nanoseconds. Containers of one pod share
// the node's kernel, so the agent and the wrappers read the same clock; it
// never jumps with NTP or a skewed wall clock.
func MonotonicNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err)) // cannot fail on Linux
	}
	return ts.Nano()
}

// writeAtomic writes a hidden temp file next to path and renames it over path.
func writeAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	err = errors.Join(err, f.Chmod(perm), f.Close())
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
