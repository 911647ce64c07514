# Shared settings of the test-cluster harness; sourced by up, down, kruise, images and lib/*.
# Everything the harness creates lives under $STSD_CLUSTER_DIR (state, logs, PKI) or
# $STSD_CACHE (built binaries and images, kept between runs and keyed by version).

STSD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
STSD_CLUSTER_DIR=${STSD_CLUSTER_DIR:-/var/tmp/stsd}
STSD_CACHE=${STSD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/statefulset-drain}

K8S_VERSION=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$STSD_ROOT/tests/cluster/go/kubernetes/go.mod")
ETCD_VERSION=$(awk '$1=="go.etcd.io/etcd/server/v3" {print $2}' "$STSD_ROOT/tests/cluster/go/etcd/go.mod")
CONTAINERD_VERSION=$(awk '$1=="require" {print $3}' "$STSD_ROOT/tests/cluster/go/containerd/go.mod")
KRUISE_VERSION=$(awk '$1=="github.com/openkruise/kruise" {print $2; exit}' "$STSD_ROOT/tests/cluster/go/kruise/go.mod")
PAUSE_HASH=$(cat "$STSD_ROOT/tests/cluster/go/pause/"* | sha256sum | cut -c1-12)
# CoreDNS is keyed by its version and the plugin list its main.go compiles in.
COREDNS_VERSION=$(awk '$1=="require" && $2=="github.com/coredns/coredns" {print $3}' "$STSD_ROOT/tests/cluster/go/coredns/go.mod")
COREDNS_BUILD=$COREDNS_VERSION-$(sha256sum < "$STSD_ROOT/tests/cluster/go/coredns/main.go" | cut -c1-8)
# helm (v3), for the chart in artifacts/chart (./helm builds it).
HELM_VERSION=$(awk '$1=="require" && $2=="helm.sh/helm/v3" {print $3}' "$STSD_ROOT/tests/cluster/go/helm/go.mod")

BIN_K8S=$STSD_CACHE/bin/kubernetes-$K8S_VERSION
BIN_ETCD=$STSD_CACHE/bin/etcd-$ETCD_VERSION
BIN_CONTAINERD=$STSD_CACHE/bin/containerd-$CONTAINERD_VERSION
BIN_KRUISE=$STSD_CACHE/bin/kruise-$KRUISE_VERSION
BIN_PAUSE=$STSD_CACHE/bin/pause-$PAUSE_HASH
BIN_COREDNS=$STSD_CACHE/bin/coredns-$COREDNS_BUILD
BIN_HELM=$STSD_CACHE/bin/helm-$HELM_VERSION

# Debian packages the node needs (runc, CNI plugins, iptables for kube-proxy and the apiserver's
# service rule, busybox for the test image and DNS checks), openssl for the PKI and python3-yaml
# for the chart's check (artifacts/chart/compare.py).
DEB_PACKAGES=(runc containernetworking-plugins iptables busybox-static openssl iproute2 procps python3-yaml)
CNI_BIN_DIR=/usr/lib/cni

