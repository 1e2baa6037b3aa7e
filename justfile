# Recipes of the k3os A/B installer workspace. Each engineer adds their own recipes.

# --- images (owned by images/) -------------------------------------------------------------
# Test releases and disks land in images/out/<arch>/ (releases/<version>/, disk-<variant>.img);
# Debian packages are cached in .cache/debs/<arch>/. Everything is incremental.

# Build the x86_64 and aarch64 test releases and disks.
images: images-x86_64 images-aarch64

# x86_64: releases v1 v2 v3 (+ v2-panic, v2-noconfirm, v2-badhealth, v4-panic, v2-nonet), disks grub-bios, grub-efi, extlinux.
images-x86_64: (images-build "x86_64")

# aarch64: the same releases, disk grub-efi (AAVMF).
images-aarch64: (images-build "aarch64")

# One architecture (x86_64 or aarch64). The host x86_64 musl k3os-ops also signs the releases.
images-build arch:
    #!/bin/sh
    set -eu
    images/scripts/fetch-debs.sh {{arch}} >/dev/null
    cargo build --release -p k3os-ops --no-default-features --target x86_64-unknown-linux-musl
    if [ "{{arch}}" != x86_64 ]; then
        cargo build --release -p k3os-ops --no-default-features --target {{arch}}-unknown-linux-musl
    fi
    images_tool=$(scripts/host-tool.sh k3os-images k3os-images)
    "$images_tool" build --arch {{arch}} \
        --debs .cache/debs/{{arch}}/root \
        --k3os-ops target/{{arch}}-unknown-linux-musl/release/k3os-ops \
        --verity-open target/{{arch}}-unknown-linux-musl/release/k3os-verity-open \
        --tool target/x86_64-unknown-linux-musl/release/k3os-ops \
        --out images/out

# The previous release's disks and v1 (CHANGELOG.md's newest entry with a commit), built by that
# release's own code from this repository's history (a git worktree in target/previous/<sha>)
# into images/out/previous/<arch>/, trusting the current test key; cached by commit. For the VM
# scenario upgrade-from-previous. A shallow clone fails saying `git fetch --unshallow`.
images-previous: images (images-previous-build "x86_64 aarch64")

# The same for x86_64 only (what `just test` needs: its default set boots x86_64 previous disks).
images-previous-x86_64: images-x86_64 (images-previous-build "x86_64")

# The Kubernetes node variant (releases v1-kube, v2-kube and v2-kubenotready, whose kubelet
# config does not load; disk grub-efi-kube, x86_64 and aarch64):
# the plain root plus Debian's containerd, runc, CNI plugins and iptables
# (images/scripts/fetch-debs.sh --kube) and the kubelet of the Kubernetes binaries scripts/setup.sh
# installs into .cache/kube/<version>/linux-<debarch>. Every -kube release also carries the
# agent's image (the `image` recipe's k3os-oci, this platform only, uncompressed layer) as a
# payload that containerd imports at boot. The plain releases and disks are untouched.
images-kube-x86_64: (images-kube "x86_64" "amd64" "grub-efi")

# The same for aarch64 (AAVMF): arm64 packages, the linux-arm64 kubelet, the aarch64 musl agent.
images-kube-aarch64: (images-kube "aarch64" "arm64" "grub-efi")

images-kube arch debarch boots kube_version="v1.36.2":
    #!/bin/sh
    set -eu
    images/scripts/fetch-debs.sh {{arch}} >/dev/null
    images/scripts/fetch-debs.sh --kube {{arch}} >/dev/null
    cargo build --release -p k3os-ops --no-default-features --target x86_64-unknown-linux-musl
    if [ "{{arch}}" != x86_64 ]; then
        cargo build --release -p k3os-ops --no-default-features --target {{arch}}-unknown-linux-musl
    fi
    images_tool=$(scripts/host-tool.sh k3os-images k3os-images)
    t="${CARGO_TARGET_DIR:-target}"
    agent="$t/oci/k3os-ops-{{debarch}}.oci.tar"
    "$(scripts/host-tool.sh k3os-ops k3os-oci)" --out "$agent" \
        --ref docker.io/library/k3os-ops:0.2.0 --layer-compression none \
        --binary {{debarch}}="$t/{{arch}}-unknown-linux-musl/release/k3os-ops"
    boots=""
    for b in {{boots}}; do boots="$boots --boot $b"; done
    "$images_tool" build --arch {{arch}} \
        --debs .cache/debs/{{arch}}/root \
        --kube-debs .cache/debs/{{arch}}/kube/root \
        --kube-assets .cache/kube/{{kube_version}}/linux-{{debarch}} \
        --kube-agent-image "$agent" \
        --k3os-ops target/{{arch}}-unknown-linux-musl/release/k3os-ops \
        --verity-open target/{{arch}}-unknown-linux-musl/release/k3os-verity-open \
        --tool target/x86_64-unknown-linux-musl/release/k3os-ops \
        --out images/out \
        --release v1-kube --release v2-kube --release v2-kubenotready --slot-a v1-kube $boots

