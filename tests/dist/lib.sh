# lib.sh: shared by the multi-process tests: paths, skips, and checks on the ranks' output.
# Sourced by tests/dist/*.sh; `make check` sets CACCEL_TEST_BUILDDIR and CACCEL_PLUGIN_PATH.

BUILD=${CACCEL_TEST_BUILDDIR:-$(pwd)}
CACCEL="$BUILD/tools/caccel"
CHECK="$BUILD/tests/dist/comm_check"
# A marker on every process this test starts, to look for survivors afterwards.
TAG="catest-$(basename "$0" .sh)-$$"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-dist.XXXXXX")
trap 'cleanup_all' EXIT
CLEANUPS=""

cleanup_all() {
    for c in $CLEANUPS; do $c; done
    pkill -KILL -f -- "$TAG" 2>/dev/null
    rm -rf "$WORK"
}

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
note() { echo "== $*"; }

need_caccel() { [ -x "$CACCEL" ] || skip "no caccel command at $CACCEL"; }

need_backend() {
    # the plugin is there when its shared object was built
    for d in $(echo "${CACCEL_PLUGIN_PATH:-}" | tr ':' ' '); do
        [ -e "$d/caccel_$1.so" ] && return 0
    done
    skip "collective backend $1 was not built (its plugin caccel_$1.so is not in CACCEL_PLUGIN_PATH)"
}

need_mpirun() {
    command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 || skip "no mpirun (install openmpi-bin)"
    need_backend mpi
}

# Open MPI's own allocations (and those of MCA components it unloads at exit) are never freed:
# a sanitizer build must not count them as caccel's leaks. valgrind covers caccel's leaks.
ASAN_OPTIONS_MPI="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

# The large size of the correctness runs (comm_check --large-mib): 16 MiB, four shared-memory slots of
# 4 MiB; under the sanitizers (CACCEL_TEST_SANITIZED=yes) 9 MiB, two whole slots and a part of one,
# at half the instrumented copying and checking.
LARGE_MIB=16
[ "${CACCEL_TEST_SANITIZED:-no}" != yes ] || LARGE_MIB=9

# mpirun as this machine allows it (root, more ranks than cores); MPI_TIMEOUT bounds a hung mpirun
run_mpi() {
    np=$1; shift
    ASAN_OPTIONS="$ASAN_OPTIONS_MPI" timeout -k 5 "${MPI_TIMEOUT:-600}" "${MPIRUN:-mpirun}" --allow-run-as-root --oversubscribe -np "$np" "$@"
}

# The processes of this test's ranks: those carrying $TAG that are not a launcher, a shell or
# `timeout`, nor a zombie (a rank that has exited but was not reaped yet).
live_ranks() {
    for p in $(pgrep -f -- "$TAG"); do
        c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
        case $c in mpirun|orterun|prterun|mpiexec|timeout|sh|bash|dash) continue ;; esac
        st=$(sed 's/^.*) \(.\).*$/\1/' "/proc/$p/stat" 2>/dev/null) || continue
        [ "$st" = Z ] || echo "$p"
    done
}

# ps of every process carrying $TAG, to say what was still running when a bound was missed.
show_survivors() {
    echo "processes of this test still present:"
    ps -eo pid,ppid,stat,etimes,wchan:24,args | grep -F -- "$TAG" | grep -v "grep -F"
}

