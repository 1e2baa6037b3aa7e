#!/usr/bin/env bash
# `just fuzz [SECS] [TARGET...]`: builds every fuzz target (cargo-fuzz on the stable toolchain,
# see README.md), runs each for SECS seconds (default 60) as one libFuzzer job under nice, then
# replays every corpus against the real `grub-editenv`. Fails on any crash, assertion, timeout
# (an input running longer than 10 s) or out-of-memory (2 GiB RSS, or one allocation above
# 512 MiB); the crashing input is left in fuzz/artifacts/<target>/. The last line says how many
# executions each target ran.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
shift || true
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for f in fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi
command -v cargo-fuzz >/dev/null || [ -x "$HOME/.cargo/bin/cargo-fuzz" ] || {
    echo "fuzz: cargo-fuzz is missing: run scripts/setup.sh (cargo install cargo-fuzz --locked)" >&2
    exit 1
}
# cc-rs instruments the C dependencies for ASan too (-fsanitize=address from -Zsanitizer).
# zstd-sys compiles zstd with -fmerge-all-constants, which puts function-local const tables
# (zstd_opt.c's getAllMatchesFns) in static storage while GCC's use-after-scope
# instrumentation still poisons them at scope exit: the second compression in a process then
# reads a "stack-use-after-scope" in a global (README.md, Findings). CFLAGS come after the
# crate's own flags, so this undoes the merge for the fuzz build only; a node's build (no
# ASan) reads the same in-bounds constant either way.
export CFLAGS_x86_64_unknown_linux_gnu="${CFLAGS_x86_64_unknown_linux_gnu:-} -fno-merge-all-constants"
# cargo-fuzz passes nightly-only flags (-Zsanitizer=address, sancov passes); the stable
# toolchain accepts them with RUSTC_BOOTSTRAP=1 (see README.md).
RUSTC_BOOTSTRAP=1 nice -n 10 cargo fuzz build -O --sanitizer address
bin=target/x86_64-unknown-linux-gnu/release
summary=()
failed=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t" "seeds/$t"
    # Every finding's input, three times in one process (a finding may need state an earlier
    # run left, as the zstd one did): a regression fails here before any fuzzing.
    regress=(seeds/"$t"/regress-*)
    if [ -e "${regress[0]}" ] && ! nice -n 10 "$bin/$t" -runs=3 -detect_leaks=0 \
        -malloc_limit_mb=512 -rss_limit_mb=2048 -timeout=10 "${regress[@]}" >"artifacts/$t/regress.log" 2>&1; then
        tail -40 "artifacts/$t/regress.log"
        echo "fuzz: $t FAILED on a regression input (log: fuzz/artifacts/$t/regress.log)"
        failed+=("$t")
        summary+=("$t=regress")
        continue
    fi
    work=$(mktemp -d)
    echo "fuzz: $t for ${secs}s"
    rc=0
    # -jobs=1 -workers=1: one fuzzing process (libFuzzer logs it to fuzz-0.log in its cwd).
    (cd "$work" && timeout --kill-after=30 $((secs + 120)) nice -n 10 "$OLDPWD/$bin/$t" \
        -jobs=1 -workers=1 -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -malloc_limit_mb=512 -print_final_stats=1 -detect_leaks=0 \
        -artifact_prefix="$OLDPWD/artifacts/$t/" \
        "$OLDPWD/corpus/$t" "$OLDPWD/seeds/$t") || rc=$?
    log="$work/fuzz-0.log"
    execs=$(grep -a 'stat::number_of_executed_units' "$log" 2>/dev/null | tail -1 | awk '{print $2}')
    if [ "$rc" -ne 0 ] || ! grep -aq 'Done [0-9]* runs' "$log" 2>/dev/null; then
        tail -40 "$log" 2>/dev/null || true
        echo "fuzz: $t FAILED (exit $rc); inputs in fuzz/artifacts/$t/"
        failed+=("$t")
    fi
    summary+=("$t=${execs:-?}")
    rm -rf "$work"
done
# GRUB's own reader on every input the grubenv target has seen (seeds and corpus).
nice -n 10 cargo test -q --test grub_editenv
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]}; executions: ${summary[*]}"
    exit 1
fi
echo "fuzz: all ${#targets[@]} targets passed (${secs}s each); executions: ${summary[*]}"
