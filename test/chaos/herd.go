package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

// herd fires a Herd: HerdKeys other CronJobs in every cluster of the
// schedule at once, for window f.Window. Each of their pods opens its own
// connection to its cluster's PgBouncer (as a pod's agent does) and claims
// the window with the agent's statement; the winner renews every TTL/3
// with the agent's renewal until f.For has passed and records success. The
// pods are goroutines of the harness, not processes: the herd is load on
// the database and the bouncers the schedule's own pods queue behind, not
// on the machine's CPUs, which the schedule's processes need for their
// timing. The herd's keys are not the schedule's, so the checker holds only
// the schedule's key to the invariants; the herd's own calls may fail under
// the other faults and are counted, not judged.
func (r *run) herd(f Fault) {
	s := r.w.Settings
	window := r.windowStart(f.Window)
	r.fault(f.Kind, "", "", "%d other CronJobs fire in each of %d clusters with window %d; their winners run for %s",
		HerdKeys, len(r.clusters), f.Window, f.For.Round(time.Millisecond))
	// Bounded so that a cut cluster's hanging calls end with the herd.
	ctx, cancel := context.WithTimeout(context.Background(), f.For+3*s.TTL)
	defer cancel()
	var claimed, refused, renewals, failed atomic.Int64
	var wg sync.WaitGroup
	for _, cl := range r.clusters {
		for i := range HerdKeys {
			wg.Go(func() {
				o := store.Owner{Cluster: cl.name, Namespace: "chaos", Job: fmt.Sprintf("%s-herd-%d", r.name, i),
					JobUID: fmt.Sprintf("uid-%s-%s-herd-%d", cl.name, r.name, i), Pod: fmt.Sprintf("%s-herd-%d-pod", r.name, i)}
				err := herdPod(ctx, cl.bouncer.DSN(), fmt.Sprintf("%s-herd-%d", r.key, i), window, o, s.TTL, f.For, &renewals)
				switch {
				case err == nil:
					claimed.Add(1)
				case errors.Is(err, store.ErrWindowTaken):
					refused.Add(1)
				default:
					failed.Add(1)
				}
			})
		}
	}
	wg.Wait()
	r.event(Event{Kind: "herd-done", Detail: fmt.Sprintf("%d windows claimed and run, %d refused, %d renewals, %d pods failed (other faults)",
		claimed.Load(), refused.Load(), renewals.Load(), failed.Load())})
}

// herdPod is one herd pod: claim, then renew until run has passed, then
// record success, retrying while the database is unavailable as an agent
// does. ErrWindowTaken when another cluster's pod won.
func herdPod(ctx context.Context, dsn, key string, window time.Time, o store.Owner, ttl, run time.Duration, renewals *atomic.Int64) error {
	st, err := store.Open(ctx, dsn, store.Options{MaxConns: 1})
	if err != nil {
		return err
	}
	defer st.Close()
	var c store.Claim
	for {
		c, err = st.ClaimWindow(ctx, store.ClaimRequest{Key: key, Window: window, Index: store.NotIndexed, Owner: o, TTL: ttl})
		if !errors.Is(err, store.ErrUnavailable) || ctx.Err() != nil {
			break
		}
		time.Sleep(ttl / 10)
	}
	if err != nil {
		return err
	}
	end := time.After(run)
	beat := time.NewTicker(ttl / 3)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-beat.C:
			_, err := st.Renew(ctx, store.Renewal{Key: key, Window: window, Index: store.NotIndexed, WindowToken: c.Window.Token, TTL: ttl})
			switch {
			case err == nil:
				renewals.Add(1)
			case !errors.Is(err, store.ErrUnavailable):
				return err
			}
		case <-end:
			_, err := st.Finish(ctx, key, window, store.NotIndexed, c.Window.Token, store.StateSucceeded, nil)
			return err
		}
	}
}