NODE_NAME=$(hostname | tr "[:upper:]" "[:lower:]")
BRIDGE=stsd0
POD_SUBNET=10.244.0.0/24
BRIDGE_IP=10.244.0.1
# The host node's pods get addresses from here up; below it sit the workers' node IPs.
POD_RANGE_START=10.244.0.64
CLUSTER_CIDR=10.244.0.0/16
SERVICE_RANGE=10.96.0.0/16
API_SERVICE_IP=10.96.0.1
# Cluster DNS (lib/dns): the kube-dns Service's fixed IP, in the service range; the kubelet
# points pods at it.
DNS_SERVICE_IP=10.96.0.10
CLUSTER_DOMAIN=cluster.local
COREDNS_IMAGE=statefulset-drain.local/coredns:$COREDNS_BUILD
# kube-proxy (iptables mode) on 127.0.0.1: health and metrics.
KUBE_PROXY_HEALTHZ_PORT=10256
KUBE_PROXY_METRICS_PORT=10249
API_PORT=6443
IPT_CHAIN=STSD-APISERVER
CGROUP_NAME=stsd-cluster
PAUSE_IMAGE=statefulset-drain.local/pause:$PAUSE_HASH
HOSTPATH_PV_DIR=/tmp/hostpath_pv
# kruise-manager (./kruise): metrics and health on 127.0.0.1, admission webhooks (which kruise
# binds on all addresses) reached by the apiserver at https://127.0.0.1:$KRUISE_WEBHOOK_PORT.
KRUISE_METRICS_PORT=10281
KRUISE_HEALTH_PORT=10282
KRUISE_WEBHOOK_PORT=10283
# Paths outside $STATE that the kubelet, containerd or the CNI plugins create; ./down removes
# those that did not exist before ./up.
OUTSIDE_PATHS=(/var/log/pods /var/log/containers /run/containerd /var/lib/cni /run/netns /var/lib/kubelet)

STATE=$STSD_CLUSTER_DIR
PKI=$STATE/pki
LOGS=$STATE/logs
PIDS=$STATE/pids
SOCK=$STATE/containerd/containerd.sock
KUBECONFIG_ADMIN=$STATE/admin.kubeconfig

