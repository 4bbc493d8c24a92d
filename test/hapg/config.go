package hapg

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/dislock/dislock/test/pgtest"
)

// Patroni's timing, the bootstrap "dcs" settings. Patroni wants
// loop_wait + 2*retry_timeout <= ttl. A failover starts when the dead
// leader's etcd lease (ttl) runs out; the replicas watch the leader key and
// act at once, so a failover costs about ttl. Lower than this and a primary
// on a busy 2-core machine (a pg_basebackup running beside it) risks missing
// a lease refresh and demoting itself.
const (
	patroniTTL          = 6 // seconds
	patroniLoopWait     = 1
	patroniRetryTimeout = 2
	// scope is the Patroni cluster name; namespace is the etcd key prefix
	// (etcd is the harness's own, so neither needs to be unique).
	patroniScope     = "dislock"
	patroniNamespace = "/hapg/"
)

// HAProxy health checks: the REST port of each node is asked every
// haproxyInter; one 200 from GET /primary brings a node up, two failures take
// it down. A promoted node therefore receives connections within about
// haproxyInter of Patroni promoting it.
const haproxyInter = 250 * time.Millisecond

// patroniConfig is a node's patroni.yml, written as JSON (which is YAML).
func (c *Cluster) patroniConfig(n *node) (string, error) {
	cfg := map[string]any{
		"scope":     patroniScope,
		"namespace": patroniNamespace,
		"name":      n.name,
		"log":       map[string]any{"level": "INFO"},
		"restapi": map[string]any{
			"listen":          addr(n.restPort),
			"connect_address": addr(n.restPort),
		},
		"etcd3": map[string]any{
			"hosts":    []string{addr(c.etcdPort)},
			"protocol": "http",
		},
		// No /dev/watchdog here; "automatic" would only log that.
		"watchdog": map[string]any{"mode": "off"},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl":                     patroniTTL,
				"loop_wait":               patroniLoopWait,
				"retry_timeout":           patroniRetryTimeout,
				"maximum_lag_on_failover": 1 << 20,
				"synchronous_mode":        !c.opts.Async,
				"postgresql": map[string]any{
					// A killed primary has WAL the new one never saw;
					// pg_rewind (which needs wal_log_hints) lets it rejoin
					// without a new base backup.
					"use_pg_rewind": true,
					"use_slots":     true,
					"parameters": map[string]any{
						"wal_log_hints":         "on",
						"max_connections":       200,
						"max_wal_senders":       10,
						"max_replication_slots": 10,
						"hot_standby":           "on",
					},
				},
			},
			"initdb": []any{
				map[string]string{"encoding": "UTF8"},
				map[string]string{"locale": "C"},
				// Skips the final flush of the new cluster, which only
				// matters if the OS crashes; the server's fsync stays on.
				"no-sync",
			},
		},
		"postgresql": map[string]any{
			"listen":          addr(n.pgPort),
			"connect_address": addr(n.pgPort),
			"data_dir":        n.dataDir(),
			"bin_dir":         c.bin.pgBin,
			"pgpass":          n.path("pgpass"),
			// Patroni's own queries go over the trusted socket.
			"use_unix_socket": true,
			"authentication": map[string]any{
				"superuser":   map[string]string{"username": pgtest.Superuser, "password": pgtest.SuperuserPassword},
				"replication": map[string]string{"username": replicationUser, "password": replicationPassword},
			},
			"pg_hba": pgHBA,
			"parameters": map[string]any{
				"unix_socket_directories": n.dir,
				// Only the account (and root) may use the socket, which is
				// what makes "trust" on it safe.
				"unix_socket_permissions": "0700",
				"password_encryption":     "scram-sha-256",
				"shared_buffers":          "32MB",
				// Durable commits, as in production.
				"fsync":              "on",
				"synchronous_commit": "on",
				"full_page_writes":   "on",
				"logging_collector":  "on",
				"log_directory":      n.path("log"),
				"log_filename":       "postgresql.log",
				"log_file_mode":      "0644",
				"log_rotation_age":   0,
				"log_rotation_size":  0,
				"log_line_prefix":    "%m [%p] %q%u@%d ",
			},
			"basebackup": []any{map[string]string{"checkpoint": "fast"}},
			// A killed primary that cannot be rewound is cloned afresh
			// rather than left out of the cluster.
			"remove_data_directory_on_rewind_failure":     true,
			"remove_data_directory_on_diverged_timelines": true,
		},
		"tags": map[string]any{"nofailover": false, "noloadbalance": false, "clonefrom": false, "nosync": false},
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return "", fmt.Errorf("hapg: patroni config: %w", err)
	}
	return string(b) + "\n", nil
}

// haproxyConfig routes TCP connections on port to whichever node's Patroni
// answers OPTIONS /primary with 200, i.e. the leader, once it runs as
// primary. A node marked down has its sessions cut, so that clients of a
// demoted or lost primary reconnect. The check is OPTIONS rather than GET:
// the same status codes without a body, which HAProxy would cut off after
// reading the status line, making Patroni log a ConnectionResetError
// traceback for every check of a replica. statsPort serves the servers'
// states as CSV (GET /stats;csv), which Start waits on.
func (c *Cluster) haproxyConfig(port, statsPort int) string {
	var servers strings.Builder
	for _, n := range c.nodes {
		fmt.Fprintf(&servers, "  server %s %s check port %d\n", n.name, addr(n.pgPort), n.restPort)
	}
	inter := haproxyInter.Milliseconds()
	return fmt.Sprintf(`# hapg: HAProxy in front of the Patroni cluster
global
  maxconn 1000
  log stdout format raw local0 info

defaults
  log global
  retries 2
  timeout connect 1s
  timeout check 1s
  # Lock agents hold connections idle between heartbeats.
  timeout client 1h
  timeout server 1h

listen postgres
  mode tcp
  option tcplog
  bind %s
  option httpchk OPTIONS /primary
  http-check expect status 200
  default-server inter %dms fastinter %dms downinter %dms fall 2 rise 1 on-marked-down shutdown-sessions
%s
listen stats
  mode http
  no log
  bind %s
  stats enable
  stats uri /stats
`, addr(port), inter, inter, inter, servers.String(), addr(statsPort))
}