# The signed UEFI path (x86_64, docs/design/trust.md): the test Secure Boot key, signed UKIs of
# v1 and v2 (images/out/x86_64/uki/), the OVMF variable store with the key enrolled
# (images/out/x86_64/secure-boot/) and disk-grub-efi-sb.img (signed GRUB, slot A v1's UKI).
images-secure-boot-x86_64:
    #!/bin/sh
    set -eu
    images/scripts/fetch-debs.sh x86_64 >/dev/null
    cargo build --release -p k3os-ops --no-default-features --target x86_64-unknown-linux-musl
    images_tool=$(scripts/host-tool.sh k3os-images k3os-images)
    "$images_tool" build --arch x86_64 \
        --debs .cache/debs/x86_64/root \
        --k3os-ops target/x86_64-unknown-linux-musl/release/k3os-ops \
        --verity-open target/x86_64-unknown-linux-musl/release/k3os-verity-open \
        --tool target/x86_64-unknown-linux-musl/release/k3os-ops \
        --out images/out \
        --release v1 --release v2 --boot grub-efi-sb --secure-boot

images-previous-build arches:
    images/scripts/build-previous.sh {{arches}}

# --- project entry points ------------------------------------------------------------------

# Install everything on a fresh Debian machine (root): packages, Rust targets, just.
setup:
    bash scripts/setup.sh

# The whole test suite: lint, unit + integration tests (loop devices, mounts, GRUB and extlinux
# tools), the agent's container image (skopeo, runc), then the default QEMU scenarios. This is
# what CI runs. At its end (also when a phase fails) it prints the wall time of each phase and
# of each VM scenario (scripts/phases.sh; records in target/phases/). The workspace tests run in
# the background beside the image phases and the VM scenarios.
test:
    #!/usr/bin/env bash
    set -euo pipefail
    . scripts/phases.sh
    phases_begin
    phase setup {{just_executable()}} setup
    phase lint {{just_executable()}} lint
    phase builds {{just_executable()}} builds
    # The recipes below use the host tools (k3os-images, k3os-oci) the builds phase made.
    export K3OS_HOST_TOOLS_BUILT=1
    # The workspace tests keep about one core busy (QEMU boots of the loader tests, servers,
    # timeouts), and the phases after them leave part of the second idle (the image builds
    # wait on mksquashfs and the disks, the scenarios on their guests' timers): they run in the
    # background from here to the end, at a lower priority than the chain that decides when the
    # run ends. They read the Debian packages (kernel, root), fetched first.
    phase debs sh -c 'images/scripts/fetch-debs.sh x86_64 >/dev/null'
    phase_start "workspace tests (background)" nice -n 5 cargo test --workspace
    phase images {{just_executable()}} images
    phase "previous release" {{just_executable()}} images-previous-build x86_64
    phase image-test {{just_executable()}} image-test
    phase "VM scenarios" cargo test --workspace --test scenarios -- --nocapture --test-threads 2
    phase_join

# Every binary the later phases of `just test` run: the static node binaries (x86_64 and
# aarch64 musl, release), and in one debug build the workspace's test binaries, the QEMU
# scenarios and the host tools (k3os-images, k3os-oci: scripts/host-tool.sh), so the phases
# after it time what they do, not compilation. Every later cargo invocation selects the whole
# workspace with its tests (`--workspace`, a `--test` filter at most), so the dependencies'
# features resolve the same and nothing is compiled twice.
builds:
    cargo build --release -p k3os-ops --no-default-features --target x86_64-unknown-linux-musl
    cargo build --release -p k3os-ops --no-default-features --target aarch64-unknown-linux-musl
    cargo test --workspace --no-run
    cargo test --workspace --no-run --test scenarios

