package cli

import (
	"context"
	"flag"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dislock/dislock/internal/kubeconfig"
	"github.com/dislock/dislock/internal/tokenrecord"
	"github.com/dislock/dislock/lockagent/store/check"
	"github.com/dislock/dislock/lockagent/store/ledger"
)

// tokenFloor is the highest fencing token recorded outside the database,
// from --token-floor and --token-record: what `dislock check` compares
// the database with and `dislock tokens` moves the epoch past.
type tokenFloor struct {
	floor      int64
	record     string
	kubeconfig string
}

func (f *tokenFloor) flags(fs *flag.FlagSet) {
	fs.Int64Var(&f.floor, "token-floor", 0, "the highest fencing token recorded for this database (the highest highWater of every cluster's token record)")
	fs.StringVar(&f.record, "token-record", "", "<namespace>/"+tokenrecord.Name+": read the recorded high water from this cluster's token record (with --kubeconfig)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster whose --token-record is read (default: in-cluster, or $KUBECONFIG)")
}

// resolve reads the record, if one was named: the floor is the higher of
// it and --token-floor. from says where it came from. A record that does
// not exist is an error unless the caller will create it.
func (f *tokenFloor) resolve(ctx context.Context, creates bool) (floor int64, from string, rec *recordRef, err error) {
	floor, from = f.floor, ""
	if f.floor < 0 {
		return 0, "", nil, usageError{fmt.Errorf("--token-floor %d: want a token, 0 or more", f.floor)}
	}
	if f.floor > 0 {
		from = "--token-floor"
	}
	if f.record == "" {
		return floor, from, nil, nil
	}
	key, err := tokenrecord.ParseRef(f.record)
	if err != nil {
		return 0, "", nil, usageError{err}
	}
	cfg, err := kubeconfig.Load(f.kubeconfig)
	if err != nil {
		return 0, "", nil, err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return 0, "", nil, err
	}
	r, found, err := tokenrecord.Read(ctx, c, key)
	if err != nil {
		return 0, "", nil, err
	}
	if !found && !creates {
		return 0, "", nil, fmt.Errorf("there is no token record %s: name the namespace the webhook runs in (its elected replica writes the record within seconds of its start)", key)
	}
	if r.HighWater > floor {
		floor = r.HighWater
		from = fmt.Sprintf("token record %s (written by %s at %s)", key, r.Cluster, r.RecordedAt.Format(time.RFC3339))
	}
	return floor, from, &recordRef{c: c, key: key}, nil
}

// recordRef is a token record the command may raise after it moved the
// epoch.
type recordRef struct {
	c   client.Client
	key types.NamespacedName
}

func setupTokens(fs *flag.FlagSet) func(context.Context, *common) error {
	var f tokenFloor
	f.flags(fs)
	newEpoch := fs.Bool("new-epoch", false, "move to a new epoch, starting the counter again: after every restore of the database, and when dislock check says the counter fills")
	return func(ctx context.Context, c *common) error {
		floor, from, ref, err := f.resolve(ctx, true)
		if err != nil {
			return err
		}
		st, err := ledger.KeepTokens(ctx, c.store, floor, *newEpoch)
		if err != nil {
			return err
		}
		recorded := ""
		if ref != nil {
			r, err := tokenrecord.Raise(ctx, ref.c, ref.c, ref.key, tokenrecord.Record{HighWater: st.HighWater, Epoch: st.Epoch,
				SystemID: st.SystemID, Timeline: st.Timeline, Cluster: "dislock tokens", RecordedAt: time.Now()})
			if err != nil {
				return err
			}
			recorded = fmt.Sprintf("token record %s holds %d", ref.key, r.HighWater)
		}
		res := struct {
			Epoch     int64  `json:"epoch"`
			HighWater int64  `json:"highWater"`
			Moved     string `json:"moved,omitempty"`
			Floor     int64  `json:"floor"`
			FloorFrom string `json:"floorFrom,omitempty"`
			Recorded  string `json:"recorded,omitempty"`
		}{st.Epoch, st.HighWater, st.Moved, floor, from, recorded}
		return c.print(res, func(t *table) {
			if st.Moved != "" {
				t.line("moved the fencing tokens to epoch %d: %s", st.Epoch, st.Moved)
			} else {
				t.line("fencing tokens stay in epoch %d: nothing to move", st.Epoch)
			}
			t.line("every token handed out from now on is above %d", st.HighWater)
			if from != "" {
				t.line("compared with %d from %s", floor, from)
			}
			if recorded != "" {
				t.line("%s", recorded)
			}
		})
	}
}

// checkOptions puts the floor into check's options.
func (f *tokenFloor) checkOptions(ctx context.Context, opts check.Options) (check.Options, error) {
	floor, from, _, err := f.resolve(ctx, false)
	if err != nil {
		return opts, err
	}
	opts.TokenFloor, opts.TokenRecord = floor, from
	return opts, nil
}
