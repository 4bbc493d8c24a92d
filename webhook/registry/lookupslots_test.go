package registry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/dislock/dislock/webhook/internal/registrytest"
)

// silentRegistry is a registry that never answers: each request is
// announced on arrived (up to buffer of them) and held until the client
// gives up or release is called. Its host is host:port.
func silentRegistry(t *testing.T, buffer int) (host string, arrived <-chan struct{}, release func()) {
	t.Helper()
	held := make(chan struct{})
	came := make(chan struct{}, buffer)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case came <- struct{}{}:
		default:
		}
		select {
		case <-r.Context().Done():
		case <-held:
		}
	}))
	t.Cleanup(srv.Close)
	var once sync.Once
	return strings.TrimPrefix(srv.URL, "http://"), came, func() { once.Do(func() { close(held) }) }
}

// A tenant looping `kubectl create job --from=cronjob/x` with images from a
// registry that never answers must not make other tenants' lookups wait for
// that registry, and be denied as if their own registry were slow.
func TestOneNamespaceCannotTakeEveryRegistryLookupSlot(t *testing.T) {
	t.Parallel()
	silentHost, arrived, release := silentRegistry(t, 1024)
	t.Cleanup(release) // runs first: frees any handler still waiting

	reg := registrytest.Start(t, nil)
	registrytest.PushImage(t, reg.Host+"/quiet/app:1", v1.Config{Entrypoint: []string{"/app"}})

	// The defaults: 8 slots, of which a namespace may hold 4; a 3 s lookup
	// timeout inside a 4 s review budget.
	r := NewResolver(Options{Insecure: true})
	const noisyReviews, share = 4, DefaultMaxConcurrentLookups / 2
	start := time.Now()
	type review struct {
		images []string
		err    error
	}
	noisy := make(chan review, noisyReviews)
	for i := range noisyReviews {
		var containers []corev1.Container
		var images []string
		for j := range maxLookupsPerReview {
			image := fmt.Sprintf("%s/stuck/app:%d-%d", silentHost, i, j)
			containers = append(containers, corev1.Container{Name: fmt.Sprintf("c%d", j), Image: image})
			images = append(images, image)
		}
		go func() {
			_, err := r.Entrypoints(context.Background(), "noisy", containers, nil)
			noisy <- review{images, err}
		}()
	}
	// The noisy namespace holds every slot it may: that many of its lookups
	// are at the silent registry, and stay there until their timeout.
	for range share {
		select {
		case <-arrived:
		case <-time.After(DefaultReviewBudget):
			t.Fatal("the noisy namespace's lookups did not reach the silent registry within a review budget")
		}
	}

	got, err := r.Entrypoints(context.Background(), "quiet", []corev1.Container{epContainer(reg.Host + "/quiet/app:1")}, nil)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("the quiet namespace's lookup failed while another namespace's registry hung: %v", err)
	}
	if !slices.Equal(got["app"], []string{"/app"}) {
		t.Errorf("entrypoint %q, want [/app]", got["app"])
	}
	// Its answer came before any noisy lookup could have given up: it never
	// waited for the silent registry.
	if took >= DefaultResolveTimeout {
		t.Errorf("the quiet namespace's lookup ended %s after the noisy namespace's started, not before their %s timeout: it waited for their registry",
			took.Round(time.Millisecond), DefaultResolveTimeout)
	}

	// The noisy namespace's own lookups end inside its budget: those that
	// reached the registry as a timeout, those that never got a slot as
	// busy, naming the namespace (and never the quiet one).
	for range noisyReviews {
		rv := <-noisy
		if rv.err == nil {
			t.Fatal("a review against the silent registry succeeded")
		}
		msg := rv.err.Error()
		for _, image := range rv.images {
			if !strings.Contains(msg, fmt.Sprintf("image %q (timeout: the registry did not answer in time", image)) &&
				!strings.Contains(msg, fmt.Sprintf("image %q (busy: the registry was never asked: ", image)) {
				t.Errorf("image %s is neither a registry timeout nor a busy lookup in %q", image, msg)
			}
		}
		if strings.Contains(msg, "(busy: ") && !strings.Contains(msg, "namespace noisy holds") {
			t.Errorf("a busy denial does not say what namespace noisy holds: %q", msg)
		}
		if strings.Contains(msg, "quiet") {
			t.Errorf("a denial of namespace noisy names another namespace: %q", msg)
		}
	}
}

