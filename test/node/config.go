package node

// The node's configuration files: containerd's config.toml, the CNI network
// and the KubeletConfiguration. Every path points into the node's own
// directory and every port is picked at start, so that nodes share nothing.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// cniBinDir is where Debian's containernetworking-plugins installs them.
const cniBinDir = "/usr/lib/cni"

// containerdConfig is config.toml (format version 2, containerd 1.6).
func (n *Node) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

# No debug or metrics listeners: nothing must listen beyond the node's socket.
[debug]
  address = ""
[metrics]
  address = ""

# Its default (/opt/containerd) is a host path outside the node's directory.
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  # Root here lacks CAP_SYS_RESOURCE: without this, runc fails to lower a
  # container's oom_score_adj below containerd's own and every sandbox fails
  # with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # No systemd here: the kubelet uses cgroupfs too.
        SystemdCgroup = false
        # runc keeps container state in /run/containerd/runc by default.
        Root = %[7]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[8]q
    conf_dir = %[9]q
`, n.path("containerd", "root"), n.path("containerd", "state"), n.socket(), n.socket()+".ttrpc",
		n.path("containerd", "opt"), n.opts.PauseImage, n.path("runc"), cniBinDir, n.path("cni"))
}

// cniConfig is the node's only network. The test pods use the host network
// (nothing but loopback may carry test traffic on this machine), so the
// network is never set up for a pod; the kubelet only needs the runtime to
// report a network plugin as ready before it calls the node Ready.
const cniConfig = `{
  "cniVersion": "0.4.0",
  "name": "dislock-test-loopback",
  "plugins": [{"type": "loopback"}]
}
`

// kubeletConfig is the KubeletConfiguration (kubelet.config.k8s.io/v1beta1).
// JSON is valid YAML.
func (n *Node) kubeletConfig() ([]byte, error) {
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		"address":    n.Address(),
		"port":       n.kubeletPort,
		// The read-only port would be another listener on a fixed default.
		"readOnlyPort":       0,
		"healthzBindAddress": "127.0.0.1",
		"healthzPort":        n.healthzPort,
		// The API server reaches the kubelet (logs, exec) anonymously; tests
		// only.
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": true},
			"webhook":   map[string]any{"enabled": false},
		},
		"authorization":            map[string]any{"mode": "AlwaysAllow"},
		"containerRuntimeEndpoint": "unix://" + n.socket(),
		"cgroupDriver":             "cgroupfs",
		// Every node has its own cgroup subtree, created by Start and removed
		// by Close, so that two nodes on one host never touch each other's
		// pods.
		"cgroupRoot":      n.cgroupRoot(),
		"cgroupsPerQOS":   true,
		"failSwapOn":      false,
		"failCgroupV1":    false,
		"podLogsDir":      n.path("pod-logs"),
		"volumePluginDir": n.path("volume-plugins"),
		// The KUBE-FIREWALL and canary chains are host-wide and shared by
		// every kubelet; the test pods do not need them.
		"makeIPTablesUtilChains": false,
		// The kubelet would lower its own oom_score_adj, which needs
		// CAP_SYS_RESOURCE.
		"oomScoreAdj": 0,
		// A test machine's disk can be fuller than a real node's: evict
		// nothing and never collect the imported images, which cannot be
		// pulled again.
		"evictionHard": map[string]string{
			"memory.available": "50Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%", "imagefs.available": "1%",
		},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"serializeImagePulls":         false,
		"kubeAPIQPS":                  50,
		"kubeAPIBurst":                100,
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("node: encoding the kubelet config: %w", err)
	}
	return append(b, '\n'), nil
}

// writeConfigs writes the three files and creates the directories they name.
func (n *Node) writeConfigs() error {
	for _, d := range []string{"cni", "pod-logs", "volume-plugins", "kubelet", "kubelet-certs", "runc"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return fmt.Errorf("node: %w", err)
		}
	}
	kubelet, err := n.kubeletConfig()
	if err != nil {
		return err
	}
	files := map[string][]byte{
		n.path("containerd.toml"):                      []byte(n.containerdConfig()),
		filepath.Join(n.path("cni"), "10-lo.conflist"): []byte(cniConfig),
		n.path("kubelet.json"):                         kubelet,
	}
	for p, b := range files {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return fmt.Errorf("node: %w", err)
		}
	}
	return nil
}
