#!/bin/sh
# Download and extract the real Debian packages of the delta benchmark (`just bench-delta`).
#
#   delta-debs.sh CACHE_DIR
#
# Trees (extracted with dpkg-deb -x, no maintainer scripts) land in CACHE_DIR/trees/:
#   monthly-v1  the package set below, where the BUMP packages are at the previous version the
#               archive still carries (bookworm point release or an older security update)
#   monthly-v2  the same set, every package at the newest bookworm/-updates/-security version
#   monthly-v0  the month before monthly-v1: the BUMP packages of which the archive still
#               carries a third, older version (openssl, libssl3, openssh-*) at that version,
#               everything else as in monthly-v1 (the second monthly pair, v0 → v1)
#   major-v2    the same roles from trixie (Debian 13): most files change, many names too
# (major-v1 is monthly-v2.) trees/libzstd-trixie holds trixie's libzstd1 alone (1.5.7),
# which the benchmark loads into mksquashfs with LD_LIBRARY_PATH for its foreign-zstd pair. The trixie lists come from a private apt directory under CACHE_DIR
# (the ordinary apt client, the system's apt state is not touched). Idempotent: .debs already
# downloaded are kept, a tree is rebuilt only when its list of .debs changed.
set -eu

cache=${1:?usage: delta-debs.sh CACHE_DIR}
mkdir -p "$cache/debs" "$cache/trees"
cache=$(cd "$cache" && pwd)

here=$(cd "$(dirname "$0")" && pwd)
# The package sets live in delta-packages.txt (data, not commands).
section() { awk -v s="[$1]" '$0 == s { on = 1; next } /^\[/ { on = 0 } on && !/^#/' "$here/delta-packages.txt" | tr '\n' ' '; }
BOOKWORM=$(section bookworm)
BUMP=$(section bump)
TRIXIE=$(section trixie)

# apt with an optional private configuration (trixie); APT_OPTS is word-split on purpose.
APT_OPTS="-o APT::Architectures=amd64 -o APT::Sandbox::User=root"

# The versions apt knows for a package, newest first.
versions() { apt-cache $APT_OPTS madison "$1" | awk -F'|' '{gsub(/ /, "", $2); print $2}' | uniq; }

# fetch NAME VERSION: make sure debs/NAME_VERSION_*.deb exists, print its file name.
fetch() {
    fver=$(printf %s "$2" | sed 's/:/%3a/g')
    for a in amd64 all; do
        f="$cache/debs/${1}_${fver}_$a.deb"
        [ -f "$f" ] && { echo "$f"; return; }
    done
    (cd "$cache/debs" && apt-get $APT_OPTS download -q "$1=$2" >&2)
    for a in amd64 all; do
        f="$cache/debs/${1}_${fver}_$a.deb"
        [ -f "$f" ] && { echo "$f"; return; }
    done
    echo "delta-debs: apt-get download $1=$2 produced no .deb" >&2
    exit 1
}

# tree NAME FILE-WITH-DEBS: extract the listed .debs into trees/NAME (only when the list changed).
tree() {
    t="$cache/trees/$1"
    if [ -f "$t.debs" ] && cmp -s "$2" "$t.debs" && [ -d "$t" ]; then return; fi
    echo "delta-debs: extracting $(wc -l <"$2") packages into $t" >&2
    rm -rf "$t"
    mkdir -p "$t"
    while read -r deb; do dpkg-deb -x "$deb" "$t"; done <"$2"
    cp "$2" "$t.debs"
}

is_bumped() { printf '%s\n' $BUMP | grep -qx "$1"; }

: >"$cache/monthly-v0.list"
: >"$cache/monthly-v1.list"
: >"$cache/monthly-v2.list"
for p in $BOOKWORM; do
    vs=$(versions "$p")
    new=$(printf '%s\n' $vs | head -n1)
    [ -n "$new" ] || { echo "delta-debs: no version of $p in the apt lists (apt-get update?)" >&2; exit 1; }
    old=$new
    older=$new
    if is_bumped "$p"; then
        old=$(printf '%s\n' $vs | sed -n 2p)
        [ -n "$old" ] || old=$new
        older=$(printf '%s\n' $vs | sed -n 3p)
        [ -n "$older" ] || older=$old
    fi
    fetch "$p" "$new" >>"$cache/monthly-v2.list"
    fetch "$p" "$old" >>"$cache/monthly-v1.list"
    fetch "$p" "$older" >>"$cache/monthly-v0.list"
done
tree monthly-v0 "$cache/monthly-v0.list"
tree monthly-v1 "$cache/monthly-v1.list"
tree monthly-v2 "$cache/monthly-v2.list"

# trixie through a private apt state.
A="$cache/apt-trixie"
mkdir -p "$A/lists/partial" "$A/cache/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" >"$A/sources.list"
: >"$A/status"
APT_OPTS="$APT_OPTS -o Dir::Etc::SourceList=$A/sources.list -o Dir::Etc::SourceParts=/nonexistent
 -o Dir::State::Lists=$A/lists -o Dir::Cache=$A/cache -o Dir::State::status=$A/status"
[ -n "$(ls "$A/lists" | grep Packages)" ] || apt-get $APT_OPTS update -qq >&2
: >"$cache/major-v2.list"
for p in $TRIXIE; do
    new=$(versions "$p" | head -n1)
    if [ -z "$new" ]; then echo "delta-debs: trixie has no $p, skipped" >&2; continue; fi
    fetch "$p" "$new" >>"$cache/major-v2.list"
done
tree major-v2 "$cache/major-v2.list"
grep '/libzstd1_' "$cache/major-v2.list" >"$cache/libzstd-trixie.list" ||
    { echo "delta-debs: trixie's libzstd1 is not in the [trixie] set" >&2; exit 1; }
tree libzstd-trixie "$cache/libzstd-trixie.list"
du -sh "$cache/trees/monthly-v0" "$cache/trees/monthly-v1" "$cache/trees/monthly-v2" "$cache/trees/major-v2" >&2
