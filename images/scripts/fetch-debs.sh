#!/bin/sh
# Download and extract the Debian packages one architecture's images are built from.
#
#   fetch-debs.sh <x86_64|aarch64> [CACHE_DIR]          the plain test OS
#   fetch-debs.sh --kube <x86_64|aarch64> [CACHE_DIR]   what its Kubernetes node variant adds
#
# Plain: the kernel, busybox-static and (arm64) grub-efi-arm64-bin go to $CACHE_DIR/<arch>/*.deb
# (default CACHE_DIR: <repo>/.cache/debs) and are extracted to $CACHE_DIR/<arch>/root/. The
# kernel is resolved through the linux-image-<debarch> metapackage's dependency, never
# hard-coded. Prints the resolved kernel release (e.g. 6.1.0-57-amd64) last.
#
# --kube (the `-kube` releases): containerd, runc, the CNI plugins (containernetworking-plugins)
# and iptables, with every shared library they link, go to $CACHE_DIR/<arch>/kube/*.deb and are
# extracted to $CACHE_DIR/<arch>/kube/root/ — a tree of its own, so the plain images' inputs stay
# exactly what they were. The libraries are resolved through `apt-cache depends` (every
# `Depends:` named lib*, recursively), never hard-coded. Prints the extracted root last.
#
# Both sets are fetched by the same loop: idempotent, a package whose .deb is already present is
# not downloaded again, and extraction is skipped when the set of .debs is unchanged
# (root/.extracted lists them).
set -eu

set_name=plain
if [ "${1:-}" = --kube ]; then
    set_name=kube
    shift
fi
usage="usage: fetch-debs.sh [--kube] <x86_64|aarch64> [CACHE_DIR]"
arch=${1:?$usage}
here=$(cd "$(dirname "$0")" && pwd)
cache=${2:-$here/../../.cache/debs}

case "$arch" in
x86_64) debarch=amd64; suffix="" ;;
aarch64) debarch=arm64; suffix=":arm64" ;;
*) echo "fetch-debs: unknown architecture '$arch' (expected x86_64 or aarch64)" >&2; exit 2 ;;
esac

if [ "$debarch" != "$(dpkg --print-architecture)" ] &&
    ! dpkg --print-foreign-architectures | grep -qx "$debarch"; then
    echo "fetch-debs: enabling multiarch $debarch (dpkg --add-architecture, apt-get update)" >&2
    dpkg --add-architecture "$debarch"
    apt-get update -qq
fi

# The plain set: the kernel behind the linux-image-<debarch> metapackage, busybox, arm64 GRUB.
resolve_kernel() {
    apt-cache depends "linux-image-$debarch$suffix" 2>/dev/null |
        sed -n "s/^ *Depends: \(linux-image-[0-9][^: ]*-$debarch\).*/\1/p" | head -n1
}
plain_packages() {
    kpkg=$(resolve_kernel)
    if [ -z "$kpkg" ]; then
        echo "fetch-debs: linux-image-$debarch$suffix not in the apt lists; running apt-get update" >&2
        apt-get update -qq
        kpkg=$(resolve_kernel)
    fi
    if [ -z "$kpkg" ]; then
        echo "fetch-debs: cannot resolve the kernel package behind linux-image-$debarch$suffix (apt-cache depends printed no linux-image-*-$debarch dependency)" >&2
        exit 1
    fi
    pkgs="$kpkg busybox-static"
    [ "$arch" = aarch64 ] && pkgs="$pkgs grub-efi-arm64-bin"
    return 0
}

# The Depends of $1 that are shared-library packages (lib*), without version or arch qualifiers.
lib_depends() {
    apt-cache depends "$1$suffix" 2>/dev/null |
        sed -n 's/^ *Depends: \(lib[^ :<>]*\).*/\1/p' | sort -u
}
# The kube set: every package of $top plus the library closure of their Depends.
kube_packages() {
    top="containerd runc containernetworking-plugins iptables"
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
}

# Download every package of $pkgs (its candidate version) into the current directory unless
# its .deb is there; sets $debs to the .deb files, in the order of $pkgs.
download() {
    debs=""
    for p in $pkgs; do
        ver=$(apt-cache policy "$p$suffix" | sed -n 's/^ *Candidate: //p')
        if [ -z "$ver" ] || [ "$ver" = "(none)" ]; then
            echo "fetch-debs: package $p$suffix has no installable candidate version (apt-get update?)" >&2
            exit 1
        fi
        # apt-get download names files <pkg>_<version with ':' as %3a>_<arch>.deb
        fver=$(printf %s "$ver" | sed 's/:/%3a/g')
        found=""
        for a in "$debarch" all; do
            [ -f "${p}_${fver}_${a}.deb" ] && found="${p}_${fver}_${a}.deb"
        done
        if [ -z "$found" ]; then
            echo "fetch-debs: downloading $p$suffix=$ver" >&2
            apt-get download -q -o APT::Sandbox::User=root "$p$suffix=$ver" >&2
            for a in "$debarch" all; do
                [ -f "${p}_${fver}_${a}.deb" ] && found="${p}_${fver}_${a}.deb"
            done
            if [ -z "$found" ]; then
                echo "fetch-debs: apt-get download of $p$suffix=$ver produced no ${p}_${fver}_*.deb in $(pwd)" >&2
                exit 1
            fi
        fi
        debs="$debs $found"
    done
}

# Extract $debs into ./root unless root/.extracted already lists exactly them.
extract() {
    want=$(printf '%s\n' $debs | sort)
    if [ ! -f root/.extracted ] || [ "$(cat root/.extracted)" != "$want" ]; then
        echo "fetch-debs: extracting into $(pwd)/root" >&2
        rm -rf root.tmp
        mkdir root.tmp
        for d in $debs; do dpkg-deb -x "$d" root.tmp; done
        printf '%s\n' "$want" >root.tmp/.extracted
        rm -rf root
        mv root.tmp root
    fi
}

case "$set_name" in
plain) plain_packages; dir=$cache/$arch ;;
kube) kube_packages; dir=$cache/$arch/kube ;;
esac
mkdir -p "$dir"
cd "$dir"
download
extract

if [ "$set_name" = kube ]; then
    for b in usr/bin/containerd usr/sbin/runc usr/lib/cni/bridge; do
        if [ ! -f "root/$b" ]; then
            echo "fetch-debs: the extracted packages hold no $b" >&2
            exit 1
        fi
    done
    echo "$dir/root"
    exit 0
fi

# The kernel release is the one directory under lib/modules of the resolved package.
kver=${kpkg#linux-image-}
if [ ! -d "root/lib/modules/$kver" ]; then
    echo "fetch-debs: $kpkg extracted no root/lib/modules/$kver" >&2
    exit 1
fi
if [ ! -f "root/lib/modules/$kver/modules.dep" ] || [ "root/lib/modules/$kver/modules.order" -nt "root/lib/modules/$kver/modules.dep" ]; then
    depmod -b "$dir/root" "$kver"
fi
echo "$kver"
