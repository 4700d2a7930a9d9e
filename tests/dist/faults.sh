#!/bin/sh
# The fault matrix: kill -9, SIGSTOP, exit(0), exit(1) and abort() in a random rank at a random step,
# at 2 and 4 ranks, over Gloo (shared memory and TCP) and MPI, under caccel launch, mpirun and
# launcher-less starts (torchrun-style variables), seeded trials per cell. Each trial must end within
# its bound (crashes and exits: 10 s from the fault; SIGSTOP: the collective timeout + 10 s), name the
# failed rank, end with a non-zero status, and leave no process and no shared-memory segment behind
# (sockets live only in processes). A launcher-less job has no launcher to kill a stopped rank: the
# script plays the scheduler, continuing the stopped rank once the others have ended; it must then
# end by itself within 10 s.
#
# usage: faults.sh [--trials N] [--seed S] [--cells REGEX] [--subset K] [--timeout SEC] [--report FILE]
#   --trials N    trials per cell (default 1)
#   --subset K    K cells drawn from the seed (default: every cell when --trials is given, else 8)
#   --cells REGEX only the cells whose name (setup/fault/npN) matches
#   --timeout SEC the collective timeout, CACCEL_TIMEOUT (default 3)
#   --report FILE the per-cell summary as a Markdown table
# `make check` runs 8 seeded cells once; `make fault-matrix` runs every cell 20 times.
. "$(dirname "$0")/lib.sh"
need_caccel
unset CACCEL_SHM CACCEL_SHM_SLOT_MB CACCEL_LAUNCHER RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE

trials=1 seed=1 cells="" subset="" timeout_s=3 report=""
while [ $# -gt 0 ]; do
    case $1 in
        --trials) trials=$2; subset=${subset:-all}; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --cells) cells=$2; shift 2 ;;
        --subset) subset=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --report) report=$2; shift 2 ;;
        *) fail "unknown argument $1" ;;
    esac
done
subset=${subset:-8}

setups=""
have gloo && setups="launch-shm launch-tcp env-shm env-tcp"
if have mpi && command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then setups="$setups mpirun-mpi"; fi
[ -n "$setups" ] || skip "neither the Gloo nor the MPI plugin was built"

# A seeded linear congruential generator, the same on every machine: rnd N sets R to 0..N-1.
state=$seed
rnd() { state=$(( (state * 1103515245 + 12345) % 2147483648 )); R=$(( (state / 65536) % $1 )); }
now_ms() { date +%s%3N; }

all_cells() {
    for s in $setups; do for f in kill9 stop exit0 exit1 abort; do for n in 2 4; do echo "$s/$f/np$n"; done; done; done
}
all_cells | { [ -n "$cells" ] && grep -E -- "$cells" || cat; } > "$WORK/cells"
if [ "$subset" != all ]; then   # K cells without repetition, drawn from the seed
    : > "$WORK/pick"
    n=$(wc -l < "$WORK/cells")
    k=0
    while [ $k -lt "$subset" ] && [ -s "$WORK/cells" ]; do
        rnd "$n"
        sed -n "$((R + 1))p" "$WORK/cells" >> "$WORK/pick"
        sed -i "$((R + 1))d" "$WORK/cells"
        n=$((n - 1)) k=$((k + 1))
    done
    mv "$WORK/pick" "$WORK/cells"
fi
[ -s "$WORK/cells" ] || fail "no cell matches '$cells'"

shm_list() { ls /dev/shm 2>/dev/null | grep -i caccel | sort; }

# The ranks of a launcher-less job, as torchrun or srun start them: pids in $WORK/pids, victim's in VPID.
start_env() {   # start_env NP VICTIM ARGS...
    np=$1 v=$2; shift 2
    port=$(free_port)
    [ -n "$port" ] || fail "no free port"
    : > "$WORK/pids"
    r=0
    while [ $r -lt "$np" ]; do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=$np LOCAL_WORLD_SIZE=$np RANK=$r LOCAL_RANK=$r \
            CACCEL_JOB_TOKEN=faults-$$ "$@" >> "$WORK/out" 2>&1 &
        echo "$r $!" >> "$WORK/pids"
        [ $r -eq "$v" ] && VPID=$!
        r=$((r + 1))
    done
}

# Waits for a launcher-less job: the others first; a stopped victim is then continued and must end
# within 10 s. Sets RC (the first non-zero status, the job's) and END (ms: when the last rank ended,
# the continued victim not counted).
wait_env() {   # wait_env FAULT
    RC=0 END=""
    while read -r r p; do
        [ "$p" = "$VPID" ] && [ "$1" = stop ] && continue
        wait "$p"; st=$?
        [ "$RC" -ne 0 ] || RC=$st
    done < "$WORK/pids"
    END=$(now_ms)
    [ "$1" = stop ] || return 0
    # the rank runs under timeout(1), which leads a process group of its own: continue the group
    kill -s CONT -- "-$VPID" 2>/dev/null
    ( sleep 10; kill -s KILL -- "-$VPID" 2>/dev/null ) &
    guard=$!
    wait "$VPID"; st=$?
    kill "$guard" 2>/dev/null
    if [ "$(( $(now_ms) - END ))" -ge 10000 ]; then CONT_LATE=1; fi
    [ "$RC" -ne 0 ] || RC=$st
}

