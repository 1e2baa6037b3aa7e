#!/bin/sh
# Build the disks of the previous release with the previous release's own code, for the VM
# scenario `upgrade-from-previous`.
#
#   build-previous.sh <x86_64|aarch64>...
#
# The previous release is the newest `## vX.Y.Z — <date> — commit <sha>` entry of CHANGELOG.md
# that names a commit. Its commit is checked out from this repository's own history as a git
# worktree in target/previous/<sha>, and the commit's own `just images-build <arch>` recipe
# builds its k3os-ops (static musl), its k3os-images and its disks and releases there (its own
# Cargo.lock, its own target/). Copied out to images/out/previous/<arch>/:
#
#   disk-<variant>.img   the previous release's disks (slot A: its v1, its boot script and env)
#   releases/v1/         its v1 release
#   k3os-ops.sha256      sha256 of the k3os-ops binary inside its v1 rootfs
#   previous.stamp       what the outputs were built from: version, commit, trusted public key
#
# Key: the previous build is given the current build's test key (images/out/keys, made by `just
# images-<arch>`, which must run first) before it runs, so its v1 trusts exactly the key that
# signs the current releases (v2, v3, v4-panic of images/out/<arch>/releases). A publisher keeps
# one release key across versions the same way.
#
# Compiled dependencies are shared with the current build: the old tree's cargo uses this tree's
# target/ as its build directory (CARGO_BUILD_BUILD_DIR, cargo's `build.build-dir`), so a crate
# of the same version, features and profile as the current build's is not compiled again, while
# its final binaries still land in its own target/ (the current build's target/<triple>/release/
# k3os-ops is not overwritten). Its own workspace crates hash differently (another path), so
# nothing of the current build is replaced. It builds with this tree's profiles: a config file
# beside its worktree, target/previous/.cargo/config.toml, holds this Cargo.toml's
# [profile.dev*] and [profile.release*] tables (cargo reads config files from the parent
# directories, and their profiles override Cargo.toml's), so the dependencies of its musl
# k3os-ops and of its debug k3os-images are the ones already compiled, not a second set at
# other optimisation or debug-info levels. Its code is the same; only how much LLVM optimises
# it may differ from the release as it was cut. What it compiles stays in this tree's target/.
#
# Cached by commit: when previous.stamp matches, nothing is built (a second run is free). After
# a build the old tree's target/ and images/out are deleted (GBs; the outputs are copied), unless
# K3OS_PREVIOUS_KEEP=1. A clone without the commit (shallow) fails saying how to fetch it.
set -eu

