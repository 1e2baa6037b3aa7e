#!/bin/sh
# /sbin/init of the Kubernetes node variant (the `-kube` releases), run before the plain init.
#
# Prepares what containerd and the kubelet need and the plain init does not do: the kernel
# filesystems (the plain init skips what is already mounted), cgroup v2 at /sys/fs/cgroup with
# its controllers delegated, the kernel modules of /etc/k3os-kube/modules (busybox modprobe,
# modules.dep written at build time). Then it starts /usr/sbin/k3os-kube-up in the background
# (seed, containerd, the slot's image archives, kubelet: once the plain init has confirmed the
# slot and configured eth0) and execs the plain init, /sbin/init.base, which stays PID 1
# exactly as on a plain node.
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
umask 022

mounted() { grep -q " $1 " /proc/mounts; }
mount -t proc proc /proc 2>/dev/null
mounted /sys || mount -t sysfs sysfs /sys
mounted /dev || mount -t devtmpfs devtmpfs /dev
mounted /run || mount -t tmpfs -o mode=0755 tmpfs /run
mounted /var || { mount -t tmpfs -o mode=0755 tmpfs /var && mkdir -p /var/lib/k3os-ops /var/log /var/tmp; }

mounted /sys/fs/cgroup || mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup ||
    echo "k3os-kube: mounting cgroup2 on /sys/fs/cgroup failed"
for c in cpuset cpu io memory pids hugetlb; do
    echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
done

while read -r m; do
    case "$m" in '' | '#'*) continue ;; esac
    modprobe "$m" || echo "k3os-kube: modprobe $m failed"
done </etc/k3os-kube/modules

/usr/sbin/k3os-kube-up </dev/null >/dev/console 2>&1 &
exec /sbin/init.base "$@"
