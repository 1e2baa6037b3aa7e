#!/bin/sh
# Download and extract the Debian packages one architecture's images are built from.
#
#   fetch-debs.sh <x86_64|aarch64> [CACHE_DIR]
#
# Packages go to $CACHE_DIR/<arch>/*.deb (default CACHE_DIR: <repo>/.cache/debs) and are
# extracted to $CACHE_DIR/<arch>/root/. The kernel is resolved through the linux-image-<debarch>
# metapackage's dependency, never hard-coded. Idempotent: a package whose .deb is already present
# is not downloaded again, and extraction is skipped when the set of .debs is unchanged
# (root/.extracted lists them). Prints the resolved kernel release (e.g. 6.1.0-57-amd64) last.
set -eu

arch=${1:?usage: fetch-debs.sh <x86_64|aarch64> [CACHE_DIR]}
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

resolve_kernel() {
    apt-cache depends "linux-image-$debarch$suffix" 2>/dev/null |
        sed -n "s/^ *Depends: \(linux-image-[0-9][^: ]*-$debarch\).*/\1/p" | head -n1
}
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

dir=$cache/$arch
mkdir -p "$dir"
cd "$dir"
debs=""
for p in $pkgs; do
    ver=$(apt-cache policy "$p$suffix" | sed -n 's/^ *Candidate: //p')
    if [ -z "$ver" ] || [ "$ver" = "(none)" ]; then
        echo "fetch-debs: package $p$suffix has no installable candidate version" >&2
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
            echo "fetch-debs: apt-get download of $p$suffix=$ver produced no ${p}_${fver}_*.deb in $dir" >&2
            exit 1
        fi
    fi
    debs="$debs $found"
done

want=$(printf '%s\n' $debs | sort)
if [ ! -f root/.extracted ] || [ "$(cat root/.extracted)" != "$want" ]; then
    echo "fetch-debs: extracting into $dir/root" >&2
    rm -rf root.tmp
    mkdir root.tmp
    for d in $debs; do dpkg-deb -x "$d" root.tmp; done
    printf '%s\n' "$want" >root.tmp/.extracted
    rm -rf root
    mv root.tmp root
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
