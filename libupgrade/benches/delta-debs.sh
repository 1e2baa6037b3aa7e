#!/bin/sh
# Download and extract the real Debian packages of the delta benchmark (`just bench-delta`).
#
#   delta-debs.sh CACHE_DIR
#
# Trees (extracted with dpkg-deb -x, no maintainer scripts) land in CACHE_DIR/trees/:
#   monthly-v1  the package set below, where the BUMP packages are at the previous version the
#               archive still carries (bookworm point release or an older security update)
#   monthly-v2  the same set, every package at the newest bookworm/-updates/-security version
#   major-v2    the same roles from trixie (Debian 13): most files change, many names too
# (major-v1 is monthly-v2.) The trixie lists come from a private apt directory under CACHE_DIR
# (the ordinary apt client, the system's apt state is not touched). Idempotent: .debs already
# downloaded are kept, a tree is rebuilt only when its list of .debs changed.
set -eu

cache=${1:?usage: delta-debs.sh CACHE_DIR}
mkdir -p "$cache/debs" "$cache/trees"
cache=$(cd "$cache" && pwd)

BOOKWORM="libc6 libc-bin libgcc-s1 libstdc++6 zlib1g liblzma5 libzstd1 libbz2-1.0 libssl3 openssl
ca-certificates systemd libsystemd0 libudev1 udev dbus libdbus-1-3 bash coreutils util-linux mount
libmount1 libblkid1 libuuid1 e2fsprogs perl-base perl-modules-5.36 libperl5.36 python3.11-minimal
libpython3.11-minimal libpython3.11-stdlib python3.11 curl libcurl4 libnghttp2-14 libssh2-1 tzdata
openssh-server openssh-client openssh-sftp-server vim-tiny iproute2 iptables libip4tc2 libip6tc2
libxtables12 nftables libnftables1 libnftnl11 libmnl0 gzip tar sed grep findutils procps libproc2-0
kmod libkmod2 sudo less git git-man libexpat1 libxml2 libglib2.0-0 libgnutls30 libp11-kit0
libtasn1-6 libnettle8 libhogweed6 libgmp10 libidn2-0 libunistring2 runc containerd conntrack socat
ethtool"
# A realistic month of security updates: these move to their newest version in monthly-v2.
BUMP="libssl3 openssl systemd libsystemd0 libudev1 udev openssh-server openssh-client
openssh-sftp-server libxml2 libexpat1 curl libcurl4"
TRIXIE="libc6 libc-bin libgcc-s1 libstdc++6 zlib1g liblzma5 libzstd1 libbz2-1.0 libssl3t64 openssl
ca-certificates systemd libsystemd0 libudev1 udev dbus libdbus-1-3 bash coreutils util-linux mount
libmount1 libblkid1 libuuid1 e2fsprogs perl-base perl-modules-5.40 libperl5.40 python3.13-minimal
libpython3.13-minimal libpython3.13-stdlib python3.13 curl libcurl4t64 libnghttp2-14 libssh2-1t64
tzdata openssh-server openssh-client openssh-sftp-server vim-tiny iproute2 iptables libip4tc2
libip6tc2 libxtables12 nftables libnftables1 libnftnl11 libmnl0 gzip tar sed grep findutils procps
libproc2-0 kmod libkmod2 sudo less git git-man libexpat1 libxml2 libglib2.0-0t64 libgnutls30t64
libp11-kit0 libtasn1-6 libnettle8t64 libhogweed6t64 libgmp10 libidn2-0 libunistring5 runc
containerd conntrack socat ethtool"

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

: >"$cache/monthly-v1.list"
: >"$cache/monthly-v2.list"
for p in $BOOKWORM; do
    vs=$(versions "$p")
    new=$(printf '%s\n' $vs | head -n1)
    [ -n "$new" ] || { echo "delta-debs: no version of $p in the apt lists (apt-get update?)" >&2; exit 1; }
    old=$new
    if is_bumped "$p"; then
        old=$(printf '%s\n' $vs | sed -n 2p)
        [ -n "$old" ] || old=$new
    fi
    fetch "$p" "$new" >>"$cache/monthly-v2.list"
    fetch "$p" "$old" >>"$cache/monthly-v1.list"
done
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
du -sh "$cache/trees/monthly-v1" "$cache/trees/monthly-v2" "$cache/trees/major-v2" >&2