# --- nodes -----------------------------------------------------------------------------------------
# Node 1 is this host ($NODE_NAME, beside the control plane, like a kubeadm control-plane node that
# runs pods); nodes 2..N are workers (lib/worker), each in its own network namespace with its own
# containerd, kubelet, kube-proxy and cgroup root, so that one can fail alone (./node). A cluster
# that is up keeps the count it was made with ($STATE/nodes); STSD_NODES chooses it for a new one.
NODES_DEFAULT=3
if [ -f "$STATE/nodes" ]; then NODES=$(cat "$STATE/nodes"); else NODES=${STSD_NODES:-$NODES_DEFAULT}; fi
WORKERS=$((NODES - 1))
worker_name() { echo "stsd-w$1"; }
worker_ip() { echo "10.244.0.$((10 + $1))"; }
worker_subnet() { echo "10.244.$1.0/24"; }
worker_dir() { echo "$STATE/workers/stsd-w$1"; }
# worker_index NAME : k for stsd-wk, or nothing.
worker_index() { case $1 in stsd-w[0-9]*) echo "${1#stsd-w}" ;; esac; }
# Hierarchies a worker's cgroup root is made in: every mounted cgroup v1 hierarchy, and cgroup2.
cgroup_hierarchies() { local h; for h in /sys/fs/cgroup/*/; do [ -d "$h" ] && echo "${h%/}"; done; }
node_socks() {
  local k
  echo "$SOCK"
  for ((k = 1; k <= WORKERS; k++)); do echo "$(worker_dir "$k")/containerd/containerd.sock"; done
}

say() { echo "cluster: $*" >&2; }
die() { echo "cluster: error: $*" >&2; exit 1; }

kubectl_admin() { "$BIN_K8S/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" --request-timeout=10s "$@"; }
ctr_node() { "$BIN_CONTAINERD/ctr" --address "$SOCK" -n k8s.io "$@"; }
# import_image TARBALL : imports an OCI image into every node's containerd, in parallel.
import_image() {
  local sock pids=() p
  for sock in $(node_socks); do
    "$BIN_CONTAINERD/ctr" --address "$sock" -n k8s.io images import "$1" >/dev/null &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || die "importing $1 into a node's containerd failed"; done
}
# has_image NAME : whether every node's containerd holds the image.
has_image() {
  local sock
  for sock in $(node_socks); do
    "$BIN_CONTAINERD/ctr" --address "$sock" -n k8s.io images ls -q | grep -qxF "$1" || return 1
  done
}

# kubelet_config FILE ADDRESS HEALTHZ_ADDRESS RUNTIME_ENDPOINT CGROUP_ROOT POD_LOGS_DIR : a node's
# KubeletConfiguration (the host node has no cgroup root of its own: "").
kubelet_config() {
cat > "$1" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $2
port: 10250
healthzBindAddress: $3
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: "$4"
clusterDNS: ["$DNS_SERVICE_IP"]
clusterDomain: $CLUSTER_DOMAIN
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
maxPods: 250
podLogsDir: $6
# Renewed every 5 s; the controller-manager marks a node lost after 24 s without (./up).
nodeLeaseDurationSeconds: 20
${5:+cgroupRoot: $5}
YAML
}

# --- processes the harness starts (used by up and kruise) ----------------------------------------
# alive NAME : whether the process started as NAME is running.
alive() { [ -f "$PIDS/$1" ] && kill -0 "$(cat "$PIDS/$1")" 2>/dev/null; }

# start NAME CMD... : runs CMD in the harness cgroup ($CG, set by the caller), detached, logging
# to $LOGS/NAME.log.
start() {
  local name=$1; shift
  say "starting $name (log: $LOGS/$name.log)"
  # Its command line and PATH, for ./restart.
  printf '%s\0' "$@" > "$PIDS/$name.cmd"
  printf '%s' "$PATH" > "$PIDS/$name.path"
  rm -f "$PIDS/$name.node"
  launch "$name"
}

# start_on WORKER NAME CMD... : like start, in the worker's network namespace and cgroups.
start_on() {
  local node=$1 name=$2; shift 2
  say "starting $name on $node (log: $LOGS/$name.log)"
  printf '%s\0' "$@" > "$PIDS/$name.cmd"
  printf '%s' "$PATH" > "$PIDS/$name.path"
  echo "$node" > "$PIDS/$name.node"
  launch "$name"
}

# launch NAME : (re)starts NAME with the command line, PATH and place start or start_on recorded.
launch() {
  local name=$1 cmd node=
  mapfile -d '' cmd < "$PIDS/$name.cmd"
  [ -f "$PIDS/$name.node" ] && node=$(cat "$PIDS/$name.node")
  (
    exec 9>&- 2>/dev/null || true
    PATH=$(cat "$PIDS/$name.path")
    export PATH
    if [ -z "$node" ]; then
      echo "$BASHPID" > "$(cat "$STATE/cgroup")/cgroup.procs"
      exec setsid "${cmd[@]}" </dev/null >>"$LOGS/$name.log" 2>&1
    fi
    # The worker's daemons sit in its pids and freezer cgroups (which its pods sit under too),
    # in its network namespace and the host's mount namespace (so that its pods' volume mounts
    # are the host's, and ./down sees them).
    for h in pids freezer; do echo "$BASHPID" > "/sys/fs/cgroup/$h/$node/daemons/cgroup.procs"; done
    exec setsid nsenter --net="/run/netns/$node" -- "${cmd[@]}" </dev/null >>"$LOGS/$name.log" 2>&1
  ) &
  echo $! > "$PIDS/$name"
}

# wait_for NAME SECONDS CMD... : waits until CMD succeeds, or fails naming NAME and its log.
wait_for() {
  local name=$1 secs=$2; shift 2
  local i
  for ((i = 0; i < secs * 5; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    if [ -f "$PIDS/$name" ] && ! alive "$name"; then
      tail -n 20 "$LOGS/$name.log" >&2 || true
      die "$name exited; its log: $LOGS/$name.log"
    fi
    sleep 0.2
  done
  tail -n 20 "$LOGS/$name.log" >&2 || true
  die "$name not ready after ${secs}s; its log: $LOGS/$name.log"
}

# http_ok PORT PATH [ADDRESS] : whether GET http://ADDRESS:PORT/PATH answers 200 (127.0.0.1).
http_ok() {
  local status addr=${3:-127.0.0.1}
  { exec 3<>"/dev/tcp/$addr/$1"; } 2>/dev/null || return 1
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$2" "$addr" >&3
  read -r -t 5 _ status _ <&3 || true
  exec 3<&-
  [ "$status" = 200 ]
}
