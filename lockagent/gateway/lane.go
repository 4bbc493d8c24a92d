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
// whole queue. A namespace holds at most maxRunningPerNamespace of the
// connections, so one whose calls wait on something of its own (a row its
// old database role keeps locked, say) cannot hold them all.
//
// The lane never keeps a connection free while a call that may take it
// waits: dispatch hands out every free connection at once.
type lane struct {
	name  string
	locks store.Locks
	// conns is how many calls run at once; maxRunningPerNamespace how many
	// of them one namespace's; maxQueued and maxQueuedPerNamespace bound
	// the waiting ones.
	conns, maxRunningPerNamespace, maxQueued, maxQueuedPerNamespace int

	mu        sync.Mutex
	running   int
	runningBy map[string]int       // by namespace, only those running
	queued    int                  // every namespace's waiting calls
	waiting   map[string][]*waiter // by namespace, oldest first
	turns     []string             // namespaces with calls waiting, in turn order
}

// waiter is one queued call: ready is closed once a connection is its.
type waiter struct {
	ready chan struct{}
	given bool
}

func newLane(name string, l store.Locks, conns, maxRunningPerNamespace, maxQueued, maxQueuedPerNamespace int) *lane {
	if maxRunningPerNamespace == 0 {
		maxRunningPerNamespace = max(1, conns-1)
	}
	return &lane{name: name, locks: l, conns: conns, maxRunningPerNamespace: maxRunningPerNamespace,
		maxQueued: maxQueued, maxQueuedPerNamespace: maxQueuedPerNamespace,
		runningBy: map[string]int{}, waiting: map[string][]*waiter{}}
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
	defer l.release(ns)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%w: the caller left before its call started", store.ErrUnavailable)
	}
	runCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return call(runCtx)
}

func (l *lane) acquire(ctx context.Context, ns string) error {
	l.mu.Lock()
	// A free connection means no waiting call may take it (dispatch), so
	// a call that may take it does at once.
	if l.running < l.conns && l.runningBy[ns] < l.maxRunningPerNamespace {
		l.start(ns)
		l.mu.Unlock()
		return nil
	}
	mine := len(l.waiting[ns])
	switch {
	case l.queued >= l.maxQueued:
		l.mu.Unlock()
		return fmt.Errorf("%w: the lock gateway's %s queue is full (%d calls waiting)", store.ErrUnavailable, l.name, l.queued)
	case mine >= l.maxQueuedPerNamespace:
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
	given := w.given
	if !given {
		l.remove(ns, w)
	}
	l.mu.Unlock()
	if given {
		// The connection became its as the caller left: pass it on.
		l.release(ns)
	}
	return fmt.Errorf("%w: the caller left before its call started", store.ErrUnavailable)
}

// start counts a call of ns as running; l.mu is held.
func (l *lane) start(ns string) {
	l.running++
	l.runningBy[ns]++
}

// release frees a connection of ns and hands out what can be.
func (l *lane) release(ns string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running--
	if l.runningBy[ns]--; l.runningBy[ns] == 0 {
		delete(l.runningBy, ns)
	}
	l.dispatch()
}

// dispatch hands each free connection to the oldest call of the next
// namespace in turn that may take one; that namespace goes to the end of
// the turns if it has more waiting. l.mu is held.
func (l *lane) dispatch() {
	for l.running < l.conns {
		i := -1
		for j, ns := range l.turns {
			if l.runningBy[ns] < l.maxRunningPerNamespace {
				i = j
				break
			}
		}
		if i < 0 {
			return
		}
		ns := l.turns[i]
		l.turns = append(l.turns[:i:i], l.turns[i+1:]...)
		w := l.waiting[ns][0]
		l.waiting[ns] = l.waiting[ns][1:]
		l.queued--
		if len(l.waiting[ns]) > 0 {
			l.turns = append(l.turns, ns)
		} else {
			delete(l.waiting, ns)
		}
		l.start(ns)
		w.given = true
		close(w.ready)
	}
}

// remove takes w, whose caller left, out of ns's queue, and ns out of the
// turns when nothing of it waits any more. l.mu is held.
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
