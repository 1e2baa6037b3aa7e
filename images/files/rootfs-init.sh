#!/bin/sh
# /sbin/init of the test rootfs (busybox sh as PID 1).
#
# Mounts the kernel filesystems (and pstore where the kernel has it), /boot (PARTLABEL=boot) and the state partition
# (PARTLABEL=state at /var/lib/k3os-ops), writes the k3os-ops config of this boot (`k3os-node-config`:
# the one matching the bootloader installed on /boot), prints K3OS-BOOTED, confirms the slot (K3OS-CONFIRM ok|failed|pending; pending:
# the activation awaits the agent's Node-Ready, `slot await-bless` runs in the background; on failure
# k3os-ops has already rolled back, init prints K3OS-ROLLBACK and reboots), brings up eth0,
# starts the workload (httpd on :80 serving "alive"), prints K3OS-READY and runs a root shell on
# the serial console for the test harness. `reboot`, `halt` and `poweroff` (busybox: a signal to
# PID 1) print K3OS-SHUTDOWN <how>, unmount /boot and the state partition, and do it.
#
# /etc/k3os-ops/mode selects a failure variant: "noconfirm" never confirms (prints
# K3OS-NOCONFIRM and keeps running until the harness resets the VM, like a watchdog); "nonet"
# never brings eth0 up (a release whose network configuration is broken).
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
export HOME=/root
umask 022

# busybox reboot/halt/poweroff (which k3os-ops runs) signal PID 1: TERM, USR1, USR2.
shutdown() {
    echo "K3OS-SHUTDOWN $1"
    sync
    umount /boot /var/lib/k3os-ops 2>/dev/null || mount -o remount,ro /boot 2>/dev/null
    "$1" -f
    sleep 60
}
trap 'shutdown reboot' TERM
trap 'shutdown halt' USR1
trap 'shutdown poweroff' USR2

mounted() { grep -q " $1 " /proc/mounts; }
mount -t proc proc /proc 2>/dev/null
mounted /sys || mount -t sysfs sysfs /sys
mounted /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts && (mounted /dev/pts || mount -t devpts devpts /dev/pts)
mounted /tmp || mount -t tmpfs -o mode=1777 tmpfs /tmp
mounted /run || mount -t tmpfs -o mode=0755 tmpfs /run
mounted /var || { mount -t tmpfs -o mode=0755 tmpfs /var && mkdir -p /var/lib/k3os-ops /var/log /var/tmp; }
hostname k3os-node

cmdline=$(cat /proc/cmdline)
slot=unknown
console=""
for arg in $cmdline; do
    case "$arg" in
    k3os.slot=*) slot=${arg#k3os.slot=} ;;
    console=*) c=${arg#console=}; console=${c%%,*} ;;
    esac
done
VERSION=unknown
. /etc/k3os-release
version=$VERSION
tty=/dev/${console:-console}
[ -c "$tty" ] || tty=/dev/console

bypartlabel() {
    for u in /sys/class/block/*/uevent; do
        if grep -qx "PARTNAME=$1" "$u"; then
            echo "/dev/$(sed -n 's/^DEVNAME=//p' "$u")"
            return 0
        fi
    done
    return 1
}
mountlabel() {
    dev=$(bypartlabel "$1") || { echo "k3os-init: no partition named $1"; return 1; }
    mount -t ext4 -o rw "$dev" "$2" || { echo "k3os-init: mount $dev ($1) on $2 failed"; return 1; }
}
# pstore (the initrd loaded its backend, efi_pstore): a panic's kernel log the firmware kept,
# read by the assessment into the failed attempt's bundle. Nothing to mount without pstore.
mounted /sys/fs/pstore || mount -t pstore pstore /sys/fs/pstore 2>/dev/null ||
    echo "k3os-init: no pstore"
mountlabel boot /boot
mkdir -p /var/lib/k3os-ops
mountlabel state /var/lib/k3os-ops

# This boot's config (the loader's, plus the report keys a scenario put on the state partition:
# the test OS reports nowhere otherwise); /etc/k3os-ops/config.toml links to it, for tools
# started without the variable.
K3OS_OPS_CONFIG=$(k3os-node-config) || echo "k3os-init: k3os-node-config failed"
export K3OS_OPS_CONFIG
echo "export K3OS_OPS_CONFIG=$K3OS_OPS_CONFIG" >/run/k3os-ops.env

echo "K3OS-BOOTED slot=$slot version=$version"

# Power-cut tests (vm-tests powercut, confirm phase): a one-shot request on the state partition
# makes this boot's confirm announce its write barriers ("announce") or stop dead at barrier k
# ("stop k") so the harness can cut the power there. The request is removed, and the removal
# synced, before confirm runs: the boot after the cut confirms normally.
barrier_req=/var/lib/k3os-ops/barrier-request
if [ -f "$barrier_req" ]; then
    read -r what k <"$barrier_req" || true
    rm -f "$barrier_req"
    sync
    case "$what" in
    announce) export K3OS_OPS_BARRIERS=1 ;;
    stop) export K3OS_OPS_BARRIER_STOP="$k" ;;
    esac
fi

mode=$(cat /etc/k3os-ops/mode 2>/dev/null)
confirm_rc=0
if [ "$mode" = noconfirm ]; then
    echo "K3OS-NOCONFIRM"
else
    k3os-ops slot confirm || confirm_rc=$?
    case "$confirm_rc" in
    0) echo "K3OS-CONFIRM ok" ;;
    75)
        # The activation awaits checks only its caller can report (the agent's Node-Ready):
        # the slot stays on trial; await-bless rolls back if they do not come in time.
        echo "K3OS-CONFIRM pending"
        k3os-ops slot await-bless --reboot </dev/null >/dev/console 2>&1 &
        ;;
    *)
        echo "K3OS-CONFIRM failed"
        echo "K3OS-ROLLBACK"
        shutdown reboot
        ;;
    esac
fi
unset K3OS_OPS_BARRIERS K3OS_OPS_BARRIER_STOP

ip link set lo up
if [ "$mode" = nonet ]; then
    echo "k3os-init: network left down (this release's network configuration is broken on purpose)"
elif ip link show eth0 >/dev/null 2>&1; then
    ip link set eth0 up
    udhcpc -i eth0 -s /etc/udhcpc/default.script -q -n -t 5 -T 2 ||
        echo "k3os-init: udhcpc on eth0 got no lease"
else
    echo "k3os-init: no eth0"
fi

httpd -p 80 -h /srv/www

echo "K3OS-READY"
# The shell runs as a background job so that `wait` (unlike a foreground command) is
# interrupted by the signals above and the shutdown trap runs at once.
while true; do
    setsid sh -c "exec sh -l <$tty >$tty 2>&1" &
    wait $!
    sleep 1
done
