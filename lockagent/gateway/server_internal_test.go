package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/lockagent/store"
)

// An agent newer than its gateway may send fields the gateway does not
// know: they are ignored, and the fields the gateway checks are still
// checked, whatever their case or order.
func TestACallWithFieldsTheGatewayDoesNotKnowStillRunsChecked(t *testing.T) {
	s := &Server{cfg: Config{Cluster: "dc-a"}}
	ok := `{"Key":"team/report","Window":"2026-12-06T06:00:00Z","Index":-1,"TTL":30000000000,
		"Owner":{"Cluster":"dc-a","Namespace":"team","Job":"j","JobUID":"u","Pod":"p"},"Pause":{"until":"tomorrow"}}`
	if _, err := prepareClaim(s, "team", []byte(ok)); err != nil {
		t.Fatalf("a claim with a field the gateway does not know: %v", err)
	}
	for name, body := range map[string]string{
		"another namespace's key, in another case": `{"key":"other/report","Owner":{"Cluster":"dc-a","Namespace":"team"}}`,
		"a key given twice, the last another's":    `{"Key":"team/report","Key":"other/report","Owner":{"Cluster":"dc-a","Namespace":"team"}}`,
		"trailing bytes":                           `{"Key":"team/report","Owner":{"Cluster":"dc-a","Namespace":"team"}} {"Key":"other/x"}`,
	} {
		if _, err := prepareClaim(s, "team", []byte(body)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A namespace whose credential is empty (a Secret key left blank) admits
// nobody, not a caller without a password.
func TestAnEmptyCredentialAdmitsNobody(t *testing.T) {
	c := StaticCredentials{"team": ""}
	if err := c.Check(context.Background(), "team", ""); err == nil {
		t.Fatal("an empty credential admitted an empty password")
	}
}

// scopeLocks is a store.Locks that fails the fuzz target when a call
// reaches it with a key, owner or cluster outside namespace "team" of
// cluster "dc-a".
type scopeLocks struct {
	t *testing.T
}

func (l scopeLocks) key(k string) {
	if !strings.HasPrefix(k, "team/") || k == "team/" {
		l.t.Fatalf("a call reached the database with key %q", k)
	}
}

func (l scopeLocks) owner(o store.Owner) {
	if o.Namespace != "team" || o.Cluster != "dc-a" {
		l.t.Fatalf("a call reached the database with owner %+v", o)
	}
}

func (l scopeLocks) Now(context.Context) (time.Time, error) { return time.Time{}, nil }
func (l scopeLocks) RecordView(_ context.Context, key, cluster string, _ store.View, _ time.Duration) ([]store.ClusterView, error) {
	l.key(key)
	if cluster != "dc-a" {
		l.t.Fatalf("a view reached the database as cluster %q", cluster)
	}
	return nil, nil
}
func (l scopeLocks) ClaimWindow(_ context.Context, r store.ClaimRequest) (store.Claim, error) {
	l.key(r.Key)
	l.owner(r.Owner)
	return store.Claim{}, nil
}
func (l scopeLocks) WindowAt(_ context.Context, key string, _ time.Time, _ int) (store.Window, time.Time, error) {
	l.key(key)
	return store.Window{}, time.Time{}, nil
}
func (l scopeLocks) AcquireLease(_ context.Context, key string, o store.Owner, _ time.Duration) (store.LeaseGrant, error) {
	l.key(key)
	l.owner(o)
	return store.LeaseGrant{}, nil
}
func (l scopeLocks) Heartbeat(_ context.Context, key string, _ time.Time, _ int, _ int64, _ time.Duration) (time.Time, time.Time, error) {
	l.key(key)
	return time.Time{}, time.Time{}, nil
}
func (l scopeLocks) Renew(_ context.Context, r store.Renewal) (store.Renewed, error) {
	if r.Key != "" {
		l.key(r.Key)
	}
	if r.LeaseKey != "" {
		l.key(r.LeaseKey)
	}
	if r.Key == "" && r.LeaseKey == "" {
		l.t.Fatal("a renewal of nothing reached the database")
	}
	return store.Renewed{}, nil
}
func (l scopeLocks) Finish(_ context.Context, key string, _ time.Time, _ int, _ int64, _ store.State, _ *int) (time.Time, error) {
	l.key(key)
	return time.Time{}, nil
}
func (l scopeLocks) ReleaseLease(_ context.Context, key string, _ int64) (bool, error) {
	l.key(key)
	return false, nil
}
func (l scopeLocks) RecordDecision(_ context.Context, d store.Decision) error {
	l.key(d.Key)
	if d.Cluster != "dc-a" {
		l.t.Fatalf("a decision reached the database as cluster %q", d.Cluster)
	}
	return nil
}
func (l scopeLocks) Close() {}

// FuzzCallBodies: whatever body a caller of namespace "team" sends to
// whichever call, the gateway answers without panicking, and nothing
// outside the namespace and the gateway's cluster reaches the database.
func FuzzCallBodies(f *testing.F) {
	f.Add("claim", `{"Key":"team/report","Owner":{"Cluster":"dc-a","Namespace":"team","Job":"j","JobUID":"u","Pod":"p"},"TTL":1}`)
	f.Add("claim", `{"Key":"other/report","key":"team/x","Owner":{"Cluster":"dc-a","Namespace":"team"}}`)
	f.Add("renew", `{"Key":"","LeaseKey":"team/x#1","LeaseToken":3}`)
	f.Add("view", `{"Key":"team/r","Cluster":"dc-a","View":{"schedule":"* * * * *"}}`)
	f.Add("decision", `{"Decision":{"key":"team/r","cluster":"dc-a","pod":"p","action":"skip"},"Duration":5}`)
	f.Add("lease", `{"Key":"team/r#0","Owner":{"Cluster":"dc-a","Namespace":"team"},"TTL":-1}`)
	f.Add("release", `{"Key":"team/r","Token":1}`)
	f.Add("finish", `{"Key":"team/r","State":"succeeded"}`)
	f.Add("window", `{"Key":"team/r","Index":-1}`)
	f.Add("now", `{}`)
	f.Fuzz(func(t *testing.T, name, body string) {
		s, err := NewServer(Config{Cluster: "dc-a", Decisions: scopeLocks{t}, Renewals: scopeLocks{t}, DecisionConns: 1, RenewalConns: 1,
			Credentials: StaticCredentials{"team": "x"}})
		if err != nil {
			t.Fatal(err)
		}
		c, ok := s.calls[name]
		if !ok {
			return
		}
		run, err := c.prepare(s, "team", []byte(body))
		if err != nil {
			return
		}
		_, _ = run(context.Background(), c.lane.locks)
	})
}
