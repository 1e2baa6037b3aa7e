#!/bin/sh
# Print docs/reference/cli.md from the built binary's own help: every command and subcommand of
# `k3os-ops`, each with its `--help` text.
#
#   scripts/cli-reference.sh [K3OS_OPS] > docs/reference/cli.md
#
# K3OS_OPS defaults to target/debug/k3os-ops (`cargo build -p k3os-ops`, default features: the
# collector included). `cargo test -p checks --test guide` fails when the file differs.
set -eu
export COLUMNS=100
# clap prints the value of an argument's environment variable in its help: none here.
unset K3OS_OPS_CONFIG K3OS_OPS_METRICS_ADDR NODE_NAME POD_NAME POD_NAMESPACE
bin=${1:-target/debug/k3os-ops}

# The subcommand names listed under "Commands:" in a help text (without `help`).
subcommands() {
    sed -n '/^Commands:/,/^$/p' | sed -n 's/^  \([a-z][a-z-]*\) .*/\1/p; s/^  \([a-z][a-z-]*\)$/\1/p' | grep -vx help || true
}

section() {
    # $1: heading depth (##, ###, …); the rest: the command words after k3os-ops.
    depth=$1
    shift
    echo
    echo "$depth \`k3os-ops $*\`"
    echo
    echo '```text'
    "$bin" "$@" --help
    echo '```'
    for sub in $("$bin" "$@" --help | subcommands); do
        (section "$depth#" "$@" "$sub") # a subshell: sh has no local variables
    done
}

cat <<'HEAD'
# `k3os-ops` command reference

*Reference.* Every command and flag, as the binary prints them (`k3os-ops <command> --help`).
Generated from the clap definitions in `k3os-ops/src` by `scripts/cli-reference.sh >
docs/reference/cli.md`; `cargo test -p checks --test guide` fails when this file differs from
the built binary's help. The static node build (`--no-default-features`) has no `collector`
command and no `rollout-status --reports`.

## Exit statuses

| status | meaning |
|---|---|
| 0 | done; also `upgrade` with nothing newer offered or the release held back because it failed on this node (`nothing to stage: failed here: …`), and `upgrade --converge` when the booted slot already runs the version |
| 1 | failed; one `error:` line names what and why (a `slot confirm` whose boot did not end on a good slot, a schedule that already ended, `upgrade --converge` of a release that failed on this node) |
| 2 | wrong arguments (clap) |
| 75 | `EX_TEMPFAIL`: do the rest later — `slot confirm` while awaited checks are not reported yet; `upgrade` stopped cleanly at its byte budget (`--max-bytes`) or the end of its schedule (`--stage-until`, `--stage-window`); run it again to resume |

## `k3os-ops`

```text
HEAD
"$bin" --help
echo '```'
for sub in $("$bin" --help | subcommands); do
    section "##" "$sub"
done