# run_mpi_watched NP ARGS...: run_mpi, watching this test's ranks. Sets MPI_RC (mpirun's status),
# RANKS_END (seconds from $start until no rank was left), RANKS_END_MS (that moment, epoch ms) and MPIRUN_LINGERED (1 when mpirun was
# still there 10 s after every rank had ended, and was killed). Open MPI's mpirun can hang after
# the last rank has exited when a rank exits non-zero without MPI_Finalize (open-mpi/ompi#3380):
# that is the launcher's, not a rank's, and must not be read as a rank that did not end.
run_mpi_watched() {
    np=$1; shift
    run_mpi "$np" "$@" &
    mp=$!
    seen=0 gone_at="" RANKS_END="" RANKS_END_MS="" MPIRUN_LINGERED=0
    while kill -0 "$mp" 2>/dev/null; do
        if [ -n "$(live_ranks)" ]; then seen=1
        elif [ "$seen" = 1 ] && [ -z "$gone_at" ]; then
            gone_at=$(date +%s); RANKS_END=$(elapsed_since "$start"); RANKS_END_MS=$(date +%s%3N)
        fi
        if [ -n "$gone_at" ] && [ "$(elapsed_since "$gone_at")" -ge 10 ] && [ "$MPIRUN_LINGERED" = 0 ]; then
            MPIRUN_LINGERED=1
            show_survivors
            pkill -KILL -f -- "mpirun.*$TAG"
        fi
        sleep 0.1
    done
    wait "$mp"
    MPI_RC=$?
    [ -n "$RANKS_END" ] || RANKS_END=$(elapsed_since "$start")
    [ -n "$RANKS_END_MS" ] || RANKS_END_MS=$(date +%s%3N)
}

# running PID: PID is a process that has not ended (an ended child of this shell stays a zombie
# until it is waited for, and `kill -0` still finds it)
running() {
    st=$(sed 's/^.*) \(.\).*$/\1/' "/proc/$1/stat" 2>/dev/null) && [ "$st" != Z ]
}

# wait_lines N PATTERN WHAT "PIDS" FILES...: until FILES hold N lines matching PATTERN. The sign a
# test acts on (kill, stop, cut a link) is a line printed after the state it needs, never a sleep.
# Fails naming WHAT, with the output, when one of PIDS (the job's launchers) ends first or after
# WAIT_LINES_S seconds (default 120: a loaded machine starts processes slowly).
wait_lines() {
    n=$1 pat=$2 what=$3 pids=$4; shift 4
    end=$(( $(date +%s) + ${WAIT_LINES_S:-120} ))
    until [ "$(cat "$@" 2>/dev/null | grep -c -- "$pat")" -ge "$n" ]; do
        for p in $pids; do
            running "$p" || { cat "$@"; fail "$what: the job ended before $n line(s) matched '$pat'"; }
        done
        [ "$(date +%s)" -lt "$end" ] ||
            { cat "$@"; fail "$what: fewer than $n line(s) matched '$pat' within ${WAIT_LINES_S:-120} s"; }
        sleep 0.1
    done
}

# lines_or_exit N PATTERN PID FILES...: as wait_lines, for a process that may end on its own first:
# returns 0 once FILES hold N lines matching PATTERN, 1 once PID has ended (a bound as wait_lines').
lines_or_exit() {
    n=$1 pat=$2 pid=$3; shift 3
    end=$(( $(date +%s) + ${WAIT_LINES_S:-120} ))
    until [ "$(cat "$@" 2>/dev/null | grep -c -- "$pat")" -ge "$n" ]; do
        running "$pid" || return 1
        [ "$(date +%s)" -lt "$end" ] || { cat "$@"; fail "fewer than $n line(s) matched '$pat' within ${WAIT_LINES_S:-120} s"; }
        sleep 0.05
    done
}

# count LINES PATTERN FILE: FILE holds exactly LINES lines matching PATTERN
count() {
    n=$(grep -c -- "$2" "$3" || true)
    [ "$n" -eq "$1" ] || { cat "$3"; fail "expected $1 line(s) matching '$2' in $(basename "$3"), got $n"; }
}

# No process carrying this test's marker may outlive its launcher: once it has ended they are gone
# within 10 s (checked every 0.1 s; a busy machine takes a while to run a killed process's exit).
no_orphans() {
    end=$(( $(date +%s) + 10 ))
    while pgrep -f -- "$TAG" >/dev/null; do
        [ "$(date +%s)" -lt "$end" ] || { pgrep -a -f -- "$TAG"; fail "processes outlived their launcher by 10 s"; }
        sleep 0.1
    done
}

