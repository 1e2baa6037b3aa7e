#!/bin/sh
# /sbin/k3os-node-config: write this boot's k3os-ops config, /run/k3os-ops/config.toml (where
# K3OS_OPS_CONFIG and /etc/k3os-ops/config.toml point), and print its path.
#
# The base is the config for the loader installed on /boot, from the read-only root:
# config.syslinux.toml when /boot/syslinux exists, else config.grub.toml. The test OS reports
# nowhere unless a scenario asks: the lines of /var/lib/k3os-ops/report-to.toml on the state
# partition (report_url and report_site, which must come before the config's [layout] table)
# go first. init runs this at every boot; a scenario that writes report-to.toml runs it again,
# so the node reports from that command on and at every later boot.
set -eu
if [ -d /boot/syslinux ]; then
    base=/etc/k3os-ops/config.syslinux.toml
else
    base=/etc/k3os-ops/config.grub.toml
fi
report_to=/var/lib/k3os-ops/report-to.toml
out=/run/k3os-ops/config.toml
mkdir -p /run/k3os-ops
if [ -f "$report_to" ]; then
    cat "$report_to" "$base" >"$out.tmp"
else
    cat "$base" >"$out.tmp"
fi
mv -f "$out.tmp" "$out"
echo "$out"
