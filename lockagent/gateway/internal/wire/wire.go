// Package wire is the lock gateway's wire: the calls, their bodies, and the
// errors by kind, shared by the gateway (lockagent/gateway) and the client
// pods use (lockagent/gateway/client).
package wire

import (
	"errors"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

// The calls, as the last element of the path /v1/<call>.
const (
	Now      = "now"
	View     = "view"
	Claim    = "claim"
	Window   = "window"
	Lease    = "lease"
	Renew    = "renew"
	Finish   = "finish"
	Release  = "release"
	Decision = "decision"
)

// PathPrefix is the path of every call without its name.
const PathPrefix = "/v1/"

// MaxBody bounds a request's and a reply's body: the largest is a claim's
// view or a decision's reason, a few kilobytes. The gateway holds a queued
// call's body until it runs.
const MaxBody = 64 << 10

// Version is in every answer of the gateway (Reply.V): an answer without it
// is not the gateway's (a proxy's page, another service), and the client
// takes it for no answer at all, never for a grant.
const Version = 1

type (
	NowReply struct{ DBTime time.Time }

	ViewRequest struct {
		Key, Cluster string
		View         store.View
		Recency      time.Duration
	}

	// ViewReply holds the other clusters' differing views: an object, so
	// that every successful answer has a result.
	ViewReply struct{ Others []store.ClusterView }

	WindowRequest struct {
		Key    string
		Window time.Time
		Index  int
	}
	WindowReply struct {
		Window store.Window
		DBTime time.Time
	}

	LeaseRequest struct {
		Key   string
		Owner store.Owner
		TTL   time.Duration
	}

	FinishRequest struct {
		Key      string
		Window   time.Time
		Index    int
		Token    int64
		State    store.State
		ExitCode *int
	}
	FinishReply struct{ FinishedAt time.Time }

	ReleaseRequest struct {
		Key   string
		Token int64
	}
	ReleaseReply struct{ Released bool }

	// DecisionRequest carries the decision's Duration, which store.Decision
	// leaves out of its JSON.
	DecisionRequest struct {
		Decision store.Decision
		Duration time.Duration
	}
	Empty struct{}
)

// Reply is every answer's body: the version, and the result, the error, or
// both (a refused claim carries the holder's row with ErrWindowTaken, as
// store does).
type Reply struct {
	V      int    `json:"v"`
	Result any    `json:"result,omitempty"`
	Error  *Error `json:"error,omitempty"`
	// Waited is how long the call waited in the gateway, from its arrival
	// until it started on the database (its queue, mostly): what a grant
	// or renewal earns runs from that start (store.Claim.Waited). Absent
	// from a gateway that does not say, and then 0.
	Waited time.Duration `json:"waited,omitempty"`
}

// Error is an error on the wire: its message and its kind (kinds).
type Error struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// kinds are the store's errors by their name on the wire, most specific
// first: an error travels as the first kind it matches, and comes back
// matching every error of that kind.
var kinds = []struct {
	name string
	errs []error
}{
	{"uncertain-commit", []error{store.ErrUncertainCommit}}, // wraps ErrUnavailable
	{"tokens-held", []error{store.ErrTokensHeld, store.ErrUnavailable}},
	{"unavailable", []error{store.ErrUnavailable}},
	{"window-taken", []error{store.ErrWindowTaken}},
	{"window-stale", []error{store.ErrWindowStale}},
	{"window-lost", []error{store.ErrWindowLost}},
	{"lease-held", []error{store.ErrLeaseHeld}},
	{"lease-lost", []error{store.ErrLeaseLost}},
	{"completion-modes-disagree", []error{store.ErrCompletionModesDisagree}},
	{"key-paused", []error{store.ErrKeyPaused}},
	{"tokens-exhausted", []error{store.ErrTokensExhausted}},
	{"not-found", []error{store.ErrNotFound}},
	{"forbidden", []error{store.ErrForbidden}},
}

// KindOf names err's kind on the wire; "" for an error of no kind (a bad
// request, say), which comes back as a plain error.
func KindOf(err error) string {
	for _, k := range kinds {
		if errors.Is(err, k.errs[0]) {
			return k.name
		}
	}
	return ""
}

// remoteError is an error the gateway answered: its message, matching
// (errors.Is) every error of its kind.
type remoteError struct {
	msg  string
	errs []error
}

func (e *remoteError) Error() string   { return e.msg }
func (e *remoteError) Unwrap() []error { return e.errs }

// Err turns an answered error back into one that matches the store's
// errors of its kind. An unknown kind (a newer gateway's) matches none.
func Err(w *Error) error {
	e := &remoteError{msg: "lock gateway: " + w.Message}
	for _, k := range kinds {
		if k.name == w.Kind {
			e.errs = k.errs
		}
	}
	return e
}
