#!/bin/sh
# Stop-and-resume of examples/fashion_mnist (--checkpoint_dir, --resume) on the CPU, at the same
# world size and thread count: a run killed with kill -9 and resumed from its latest complete
# checkpoint ends with the same parameters, bit for bit, and prints the same epoch lines (loss and
# accuracy) as the uninterrupted run. On 1 process and on 2 (caccel launch over Gloo; mpirun when
# it is there). kill -9 during a save (CACCEL_TEST_SAVE_STALL holds the save at a chosen point)
# leaves a complete checkpoint loadable: after the files were written (the directory is still
# <name>.tmp; the previous checkpoint is loaded) and after the rename (complete.json was written
# inside <name>.tmp before it, so the new checkpoint is complete and loaded). tests/test_state
# kills a save at every stage.
# Deterministic mode (docs/DETERMINISM.md) resumes bit for bit too (2 processes). Under
# `caccel launch --max_restarts 1` with --resume from the start, a rank killed with kill -9 mid-epoch
# makes the launcher start the group again, which resumes by itself and ends with the uninterrupted
# run's parameters, bit for bit.
. "$(dirname "$0")/dist/lib.sh"
FM="$BUILD/examples/fashion_mnist"
[ -x "$FM" ] || skip "no $FM"
export OPENBLAS_NUM_THREADS=1
ARGS="--cpu --epochs 3 --seed 7 --schedule cosine --warmup 0.1"
# a checkpoint every CK optimizer steps; the runs killed in a save stop after MS steps. Under the
# sanitizers the runs train on the first 12800 samples (100 steps an epoch on one process, 50 on two)
# with CK and MS scaled alike: every save still falls before an epoch's end, the kills in the same places.
CK=100 MS=400
if [ "${CACCEL_TEST_SANITIZED:-no}" = yes ]; then
    ARGS="$ARGS --max_train_samples 12800 --max_eval_samples 2000"
    CK=10 MS=40
