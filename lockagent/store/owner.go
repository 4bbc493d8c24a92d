package store

import (
	"errors"
	"fmt"
	"strings"
)

// Owner names who claims: the pod doing the work, of a Job in a namespace of
// one cluster. Windows and leases are both owned by the pod: only the same pod
// (a restarted sidecar) re-enters a claim with its token. Another pod of the
// same Job (a retry, a replacement while the old pod terminates) waits while
// the owner is alive and takes over, with a new token, once it failed or
// lapsed; see JobPrefix.
type Owner struct {
	Cluster   string
	Namespace string
	Job       string
	JobUID    string
	Pod       string
}

// Validate lists every empty or ambiguous part.
func (o Owner) Validate() error {
	var errs []error
	for _, f := range []struct{ name, value string }{
		{"cluster", o.Cluster}, {"namespace", o.Namespace}, {"job", o.Job}, {"job UID", o.JobUID}, {"pod", o.Pod},
	} {
		switch {
		case f.value == "":
			errs = append(errs, fmt.Errorf("owner %s is empty", f.name))
		case strings.Contains(f.value, "/"):
			// '/' separates the parts of the owner string; allowing it would
			// let two different owners print the same.
			errs = append(errs, fmt.Errorf("owner %s %q contains '/'", f.name, f.value))
		}
	}
	return errors.Join(errs...)
}

// String is <cluster>/<namespace>/<job>/<job-uid>/<pod>, the owner column of
// windows and leases.
func (o Owner) String() string { return o.JobPrefix() + o.Pod }

// JobPrefix is <cluster>/<namespace>/<job>/<job-uid>/: every owner string of
// a pod of the same Job starts with it.
func (o Owner) JobPrefix() string {
	return o.Cluster + "/" + o.Namespace + "/" + o.Job + "/" + o.JobUID + "/"
}

// WindowOwner is the owner of the pod's window claims (String).
func (o Owner) WindowOwner() string { return o.String() }

// LeaseOwner is the owner of the pod's leases (String).
func (o Owner) LeaseOwner() string { return o.String() }

// SameJob reports whether an owner string belongs to a pod of the caller's
// Job, the caller's own pod included.
func (o Owner) SameJob(owner string) bool { return strings.HasPrefix(owner, o.JobPrefix()) }
