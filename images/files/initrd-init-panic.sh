#!/bin/sh
# initrd /init of the "-panic" failure variant: loads the pstore backends of /etc/modules.pstore
# (efi_pstore: where the firmware has UEFI variables, the panic's kernel log is written there and
# the next good boot reads it back from /sys/fs/pstore), then exits at once, so the kernel panics
# ("Attempted to kill init") and panic=<secs> on the command line reboots into the loader.
export PATH=/bin:/sbin
while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/$m" || echo "k3os-initrd: pstore backend $m not loaded"
done </etc/modules.pstore
echo "K3OS-INITRD-PANIC exiting /init on purpose"
exit 1
