package gateway

import (
	"context"
	"time"

	"github.com/dislock/dislock/lockagent/store"
	"github.com/dislock/dislock/lockagent/store/migrate"
)

// schemaRecheck is how often a gateway on a schema older than
// migrate.ExpiriesNeverMoveBack looks again: the webhook migrates the
// database while the gateways of the same release start.
const schemaRecheck = 30 * time.Second

// watchSchema keeps the answers from saying how long calls waited until the
// database's schema keeps a holder's expiries from moving back: before it,
// a call a pod gave up on could land after its next one and set an expiry
// earlier than the one a deadline counted from the later call's start
// relies on. Counted from when the pod sent the call, as without a
// gateway, a deadline needs nothing of the schema. It reads the schema at
// once, and again every schemaRecheck until it is new enough or the
// server closes.
func (s *Server) watchSchema(ctx context.Context, st *store.Store) {
	ready := func() (bool, int, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		sc, err := migrate.Schema(cctx, st)
		return err == nil && sc.Current >= migrate.ExpiriesNeverMoveBack, sc.Current, err
	}
	ok, current, err := ready()
	if ok {
		return
	}
	s.waitsUncounted.Store(true)
	s.cfg.Logger.Warn("until the database's schema keeps expiries from moving back, pods count their deadlines from when they sent each call, and a queue in the gateway shortens them; looking again every 30s",
		"schema", current, "needs", migrate.ExpiriesNeverMoveBack, "err", err)
	go func() {
		t := time.NewTicker(schemaRecheck)
		defer t.Stop()
		for {
			select {
			case <-s.closed:
				return
			case <-t.C:
				if ok, _, _ := ready(); ok {
					s.waitsUncounted.Store(false)
					s.cfg.Logger.Info("the database's schema is migrated: answers say again how long calls waited in the gateway")
					return
				}
			}
		}
	}()
}