# One trial; prints its line and appends "cell ok ms" to $WORK/results.
trial() {   # trial CELL
    cell=$1
    setup=${cell%%/*} rest=${cell#*/}
    fault=${rest%%/*} np=${rest##*/np}
    rnd "$np"; v=$R
    rnd 200; step=$((R + 1))
    : > "$WORK/out"
    before=$(shm_list)
    CONT_LATE=0 LINGER=0
    args="$CHECK --tag $TAG --mode fault --fault $fault --victim $v --step $step --fail-code 3"
    case $setup in
        launch-*)
            [ "$setup" = launch-tcp ] && export CACCEL_SHM=0
            # shellcheck disable=SC2086
            CACCEL_TIMEOUT=$timeout_s timeout 120 "$CACCEL" launch --main_process_port 0 --num_processes "$np" $args \
                --backend gloo >> "$WORK/out" 2>&1
            RC=$? END=$(now_ms)
            unset CACCEL_SHM ;;
        env-*)
            [ "$setup" = env-tcp ] && export CACCEL_SHM=0
            # shellcheck disable=SC2086
            CACCEL_TIMEOUT=$timeout_s start_env "$np" "$v" timeout 120 $args --backend gloo
            wait_env "$fault"
            unset CACCEL_SHM ;;
        mpirun-mpi)
            start=$(date +%s)
            # shellcheck disable=SC2086
            CACCEL_TIMEOUT=$timeout_s MPI_TIMEOUT=120 run_mpi_watched "$np" -x CACCEL_TIMEOUT $args --backend mpi \
                >> "$WORK/out" 2>&1
            RC=$MPI_RC END=$RANKS_END_MS LINGER=$MPIRUN_LINGERED ;;
    esac
    sleep 0.3   # what a launcher's children need to be reaped
    # mpirun forwards stdout and stderr separately: a crash report can land in front of the line
    inj=$(sed -n 's/.*comm_check: rank [0-9]* injects .* at \([0-9]*\) ms$/\1/p' "$WORK/out" | head -1)
    why=""
    if [ -z "$inj" ]; then why="the victim never injected the fault"; ttf=-1
    else ttf=$((END - inj)); fi
    bound=10000
    [ "$fault" = stop ] && bound=$(( (timeout_s + 10) * 1000 ))
    [ -n "$why" ] || [ "$ttf" -lt "$bound" ] || why="ended $ttf ms after the fault (bound $bound ms)"
    [ -n "$why" ] || [ "$RC" -ne 0 ] || why="the job's status is 0"
    if [ -z "$why" ] && ! grep -E -q "comm_check: EXPECTED|caccel launch: (before that, )?rank $v \(|caccel: rank $v exits|process rank $v with PID" "$WORK/out"; then
        why="nothing names rank $v"
    fi
    if [ -z "$why" ] && grep -q "UNEXPECTED\|FAILED on rank" "$WORK/out"; then why="a rank failed in an unexpected way"; fi
    [ -n "$why" ] || [ "$CONT_LATE" = 0 ] || why="the continued rank $v did not end within 10 s"
    if [ -z "$why" ] && [ -n "$(live_ranks)" ]; then show_survivors; why="processes were left"; fi
    # new segments only, and of a creator no longer running (caccel-PID-...: none of this job's
    # processes is left, so a live creator is another job's on the machine)
    left=$(shm_list | while read -r f; do
        echo "$before" | grep -qxF -- "$f" && continue
        p=$(echo "$f" | sed -n 's/^caccel-\([0-9]*\)-.*/\1/p')
        [ -n "$p" ] && kill -0 "$p" 2>/dev/null && continue
        echo "$f"
    done)
    if [ -z "$why" ] && [ -n "$left" ]; then why="shared memory was left: $(echo "$left" | tr '\n' ' ')"; fi
    pkill -KILL -f -- "$TAG" 2>/dev/null
    if [ -n "$why" ]; then
        echo "trial $cell victim=$v step=$step status=$RC ttf_ms=$ttf FAIL: $why"
        sed 's/^/    | /' "$WORK/out" | cut -c1-400
        echo "$cell 0 $ttf" >> "$WORK/results"
    else
        note=""; [ "$LINGER" = 1 ] && note=" (mpirun outlived its ranks by 10 s and was killed)"
        echo "trial $cell victim=$v step=$step status=$RC ttf_ms=$ttf ok$note"
        echo "$cell 1 $ttf" >> "$WORK/results"
    fi
}

echo "fault matrix: seed $seed, $trials trial(s) per cell, $(wc -l < "$WORK/cells") cell(s), CACCEL_TIMEOUT=$timeout_s"
: > "$WORK/results"
while read -r cell; do
    t=0
    while [ $t -lt "$trials" ]; do trial "$cell"; t=$((t + 1)); done
done < "$WORK/cells"

# per cell: trials, passed, median and max time from the fault to the end of the job
summary() {
    echo "| cell | trials | passed | median ms | max ms |"
    echo "|---|---:|---:|---:|---:|"
    while read -r cell; do
        grep "^$cell " "$WORK/results" | awk '{print $3}' | sort -n > "$WORK/t"
        n=$(wc -l < "$WORK/t")
        ok=$(grep -c "^$cell 1 " "$WORK/results")
        med=$(sed -n "$(( (n + 1) / 2 ))p" "$WORK/t")
        max=$(tail -1 "$WORK/t")
        echo "| $cell | $n | $ok | $med | $max |"
    done < "$WORK/cells"
}
summary | tee "$WORK/summary"
[ -z "$report" ] || cp "$WORK/summary" "$report"
failed=$(grep -c ' 0 ' "$WORK/results")
[ "$failed" -eq 0 ] || fail "$failed trial(s) failed"
echo "PASS"