fi
PIDS=""
kill_ours() { for p in $PIDS; do pkill -KILL -P "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done; }
CLEANUPS="kill_ours"

# wait_for FILE PID: FILE appears (within 300 s) while PID still runs
wait_for() {
    i=0
    while [ ! -e "$1" ]; do
        running "$2" || return 1
        i=$((i + 1))
        [ $i -lt 6000 ] || return 1
        sleep 0.05
    done
}

# the epoch lines without the throughput: "epoch 2/3: train loss 0.4410, test accuracy ..." (not the
# progress bar's "epoch 2/3:  10% 47/469 [...]" lines)
epochs() { grep '^epoch [0-9]*/[0-9]*: train loss' "$1" | sed 's/, [0-9.]* samples\/s.*//'; }

# same_epochs RESUMED FULL: every epoch line of the resumed run is the uninterrupted run's
same_epochs() {
    epochs "$1" > "$WORK/e1"
    epochs "$2" > "$WORK/e2"
    [ -s "$WORK/e1" ] || { cat "$1"; fail "the resumed run printed no epoch line"; }
    while read -r line; do
        grep -qxF "$line" "$WORK/e2" || { cat "$WORK/e1" "$WORK/e2"; fail "resumed '$line' is not in the uninterrupted run"; }
    done < "$WORK/e1"
    echo "  same epoch lines: $(wc -l < "$WORK/e1")"
}

# resume_check LAUNCH... : uninterrupted vs killed (kill -9 once checkpoint_3 is complete) + resumed
resume_check() {
    name=$1; shift
    "$@" "$FM" $ARGS --dump-params "$WORK/$name.full" > "$WORK/$name.full.out" 2>&1 ||
        { cat "$WORK/$name.full.out"; fail "$name: the uninterrupted run failed"; }
    "$@" "$FM" $ARGS --checkpoint_dir "$WORK/$name" --checkpointing_steps $CK > "$WORK/$name.a.out" 2>&1 &
    pid=$!
    PIDS="$PIDS $pid"
    wait_for "$WORK/$name/checkpoints/checkpoint_3/complete.json" $pid ||
        { cat "$WORK/$name.a.out"; fail "$name: the run ended before its 4th checkpoint"; }
    pkill -KILL -P $pid 2>/dev/null
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    [ "$(epochs "$WORK/$name.a.out" | wc -l)" -lt 3 ] || fail "$name: the run finished before it was killed"
    echo "  killed after $(ls "$WORK/$name/checkpoints" | tr '\n' ' ')"
    "$@" "$FM" $ARGS --checkpoint_dir "$WORK/$name" --checkpointing_steps $CK --resume \
        --dump-params "$WORK/$name.res" > "$WORK/$name.b.out" 2>&1 ||
        { cat "$WORK/$name.b.out"; fail "$name: the resumed run failed"; }
    cmp "$WORK/$name.full" "$WORK/$name.res" || fail "$name: the resumed parameters differ from the uninterrupted run's"
    echo "  same parameters, bit for bit"
    same_epochs "$WORK/$name.b.out" "$WORK/$name.full.out"
}

# restart_check NAME LAUNCH...: one run under --max_restarts 1 with --resume (nothing to resume at
# first); a rank is killed once checkpoint_3 is complete; the restarted group resumes and ends with
# the parameters of WORK/two.full (the uninterrupted run on 2 processes)
restart_check() {
    name=$1; shift
    "$@" --max_restarts 1 --monitor_interval 0.2 "$FM" $ARGS --checkpoint_dir "$WORK/$name" \
        --checkpointing_steps $CK --resume --dump-params "$WORK/$name.res" > "$WORK/$name.out" 2>&1 &
    pid=$!
    PIDS="$PIDS $pid"
    wait_for "$WORK/$name/checkpoints/checkpoint_3/complete.json" $pid ||
        { cat "$WORK/$name.out"; fail "$name: the run ended before its 4th checkpoint"; }
    rank=$(pgrep -n -P $pid)
    kill -9 "$rank"
    had=$(ls "$WORK/$name/checkpoints" | tr '\n' ' ')
    wait $pid || { cat "$WORK/$name.out"; fail "$name: the restarted job failed"; }
    grep -q "no complete checkpoint under .* yet: starting from the beginning" "$WORK/$name.out" ||
        { cat "$WORK/$name.out"; fail "$name: the first start did not say it had nothing to resume"; }
    grep -q "was killed by signal 9" "$WORK/$name.out" && grep -q "restarting every process (restart 1 of 1)" "$WORK/$name.out" ||
        { cat "$WORK/$name.out"; fail "$name: no restart after the kill"; }
    [ "$(grep -c '^epoch 3/3: train loss' "$WORK/$name.out")" -eq 1 ] || { cat "$WORK/$name.out"; fail "$name: epoch 3 not run once"; }
    echo "  killed a rank after $had; restarted"
    cmp "$WORK/two.full" "$WORK/$name.res" || fail "$name: the parameters after the restart differ from the uninterrupted run's"
    echo "  same parameters, bit for bit"
}

# stall_check NAME PHASE:N STALLS EXPECT REF LAUNCH...: killed while held in save N at PHASE (once
# the STALLS ranks that reach it have said so), resumed: the parameters equal WORK/REF (the
# uninterrupted 400 steps)
stall_check() {
    name=$1 stall=$2 stalls=$3 expect=$4 ref=$5; shift 5
    CACCEL_TEST_SAVE_STALL=$stall "$@" "$FM" $ARGS --max-steps $MS --checkpoint_dir "$WORK/$name" \
        --checkpointing_steps $CK > "$WORK/$name.a.out" 2>&1 &
    pid=$!
    PIDS="$PIDS $pid"
    i=0
    until [ "$(grep -c "stalled at" "$WORK/$name.a.out" 2>/dev/null)" -ge "$stalls" ]; do
        running $pid || { cat "$WORK/$name.a.out"; fail "$name: the run ended without $stalls rank(s) stalling"; }
        i=$((i + 1)); [ $i -lt 6000 ] || { cat "$WORK/$name.a.out"; fail "$name: not $stalls stall(s) within 300 s"; }
        sleep 0.05
    done
    pkill -KILL -P $pid 2>/dev/null
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    echo "  killed in save ${stall#*:} at '${stall%:*}': $(ls "$WORK/$name/checkpoints" | tr '\n' ' ')"
    cp -r "$WORK/$name" "$WORK/$name.copy"   # for the resumes at another world size below
    "$@" "$FM" $ARGS --max-steps $MS --checkpoint_dir "$WORK/$name" --resume --dump-params "$WORK/$name.res" \
        > "$WORK/$name.b.out" 2>&1 || { cat "$WORK/$name.b.out"; fail "$name: the resumed run failed"; }
    [ -z "$expect" ] || grep -q "$expect" "$WORK/$name.b.out" || { cat "$WORK/$name.b.out"; fail "$name: no '$expect'"; }
    cmp "$WORK/$ref" "$WORK/$name.res" || fail "$name: the parameters after resuming differ"
    echo "  same parameters as the uninterrupted $MS steps"
}

note "1 process: kill -9 after the 4th checkpoint, resume"
resume_check one
note "1 process: kill -9 during saves"
"$FM" $ARGS --max-steps $MS --dump-params "$WORK/ref1" > "$WORK/ref.out" 2>&1 || { cat "$WORK/ref.out"; fail "reference run"; }
stall_check files "files:3" 1 "" ref1
[ -d "$WORK/files/checkpoints/checkpoint_2.tmp" ] && [ -f "$WORK/files/checkpoints/checkpoint_1/complete.json" ] ||
    fail "expected checkpoint_1 complete and checkpoint_2.tmp left behind"
stall_check renamed "renamed:2" 1 "" ref1
[ -f "$WORK/renamed.copy/checkpoints/checkpoint_1/complete.json" ] || fail "checkpoint_1 was published without its complete.json"

have_backend() {
    for d in $(echo "${CACCEL_PLUGIN_PATH:-}" | tr ':' ' '); do [ -e "$d/caccel_$1.so" ] && return 0; done
    return 1
}

if have_backend gloo && [ -x "$CACCEL" ]; then
    L="$CACCEL launch --num_processes 2 --cpu --backend gloo"
    note "2 processes (caccel launch, Gloo): kill -9 after the 4th checkpoint, resume"
    resume_check two $L
    note "2 processes, caccel launch --max_restarts 1: a rank killed with kill -9 mid-epoch, the group restarts and resumes"
    restart_check restart $L
    note "2 processes, deterministic mode: kill -9 after the 4th checkpoint, resume"
    saved_args=$ARGS
    ARGS="$ARGS --deterministic"
    resume_check det2 $L
    ARGS=$saved_args
    note "2 processes: kill -9 while both ranks are in a save"
    $L "$FM" $ARGS --max-steps $MS --dump-params "$WORK/ref2" > "$WORK/ref2.out" 2>&1 || { cat "$WORK/ref2.out"; fail "reference run (2)"; }
    stall_check files2 "files:2" 2 "" ref2 $L
    note "2 processes: kill -9 while rank 0 publishes a save (complete.json written in checkpoint_1.tmp)"
    stall_check manifest2 "manifest:2" 1 "" ref2 $L
    [ -f "$WORK/manifest2.copy/checkpoints/checkpoint_1.tmp/complete.json" ] && [ ! -e "$WORK/manifest2.copy/checkpoints/checkpoint_1" ] ||
        fail "expected a complete checkpoint_1.tmp, not yet published"
    # another world size: the run goes on from the same global sample position (not bit for bit)
    note "saved on 2 processes, resumed on 1; saved on 1, resumed on 2"
    "$FM" $ARGS --max-steps $MS --checkpoint_dir "$WORK/files2.copy" --resume > "$WORK/w1.out" 2>&1 ||
        { cat "$WORK/w1.out"; fail "2 -> 1 process resume failed"; }
    grep -q '^epoch 1/3: train loss' "$WORK/w1.out" || { cat "$WORK/w1.out"; fail "2 -> 1: no epoch line"; }
    $L "$FM" $ARGS --max-steps $MS --checkpoint_dir "$WORK/files.copy" --resume > "$WORK/w2.out" 2>&1 ||
        { cat "$WORK/w2.out"; fail "1 -> 2 processes resume failed"; }
    grep -q "no random_states_1.json (saved with fewer processes); using random_states_0.json" "$WORK/w2.out" ||
        { cat "$WORK/w2.out"; fail "1 -> 2: rank 1 did not say whose generator it took"; }
    echo "  both continue"
else
    echo "SKIPPED PART: 2 processes (no caccel or no Gloo plugin)"
fi

if command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 && have_backend mpi; then
    note "2 processes (mpirun): kill -9 after the 4th checkpoint, resume"
    # Open MPI never frees some of its allocations: not caccel's leaks (see dist/lib.sh)
    M="env ASAN_OPTIONS=$ASAN_OPTIONS_MPI ${MPIRUN:-mpirun} --allow-run-as-root --oversubscribe -np 2"
    resume_check mpi $M
else
    echo "SKIPPED PART: mpirun (no mpirun or no MPI plugin)"
fi
echo "ok"