# The main job: build the x86_64 images, boot a VM, show `slot status`, upgrade v1 -> v2 over
# HTTP, reboot into slot B and show `slot status` again.
demo: setup images-x86_64
    cargo run -q -p vm-tests --bin demo

# Formatting, clippy and the API docs of every crate (broken or private links included),
# warnings are errors; libupgrade and bootconfig also refuse an undocumented public item.
lint:
    cargo fmt --all --check
    cargo clippy --workspace --all-targets -- -D warnings
    # The node binary as it ships: without the tests' `testing` feature (the agent's modules
    # crate-private), so code only the tests use shows up as dead here.
    cargo clippy -p k3os-ops -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace

# Stage throughput and peak RSS against dd + sha256sum (BENCH_SIZE_MIB=1024 by default).
bench:
    cargo bench -p libupgrade --bench stage

# The collector's ingest (issue 32): 10,000 one-node sites × 10 reports over HTTP and in
# process, into SQLite and into a PostgreSQL server the test starts (postgresql-15, setup.sh);
# reports/s, p50/p99, database size, bytes per upgrade (COLLECTOR_BENCH_SITES=N for another size).
bench-collector:
    cargo test -p collector --profile dist -- --ignored ingest --nocapture --test-threads 1

# The agent at fleet scale: N simulated nodes against the fake API, idle cost and rollouts at
# concurrency 1, 10 and 100 (virtual time; FLEET_NODES, FLEET_ROLLOUT_NODES; README "Benchmarks").
bench-fleet:
    cargo bench -p k3os-ops --bench fleet

# Delta updates on real Debian squashfs images (two monthly pairs, a major pair): bytes fetched
# by us vs casync, 4 KiB blocks (RAUC block-hash-index), xdelta3 and our per-pair patches
# (their build and apply time and RSS), mksquashfs options, chunk sizes, and the real stage's
# time and RSS; and the agent's OCI image from the previous release to this tree as an
# image-archive payload (chunks, patch) against xdelta3 and a registry pull of the changed layers.
# Downloads ~300 MB of .debs once into .cache/delta. Not in CI.
bench-delta: images-previous-x86_64
    libupgrade/benches/delta-debs.sh .cache/delta
    libupgrade/benches/delta-images.sh .cache/delta
    cargo bench -p libupgrade --bench delta

# bsdiff against zstd --patch-from on every file the delta pairs change: bytes and seconds of
# each, the measurement behind the patch format's choice of zstd (libupgrade/src/patch/mod.rs).
bench-diff-tools:
    libupgrade/benches/delta-debs.sh .cache/delta
    sh libupgrade/benches/diff-tools.sh .cache/delta

# --- agent image (owned by k3os-ops/) -------------------------------------------------------
# The agent's container image as an OCI archive (image index: amd64 + arm64) at
# $CARGO_TARGET_DIR/oci/k3os-ops.oci.tar (default target/), written by k3os-ops' own k3os-oci
# from the static musl release binaries; no container daemon. Load it on a k3s node with
# `k3s ctr images import k3os-ops.oci.tar`, or push it with skopeo (see README).
image:
    #!/bin/sh
    set -eu
    t="${CARGO_TARGET_DIR:-target}"
    cargo build --release -p k3os-ops --no-default-features --target x86_64-unknown-linux-musl
    cargo build --release -p k3os-ops --no-default-features --target aarch64-unknown-linux-musl
    "$(scripts/host-tool.sh k3os-ops k3os-oci)" --out "$t/oci/k3os-ops.oci.tar" \
        --ref docker.io/library/k3os-ops:0.2.0 \
        --binary amd64="$t/x86_64-unknown-linux-musl/release/k3os-ops" \
        --binary arm64="$t/aarch64-unknown-linux-musl/release/k3os-ops"

# The image's tests: skopeo validates the archive (both platforms), runc runs the amd64 image
# with the DaemonSet's mounts up to the agent's start-up line, and the SUC Plan's prepare and
# upgrade containers with the Plan's mounts and privileges (root, runc, skopeo).
image-test: image
    cargo test --workspace --test image -- --ignored --test-threads 1

