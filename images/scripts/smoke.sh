#!/bin/sh
# Boot one test disk under QEMU (TCG) and wait for the rootfs's markers:
#
#   smoke.sh <x86_64|aarch64> <grub-bios|grub-efi|extlinux> [timeout_secs] [http_port]
#
# DISK=<path> boots that disk image instead (same arch/variant recipe).
# Boots a scratch copy of images/out/<arch>/disk-<variant>.img (the original stays pristine),
# serial console to images/out/<arch>/smoke-<variant>.log, and succeeds once K3OS-BOOTED and
# K3OS-READY were printed and the workload answers "alive" on the forwarded port. Prints the
# QEMU command line and the time to each marker. Fails (exit 1) on timeout, on
# K3OS-INITRD-FAILED / K3OS-CONFIRM failed / a kernel panic, naming what it saw.
set -eu
arch=${1:?usage: smoke.sh <arch> <variant> [timeout] [port]}
variant=${2:?usage: smoke.sh <arch> <variant> [timeout] [port]}
timeout=${3:-180}
port=${4:-18080}
here=$(cd "$(dirname "$0")" && pwd)
out=$here/../out/$arch
disk=${DISK:-$out/disk-$variant.img}
[ -f "$disk" ] || { echo "smoke: $disk does not exist (run just images-$arch)" >&2; exit 1; }
scratch=$(mktemp -d "$out/.smoke.XXXXXX")
log=$out/smoke-$variant.log
qpid=""
cleanup() {
    [ -n "$qpid" ] && kill "$qpid" 2>/dev/null || true
    rm -rf "$scratch"
}
trap cleanup EXIT INT TERM
cp --sparse=always "$disk" "$scratch/disk.img"

common="-m 512 -accel tcg -display none -monitor none -serial stdio \
 -drive file=$scratch/disk.img,format=raw,if=virtio \
 -nic user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:$port-:80"
case "$arch/$variant" in
x86_64/grub-bios | x86_64/extlinux)
    cmd="qemu-system-x86_64 $common" ;;
x86_64/grub-efi)
    cp /usr/share/OVMF/OVMF_VARS_4M.fd "$scratch/vars.fd"
    cmd="qemu-system-x86_64 -M q35 $common \
 -drive if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd \
 -drive if=pflash,format=raw,file=$scratch/vars.fd" ;;
aarch64/grub-efi)
    cp /usr/share/AAVMF/AAVMF_VARS.fd "$scratch/vars.fd"
    cmd="qemu-system-aarch64 -M virt -cpu cortex-a57 -smp 2 $common \
 -drive if=pflash,format=raw,readonly=on,file=/usr/share/AAVMF/AAVMF_CODE.fd \
 -drive if=pflash,format=raw,file=$scratch/vars.fd" ;;
*) echo "smoke: no boot recipe for $arch/$variant" >&2; exit 2 ;;
esac
echo "smoke: $cmd" | tr -s ' '

start=$(date +%s.%N)
# shellcheck disable=SC2086
$cmd </dev/null >"$log" 2>&1 &
qpid=$!
booted=""
ready=""
while :; do
    now=$(date +%s.%N)
    el=$(echo "$now - $start" | bc)
    if [ -z "$booted" ] && grep -q 'K3OS-BOOTED' "$log"; then
        booted=$el
        echo "smoke: $(grep -a -m1 -o 'K3OS-BOOTED.*' "$log" | tr -d '\r') after ${el}s"
    fi
    if [ -z "$ready" ] && grep -q 'K3OS-READY' "$log"; then
        ready=$el
        echo "smoke: K3OS-READY after ${el}s"
        break
    fi
    for bad in 'K3OS-INITRD-FAILED' 'K3OS-CONFIRM failed' 'Kernel panic' 'K3OS-ROLLBACK'; do
        if grep -q "$bad" "$log"; then
            echo "smoke: FAILED: saw '$bad' after ${el}s; serial log: $log" >&2
            grep -a -m3 -A3 "$bad" "$log" >&2
            exit 1
        fi
    done
    if ! kill -0 "$qpid" 2>/dev/null; then
        echo "smoke: FAILED: QEMU exited after ${el}s; serial log: $log" >&2
        tail -5 "$log" >&2
        exit 1
    fi
    if [ "$(echo "$el > $timeout" | bc)" = 1 ]; then
        echo "smoke: FAILED: no K3OS-READY within ${timeout}s (booted: ${booted:-no}); serial log: $log" >&2
        tail -5 "$log" >&2
        exit 1
    fi
    sleep 0.5
done
body=$(curl -s --max-time 20 "http://127.0.0.1:$port/" || true)
if [ "$body" != alive ]; then
    echo "smoke: FAILED: workload on port 80 (forwarded to $port) answered '$body', expected 'alive'" >&2
    exit 1
fi
echo "smoke: workload answered 'alive'; PASS $arch $variant (booted ${booted}s, ready ${ready}s)"
