# Shared settings of the test-cluster harness; sourced by up, down, images and lib/*.
# Everything the harness creates lives under $STSD_CLUSTER_DIR (state, logs, PKI) or
# $STSD_CACHE (built binaries and images, kept between runs and keyed by version).

STSD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
STSD_CLUSTER_DIR=${STSD_CLUSTER_DIR:-/var/tmp/stsd}
STSD_CACHE=${STSD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/statefulset-drain}

K8S_VERSION=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$STSD_ROOT/tests/cluster/go/kubernetes/go.mod")
ETCD_VERSION=$(awk '$1=="require" {print $3}' "$STSD_ROOT/tests/cluster/go/etcd/go.mod")
CONTAINERD_VERSION=$(awk '$1=="require" {print $3}' "$STSD_ROOT/tests/cluster/go/containerd/go.mod")
PAUSE_HASH=$(cat "$STSD_ROOT/tests/cluster/go/pause/"* | sha256sum | cut -c1-12)

BIN_K8S=$STSD_CACHE/bin/kubernetes-$K8S_VERSION
BIN_ETCD=$STSD_CACHE/bin/etcd-$ETCD_VERSION
BIN_CONTAINERD=$STSD_CACHE/bin/containerd-$CONTAINERD_VERSION
BIN_PAUSE=$STSD_CACHE/bin/pause-$PAUSE_HASH

# Debian packages the node needs (runc, CNI plugins, iptables for the one service rule, busybox
# for the test image) and openssl for the PKI.
DEB_PACKAGES=(runc containernetworking-plugins iptables busybox-static openssl iproute2 procps)
CNI_BIN_DIR=/usr/lib/cni

NODE_NAME=$(hostname | tr "[:upper:]" "[:lower:]")
BRIDGE=stsd0
POD_SUBNET=10.244.0.0/24
BRIDGE_IP=10.244.0.1
SERVICE_RANGE=10.96.0.0/16
API_SERVICE_IP=10.96.0.1
API_PORT=6443
IPT_CHAIN=STSD-APISERVER
CGROUP_NAME=stsd-cluster
PAUSE_IMAGE=statefulset-drain.local/pause:$PAUSE_HASH
HOSTPATH_PV_DIR=/tmp/hostpath_pv
# Paths outside $STATE that the kubelet, containerd or the CNI plugins create; ./down removes
# those that did not exist before ./up.
OUTSIDE_PATHS=(/var/log/pods /var/log/containers /run/containerd /var/lib/cni /run/netns)

STATE=$STSD_CLUSTER_DIR
PKI=$STATE/pki
LOGS=$STATE/logs
PIDS=$STATE/pids
SOCK=$STATE/containerd/containerd.sock
KUBECONFIG_ADMIN=$STATE/admin.kubeconfig

say() { echo "cluster: $*" >&2; }
die() { echo "cluster: error: $*" >&2; exit 1; }

kubectl_admin() { "$BIN_K8S/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" --request-timeout=10s "$@"; }
ctr_node() { "$BIN_CONTAINERD/ctr" --address "$SOCK" -n k8s.io "$@"; }
