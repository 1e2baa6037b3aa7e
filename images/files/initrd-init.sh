#!/bin/sh
# initrd /init: load the modules listed in /etc/modules (in order), find the root partition named
# by root=PARTLABEL=<name> on the kernel command line, mount its squashfs read-only with tmpfs
# for the writable trees, and switch_root into its /sbin/init. Any failure drops to an
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

partlabel=""
for arg in $(cat /proc/cmdline); do
    case "$arg" in
    root=PARTLABEL=*) partlabel=${arg#root=PARTLABEL=} ;;
    esac
done
[ -n "$partlabel" ] || fail "no root=PARTLABEL=<name> on the kernel command line: $(cat /proc/cmdline)"

# The disk appears asynchronously after virtio_blk loads: scan the partitions' uevents for
# PARTNAME for up to 10 s.
dev=""
i=0
while [ -z "$dev" ] && [ $i -lt 100 ]; do
    for u in /sys/class/block/*/uevent; do
        [ -f "$u" ] || continue
        if grep -qx "PARTNAME=$partlabel" "$u"; then
            dev=/dev/$(sed -n 's/^DEVNAME=//p' "$u")
            break
        fi
    done
    [ -n "$dev" ] || { sleep 0.1; i=$((i + 1)); }
done
[ -n "$dev" ] || fail "no partition named $partlabel (block devices: $(ls /sys/class/block | tr '\n' ' '))"
echo "k3os-initrd: root $partlabel is $dev"

mount -t squashfs -o ro "$dev" /newroot || fail "mount squashfs $dev"
mount -t tmpfs -o mode=0755 tmpfs /newroot/var || fail "tmpfs /newroot/var"
mkdir -p /newroot/var/lib/k3os-ops /newroot/var/log /newroot/var/tmp
mount --move /dev /newroot/dev || fail "move /dev"
umount /proc /sys
exec switch_root /newroot /sbin/init
