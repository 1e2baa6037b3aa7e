#!/bin/sh
# /usr/sbin/k3os-kube-up of the Kubernetes node variant, started in the background by
# /sbin/init (kube-init.sh). Prints `K3OS-KUBE <step> t=<uptime>` on the console at each step:
#
#   net          the plain init has configured eth0 (or 60 s passed without an address)
#   seed         the run-time configuration was found and copied into /var/lib/kubelet
#   containerd   containerd answers on /run/containerd/containerd.sock
#   imported     every archive linked in the airgap directory is in containerd's k8s.io store
#   kubelet      the kubelet was started
#
# The seed is an ext4 filesystem labelled `k3os-seed` (a second disk, like cloud-init's NoCloud
# seed), mounted read-only: `kubeconfig` (the API server's address and CA, the node's client
# certificate and key, embedded), `ca.crt` (the cluster CA: the kubelet authenticates its own
# clients with it) and optionally `node-name` (default: the hostname). Without a seed nothing
# starts: `k3os-kube: no seed: kubelet not started`.
#
# The booted slot's image archives were linked into the airgap directory by the plain init's
# `k3os-ops slot confirm`; they are imported at every boot (the store is on tmpfs), before the
# kubelet starts. A failure prints `K3OS-KUBE-FAILED <step>: <why>` and the tail of the log.
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
AIRGAP=/var/lib/rancher/k3s/agent/images
KUBELET_DIR=/var/lib/kubelet

mark() { echo "K3OS-KUBE $1 t=$(cut -d' ' -f1 /proc/uptime)"; }
fail() {
    echo "K3OS-KUBE-FAILED $1: $2"
    [ -n "${3:-}" ] && tail -n 20 "$3" 2>/dev/null | sed 's/^/k3os-kube: | /'
    exit 1
}

i=0
until ip -4 addr show eth0 2>/dev/null | grep -q inet; do
    i=$((i + 1))
    if [ "$i" -ge 120 ]; then
        echo "k3os-kube: eth0 has no address after 60 s; going on"
        break
    fi
    sleep 0.5
done
mark net

seed_dev=$(findfs LABEL=k3os-seed 2>/dev/null)
if [ -z "$seed_dev" ]; then
    echo "k3os-kube: no seed: kubelet not started"
    exit 0
fi
mkdir -p /run/k3os-seed "$KUBELET_DIR/pki"
mount -t ext4 -o ro "$seed_dev" /run/k3os-seed || fail seed "mount $seed_dev read-only"
[ -f /run/k3os-seed/kubeconfig ] || fail seed "$seed_dev has no kubeconfig"
cp /run/k3os-seed/kubeconfig "$KUBELET_DIR/kubeconfig"
[ -f /run/k3os-seed/ca.crt ] && cp /run/k3os-seed/ca.crt "$KUBELET_DIR/pki/ca.crt"
node=$(cat /run/k3os-seed/node-name 2>/dev/null)
umount /run/k3os-seed
[ -n "$node" ] || node=$(hostname)
mark seed

mkdir -p /var/lib/containerd /var/log
containerd --config /etc/containerd/config.toml >/var/log/containerd.log 2>&1 &
i=0
until ctr version >/dev/null 2>&1; do
    i=$((i + 1))
    [ "$i" -ge 120 ] && fail containerd "no answer on /run/containerd/containerd.sock in 60 s" /var/log/containerd.log
    sleep 0.5
done
mark containerd

for a in "$AIRGAP"/*.tar; do
    [ -e "$a" ] || fail imported "no image archive in $AIRGAP (did slot confirm link the slot's payloads?)"
    ctr -n k8s.io images import "$a" >/var/log/import.log 2>&1 ||
        fail imported "ctr -n k8s.io images import $a" /var/log/import.log
    echo "k3os-kube: imported $a"
done
mark imported

addr=$(ip -4 addr show eth0 2>/dev/null | sed -n 's/.*inet \([0-9.]*\)\/.*/\1/p' | head -n1)
kubelet --config=/etc/kubernetes/kubelet.yaml --kubeconfig="$KUBELET_DIR/kubeconfig" \
    --hostname-override="$node" ${addr:+--node-ip="$addr"} >/var/log/kubelet.log 2>&1 &
pid=$!
mark kubelet
wait "$pid"
fail kubelet "exited with status $?" /var/log/kubelet.log
