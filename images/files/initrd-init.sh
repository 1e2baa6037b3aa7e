#!/bin/sh
# initrd /init: load the modules listed in /etc/modules (in order) and the pstore backends of
# /etc/modules.pstore (failures tolerated), find the root partition named
# by root=PARTLABEL=<name> on the kernel command line, open it through dm-verity when the
# command line names k3os.verity=<root hash>,<geometry> (the modules of /etc/modules.verity and
# /bin/k3os-verity-open), mount its squashfs read-only with tmpfs for the writable trees, and
# switch_root into its /sbin/init. A dm-verity failure (the open, the mount or the first reads)
# is recorded on the state partition (verity-failure, read by the next boot's assessment) and
# reboots, so the loader counts the try and falls back; any other failure drops to an
# emergency shell on the console after printing K3OS-INITRD-FAILED <reason>.
export PATH=/bin:/sbin

mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

fail() {
    echo "K3OS-INITRD-FAILED $*"
    exec sh
}

while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/$m" || fail "insmod $m"
done </etc/modules
# pstore backends (efi_pstore): the rootfs mounts /sys/fs/pstore, where the records a panic
# left in the firmware are read back for the failed attempt's bundle. Not every target has one.
while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/$m" || echo "k3os-initrd: pstore backend $m not loaded"
done </etc/modules.pstore

partlabel=""
verity=""
slot=""
for arg in $(cat /proc/cmdline); do
    case "$arg" in
    root=PARTLABEL=*) partlabel=${arg#root=PARTLABEL=} ;;
    k3os.verity=*) verity=${arg#k3os.verity=} ;;
    k3os.slot=*) slot=${arg#k3os.slot=} ;;
    esac
done
[ -n "$partlabel" ] || fail "no root=PARTLABEL=<name> on the kernel command line: $(cat /proc/cmdline)"

# The partition named $1 (/dev/...), or nothing after $2 tenths of a second. The disk appears
# asynchronously after virtio_blk loads: scan the partitions' uevents for PARTNAME.
find_partition() {
    i=0
    while [ $i -lt "$2" ]; do
        for u in /sys/class/block/*/uevent; do
            [ -f "$u" ] || continue
            if grep -qx "PARTNAME=$1" "$u"; then
                echo "/dev/$(sed -n 's/^DEVNAME=//p' "$u")"
                return
            fi
        done
        sleep 0.1
        i=$((i + 1))
    done
}

# A dm-verity failure: print it, record it on the state partition for the next boot's
# assessment (slot status names verity as the why of the fallback), and reboot so the loader
# counts this try. The record is best effort: without it the fallback still happens.
verity_fail() {
    reason=$(echo "$*" | tr '\n' ' ')
    echo "K3OS-INITRD-VERITY-FAILED slot ${slot:-?}: $reason"
    dmesg | grep -i -e verity -e device-mapper | tail -n 5
    state=$(find_partition state 30)
    if [ -n "$state" ] && mkdir -p /state && mount -t ext4 -o rw "$state" /state; then
        printf 'format=1\nslot=%s\nreason=%s\n' "$slot" "$reason" >/state/verity-failure.tmp &&
            mv /state/verity-failure.tmp /state/verity-failure &&
            echo "k3os-initrd: recorded on $state (verity-failure)"
        umount /state
    else
        echo "k3os-initrd: could not record the failure: no state partition mounted"
    fi
    sync
    echo "K3OS-INITRD-REBOOT so the loader falls back"
    reboot -f
    echo b >/proc/sysrq-trigger
    exec sh
}

# Open $dev through dm-verity with the loader's value; sets root to the mapped device. A value
# without geometry (an activation by an earlier k3os-ops) keeps the plain partition, as then.
open_verity() {
    while read -r m; do
        [ -n "$m" ] || continue
        insmod "/lib/modules/$m" || verity_fail "insmod $m"
    done </etc/modules.verity
    out=$(k3os-verity-open "$dev" "$verity" 2>&1)
    case $? in
    0)
        root=$out
        echo "k3os-initrd: root $dev opened through dm-verity as $root"
        ;;
    3) echo "k3os-initrd: $out; mounting $dev without dm-verity" ;;
    *) verity_fail "$out" ;;
    esac
}

# The first reads through dm-verity: init and busybox; a block FEC could not correct fails
# them or leaves "is corrupted" in the kernel log.
verity_first_reads() {
    cat /newroot/sbin/init /newroot/bin/busybox >/dev/null 2>&1 ||
        verity_fail "reading /sbin/init and /bin/busybox of the root failed"
    if dmesg | grep -q 'verity.*corrupted'; then
        verity_fail "the kernel reports corrupted blocks: $(dmesg | grep 'verity.*corrupted' | tail -n 1)"
    fi
}

dev=$(find_partition "$partlabel" 100)
[ -n "$dev" ] || fail "no partition named $partlabel (block devices: $(ls /sys/class/block | tr '\n' ' '))"
echo "k3os-initrd: root $partlabel is $dev"

root=$dev
[ -z "$verity" ] || open_verity
if ! mount -t squashfs -o ro "$root" /newroot; then
    [ "$root" = "$dev" ] || verity_fail "mount squashfs $root"
    fail "mount squashfs $dev"
fi
[ "$root" = "$dev" ] || verity_first_reads
mount -t tmpfs -o mode=0755 tmpfs /newroot/var || fail "tmpfs /newroot/var"
mkdir -p /newroot/var/lib/k3os-ops /newroot/var/log /newroot/var/tmp
mount --move /dev /newroot/dev || fail "move /dev"
echo "k3os-initrd: switch_root at $(cut -d' ' -f1 /proc/uptime)s of uptime"
umount /proc /sys
exec switch_root /newroot /sbin/init
