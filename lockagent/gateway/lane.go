package gateway

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

// lane is one queue of calls and the connections that serve them. Waiting
// calls queue per namespace, and a freed connection goes to the next
// namespace in turn that has one waiting: a namespace with a thousand pods
// at the top of the hour, or one calling in a loop, delays another
// namespace's call by at most one call of each busy namespace, not by its
// whole queue.
type lane struct {
	name  string
	locks store.Locks
	// conns is how many calls run at once; maxQueued and maxPerNamespace
	// bound the waiting ones (0: no bound).
	conns, maxQueued, maxPerNamespace int

	mu      sync.Mutex
	running int
	queued  int
	waiting map[string][]*waiter // by namespace, oldest first
	turns   []string             // namespaces with calls waiting, in turn order
}

// waiter is one queued call: ready is closed once a connection is its.
type waiter struct {
	ready chan struct{}
	given bool
}

func newLane(name string, l store.Locks, conns, maxQueued, maxPerNamespace int) *lane {
	if maxPerNamespace == 0 {
		maxPerNamespace = maxQueued
	}
	return &lane{name: name, locks: l, conns: conns, maxQueued: maxQueued, maxPerNamespace: maxPerNamespace,
		waiting: map[string][]*waiter{}}
}

// LaneStats is what one lane is doing.
type LaneStats struct {
	// Queued calls wait for a connection; Running calls have one.
	Queued, Running int
}

func (l *lane) stats() LaneStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return LaneStats{Queued: l.queued, Running: l.running}
}

// serve runs call for namespace ns once one of the lane's connections is
// its, unless the queue is full or the caller left while it waited. Once
// started, call runs to its end (or timeout) whether or not the caller
// still waits: abandoning a statement mid-flight would have a pooler in
// front of PostgreSQL close the server connection, whose replacement costs
// the database a backend start.
func (l *lane) serve(ctx context.Context, ns string, timeout time.Duration, call func(context.Context) (any, error)) (any, error) {
	if err := l.acquire(ctx, ns); err != nil {
		return nil, err
	}
	defer l.release()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%w: the caller left before its call started", store.ErrUnavailable)
	}
	runCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return call(runCtx)
}

func (l *lane) acquire(ctx context.Context, ns string) error {
	l.mu.Lock()
	if l.running < l.conns && l.queued == 0 {
		l.running++
		l.mu.Unlock()
		return nil
	}
	mine := len(l.waiting[ns])
	switch {
	case l.maxQueued > 0 && l.queued >= l.maxQueued:
		l.mu.Unlock()
		return fmt.Errorf("%w: the lock gateway's %s queue is full (%d calls waiting)", store.ErrUnavailable, l.name, l.queued)
	case l.maxPerNamespace > 0 && mine >= l.maxPerNamespace:
		l.mu.Unlock()
		return fmt.Errorf("%w: namespace %s has %d calls waiting in the lock gateway's %s queue, its most", store.ErrUnavailable, ns, mine, l.name)
	}
	w := &waiter{ready: make(chan struct{})}
	if mine == 0 {
		l.turns = append(l.turns, ns)
	}
	l.waiting[ns] = append(l.waiting[ns], w)
	l.queued++
	l.mu.Unlock()

	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	if w.given {
		// The connection became its as the caller left: pass it on.
		l.mu.Unlock()
		l.release()
	} else {
		l.remove(ns, w)
		l.mu.Unlock()
	}
	return fmt.Errorf("%w: the caller left before its call started", store.ErrUnavailable)
}

// release hands the caller's connection to the oldest call of the next
// namespace in turn, which then goes to the end of the turns if it has
// more waiting, or frees it.
func (l *lane) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.turns) == 0 {
		l.running--
		return
	}
	ns := l.turns[0]
	l.turns = l.turns[1:]
	w := l.waiting[ns][0]
	l.waiting[ns] = l.waiting[ns][1:]
	l.queued--
	if len(l.waiting[ns]) > 0 {
		l.turns = append(l.turns, ns)
	} else {
		delete(l.waiting, ns)
	}
	w.given = true
	close(w.ready)
}

// remove takes w, whose caller left, out of ns's queue, and ns out of the
// turns when nothing of it waits any more.
func (l *lane) remove(ns string, w *waiter) {
	q := l.waiting[ns]
	for i, x := range q {
		if x == w {
			l.waiting[ns] = append(q[:i:i], q[i+1:]...)
			l.queued--
			break
		}
	}
	if len(l.waiting[ns]) > 0 {
		return
	}
	delete(l.waiting, ns)
	for j, t := range l.turns {
		if t == ns {
			l.turns = append(l.turns[:j:j], l.turns[j+1:]...)
			return
		}
	}
}
