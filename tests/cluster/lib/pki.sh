#!/usr/bin/env bash
# Creates the cluster's CA, serving and client certificates, service-account keys and
# kubeconfigs under $STATE_DIR, unless they exist.
set -euo pipefail
. "$(dirname "$0")/versions.sh"
mkdir -p "$PKI"
cd "$PKI"
[[ -f ca.crt ]] || openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
  -subj "/CN=toolrun-cluster-ca" 2>/dev/null
[[ -f sa.key ]] || { openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null; }

cert() { # NAME SUBJECT EXT
  local name=$1 subj=$2 ext=$3
  [[ -f $name.crt ]] && return 0
  openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "$subj" 2>/dev/null
  printf '%s\n' "$ext" > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$name.crt" \
    -days 3650 -extfile "$name.ext" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}
client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
cert apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP,IP:$KUBERNETES_SVC_IP"
cert admin "/O=system:masters/CN=toolrun-admin" "$client"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
cert kube-controller-manager "/CN=system:kube-controller-manager" "$client"
cert kube-scheduler "/CN=system:kube-scheduler" "$client"
cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "$client"
cert kube-proxy "/CN=system:kube-proxy" "$client"
cert toolrun-netpol "/O=system:masters/CN=toolrun-netpol" "$client"

kubeconfig() { # NAME CERT OUT
  local b64="base64 -w0"
  cat > "$3" <<KC
apiVersion: v1
kind: Config
clusters:
- name: toolrun
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: $($b64 < ca.crt)
users:
- name: $1
  user:
    client-certificate-data: $($b64 < "$2.crt")
    client-key-data: $($b64 < "$2.key")
contexts:
- name: toolrun
  context: {cluster: toolrun, user: $1}
current-context: toolrun
KC
  chmod 600 "$3"
}
kubeconfig toolrun-admin admin "$STATE_DIR/admin.kubeconfig"
for c in kube-controller-manager kube-scheduler kubelet kube-proxy toolrun-netpol; do
  kubeconfig "$c" "$c" "$STATE_DIR/$c.kubeconfig"
done
