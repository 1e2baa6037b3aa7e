#!/bin/sh
# initrd /init of the "-panic" failure variant: exits at once, so the kernel panics
# ("Attempted to kill init") and panic=<secs> on the command line reboots into the loader.
echo "K3OS-INITRD-PANIC exiting /init on purpose"
exit 1
