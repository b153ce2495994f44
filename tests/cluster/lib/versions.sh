# Versions and paths shared by the cluster scripts. Sourced, not executed.
K8S_VERSION=v1.34.4
ETCD_VERSION=v3.6.6
HELM_VERSION=v3.19.2
KUBE_ROUTER_VERSION=v2.6.2

CLUSTER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO_ROOT=$(cd "$CLUSTER_DIR/../.." && pwd)
CACHE_ROOT=${TOOLRUN_CLUSTER_CACHE:-/var/cache/toolrun/cluster}
BIN_CACHE=$CACHE_ROOT/$K8S_VERSION/bin
STATE_DIR=${TOOLRUN_CLUSTER_STATE:-/var/lib/toolrun-cluster}
LOG_DIR=$STATE_DIR/logs
