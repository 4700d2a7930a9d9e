#!/bin/sh
# Synchronisation control, objects and padding, and join_uneven_inputs as users run them: 1 process,
# then 2 and 3 (and 4 where cheap) ranks under caccel launch (Gloo) and mpirun (MPI). Each mode of
# tests/sync_check prints per-rank values that Accelerate's semantics fix exactly.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
SC="$BUILD/tests/sync_check"
export OPENBLAS_NUM_THREADS=1

launch() {   # launch NP BACKEND ARGS... (gloo: caccel launch; mpi: mpirun)
    np=$1 be=$2; shift 2
    if [ "$np" = 1 ]; then timeout 120 "$@" --cpu 2>&1
    elif [ "$be" = mpi ]; then MPI_TIMEOUT=120 run_mpi "$np" "$@" --cpu --backend mpi 2>&1
    else timeout 120 "$CACCEL" launch --num_processes "$np" --cpu --backend gloo "$@" 2>&1; fi
}

have() { for d in $(echo "${CACCEL_PLUGIN_PATH:-}" | tr ':' ' '); do [ -e "$d/caccel_$1.so" ] && return 0; done; return 1; }
backends=""
have gloo && backends="gloo"
have mpi && command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 && backends="$backends mpi"
echo "backends:${backends:- none (1 process only)}"
runs="1:single"
for be in $backends; do runs="$runs 2:$be 3:$be"; done

for r in $runs; do
    np=${r%%:*} be=${r#*:}
    note "$np process(es), $be"
    # rank r's gradient is r + 1: no_sync keeps it local, the next backward averages the sum of both
    # passes (2 * mean = np + 1) in one all-reduce; trigger_sync_in_backward inside no_sync averages
    # one pass ((np + 1) / 2); sync_gradients=false holds the all-reduce and the step back
    launch "$np" "$be" "$SC" --mode nosync > "$WORK/o" || { cat "$WORK/o"; fail "nosync $np $be"; }
    for k in $(seq 0 $((np - 1))); do
        count 1 "rank=$k nosync_grad=$((k + 1)) nosync_collectives=0$" "$WORK/o"
        count 1 "rank=$k unsynced_grad=$((k + 1)) sync_gradients=0 step_moved=0$" "$WORK/o"
    done
    half=$(awk -v n="$np" 'BEGIN { print (n + 1) / 2 }')
    count "$np" "synced_grad=$((np + 1)) sync_collectives=$((np > 1 ? 1 : 0))$" "$WORK/o"
    count "$np" "triggered_grad=$half$" "$WORK/o"
    count "$np" "resynced_grad=$half step_delta=-$(awk -v h="$half" 'BEGIN { print h / 2 }')$" "$WORK/o"

    # gradient_accumulation_steps set at run time: the sync pattern follows at once
    c2=010101 c3=001001
    [ "$np" = 1 ] && c2=000000 c3=000000
    launch "$np" "$be" "$SC" --mode accum > "$WORK/o" || { cat "$WORK/o"; fail "accum $np $be"; }
    count "$np" "k=2 pattern=010101 collectives=$c2 steps=3$" "$WORK/o"
    count "$np" "k=3 pattern=001001 collectives=$c3 steps=5$" "$WORK/o"
    count "$np" "error=gradient_accumulation_steps must be >= 1 (got 0)" "$WORK/o"

    # the last rank raises the trigger at iteration 3: every rank sees it there, once
    launch "$np" "$be" "$SC" --mode trigger > "$WORK/o" || { cat "$WORK/o"; fail "trigger $np $be"; }
    count "$np" "trigger_seen_at=3 again=0$" "$WORK/o"

    # two models on one accelerator: a backward reduces the buckets of the models it reached only
    # (rank r's gradient is r + 1 for the first model, 3 (r + 1) for the second)
    launch "$np" "$be" "$SC" --mode models > "$WORK/o" || { cat "$WORK/o"; fail "models $np $be"; }
    one=$((np > 1 ? 1 : 0))
    count "$np" "a_only collectives=$one grad_a=$half b_has_grad=0$" "$WORK/o"
    count "$np" "both collectives=$((2 * one)) grad_a=$half grad_b=$(awk -v h="$half" 'BEGIN { print 3 * h }')$" "$WORK/o"
    count "$np" "steps delta_a=-$(awk -v h="$half" 'BEGIN { print h / 2 }') delta_b=-$(awk -v h="$half" 'BEGIN { print 1.5 * h }')$" "$WORK/o"
    count "$np" "save_state_error=save_state: 1 model(s) prepared after the first" "$WORK/o"
    # a wholly frozen teacher prepared first: only the student's bucket is reduced
    launch "$np" "$be" "$SC" --mode teacher > "$WORK/o" || { cat "$WORK/o"; fail "teacher $np $be"; }
    count "$np" "teacher collectives=$one grad_s=$half teacher_has_grad=0$" "$WORK/o"

    launch "$np" "$be" "$SC" --mode objects > "$WORK/o" || { cat "$WORK/o"; fail "objects $np $be"; }
    case $np in
    1) g=r0 last=2 rows=1 p0=0 p1=0 ;;
    2) g=r0r1r1 last=4 rows=4 p0=0,-1,1,1 p1=-1,0,1,1 ;;
    3) g=r0r1r1r2r2r2 last=6 rows=9 p0=0,-1,-1,1,1,-1,2,2,2 p1=-1,-1,0,-1,1,1,2,2,2 ;;
    esac
    count "$np" "gathered=$g count_last=$last$" "$WORK/o"
    count "$np" "broadcast=hello from the last rank|x$" "$WORK/o"
    count "$np" "pad_first=0 rows=$rows col0=$p0$" "$WORK/o"
    count "$np" "pad_first=1 rows=$rows col0=$p1$" "$WORK/o"
    count "$np" "reduce_sum_x2=$((np * (np + 1))) reduce_mean=$half reduce_max=$np$" "$WORK/o"
    count "$np" 'reduce_error=reduce: reduction "prod" is not one of "sum", "mean", "max", "none"' "$WORK/o"
    count "$np" "rng_same_as_rank0=1$" "$WORK/o"
