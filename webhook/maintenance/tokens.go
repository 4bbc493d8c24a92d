package maintenance

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/dislock/dislock/internal/tokenrecord"
	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/ledger"
)

// DefaultTokenRecordInterval is how often the elected leader confirms the
// fencing token epoch and records the high water: the longest a restored
// database can hand out tokens before its epoch moves past the record, and
// the most grants a record can miss.
const DefaultTokenRecordInterval = 5 * time.Second

// MaxTokenRecordInterval bounds --token-record-interval.
const MaxTokenRecordInterval = time.Minute

// tokenKeeper confirms the fencing token epoch with the highest token this
// cluster recorded and then records the new high water, at once on
// becoming the elected leader and every interval after, once the
// databaseGate passed. While the record cannot be read it confirms
// nothing: tokens held after a restore stay held, rather than move to an
// epoch the record may show was used.
type tokenKeeper struct {
	databaseURL string
	cluster     string
	ready       <-chan struct{}
	record      types.NamespacedName
	interval    time.Duration
	// reader reads the record from the API server (no cache: one
	// ConfigMap), writer writes it.
	reader client.Reader
	writer client.Client
}

func (k *tokenKeeper) NeedLeaderElection() bool { return true }

func (k *tokenKeeper) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("tokens")
	db, err := openWhenReady(ctx, k.ready, k.databaseURL)
	if db == nil {
		return err
	}
	defer db.Close()
	tick := time.NewTicker(k.interval)
	defer tick.Stop()
	for {
		runStep(ctx, logger, "confirming the fencing token epoch", tokenStepTimeout, func(ctx context.Context) error {
			return k.keep(ctx, db, logger.Info)
		})
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// tokenStepTimeout bounds one confirmation: a read and a write of the
// record, and one short transaction.
const tokenStepTimeout = 30 * time.Second

// keep is one round: read the record, confirm the epoch with it, raise it.
func (k *tokenKeeper) keep(ctx context.Context, db *store.Store, info func(msg string, kv ...any)) error {
	rec, _, err := tokenrecord.Read(ctx, k.reader, k.record)
	if err != nil {
		return fmt.Errorf("%w; the epoch is not confirmed until it can be read", err)
	}
	st, err := ledger.KeepTokens(ctx, db, rec.HighWater, false)
	if err != nil {
		return err
	}
	if st.Moved != "" {
		info("moved the fencing tokens to a new epoch", "epoch", st.Epoch, "why", st.Moved,
			"recordedHighWater", rec.HighWater, "recordedBy", rec.Cluster)
	}
	_, err = tokenrecord.Raise(ctx, k.writer, k.reader, k.record, tokenrecord.Record{HighWater: st.HighWater, Epoch: st.Epoch,
		SystemID: st.SystemID, Timeline: st.Timeline, Cluster: k.cluster, RecordedAt: time.Now()})
	return err
}

func setupTokenKeeper(mgr manager.Manager, o Options, ready <-chan struct{}) error {
	interval := o.TokenRecordInterval
	if interval == 0 {
		interval = DefaultTokenRecordInterval
	}
	return mgr.Add(&tokenKeeper{databaseURL: o.DatabaseURL, cluster: o.Cluster, ready: ready,
		record: types.NamespacedName{Namespace: o.Namespace, Name: tokenrecord.Name}, interval: interval,
		reader: mgr.GetAPIReader(), writer: mgr.GetClient()})
}
