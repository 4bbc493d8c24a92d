package registry

import (
	"container/list"
	"context"
	"sync"
)

// lookupSlots shares the webhook's registry-lookup slots among namespaces.
//
// The rule: a namespace holds at most half of the slots (at least one), and
// a freed slot goes to the waiting namespace that holds the fewest, the one
// whose oldest waiter has waited longest among equals; within a namespace,
// first come, first served.
//
// Why: the registry is named by the tenant's image, so a tenant creating
// Jobs in a loop from images whose registry never answers keeps every slot
// it gets for a whole lookup timeout. Served in arrival order from one pool,
// its waiters would always be ahead of everyone else's: other tenants'
// lookups would wait out the review budget and be denied as if their own
// registry were slow, and their CronJob ticks would be lost. With the cap,
// half the slots stay for the other namespaces whatever one namespace does;
// with the order, a namespace holding nothing is served before any that
// holds slots already. A tenant with several namespaces gets a share in each:
// the cap bounds a namespace, not a tenant.
type lookupSlots struct {
	total, share int

	mu     sync.Mutex
	free   int
	held   map[string]int        // by namespace; no zero entries
	queues map[string]*list.List // of *slotWaiter, by namespace, oldest first; no empty lists
	seq    uint64                // order of arrival, across namespaces
}

// slotWaiter is one lookup's claim on a slot: granted at once, or queued.
type slotWaiter struct {
	namespace string
	seq       uint64
	elem      *list.Element // in its namespace's queue, while queued
	ready     chan struct{} // closed when the slot is granted
	granted   bool          // under lookupSlots.mu
}

// slotShare is the most slots one namespace holds at once: half of them, at
// least one.
func slotShare(total int) int { return max(1, total/2) }

func newLookupSlots(total int) *lookupSlots {
	return &lookupSlots{
		total: total, share: slotShare(total), free: total,
		held: map[string]int{}, queues: map[string]*list.List{},
	}
}

// slotsBusy is why a lookup never got a slot: it says what the slots were
// held by when the wait ended.
type slotsBusy struct {
	namespace string
	held      int // by namespace
	total     int
	share     int
	// busiest is the namespace holding the most slots, and how many; it is
	// for the webhook's log, never for the tenant, who is not told about
	// other namespaces.
	busiest     string
	busiestHeld int
}

// acquire waits for a slot for namespace until ctx ends. On success the
// caller must call release(namespace) once the lookup is over; on failure
// busy says what held the slots when the wait ended.
func (s *lookupSlots) acquire(ctx context.Context, namespace string) (busy *slotsBusy, err error) {
	return s.wait(ctx, s.enqueue(namespace))
}

// enqueue grants namespace a slot at once when the rule allows (see
// lookupSlots), else queues it behind the namespace's earlier waiters.
func (s *lookupSlots) enqueue(namespace string) *slotWaiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	w := &slotWaiter{namespace: namespace, seq: s.seq, ready: make(chan struct{})}
	// A free slot with waiters left means every waiter's namespace holds
	// its share (dispatch hands out slots otherwise), so a namespace below
	// its share may take it; one with waiters of its own queues behind them.
	if s.free > 0 && s.held[namespace] < s.share && s.queues[namespace] == nil {
		s.grant(w)
		return w
	}
	q := s.queues[namespace]
	if q == nil {
		q = list.New()
		s.queues[namespace] = q
	}
	w.elem = q.PushBack(w)
	return w
}

// wait waits for w's slot until ctx ends; see acquire.
func (s *lookupSlots) wait(ctx context.Context, w *slotWaiter) (*slotsBusy, error) {
	select {
	case <-w.ready:
		if ctx.Err() == nil {
			return nil, nil
		}
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.granted {
		// Granted as the context ended: the lookup could not start, and
		// would be reported as the registry's timeout. The slot goes on
		// to the next waiter.
		s.put(w.namespace)
	} else {
		q := s.queues[w.namespace]
		q.Remove(w.elem)
		if q.Len() == 0 {
			delete(s.queues, w.namespace)
		}
	}
	busy := s.busy(w.namespace)
	s.dispatch()
	return busy, ctx.Err()
}

// release gives back a slot namespace acquired.
func (s *lookupSlots) release(namespace string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.put(namespace)
	s.dispatch()
}

// grant gives w a free slot; s.mu is held.
func (s *lookupSlots) grant(w *slotWaiter) {
	s.free--
	s.held[w.namespace]++
	w.granted = true
	close(w.ready)
}

// put takes back a slot of namespace; s.mu is held.
func (s *lookupSlots) put(namespace string) {
	if s.held[namespace]--; s.held[namespace] <= 0 {
		delete(s.held, namespace)
	}
	s.free++
}

// dispatch hands free slots to waiters by the rule (see lookupSlots); s.mu
// is held.
func (s *lookupSlots) dispatch() {
	for s.free > 0 {
		next, nextHeld, nextSeq := "", 0, uint64(0)
		for ns, q := range s.queues {
			h := s.held[ns]
			if h >= s.share {
				continue
			}
			seq := q.Front().Value.(*slotWaiter).seq
			if next == "" || h < nextHeld || h == nextHeld && seq < nextSeq {
				next, nextHeld, nextSeq = ns, h, seq
			}
		}
		if next == "" {
			return
		}
		q := s.queues[next]
		w := q.Remove(q.Front()).(*slotWaiter)
		if q.Len() == 0 {
			delete(s.queues, next)
		}
		s.grant(w)
	}
}

// busy describes the slots for a waiter of namespace that got none; s.mu is
// held.
func (s *lookupSlots) busy(namespace string) *slotsBusy {
	b := &slotsBusy{namespace: namespace, held: s.held[namespace], total: s.total, share: s.share}
	for ns, h := range s.held {
		if h > b.busiestHeld || h == b.busiestHeld && ns < b.busiest {
			b.busiest, b.busiestHeld = ns, h
		}
	}
	return b
}

// inFlight returns how many slots namespace holds and how many of its
// lookups wait for one.
func (s *lookupSlots) inFlight(namespace string) (held, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.queues[namespace]; q != nil {
		waiting = q.Len()
	}
	return s.held[namespace], waiting
}