// A lookup that got no slot within its budget never asked its registry: it
// is denied as busy, saying what its own namespace holds, never as the
// registry's timeout, and never naming another namespace.
func TestALookupThatGetsNoSlotIsDeniedAsBusyNotAsTheRegistrysTimeout(t *testing.T) {
	t.Parallel()
	silentHost, arrived, release := silentRegistry(t, 64)

	for _, tt := range []struct {
		name    string
		holders []string // namespaces whose lookups hold the slots, one each
		waiter  string
		want    string
	}{
		{
			name: "its own namespace holds its share", holders: []string{"noisy"}, waiter: "noisy",
			want: "(busy: the registry was never asked: namespace noisy holds its share of the webhook's registry lookups (1 of 2) with its other lookups, and none of them ended in the DURATION this one could wait)",
		},
		{
			name: "other namespaces hold every slot", holders: []string{"noisy-1", "noisy-2"}, waiter: "quiet",
			want: "(busy: the registry was never asked: the webhook's registry lookups were all busy for the DURATION this one could wait; namespace quiet holds 0 of 2)",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// 2 slots, a share of 1.
			r := NewResolver(Options{Insecure: true, MaxConcurrentLookups: 2})
			held := make(chan error, len(tt.holders))
			for i, ns := range tt.holders {
				image := fmt.Sprintf("%s/held/%d:1", silentHost, i)
				go func() {
					_, err := r.Entrypoints(context.Background(), ns, []corev1.Container{epContainer(image)}, nil)
					held <- err
				}()
				<-arrived
			}
			// The API server's own deadline may end a review before the
			// budget does; the holders hold their slots for their whole
			// lookup timeout, far longer.
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			image := silentHost + "/waits:1"
			_, err := r.Entrypoints(ctx, tt.waiter, []corev1.Container{epContainer(image)}, nil)
			if err == nil {
				t.Fatal("a lookup succeeded with every slot it may use held")
			}
			t.Logf("denied: %v", err)
			want := regexp.MustCompile(strings.ReplaceAll(regexp.QuoteMeta(fmt.Sprintf("image %q %s", image, tt.want)), "DURATION", `[0-9.]+m?s`))
			if !want.MatchString(err.Error()) {
				t.Errorf("error %q, want it to match %q", err, want)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %q is not context.DeadlineExceeded", err)
			}
			for _, ns := range tt.holders {
				if ns != tt.waiter && strings.Contains(err.Error(), ns) {
					t.Errorf("the denial of namespace %s names namespace %s: %q", tt.waiter, ns, err)
				}
			}
		})
	}
	release()
}

// The slot scheduler's order: a namespace never holds more than its share,
// even with slots free; a freed slot goes to the waiting namespace holding
// the fewest, the longest-waiting one among equals; within a namespace,
// first come, first served.
func TestLookupSlotsGoToTheWaitingNamespaceHoldingFewest(t *testing.T) {
	t.Parallel()
	s := newLookupSlots(4) // a share of 2
	waiters := map[string]*slotWaiter{}
	enqueue := func(name string) {
		t.Helper()
		waiters[name] = s.enqueue(name[:1]) // "a1" is namespace a's first
	}
	granted := func() []string {
		t.Helper()
		var out []string
		for name, w := range waiters {
			select {
			case <-w.ready:
				out = append(out, name)
				delete(waiters, name)
			default:
			}
		}
		slices.Sort(out)
		return out
	}

	for _, name := range []string{"a1", "a2", "a3", "b1", "b2"} {
		enqueue(name)
	}
	if got, want := granted(), []string{"a1", "a2", "b1", "b2"}; !slices.Equal(got, want) {
		t.Fatalf("granted at once %q, want %q: namespace a holds its share of 2 while slots are free", got, want)
	}
	for _, name := range []string{"c1", "c2", "b3", "d1"} {
		enqueue(name)
	}
	if got := granted(); len(got) != 0 {
		t.Fatalf("granted %q with every slot held", got)
	}

	// Arrival order would be a3, c1, c2, b3, d1.
	for _, step := range []struct {
		release, want string
	}{
		{"a", "c1"}, // c and d hold none; c waited longer
		{"b", "d1"}, // d holds none
		{"a", "a3"}, // a holds none now, b and c hold 1 each
		{"b", "b3"}, // b holds none now, c holds 1
		{"c", "c2"}, // only c waits
	} {
		s.release(step.release)
		if got := granted(); !slices.Equal(got, []string{step.want}) {
			t.Fatalf("after a slot of %s was freed, granted %q, want [%s]", step.release, got, step.want)
		}
	}
}

func TestLookupSlotsAWaiterWhoseBudgetEndsLeavesTheQueue(t *testing.T) {
	t.Parallel()
	s := newLookupSlots(4)
	for range 2 {
		if busy, err := s.acquire(context.Background(), "a"); err != nil {
			t.Fatalf("acquire: %v (%+v)", err, busy)
		}
	}
	for range 2 {
		if busy, err := s.acquire(context.Background(), "b"); err != nil {
			t.Fatalf("acquire: %v (%+v)", err, busy)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	busy, err := s.acquire(ctx, "c")
	if err == nil {
		t.Fatal("acquire succeeded with every slot held")
	}
	if want := (slotsBusy{namespace: "c", held: 0, total: 4, share: 2, busiest: "a", busiestHeld: 2}); busy == nil || *busy != want {
		t.Errorf("busy = %+v, want %+v", busy, want)
	}
	// The canceled waiter takes no slot that is freed later.
	w := s.enqueue("d")
	s.release("a")
	select {
	case <-w.ready:
	default:
		t.Fatal("the slot a freed went to no one, or to the waiter that had left")
	}
	if held, waiting := s.inFlight("c"); held != 0 || waiting != 0 {
		t.Errorf("namespace c holds %d and waits for %d slots after its waiter left, want 0 and 0", held, waiting)
	}
}

func TestLookupSlotsShare(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ total, share int }{{1, 1}, {2, 1}, {3, 1}, {4, 2}, {8, 4}, {9, 4}, {256, 128}} {
		if got := slotShare(tt.total); got != tt.share {
			t.Errorf("slotShare(%d) = %d, want %d", tt.total, got, tt.share)
		}
	}
}