[ $# -gt 0 ] || { echo "usage: build-previous.sh <x86_64|aarch64>..." >&2; exit 2; }
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

line=$(grep -m1 -E '^## v[0-9]+\.[0-9]+\.[0-9]+ .* commit [0-9a-f]{40}[[:space:]]*$' CHANGELOG.md || true)
if [ -z "$line" ]; then
    echo "build-previous: CHANGELOG.md has no '## vX.Y.Z — <date> — commit <40-hex sha>' entry: no previous release to upgrade from" >&2
    exit 1
fi
version=$(printf '%s\n' "$line" | sed -E 's/^## (v[0-9]+\.[0-9]+\.[0-9]+).*/\1/')
sha=$(printf '%s\n' "$line" | sed -E 's/.*commit ([0-9a-f]{40})[[:space:]]*$/\1/')

if ! git cat-file -e "$sha^{commit}" 2>/dev/null; then
    shallow=""
    [ "$(git rev-parse --is-shallow-repository 2>/dev/null)" = true ] && shallow=" (it is a shallow clone)"
    echo "build-previous: this clone lacks the history of the previous release $version (commit $sha, named by CHANGELOG.md)$shallow; the scenario upgrade-from-previous builds that release from the repository's own history. Fetch it with \`git fetch --unshallow\` (or \`git fetch origin $sha\`) and run again." >&2
    exit 1
fi

keys=images/out/keys
pub=$(ls "$keys"/*.pub 2>/dev/null | head -n1 || true)
if [ -z "$pub" ] || ! ls "$keys"/*.key >/dev/null 2>&1; then
    echo "build-previous: no test key pair in $keys: run \`just images-x86_64\` first (the previous release's v1 must trust the key that signs the current releases)" >&2
    exit 1
fi
pubsum=$(sha256sum "$pub" | cut -d' ' -f1)

tree=target/previous/$sha
prepared=""
prepare_tree() {
    [ -n "$prepared" ] && return 0
    git worktree prune
    if [ -d "$tree" ] && [ "$(git -C "$tree" rev-parse HEAD 2>/dev/null)" != "$sha" ]; then
        echo "build-previous: $tree is not a checkout of $sha; recreating it" >&2
        git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
        git worktree prune
    fi
    if [ ! -d "$tree" ]; then
        mkdir -p "$(dirname "$tree")"
        git worktree add --detach "$tree" "$sha" >&2
    fi
    # This tree's profiles for the old tree's builds (see the header).
    mkdir -p "$(dirname "$tree")/.cargo"
    awk '/^\[/ { p = ($0 ~ /^\[profile\.(dev|release)[].]/) } p' Cargo.toml >"$(dirname "$tree")/.cargo/config.toml"
    if [ ! -f "$tree/justfile" ] || ! grep -q '^images-build arch:' "$tree/justfile"; then
        echo "build-previous: $version's justfile ($tree/justfile) has no \`images-build arch\` recipe: this script must learn how that release builds its images" >&2
        exit 1
    fi
    # The Debian packages: shared with the current build when the previous release fetches
    # them with the same script (no second download or extraction); else its own cache, with
    # the downloaded .debs and the extracted root/ hard-linked in. Its own script then decides:
    # when it resolves the same packages (root/.extracted lists them) it keeps that root (no
    # second extraction, ~400 MB); else it extracts its own set beside it (fetch-debs.sh
    # replaces root/ by a new directory, never writing into the linked files).
    mkdir -p "$tree/.cache" .cache/debs
    if cmp -s "$tree/images/scripts/fetch-debs.sh" images/scripts/fetch-debs.sh; then
        if [ ! -L "$tree/.cache/debs" ]; then
            rm -rf "$tree/.cache/debs"
            ln -s "$root/.cache/debs" "$tree/.cache/debs"
        fi
    else
        [ -L "$tree/.cache/debs" ] && rm -f "$tree/.cache/debs"
        for d in .cache/debs/*/; do
            [ -d "$d" ] || continue
            a=$(basename "$d")
            mkdir -p "$tree/.cache/debs/$a"
            for f in "$d"*.deb; do
                [ -f "$f" ] && ln -f "$f" "$tree/.cache/debs/$a/" 2>/dev/null || cp -n "$f" "$tree/.cache/debs/$a/" || true
            done
            if [ -f "${d}root/.extracted" ] && [ ! -e "$tree/.cache/debs/$a/root" ]; then
                cp -al "${d}root" "$tree/.cache/debs/$a/root" 2>/dev/null ||
                    rm -rf "$tree/.cache/debs/$a/root"
            fi
        done
    fi
    # The current test key, so the previous v1 trusts the current releases.
    rm -rf "$tree/images/out/keys"
    mkdir -p "$tree/images/out/keys"
    cp -p "$keys"/* "$tree/images/out/keys/"
    prepared=1
}

for arch in "$@"; do
    case "$arch" in
    x86_64 | aarch64) ;;
    *) echo "build-previous: unknown architecture '$arch' (expected x86_64 or aarch64)" >&2; exit 2 ;;
    esac
    out=images/out/previous/$arch
    want=$(printf 'version %s\ncommit %s\ntrust %s\n' "$version" "$sha" "$pubsum")
    if [ -f "$out/previous.stamp" ] && [ "$(cat "$out/previous.stamp")" = "$want" ] &&
        ls "$out"/disk-*.img >/dev/null 2>&1; then
        echo "build-previous: $arch: $version ($sha) is up to date in $out" >&2
        continue
    fi
    t0=$(date +%s)
    prepare_tree
    echo "build-previous: $arch: building $version (commit $sha) with its own code in $tree" >&2
    # Its own recipe and its own target dir for what it outputs (the paths in its recipe are
    # relative to its tree); this tree's target/ (or $CARGO_TARGET_DIR) as the build directory.
    build_dir=${CARGO_TARGET_DIR:-$root/target}
    case "$build_dir" in /*) ;; *) build_dir=$root/$build_dir ;; esac
    (cd "$tree" && env -u CARGO_TARGET_DIR CARGO_BUILD_BUILD_DIR="$build_dir" just images-build "$arch") >&2
    src=$tree/images/out/$arch
    ls "$src"/disk-*.img >/dev/null 2>&1 || {
        echo "build-previous: $version's image build wrote no $src/disk-*.img" >&2
        exit 1
    }
    [ -f "$src/releases/v1/manifest.json" ] || {
        echo "build-previous: $version's image build wrote no v1 release in $src/releases/v1" >&2
        exit 1
    }
    if ! cmp -s "$tree/images/out/keys/$(basename "$pub")" "$pub"; then
        echo "build-previous: $version's image build replaced the test key in $tree/images/out/keys" >&2
        exit 1
    fi
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp/releases"
    for d in "$src"/disk-*.img; do
        cp --sparse=always "$d" "$out.tmp/"
    done
    cp -r "$src/releases/v1" "$out.tmp/releases/v1"
    # The binary its v1 runs (what the scenario checks the node runs before it is upgraded).
    case "$arch" in
    x86_64) triple=x86_64-unknown-linux-musl ;;
    aarch64) triple=aarch64-unknown-linux-musl ;;
    esac
    sha256sum "$tree/target/$triple/release/k3os-ops" | cut -d' ' -f1 >"$out.tmp/k3os-ops.sha256"
    printf '%s\n' "$want" >"$out.tmp/previous.stamp"
    rm -rf "$out"
    mv "$out.tmp" "$out"
    echo "build-previous: $arch: $version (commit $sha) built in $(($(date +%s) - t0)) s -> $out" >&2
done

if [ -n "$prepared" ] && [ "${K3OS_PREVIOUS_KEEP:-0}" != 1 ]; then
    rm -rf "$tree/target" "$tree/images/out"
fi
echo "$version $sha"
