#!/usr/bin/env bash
# Installs the Debian packages a real test node (test/node, test/e2e) runs
# on: containerd (the runtime the kubelet talks to), runc (what containerd
# starts containers with) and the CNI plugins (the kubelet reports a node
# Ready only once the runtime has a network plugin, even though the test pods
# use the host network), plus busybox-static, the shell of the test image.
# Does nothing when everything is present.
set -euo pipefail

need=""
command -v containerd >/dev/null 2>&1 || need="$need containerd"
command -v runc >/dev/null 2>&1 || need="$need runc"
[ -x /usr/lib/cni/loopback ] || need="$need containernetworking-plugins"
[ -x /bin/busybox ] || need="$need busybox-static"
[ -z "$need" ] && exit 0

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; return; fi
  command -v sudo >/dev/null || { echo "need root to run: $*" >&2; exit 1; }
  sudo "$@"
}
echo "installing Debian packages:$need"
as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq || true
# --no-install-recommends: only the runtime, not the tools that come with it.
# shellcheck disable=SC2086
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
