package hapg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"syscall"
	"time"
)

// member is one entry of Patroni's GET /cluster.
type member struct {
	Name     string `json:"name"`
	Role     string `json:"role"` // "leader", "sync_standby" or "replica"
	State    string `json:"state"`
	Timeline int    `json:"timeline"`
}

// restClient talks to Patroni's REST API; no keep-alive, so that a killed
// node's connection is never reused.
var restClient = &http.Client{
	Timeout:   2 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
}

// httpGet GETs url and wants 200.
func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := restClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, nil
}

// members asks the Patroni of each live node in turn for the cluster as the
// DCS describes it, and returns the first answer.
func (c *Cluster) members(ctx context.Context) ([]member, error) {
	errs := []error{errors.New("hapg: no Patroni answered GET /cluster")}
	for _, n := range c.liveNodes() {
		body, err := httpGet(ctx, "http://"+addr(n.restPort)+"/cluster")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var v struct {
			Members []member `json:"members"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			errs = append(errs, fmt.Errorf("%s: GET /cluster: %w", n.name, err))
			continue
		}
		return v.Members, nil
	}
	return nil, errors.Join(errs...)
}

// errNoLeader: the DCS names no leader (none elected yet, or the last one's
// key expired).
var errNoLeader = errors.New("hapg: the cluster has no leader")

// Leader returns the name of the node that holds the leader key, as Patroni
// reports it (GET /cluster). After Kill(leader) it keeps naming the killed
// node until the key expires (about ttl); WaitLeader waits for a successor.
func (c *Cluster) Leader(ctx context.Context) (string, error) {
	ms, err := c.members(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.Role == "leader" {
			return m.Name, nil
		}
	}
	return "", errNoLeader
}

// SyncStandby returns the name of the synchronous standby Patroni has
// chosen, or "" if there is none (asynchronous mode, or no replica to
// choose).
func (c *Cluster) SyncStandby(ctx context.Context) (string, error) {
	ms, err := c.members(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.Role == "sync_standby" {
			return m.Name, nil
		}
	}
	return "", nil
}

// WaitLeader waits until a node other than notName ("" for any) holds the
// leader key and its PostgreSQL is out of recovery, and returns its name.
// On failure (ctx ended) the error ends with the tails of the logs.
func (c *Cluster) WaitLeader(ctx context.Context, notName string) (string, error) {
	leader, err := c.waitLeader(ctx, notName)
	if err != nil {
		return "", fmt.Errorf("%w\n%s", err, c.logTails())
	}
	return leader, nil
}

func (c *Cluster) waitLeader(ctx context.Context, notName string) (string, error) {
	var leader string
	err := poll(ctx, func() error {
		name, err := c.Leader(ctx)
		if err != nil {
			return err
		}
		if name == notName {
			return fmt.Errorf("%s still holds the leader key", name)
		}
		if err := isPrimary(ctx, c.nodeSuperuserDSN(name)); err != nil {
			return fmt.Errorf("leader %s: %w", name, err)
		}
		leader = name
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hapg: waiting for a leader other than %q: %w", notName, err)
	}
	return leader, nil
}

// WaitSync waits until the cluster has a leader and every node whose
// Patroni runs (every node not killed) streams WAL from it; unless
// Options.Async, one of them must also be the sync standby, both in the DCS
// and in the leader's pg_stat_replication. It fails at once if no node but
// the leader is running. On failure the error ends with the tails of the
// logs.
func (c *Cluster) WaitSync(ctx context.Context) error {
	if err := c.waitSync(ctx); err != nil {
		return fmt.Errorf("%w\n%s", err, c.logTails())
	}
	return nil
}

func (c *Cluster) waitSync(ctx context.Context) error {
	if live := c.liveNodes(); len(live) < 2 {
		return fmt.Errorf("hapg: WaitSync: %d node(s) running, so no replica can stream", len(live))
	}
	err := poll(ctx, func() error {
		leader, err := c.Leader(ctx)
		if err != nil {
			return err
		}
		rows, err := replicas(ctx, c.nodeSuperuserDSN(leader))
		if err != nil {
			return fmt.Errorf("leader %s: %w", leader, err)
		}
		streaming := map[string]replica{}
		for _, r := range rows {
			if r.state == "streaming" {
				streaming[r.name] = r
			}
		}
		var live []string
		for _, n := range c.liveNodes() {
			if n.name == leader {
				continue
			}
			live = append(live, n.name)
			if _, ok := streaming[n.name]; !ok {
				return fmt.Errorf("%s does not stream from leader %s (pg_stat_replication: %v)", n.name, leader, rows)
			}
		}
		if c.opts.Async {
			return nil
		}
		standby, err := c.SyncStandby(ctx)
		if err != nil {
			return err
		}
		if !slices.Contains(live, standby) {
			return fmt.Errorf("no running sync standby (Patroni names %q)", standby)
		}
		if s := streaming[standby].syncState; s != "sync" && s != "quorum" {
			return fmt.Errorf("sync standby %s has sync_state %q on leader %s", standby, s, leader)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("hapg: waiting for the replicas to stream: %w", err)
	}
	return nil
}

// Kill loses a data centre's database: it SIGKILLs the node's Patroni and
// its postmaster with every PostgreSQL process at once, and returns once
// they are gone and its ports refuse connections. Its data directory stays
// for Restart. Nothing demotes or fences anything: if the node was the
// leader, its key expires after Patroni's ttl and a replica takes over.
func (c *Cluster) Kill(name string) error {
	n := c.node(name)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errClosed
	}
	if !n.patroni.Running() {
		return fmt.Errorf("hapg: Kill(%s): its Patroni is not running", name)
	}
	// Find PostgreSQL's processes first so that they die within
	// microseconds of Patroni.
	pid, havePG := postmasterPID(n.dataDir())
	procs := postgresProcs(n.dataDir())
	n.patroni.SignalGroup(syscall.SIGKILL)
	if havePG {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, p := range procs {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	var errs []error
	if err := n.patroni.Stop(syscall.SIGKILL, 5*time.Second); err != nil {
		errs = append(errs, err)
	}
	// Anything forked meanwhile (Patroni may have been starting a postmaster
	// just then).
	if _, err := killPostmaster(n.dataDir(), syscall.SIGKILL); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, waitRefusing(n.pgPort), waitRefusing(n.restPort))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("hapg: Kill(%s): %w", name, err)
	}
	c.logf("killed %s (Patroni and PostgreSQL)", name)
	return nil
}

// Restart starts a killed node's Patroni again and returns once its REST API
// answers. Patroni then starts PostgreSQL, which rejoins as a replica of the
// current leader (rewound with pg_rewind, or cloned afresh if that fails);
// WaitSync waits for it to stream.
func (c *Cluster) Restart(name string) error {
	n := c.node(name)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errClosed
	}
	if n.patroni.Running() {
		c.mu.Unlock()
		return fmt.Errorf("hapg: Restart(%s): its Patroni is running", name)
	}
	p, err := startProc(n.dir, "patroni", c.acct.Cred, c.bin.patroni, n.path("patroni.yml"))
	if err == nil {
		n.patroni = p
	}
	c.mu.Unlock()
	if err != nil {
		return err
	}
	err = waitFor(readyTimeout, func() error {
		if !p.Running() {
			return errExited
		}
		return dial(n.restPort)
	})
	if err != nil {
		return fmt.Errorf("hapg: Restart(%s): %w\n%s", name, err, logTail(n.path("patroni.log")))
	}
	c.logf("restarted %s's Patroni", name)
	return nil
}

var errClosed = errors.New("hapg: closed")
