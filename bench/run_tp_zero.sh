#!/usr/bin/env bash
# Tensor parallelism composed with sharded data parallelism on 4 processes: examples/gpt on one global batch
# at tp 2 x dp_shard 2 (FSDP FULL_SHARD over the 2 data-parallel ranks of each tp coordinate), tp 2 x
# dp_replicate 2 (plain data parallelism over them) and dp 4 (plain data parallelism, no tp), under caccel
# launch (Gloo), 1 thread a process; alternating, medians of REPS runs. Prints
#   (a) tokens/s of the whole job (the throughput line, log_interval 1; median of the steps after the first)
#       and the step time it gives, and each rank's peak resident memory (/usr/bin/time %M);
#   (b) each rank's model states from the memory report (CACCEL_MEMORY_REPORT: parameters, gradients,
#       optimizer state in bytes, after one step);
#   (c) the bytes each communicator moved per step (the profiler's trace, steps 1..N-2: ring bus bytes,
#       2(n-1)/n of an all-reduce's buffer, (n-1) parts of an all-gather or reduce-scatter) beside the formula.
# --set cp: context parallelism with sharded data parallelism instead: cp 2 x dp_shard 2 (FULL_SHARD over
# dp_shard x cp, Accelerate's dp_shard_cp; 4 processes), cp 2 alone (2 processes, one batch) and cp 2 x
# dp_replicate 2 (4 processes).
# Nothing here is asserted by a test.
# usage: run_tp_zero.sh --gpt PATH --caccel PATH [--set tp|cp] [--reps N] [--steps N] [--shape L,H,C,T,B]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gpt="" caccel="" reps=3 steps=6 shape=6,6,384,256,8 set=tp
while [ $# -gt 0 ]; do
    case $1 in
        --gpt) gpt=$2; shift 2 ;;
        --caccel) caccel=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --shape) shape=$2; shift 2 ;;
        --set) set=$2; shift 2 ;;
        *) echo "run_tp_zero.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
{ [ -x "$gpt" ] && [ -x "$caccel" ]; } || { echo "run_tp_zero.sh: --gpt and --caccel are required" >&2; exit 2; }
[ "$steps" -ge 4 ] || { echo "run_tp_zero.sh: --steps must be at least 4 (steps 1..N-2 are traced)" >&2; exit 2; }
IFS=, read -r L H C T B <<< "$shape"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ACCELERATE_USE_CPU=true   # (--cpu and --use_fsdp do not go together)
work=$(mktemp -d "${TMPDIR:-/tmp}/caccel-bench-tpzero.XXXXXX")
trap 'rm -rf "$work"' EXIT
# shellcheck disable=SC2016  # expanded by the wrapper, per rank
printf '#!/bin/sh\nexec /usr/bin/time -f "peak_rss_kib rank=${RANK:-0} %%M" "$@"\n' > "$work/rss"
chmod +x "$work/rss"
case $set in
    tp) modes="tpfs tprep dp4" ;;
    cp) modes="cpfs cp2 cprep" ;;
    *) echo "run_tp_zero.sh: --set is tp or cp" >&2; exit 2 ;;
esac
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) CPUs, processes of 1 thread, $reps repetitions, $steps steps a run"

# flags MODE: the launch flags; dpw MODE: its data-parallel ranks (each reads B / dpw); nproc MODE: processes
FS="--use_fsdp --fsdp_sharding_strategy FULL_SHARD"
flags() {
    case $1 in
        cpfs) echo "--parallelism_config_cp_size 2 --parallelism_config_dp_shard_size 2 $FS" ;;
        cp2) echo "--parallelism_config_cp_size 2" ;;
        cprep) echo "--parallelism_config_cp_size 2 --parallelism_config_dp_replicate_size 2" ;;
        tpfs) echo "--parallelism_config_tp_size 2 --parallelism_config_dp_shard_size 2 --use_fsdp --fsdp_sharding_strategy FULL_SHARD" ;;
        tprep) echo "--parallelism_config_tp_size 2 --parallelism_config_dp_replicate_size 2" ;;
        dp4) echo "" ;;
    esac
}
dpw() { case $1 in dp4) echo 4 ;; cp2) echo 1 ;; *) echo 2 ;; esac; }
nproc() { [ "$1" = cp2 ] && echo 2 || echo 4; }
run() {   # run MODE OUT ARGS...
    local mode=$1 out=$2; shift 2
    # shellcheck disable=SC2046
    "$caccel" launch --num_processes "$(nproc "$mode")" --backend gloo $(flags "$mode") -q "$work/rss" "$gpt" "$@" > "$out" 2>&1 ||
        { tail -20 "$out" >&2; echo "run_tp_zero.sh: the $mode run failed" >&2; return 1; }
}
common="--n_layer $L --n_head $H --n_embd $C --block_size $T --max_steps $steps --log_interval 1 --eval_interval 0
        --eval_samples $B --sample_tokens 0 --dropout 0"
: > "$work/rows"
for r in $(seq "$reps"); do
    for mode in $modes; do
        # shellcheck disable=SC2086
        run $mode "$work/o" $common --batch_size $((B / $(dpw $mode)))
        sed "s/^/mode=$mode rep=$r /" "$work/o" >> "$work/rows"
    done
done
for mode in $modes; do
    rm -rf "$work/trace.$mode"
    # shellcheck disable=SC2086
    run $mode "$work/t.$mode" $common --batch_size $((B / $(dpw $mode))) --profile --output_trace_dir "$work/trace.$mode" \
        --profile_wait 1 --profile_active $((steps - 2)) --profile_repeat 1
    # shellcheck disable=SC2086
    CACCEL_MEMORY_REPORT="$work/mem.$mode" run $mode "$work/m.$mode" $common --batch_size $((B / $(dpw $mode)))
done
python3 "$here/tp_zero_report.py" --work "$work" --shape "$L $H $C $T $B" --steps "$steps" --set "$set"
