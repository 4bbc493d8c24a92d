package lock

import (
	"errors"
	"fmt"
	"strings"
)

// Owner names who claims: a Job in a namespace of one cluster, and the pod
// doing the work. Windows are owned by the Job (so the Job controller's
// retries re-enter); leases by the pod (so only a restarted sidecar of the
// same pod re-enters, and a retry pod waits for the old pod's lease).
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

// WindowOwner is <cluster>/<namespace>/<job>/<job-uid>.
func (o Owner) WindowOwner() string {
	return o.Cluster + "/" + o.Namespace + "/" + o.Job + "/" + o.JobUID
}

// LeaseOwner is <cluster>/<namespace>/<job>/<job-uid>/<pod>.
func (o Owner) LeaseOwner() string { return o.WindowOwner() + "/" + o.Pod }

// SameJob reports whether a lease owner string belongs to another pod of the
// caller's Job (a retry must wait for the lease, never skip).
func (o Owner) SameJob(leaseOwner string) bool {
	return strings.HasPrefix(leaseOwner, o.WindowOwner()+"/")
}
