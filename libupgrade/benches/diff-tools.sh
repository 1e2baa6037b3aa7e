#!/bin/sh
# Which binary diff the squashfs patches use per changed file (`just bench-diff-tools`, after
# `just bench-delta` has extracted the trees): zstd --patch-from (the Debian 12 CLI, zstd 1.5.4,
# the same library version the node links) against bsdiff 4.3, on every regular file that a pair
# changes at the same path, both against the old file's bytes. Prints per pair the files, the
# bytes the new files hold, each tool's total patch bytes and seconds, and the ratio
# bsdiff / zstd. The patch format's choice and its reasons are in libupgrade/src/patch/mod.rs.
#
#   diff-tools.sh CACHE_DIR [PAIR...]     (PAIR: old:new tree names; default the three pairs)
set -eu

cache=${1:?usage: diff-tools.sh CACHE_DIR [old:new ...]}
shift
pairs=${*:-"monthly-v1:monthly-v2 monthly-v0:monthly-v1 monthly-v2:major-v2"}
trees="$cache/trees"
for t in zstd bsdiff; do
    command -v "$t" >/dev/null || { echo "diff-tools: $t is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

now() { date +%s.%N; }

printf '%-24s %6s %12s %12s %8s %12s %8s %7s\n' pair files new-bytes zstd-bytes zstd-s bsdiff-bytes bsdiff-s ratio
for pair in $pairs; do
    old="$trees/${pair%%:*}"
    new="$trees/${pair##*:}"
    [ -d "$old" ] && [ -d "$new" ] || { echo "diff-tools: $old or $new missing (run just bench-delta first)" >&2; exit 1; }
    files=0 bytes=0 zb=0 bb=0 zt=0 bt=0
    list="$work/list"
    (cd "$new" && find . -type f -size +0) >"$list"
    while IFS= read -r f; do
        [ -f "$old/$f" ] && [ ! -L "$old/$f" ] || continue
        cmp -s "$old/$f" "$new/$f" && continue
        files=$((files + 1))
        bytes=$((bytes + $(stat -c %s "$new/$f")))
        t0=$(now)
        zstd -q -19 --patch-from="$old/$f" "$new/$f" -o "$work/z" -f 2>/dev/null
        t1=$(now)
        bsdiff "$old/$f" "$new/$f" "$work/b"
        t2=$(now)
        zb=$((zb + $(stat -c %s "$work/z")))
        bb=$((bb + $(stat -c %s "$work/b")))
        zt=$(echo "$zt + $t1 - $t0" | bc)
        bt=$(echo "$bt + $t2 - $t1" | bc)
    done <"$list"
    ratio=$(echo "scale=3; $bb / ($zb + ($zb == 0))" | bc)
    printf '%-24s %6d %12d %12d %8.1f %12d %8.1f %7s\n' "$pair" "$files" "$bytes" "$zb" "$zt" "$bb" "$bt" "$ratio"
done