# --- vm-tests (owned by vm-tests/) ---------------------------------------------------------
# QEMU scenarios on the disks from `just images-*`; console logs in vm-tests/out/<target>/<scenario>/.

# One scenario on one target, e.g. `just vm-test powercut x86_64-grub-bios --all-barriers`
# (scenarios: upgrade fallback-panic fallback-noconfirm badhealth powercut missing-kernel awaited-check
# upgrade-from-previous bundle-offline reachability trust-rotation rollout-wave upgrade-patch all; target "all" too;
# upgrade-from-previous needs `just images-previous`; bundle-offline writes its bundle with the
# host k3os-ops `just images` builds).
# VM_TESTS_IMAGES=<dir> boots another images tree; VM_TESTS_ACCEL=tcg|kvm skips the KVM probe.
vm-test scenario="upgrade" target="x86_64-grub-bios" *flags="":
    cargo run -p vm-tests -- run {{scenario}} {{target}} {{flags}}

# The full matrix: every scenario on every target (the ignored tests included).
# VM_TESTS_ALL_BARRIERS=1 also cuts the power at every barrier instead of a sample.
vm-test-all: images-previous images-kube-x86_64 images-kube-aarch64
    cargo test --workspace --test scenarios -- --include-ignored --nocapture --test-threads 2

# The Kubernetes node joins a control plane started on the host (x86_64 GRUB UEFI, the -kube
# disk; etcd + kube-apiserver + controller manager + scheduler from .cache/kube, or
# KUBEBUILDER_ASSETS). Not in the default `just test` set.
vm-test-kube: images-kube-x86_64
    cargo run -p vm-tests -- run kube-node-joins x86_64-grub-efi

# The same on the arm64 node (AAVMF, the aarch64 -kube disk; TCG). Not in `just test`.
vm-test-kube-aarch64: images-kube-aarch64
    cargo run -p vm-tests -- run kube-node-joins aarch64-grub-efi

# A bad input: the node's seed trusts another CA than the API server's. The join fails within
# seconds of the kubelet's first attempt, naming the node and the kubelet's x509 reason, and the
# node keeps running its good slot. Not in `just test`.
vm-test-kube-refused: images-kube-x86_64
    cargo run -p vm-tests -- run kube-join-refused x86_64-grub-efi

# A real site: on that node and control plane, `kubectl apply -k` of an overlay over
# k3os-ops/deploy, a workload with a PodDisruptionBudget and an UpdateChannel; the agent pod
# upgrades the node v1-kube -> v2-kube from a channel the host serves (stage, cordon, drain,
# reboot, containerd imports v2's images, Ready, confirm, uncordon). Not in `just test`.
vm-test-site: images-kube-x86_64
    cargo run -p vm-tests -- run site-upgrade x86_64-grub-efi

# The same site with v2-kubenotready (its kubelet config does not load): not blessed within the
# channel's rebootTimeout (3 minutes here), the node rolls back to v1-kube by itself, Ready again,
# and the agent records the failure, releases the claim and pauses the channel; a collector on the
# host stores the node's rolled_back report with its why. Not in `just test`.
vm-test-site-rollback: images-kube-x86_64
    cargo run -p vm-tests -- run site-rollback x86_64-grub-efi

# The same site's upgrade with faults: QEMU SIGKILLed while the stage writes and again during the
# drain, then the API server stopped while the node reboots into B and started again after 60 s.
# The node comes back on its good slot each time, the stage resumes (not from zero), the drain
# completes, B is blessed and the node uncordoned; no 403 in the audit log. Not in `just test`.
vm-test-site-faults: images-kube-x86_64
    cargo run -p vm-tests -- run site-faults x86_64-grub-efi

# --- fuzzing (owned by fuzz/) ---------------------------------------------------------------
# Every fuzz target of fuzz/ for `secs` seconds each (one libFuzzer job each, under nice), then
# the GRUB env corpora replayed against grub-editenv; fails on any crash, timeout or OOM. The
# last line gives the executions per target. Not in CI (`just test`). See fuzz/README.md.
fuzz secs="60" *targets="":
    bash fuzz/run.sh {{secs}} {{targets}}
