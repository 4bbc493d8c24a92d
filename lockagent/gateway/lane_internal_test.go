package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

// queueUp starts a call of ns on l that records its start in order and
// then waits for release; it returns once the call is queued or running.
func queueUp(t *testing.T, l *lane, ns string, order *[]string, mu *sync.Mutex, release <-chan struct{}, errs chan<- error) {
	t.Helper()
	before := l.stats()
	go func() {
		_, err := l.serve(context.Background(), ns, time.Minute, func(context.Context) (any, error) {
			mu.Lock()
			*order = append(*order, ns)
			mu.Unlock()
			<-release
			return nil, nil
		})
		errs <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for s := l.stats(); s.Queued+s.Running == before.Queued+before.Running; s = l.stats() {
		if time.Now().After(deadline) {
			t.Fatalf("the call of %s never queued", ns)
		}
		time.Sleep(time.Millisecond)
	}
}

// A namespace with many calls waiting delays another namespace's call by
// one of its calls, not by its whole queue; and past its own bound its
// calls are refused while other namespaces still queue.
func TestTheLaneTakesNamespacesInTurn(t *testing.T) {
	l := newLane("decisions", nil, 1, 0, 100, 5)
	var mu sync.Mutex
	var order []string
	release := make(chan struct{})
	errs := make(chan error, 20)
	for range 6 { // one running, five waiting: its bound
		queueUp(t, l, "busy", &order, &mu, release, errs)
	}
	_, err := l.serve(context.Background(), "busy", time.Minute, func(context.Context) (any, error) { return nil, nil })
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("busy's call past its bound: %v, want ErrUnavailable", err)
	}
	queueUp(t, l, "quiet", &order, &mu, release, errs)
	queueUp(t, l, "other", &order, &mu, release, errs)
	for range 8 {
		release <- struct{}{}
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"busy", "busy", "quiet", "other", "busy", "busy", "busy", "busy"}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("calls ran in the order %v, want %v", order, want)
	}
	if s := l.stats(); s != (LaneStats{}) {
		t.Fatalf("the lane after every call ended: %+v, want nothing running or queued", s)
	}
}

// Callers that leave while they wait, even as a connection is handed to
// them, never keep it: the lane ends with every connection free.
func TestCallersThatLeaveGiveTheirConnectionBack(t *testing.T) {
	l := newLane("decisions", nil, 2, 0, 1000, 1000)
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%7)*time.Millisecond)
			defer cancel()
			_, _ = l.serve(ctx, fmt.Sprintf("ns-%d", i%5), time.Minute, func(context.Context) (any, error) {
				time.Sleep(2 * time.Millisecond)
				return nil, nil
			})
		})
	}
	wg.Wait()
	if s := l.stats(); s != (LaneStats{}) {
		t.Fatalf("the lane after every caller left or ended: %+v, want nothing running or queued", s)
	}
	if len(l.turns) != 0 || len(l.waiting) != 0 {
		t.Fatalf("the lane keeps turns %v and waiting %v", l.turns, l.waiting)
	}
}

// A namespace whose calls are stuck (on a row its old database role keeps
// locked, say) holds all of a lane's connections but one: another
// namespace's call still runs at once, and the stuck namespace's next call
// waits for one of its own to end.
func TestANamespaceNeverHoldsEveryConnection(t *testing.T) {
	l := newLane("renewals", nil, 3, 0, 100, 100)
	var mu sync.Mutex
	var order []string
	stuck := make(chan struct{})
	errs := make(chan error, 10)
	for range 3 {
		queueUp(t, l, "stuck", &order, &mu, stuck, errs)
	}
	if s := l.stats(); s != (LaneStats{Queued: 1, Running: 2}) {
		t.Fatalf("with three calls of one namespace: %+v, want two running and one waiting", s)
	}
	if _, err := l.serve(context.Background(), "other", time.Minute, func(context.Context) (any, error) { return nil, nil }); err != nil {
		t.Fatalf("another namespace's call: %v", err)
	}
	close(stuck)
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if s := l.stats(); s != (LaneStats{}) {
		t.Fatalf("the lane at the end: %+v", s)
	}
}
