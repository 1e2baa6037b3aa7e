#!/bin/sh
# Inputs of `just bench-delta`'s image-archive pair: the agent's own OCI image from two commits,
# the previous release's (its k3os-ops, read out of its v1 rootfs built by `just
# images-previous-x86_64`) and this tree's (out of `just images-x86_64`'s v1), each written by
# k3os-oci twice: with the layer gzipped (what a registry serves) and as a plain tar (what a
# release should carry). Output: $1/oci/{old,new}-{gzip,plain}.tar. Nothing downloaded.
set -eu
cache=$1
out=$cache/oci
old=images/out/previous/x86_64/releases/v1/rootfs.squashfs
new=images/out/x86_64/releases/v1/rootfs.squashfs
for f in "$old" "$new"; do
    [ -f "$f" ] || { echo "delta-images: $f missing: run \`just images-previous-x86_64\` first" >&2; exit 1; }
done
mkdir -p "$out"
cargo build -q -p k3os-ops --bin k3os-oci
for which in old new; do
    eval sq=\$$which
    unsquashfs -q -cat "$sq" usr/bin/k3os-ops >"$out/$which.bin"
    for c in gzip none; do
        name=$c; [ "$c" = none ] && name=plain
        target/debug/k3os-oci --out "$out/$which-$name.tar" --ref "docker.io/library/k3os-ops:$which" \
            --binary amd64="$out/$which.bin" --layer-compression "$c" >/dev/null
    done
done
cmp -s "$out/old.bin" "$out/new.bin" && { echo "delta-images: both commits' k3os-ops are identical" >&2; exit 1; }
ls -l "$out"/*.tar