# launch_machines OUT LAUNCH_ARGS...: 2 machines x 2 processes on this host, two `caccel launch`
# sharing a rendezvous port; each launcher's output in OUT.0 and OUT.1, both in OUT; their
# statuses in $m0_rc and $m1_rc. MACHINES_TIMEOUT bounds each launcher (default 300 s).
launch_machines() {
    out=$1; shift
    port=$(free_port)
    for m in 0 1; do
        CACCEL_JOB_TOKEN="machines-$$" timeout "${MACHINES_TIMEOUT:-300}" "$CACCEL" launch --num_processes 4 \
            --num_machines 2 --machine_rank $m --main_process_ip 127.0.0.1 --main_process_port "$port" "$@" \
            > "$out.$m" 2>&1 &
        eval "lm$m=\$!"
    done
    wait "$lm0"; m0_rc=$?
    wait "$lm1"; m1_rc=$?
    cat "$out.0" "$out.1" > "$out"
}

# A port that was free a moment ago (the launcher finds one and hands it to its process).
free_port() {
    timeout 60 "$CACCEL" launch -q --num_processes 1 --main_process_port 0 sh -c 'echo $MASTER_PORT'
}

elapsed_since() { echo $(( $(date +%s) - $1 )); }

# same A B: two float32 files equal within 1e-5 (absolute), else fail; prints the largest difference.
# float_pairs A B: the f32 values of files A and B side by side, one pair a line
float_pairs() {
    od -An -v -f "$1" | tr -s ' ' '\n' | sed '/^$/d' > "$WORK/a1.txt"
    od -An -v -f "$2" | tr -s ' ' '\n' | sed '/^$/d' > "$WORK/b1.txt"
    paste "$WORK/a1.txt" "$WORK/b1.txt"
}