done

# 103 samples in batches of 8 without even batches: 13 batches, so the ranks run out at different
# steps. Inside join_uneven_inputs training ends (well within the 120 s bound, not the 1800 s
# collective timeout) and every rank holds the last rank's parameters; without it the first rank to
# run out breaks the collective sequence of the others.
for be in $backends; do
    for np in 2 3 4; do
        note "join_uneven_inputs: $np ranks, $be"
        start=$(date +%s)
        launch "$np" "$be" "$SC" --mode join --even no > "$WORK/o" || { cat "$WORK/o"; fail "join $np $be"; }
        echo "  finished in $(( $(date +%s) - start )) s"
        # 13 = 1 (mod 2, 3, 4): rank 0 has one batch more than the others
        count 1 "rank=0 batches=$(( 13 / np + 1 )) params_same=1 joined$" "$WORK/o"
        count "$np" "params_same=1 joined$" "$WORK/o"
        count $((np - 1)) "batches=$(( 13 / np )) params_same=1 joined$" "$WORK/o"
    done
    note "join_uneven_inputs with even_batches=true: nothing to join, the same batch count everywhere ($be)"
    launch 3 "$be" "$SC" --mode join --even yes > "$WORK/o" || { cat "$WORK/o"; fail "join even $be"; }
    count 3 "batches=5 params_same=1 joined$" "$WORK/o"
    note "without join_uneven_inputs the uneven ranks fail ($be)"
    if SYNC_CHECK_NO_JOIN=1 launch 2 "$be" "$SC" --mode join --even no --timeout 20 > "$WORK/o"; then
        cat "$WORK/o"; fail "uneven batches without join finished"
    fi
    grep -q "collective mismatch\|timed out\|cannot complete" "$WORK/o" || { cat "$WORK/o"; fail "no collective error"; }
done
note "autocast scopes (one process: they do not depend on the process count)"
for mp in no bf16 fp16; do
    lp=$mp
    [ "$mp" = bf16 ] || [ "$mp" = fp16 ] || lp=f32
    [ "$mp" = fp16 ] && lp=f16
    "$SC" --cpu --mode autocast --mixed_precision "$mp" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "autocast $mp"; }
    count 1 "^outside=f32 scope=$lp disabled=f32 model=$lp f16=f16 back=f32 outer=$lp after=f32 bad_ran=0 error=autocast: dtype i32 is not f16 or bf16" "$WORK/o"
done
note "join_uneven_inputs on 1 process: no effect"
launch 1 single "$SC" --mode join --even no > "$WORK/o" || { cat "$WORK/o"; fail "join 1 process"; }
count 1 "rank=0 batches=13 params_same=1 joined$" "$WORK/o"
echo "ok"
