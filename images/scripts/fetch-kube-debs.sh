#!/bin/sh
# Download and extract the Debian packages the Kubernetes node variant of one architecture's
# test OS adds to the plain one (the `-kube` releases): containerd, runc, the CNI plugins
# (containernetworking-plugins) and iptables, with every shared library they link.
#
#   fetch-kube-debs.sh <x86_64|aarch64> [CACHE_DIR]
#
# Packages go to $CACHE_DIR/<arch>/kube/*.deb (default CACHE_DIR: <repo>/.cache/debs) and are
# extracted to $CACHE_DIR/<arch>/kube/root/ — a tree of its own, so the plain images'
# inputs (fetch-debs.sh's root/) stay exactly what they were. The libraries are resolved through
# `apt-cache depends` (every `Depends:` named lib*, recursively), never hard-coded. Idempotent
# like fetch-debs.sh: present .debs are not downloaded again, and extraction is skipped when
# the set of .debs is unchanged (root/.extracted lists them). Prints the extracted root last.
set -eu

arch=${1:?usage: fetch-kube-debs.sh <x86_64|aarch64> [CACHE_DIR]}
here=$(cd "$(dirname "$0")" && pwd)
cache=${2:-$here/../../.cache/debs}

case "$arch" in
x86_64) debarch=amd64; suffix="" ;;
aarch64) debarch=arm64; suffix=":arm64" ;;
*) echo "fetch-kube-debs: unknown architecture '$arch' (expected x86_64 or aarch64)" >&2; exit 2 ;;
esac

if [ "$debarch" != "$(dpkg --print-architecture)" ] &&
    ! dpkg --print-foreign-architectures | grep -qx "$debarch"; then
    echo "fetch-kube-debs: enabling multiarch $debarch (dpkg --add-architecture, apt-get update)" >&2
    dpkg --add-architecture "$debarch"
    apt-get update -qq
fi

top="containerd runc containernetworking-plugins iptables"

# The Depends of $1 that are shared-library packages (lib*), without version or arch qualifiers.
lib_depends() {
    apt-cache depends "$1$suffix" 2>/dev/null |
        sed -n 's/^ *Depends: \(lib[^ :<>]*\).*/\1/p' | sort -u
}

# Every package of $top plus the library closure of their Depends.
pkgs=""
todo=$top
while [ -n "$todo" ]; do
    next=""
    for p in $todo; do
        case " $pkgs " in *" $p "*) continue ;; esac
        pkgs="$pkgs $p"
        next="$next $(lib_depends "$p" | tr '\n' ' ')"
    done
    todo=$next
done

dir=$cache/$arch/kube
mkdir -p "$dir"
cd "$dir"
debs=""
for p in $pkgs; do
    ver=$(apt-cache policy "$p$suffix" | sed -n 's/^ *Candidate: //p')
    if [ -z "$ver" ] || [ "$ver" = "(none)" ]; then
        echo "fetch-kube-debs: package $p$suffix has no installable candidate version (apt-get update?)" >&2
        exit 1
    fi
    fver=$(printf %s "$ver" | sed 's/:/%3a/g')
    found=""
    for a in "$debarch" all; do
        [ -f "${p}_${fver}_${a}.deb" ] && found="${p}_${fver}_${a}.deb"
    done
    if [ -z "$found" ]; then
        echo "fetch-kube-debs: downloading $p$suffix=$ver" >&2
        apt-get download -q -o APT::Sandbox::User=root "$p$suffix=$ver" >&2
        for a in "$debarch" all; do
            [ -f "${p}_${fver}_${a}.deb" ] && found="${p}_${fver}_${a}.deb"
        done
        if [ -z "$found" ]; then
            echo "fetch-kube-debs: apt-get download of $p$suffix=$ver produced no ${p}_${fver}_*.deb in $dir" >&2
            exit 1
        fi
    fi
    debs="$debs $found"
done

want=$(printf '%s\n' $debs | sort)
if [ ! -f root/.extracted ] || [ "$(cat root/.extracted)" != "$want" ]; then
    echo "fetch-kube-debs: extracting into $dir/root" >&2
    rm -rf root.tmp
    mkdir root.tmp
    for d in $debs; do dpkg-deb -x "$d" root.tmp; done
    printf '%s\n' "$want" >root.tmp/.extracted
    rm -rf root
    mv root.tmp root
fi
for b in usr/bin/containerd usr/sbin/runc usr/lib/cni/bridge; do
    if [ ! -f "root/$b" ]; then
        echo "fetch-kube-debs: the extracted packages hold no $b" >&2
        exit 1
    fi
done
echo "$dir/root"
