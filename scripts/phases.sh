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

# phase NAME CMD...: run CMD and record NAME's wall seconds, the CPU seconds (user + system) of
# every process it ran, and its outcome. CPU over wall is how many of the machine's cores the
# phase kept busy on average: where it is well under the core count, the phase waits (on a
# timeout, a single-threaded step, a lock) and could share the machine with another.
phase() {
    local name=$1 t0 c0 rc=0
    shift
    echo "=== phase: $name"
    t0=$(date +%s%N)
    phases_cpu
    c0=$PHASES_CPU
    # bash reaps a finished background phase when it ends, adding its CPU time to this shell's
    # children: a phase during which it ended must not count that time as its own (the
    # background phase's row has it).
    local bg_running=""
    [ -n "${PHASES_BG_PID:-}" ] && kill -0 "$PHASES_BG_PID" 2>/dev/null && bg_running=1
    "$@" || rc=$?
    phases_cpu
    if [ -n "$bg_running" ] && ! kill -0 "$PHASES_BG_PID" 2>/dev/null; then
        c0=$(awk -F'\t' -v n="$PHASES_BG_NAME" -v c="$c0" '$1 == n { c += $3 } END { print c }' "$PHASES_FILE")
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$(phases_secs "$t0")" \
        "$(awk -v a="$c0" -v b="$PHASES_CPU" 'BEGIN { d = b - a; printf "%.0f", d < 0 ? 0 : d }')" \
        "$([ "$rc" = 0 ] && echo ok || echo "failed ($rc)")" >>"$PHASES_FILE"
    return "$rc"
}

# phase_start NAME CMD...: run the phase NAME in the background beside the phases that follow,
# for a phase that keeps about one core busy (the workspace tests wait on timeouts, QEMU boots
# and servers) next to ones that leave the other core idle. Its output goes to a log, printed
# whole by phase_join so that it does not interleave with the foreground's; its row in the table
# is its own wall and CPU time. One background phase at a time.
phase_start() {
    local name=$1
    shift
    PHASES_BG_NAME=$name
    PHASES_BG_LOG="$PHASES_DIR/background.log"
    echo "=== phase (in the background until it is joined; output then): $name"
    # Its own process group (job control), so that a foreground failure can stop it whole.
    set -m
    (phase "$name" "$@") >"$PHASES_BG_LOG" 2>&1 &
    PHASES_BG_PID=$!
    set +m
}

# phase_join: wait for the background phase, print its output, and return its status.
phase_join() {
    local rc=0
    wait "$PHASES_BG_PID" || rc=$?
    PHASES_BG_PID=""
    echo "=== output of the background phase: $PHASES_BG_NAME"
    cat "$PHASES_BG_LOG"
    return "$rc"
}

# Set PHASES_CPU to the CPU seconds (user + system) of this shell's finished children so far,
# from bash's `times` (run here, not in a subshell, which would count its own children): its
# second line is the children's `XmY.YYYs XmY.YYYs`. A process's time is added to its parent's
# when the parent waits for it, so this counts every process a phase ran (cargo, rustc, the
# test binaries, QEMU) once the phase's command has returned.
phases_cpu() {
    local f="$PHASES_DIR/.times.$BASHPID"
    times >"$f"
    PHASES_CPU=$(awk 'NR == 2 {
        n = 0
        for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); n += p[1] * 60 + p[2] }
        printf "%.1f", n
    }' "$f")
    rm -f "$f"
}

# Seconds since $1 (date +%s%N), one decimal.
phases_secs() {
    local now
    now=$(date +%s%N)
    awk -v a="$1" -v b="$now" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'
}

phases_report() {
    echo
    echo "--- phases (wall seconds; CPU seconds of all its processes; cores busy = CPU / wall)"
    printf '%-40s %9s %9s %6s  %s\n' phase seconds cpu cores outcome
    local name secs cpu outcome
    while IFS=$'\t' read -r name secs cpu outcome; do
        printf '%-40s %9s %9s %6s  %s\n' "$name" "$secs" "$cpu" \
            "$(awk -v cpu="$cpu" -v wall="$secs" 'BEGIN { if (wall > 0) printf "%.2f", cpu / wall; else print "-" }')" "$outcome"
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
    # A foreground phase failed while the background one still runs: stop it, show its output.
    if [ -n "${PHASES_BG_PID:-}" ]; then
        kill -TERM -- "-$PHASES_BG_PID" 2>/dev/null || true
        wait "$PHASES_BG_PID" 2>/dev/null || true
        echo "=== output of the background phase (stopped): $PHASES_BG_NAME"
        cat "$PHASES_BG_LOG" 2>/dev/null || true
        printf '%s\t-\t-\tstopped\n' "$PHASES_BG_NAME" >>"$PHASES_FILE"
    fi
    phases_report || true
    exit "$rc"
}
