# Versions and paths shared by the cluster scripts. Sourced, not executed.
K8S_VERSION=v1.34.4
ETCD_VERSION=v3.6.16   # pinned in gomod/etcd/go.mod
HELM_VERSION=v3.22.0   # pinned in gomod/helm/go.mod

CLUSTER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO_ROOT=$(cd "$CLUSTER_DIR/../.." && pwd)
CACHE_ROOT=${TOOLRUN_CLUSTER_CACHE:-/var/cache/toolrun/cluster}
BIN_CACHE=$CACHE_ROOT/$K8S_VERSION/bin
STATE_DIR=${TOOLRUN_CLUSTER_STATE:-/var/lib/toolrun-cluster}
LOG_DIR=$STATE_DIR/logs
RUN_DIR=/run/toolrun-cluster
PKI=$STATE_DIR/pki
NODE_NAME=toolrun-node
# The node's address lives on a dummy interface of its own, so the cluster does not depend
# on this machine's network (or on it having a default route).
NODE_IFACE=toolrun0
NODE_IP=${TOOLRUN_NODE_IP:-10.87.0.1}
BRIDGE=toolrunbr0
POD_CIDR=10.244.0.0/16
POD_GW=10.244.0.1
SERVICE_CIDR=10.96.0.0/16
# A "public" network routed from pods to the node (TEST-NET-3, RFC 5737): the web egress
# test puts a server on the node's lo at an address in it, which the gateway may reach
# (the chart's public-only egress rule) and sandbox pods may not (their deny-all).
WEB_TEST_NET=203.0.113.0/24
KUBERNETES_SVC_IP=10.96.0.1
ETCD_PORT=12379
CONTAINERD_SOCK=$RUN_DIR/containerd/containerd.sock
KUBECONFIG_ADMIN=$STATE_DIR/admin.kubeconfig
COMPONENTS=(etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy toolrun-netpol)
