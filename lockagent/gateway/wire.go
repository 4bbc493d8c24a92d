package gateway

import (
	"errors"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

// The calls, as the last element of the path /v1/<call>.
const (
	callNow      = "now"
	callView     = "view"
	callClaim    = "claim"
	callWindow   = "window"
	callLease    = "lease"
	callRenew    = "renew"
	callFinish   = "finish"
	callRelease  = "release"
	callDecision = "decision"
)

// pathPrefix is the path of every call without its name.
const pathPrefix = "/v1/"

// maxBody bounds a request's and a reply's body: the largest is a claim's
// view or a decision's reason, a few kilobytes.
const maxBody = 1 << 20

type (
	nowReply struct{ DBTime time.Time }

	viewRequest struct {
		Key, Cluster string
		View         store.View
		Recency      time.Duration
	}

	windowRequest struct {
		Key    string
		Window time.Time
		Index  int
	}
	windowReply struct {
		Window store.Window
		DBTime time.Time
	}

	leaseRequest struct {
		Key   string
		Owner store.Owner
		TTL   time.Duration
	}

	finishRequest struct {
		Key      string
		Window   time.Time
		Index    int
		Token    int64
		State    store.State
		ExitCode *int
	}
	finishReply struct{ FinishedAt time.Time }

	releaseRequest struct {
		Key   string
		Token int64
	}
	releaseReply struct{ Released bool }

	// decisionRequest carries the decision's Duration, which store.Decision
	// leaves out of its JSON.
	decisionRequest struct {
		Decision store.Decision
		Duration time.Duration
	}
	emptyReply struct{}
)

// reply is every answer's body: the result, the error, or both (a refused
// claim carries the holder's row with ErrWindowTaken, as store does).
type reply struct {
	Result any        `json:"result,omitempty"`
	Error  *wireError `json:"error,omitempty"`
}

// wireError is an error on the wire: its message and its kind (kinds).
type wireError struct {
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
	{"tokens-exhausted", []error{store.ErrTokensExhausted}},
	{"not-found", []error{store.ErrNotFound}},
	{"forbidden", []error{store.ErrForbidden}},
}

// kindOf names err's kind on the wire; "" for an error of no kind (a bad
// request, say), which comes back as a plain error.
func kindOf(err error) string {
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

// fromWire turns an answered error back into one that matches the store's
// errors of its kind. An unknown kind (a newer gateway's) matches none.
func fromWire(w *wireError) error {
	e := &remoteError{msg: "lock gateway: " + w.Message}
	for _, k := range kinds {
		if k.name == w.Kind {
			e.errs = k.errs
		}
	}
	return e
}
