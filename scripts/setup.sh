#!/usr/bin/env bash
# Installs everything this project needs on a fresh Debian 12 machine (as root): the Debian
# packages for images and QEMU, the Rust targets for the static node binary, and `just`.
# Idempotent; safe to run again.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt/dpkg (unattended-upgrades, a second setup run) instead of failing with exit 100.
APT_WAIT=(-o DPkg::Lock::Timeout=600)

# postgresql-15 (what Debian 12's `postgresql` installs; named exactly because the test runs its
# binaries by their versioned path): collector/src/store/tests/pg_server.rs starts its own server (initdb, pg_ctl from
# /usr/lib/postgresql/15/bin, as the postgres user); the system service it also installs is not used.
# chromium: k3os-ops/tests/cli/fleet_reports.rs loads the collector's dashboard in headless Chromium.
# etcd-server: the etcd beside the Kubernetes test binaries below (Debian 12's 3.4 works with
# kube-apiserver v1.36). xz-utils: unpacks them.
# cryptsetup-bin: veritysetup, run by `release create --verity` and by libupgrade's verity tests
# (the node's own tree and FEC are checked byte for byte against it).
# sbsigntool (sbsign, sbverify), systemd-boot-efi (the UKI stub) and binutils (objcopy): the
# signed UEFI path's unified kernel images (images/src/secboot.rs).
PKGS="qemu-system-x86 qemu-system-arm qemu-utils squashfs-tools squashfs-tools-ng grub-pc-bin grub-efi-amd64-bin
grub-common grub2-common syslinux extlinux syslinux-common isolinux ovmf qemu-efi-aarch64 gdisk dosfstools mtools
busybox-static gcc-aarch64-linux-gnu libc6-dev-arm64-cross fdisk e2fsprogs cpio kmod libclang-dev clang pkgconf
musl-tools qemu-user-static binfmt-support diffutils grub-emu openssl curl bc casync rauc xdelta3 bsdiff zstd dbus-daemon time
runc skopeo util-linux mount python3 python3-pip postgresql-15 chromium cryptsetup-bin xz-utils etcd-server
sbsigntool systemd-boot-efi binutils"

missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    apt-get "${APT_WAIT[@]}" update -qq
    # One call per package: a single bulk call was seen to fail in the resolver on these
    # machines while every package installs fine on its own.
    for p in $missing; do
        apt-get "${APT_WAIT[@]}" install -y -qq --no-install-recommends "$p" >/dev/null
    done
fi
# The arm64 kernel, busybox and GRUB come from Debian's arm64 archive (multiarch).
dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64; apt-get "${APT_WAIT[@]}" update -qq; }

rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl >/dev/null
command -v just >/dev/null || [ -x "$HOME/.cargo/bin/just" ] || cargo install just --locked
# `just fuzz` (fuzz/README.md): cargo-fuzz, run on the stable toolchain with RUSTC_BOOTSTRAP=1.
command -v cargo-fuzz >/dev/null || [ -x "$HOME/.cargo/bin/cargo-fuzz" ] || cargo install cargo-fuzz --locked
# python-tuf, the TUF reference implementation, for k3os-ops/tests/cli/tuf_interop.rs (exact versions;
# --break-system-packages: Debian's python3 is "externally managed" and these are test tools).
python3 -c 'import importlib.metadata as m, sys; sys.exit(not (m.version("tuf") == "7.0.1" and m.version("securesystemslib") == "1.6.0"))' 2>/dev/null ||
    python3 -m pip install -q --break-system-packages 'tuf==7.0.1' 'securesystemslib[crypto]==1.6.0'
# virt-firmware's virt-fw-vars enrols the test Secure Boot certificate into an OVMF variable store
# (images/src/secboot.rs; Debian 12 has no package of it).
python3 -c 'import importlib.metadata as m, sys; sys.exit(m.version("virt-firmware") != "26.10")' 2>/dev/null ||
    python3 -m pip install -q --break-system-packages 'virt-firmware==26.10'

# Kubernetes v1.36.2 for the tests that need a real control plane (k3os-ops/tests/cli/cluster/,
# the vm-tests Kubernetes scenarios), in envtest's layout: .cache/kube/<version>/<os-arch>/ holds
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kubelet (kubelet also for
# linux-arm64, for the arm64 guests), and `etcd` links to Debian's. The tests find them there, or
# where KUBEBUILDER_ASSETS points. They come from ../shared/kube beside the clone when it is there
# (CI and the developers' machines: built from the upstream sources, checked against SHA256SUMS);
# elsewhere from the Kubernetes release downloads, each checked against its published sha256.
# Never committed: .cache/ is ignored.
root=$(cd "$(dirname "$0")/.." && pwd)
kube_version=v1.36.2
kube_assets="$root/.cache/kube/$kube_version"
shared_kube="$(dirname "$root")/shared/kube"
if [ -f "$shared_kube/install.sh" ]; then
    bash "$shared_kube/install.sh" "$kube_assets" linux-amd64 linux-arm64 >/dev/null
else
    echo "setup: no $shared_kube; getting Kubernetes $kube_version from the release downloads (dl.k8s.io)"
    for arch in linux-amd64 linux-arm64; do
        names="kubelet"
        [ "$arch" = linux-amd64 ] && names="kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet"
        mkdir -p "$kube_assets/$arch"
        for n in $names; do
            out="$kube_assets/$arch/$n"
            [ -x "$out" ] && continue
            url="https://dl.k8s.io/release/$kube_version/bin/${arch%%-*}/${arch#*-}/$n"
            curl -fsSL -o "$out.part" "$url"
            want=$(curl -fsSL "$url.sha256")
            echo "$want  $out.part" | sha256sum -c --quiet - || { rm -f "$out.part"; echo "setup: $url: sha256 mismatch" >&2; exit 1; }
            chmod 755 "$out.part" && mv "$out.part" "$out"
        done
    done
fi
ln -sfn /usr/bin/etcd "$kube_assets/linux-amd64/etcd"
"$kube_assets/linux-amd64/kube-apiserver" --version | grep -qx "Kubernetes $kube_version" ||
    { echo "setup: $kube_assets/linux-amd64/kube-apiserver is not $kube_version" >&2; exit 1; }
echo "setup: done"
