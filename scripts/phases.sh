# Wall time per phase of a run, printed as a table when the run ends (also when it fails).
# Source it from a bash script that runs under `set -e`:
#
#   . scripts/phases.sh
#   phases_begin                 # empties the records, prints the table at exit
#   phase lint just lint         # runs the command, records its name, seconds and status
#
# A failing phase records itself and returns the command's status, so `set -e` stops the run
# there; the table (what ran) is printed and the run keeps that status. Commands that time
# their own parts append `name<TAB>seconds<TAB>ok|failed` lines to $PHASES_DETAIL (vm-tests
# does, one line per scenario, through VM_TESTS_TIMES); the table lists them under the phase.

PHASES_DIR="${PHASES_DIR:-$PWD/target/phases}"
PHASES_FILE="$PHASES_DIR/phases.tsv"
PHASES_DETAIL="$PHASES_DIR/vm-scenarios.tsv"

phases_begin() {
    mkdir -p "$PHASES_DIR"
    : >"$PHASES_FILE"
    : >"$PHASES_DETAIL"
    export VM_TESTS_TIMES="$PHASES_DETAIL"
    PHASES_T0=$(date +%s%N)
    trap 'phases_exit $?' EXIT
}

# phase NAME CMD...: run CMD and record NAME's wall seconds and outcome.
phase() {
    local name=$1 t0 rc=0
    shift
    echo "=== phase: $name"
    t0=$(date +%s%N)
    "$@" || rc=$?
    printf '%s\t%s\t%s\n' "$name" "$(phases_secs "$t0")" "$([ "$rc" = 0 ] && echo ok || echo "failed ($rc)")" >>"$PHASES_FILE"
    return "$rc"
}

# Seconds since $1 (date +%s%N), one decimal.
phases_secs() {
    local now
    now=$(date +%s%N)
    awk -v a="$1" -v b="$now" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'
}

phases_report() {
    echo
    echo "--- phases (wall seconds)"
    printf '%-40s %9s  %s\n' phase seconds outcome
    local name secs outcome
    while IFS=$'\t' read -r name secs outcome; do
        printf '%-40s %9s  %s\n' "$name" "$secs" "$outcome"
    done <"$PHASES_FILE"
    if [ -s "$PHASES_DETAIL" ]; then
        echo "VM scenarios (each timed by its test; they run two at a time):"
        while IFS=$'\t' read -r name secs outcome; do
            printf '  %-38s %9s  %s\n' "$name" "$secs" "$outcome"
        done <"$PHASES_DETAIL"
    fi
    printf '%-40s %9s\n' total "$(phases_secs "$PHASES_T0")"
}

phases_exit() {
    local rc=$1
    phases_report || true
    exit "$rc"
}