same() {
    cmp -s "$1" "$2" && { echo "  $(basename "$1") vs $(basename "$2"): identical"; return 0; }
    float_pairs "$1" "$2" | awk -v f="$(basename "$1") vs $(basename "$2")" '
        { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
        END { printf "  %s: %d values, max |diff| %.3g\n", f, n, m; exit !(n > 0 && m <= 1e-5) }' ||
        fail "parameters differ beyond 1e-5"
}

# same_st A B [TOL]: two safetensors files with the same header (names, dtypes, shapes, offsets) and values
# within TOL (1e-5)
same_st() {
    n=$(od -An -t u8 -N 8 "$1" | tr -d ' ')
    [ "$(wc -c < "$1")" = "$(wc -c < "$2")" ] && cmp -s -n $((8 + n)) "$1" "$2" ||
        { od -c -N $((8 + n)) "$1"; od -c -N $((8 + n)) "$2"; fail "$1 and $2: other tensors (names, dtypes or shapes)"; }
    tail -c +$((9 + n)) "$1" > "$WORK/st1.bin"
    tail -c +$((9 + n)) "$2" > "$WORK/st2.bin"
    float_pairs "$WORK/st1.bin" "$WORK/st2.bin" | awk -v f="$(basename "$(dirname "$1")")/$(basename "$1")" -v tol="${3:-1e-5}" '
        { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
        END { printf "  %s: %d values, max |diff| %.3g\n", f, n, m; exit !(n > 0 && m <= tol) }' ||
        fail "$1 and $2: values differ beyond ${3:-1e-5}"
}

have() { for d in $(echo "${CACCEL_PLUGIN_PATH:-}" | tr ':' ' '); do [ -e "$d/caccel_$1.so" ] && return 0; done; return 1; }

# train_backends: sets $backends to the collective backends this build can train over (gloo under
# caccel launch, mpi under mpirun); skips the test when there is neither.
train_backends() {
    backends=""
    have gloo && backends="gloo"
    have mpi && command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 && backends="$backends mpi"
    [ -n "$backends" ] || skip "neither the Gloo nor the MPI plugin was built"
    echo "backends:$backends"
}

# launch NP BACKEND ARGS...: ARGS on NP processes, over Gloo under caccel launch or over MPI under
# mpirun; $LAUNCH_FLAGS (default --cpu) goes to both.
launch() {
    np=$1 be=$2; shift 2
    # shellcheck disable=SC2086
    if [ "$be" = mpi ]; then run_mpi "$np" "$@" ${LAUNCH_FLAGS---cpu} --backend mpi 2>&1
    else timeout 300 "$CACCEL" launch --num_processes "$np" ${LAUNCH_FLAGS---cpu} --backend gloo "$@" 2>&1; fi
}

# mesh_launch NP BACKEND PROG FLAGS... -- ARGS...: PROG on NP processes with the configuration flags
# (--parallelism_config_*) given to caccel launch (Gloo) or to the program (mpirun), so that both
# spellings are exercised
mesh_launch() {
    ml_np=$1 ml_be=$2 ml_prog=$3; shift 3
    ml_flags=""
    while [ "$1" != "--" ]; do ml_flags="$ml_flags $1"; shift; done
    shift
    # shellcheck disable=SC2086
    if [ "$ml_be" = mpi ]; then launch "$ml_np" "$ml_be" "$ml_prog" "$@" $ml_flags
    else launch "$ml_np" "$ml_be" $ml_flags "$ml_prog" "$@"; fi
}

# fmnist_subset N DIR: writes into DIR the first N training samples of Fashion-MNIST as plain IDX
# files (the test split linked whole), from $CACCEL_DATA_DIR/fashion-mnist or Debian's copy; for
# tests whose claim holds for any data and that would otherwise train on all 60,000 samples.
# Fails (status 1) when the data is not found.
fmnist_subset() {
    n=$1 dst=$2 src=""
    for d in "${CACCEL_DATA_DIR:+$CACCEL_DATA_DIR/fashion-mnist}" /usr/share/datasets/fashion-mnist; do
        [ -n "$d" ] && [ -e "$d/train-images-idx3-ubyte.gz" ] && { src=$d; break; }
    done
    [ -n "$src" ] && mkdir -p "$dst" || return 1
    be32() { for s in 24 16 8 0; do printf "\\$(printf '%03o' $(($1 >> s & 255)))"; done; }
    { printf '\000\000\010\003'; be32 "$n"; be32 28; be32 28
      gzip -dc "$src/train-images-idx3-ubyte.gz" | tail -c +17 | head -c $((n * 784)); } > "$dst/train-images-idx3-ubyte" &&
    { printf '\000\000\010\001'; be32 "$n"
      gzip -dc "$src/train-labels-idx1-ubyte.gz" | tail -c +9 | head -c "$n"; } > "$dst/train-labels-idx1-ubyte" &&
    ln -sf "$src/t10k-images-idx3-ubyte.gz" "$src/t10k-labels-idx1-ubyte.gz" "$dst/"
}

# run_env NP ARGS...: NP ranks of ARGS started as torchrun or srun start them (RANK, WORLD_SIZE,
# MASTER_ADDR, ...), no launcher, each for at most 120 s; once all have ended, their outputs on
# standard output in rank order (rank r's also in $WORK/r<r>).
run_env() {
    np=$1; shift
    port=$(free_port)
    [ -n "$port" ] || fail "no free port"
    pids=""
    r=0
    while [ $r -lt "$np" ]; do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=$np LOCAL_WORLD_SIZE=$np RANK=$r LOCAL_RANK=$r \
            CACCEL_JOB_TOKEN=env-job-$$ timeout 120 "$@" >"$WORK/r$r" 2>&1 &
        pids="$pids $!"
        r=$((r + 1))
    done
    for p in $pids; do wait "$p"; done
    r=0
    while [ $r -lt "$np" ]; do cat "$WORK/r$r"; r=$((r + 1)); done
}
