#!/usr/bin/env bash
# Sharded state dicts against full state under tensor parallelism: tests/tp_check's MLP widened (--hidden N;
# 13 N + 4 parameters, SGD with momentum) at tp 2 x FULL_SHARD 2 on 4 processes (caccel launch, Gloo, 1
# thread each) saves after one step as SHARDED_STATE_DICT (each rank its shard of its tp slices) and as
# FULL_STATE_DICT (gathered over dp and tp, rank 0 writes), alternating, REPS times each; then loads each at
# the same mesh. Prints per rank the median wall time of ca_save_state and ca_load_state (tp_check's
# save_state_ms / load_state_ms) and the bytes of tensor files each rank wrote.
# Nothing here is asserted by a test.
# usage: run_tp_sharded_state.sh --tp-check PATH --caccel PATH [--reps N] [--hidden N]
set -euo pipefail
tpc="" caccel="" reps=3 hidden=262144
while [ $# -gt 0 ]; do
    case $1 in
        --tp-check) tpc=$2; shift 2 ;;
        --caccel) caccel=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --hidden) hidden=$2; shift 2 ;;
        *) echo "run_tp_sharded_state.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
{ [ -x "$tpc" ] && [ -x "$caccel" ]; } || { echo "run_tp_sharded_state.sh: --tp-check and --caccel are required" >&2; exit 2; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ACCELERATE_USE_CPU=true
work=$(mktemp -d "${TMPDIR:-/tmp}/caccel-bench-tpsharded.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) CPUs, 4 processes of 1 thread, $reps repetitions, hidden $hidden ($((13 * hidden + 4)) parameters)"
MESH="--parallelism_config_tp_size 2 --parallelism_config_dp_shard_size 2 --use_fsdp --fsdp_sharding_strategy FULL_SHARD"
: > "$work/rows"
for r in $(seq "$reps"); do
    for kind in SHARDED_STATE_DICT FULL_STATE_DICT; do
        rm -rf "$work/ck"
        # shellcheck disable=SC2086
        "$caccel" launch --num_processes 4 --backend gloo $MESH --fsdp_state_dict_type "$kind" "$tpc" --plan \
            --hidden "$hidden" --steps 1 --batch 8 --save-state "$work/ck" > "$work/o" 2>&1 || { tail "$work/o" >&2; exit 1; }
        sed -n "s/^rank=\([0-9]\) save_state_ms=\(.*\)/$kind save \1 \2/p" "$work/o" >> "$work/rows"
        # shellcheck disable=SC2086
        "$caccel" launch --num_processes 4 --backend gloo $MESH "$tpc" --plan --hidden "$hidden" --steps 0 --batch 8 \
            --load-state "$work/ck" > "$work/o" 2>&1 || { tail "$work/o" >&2; exit 1; }
        sed -n "s/^rank=\([0-9]\) load_state_ms=\(.*\)/$kind load \1 \2/p" "$work/o" >> "$work/rows"
        if [ "$r" = 1 ]; then   # the bytes each rank wrote: its shard file, or rank 0's model and optimizer
            for k in 0 1 2 3; do
                if [ "$kind" = SHARDED_STATE_DICT ]; then b=$(stat -c %s "$work/ck/zero_shard_$k.safetensors")
                elif [ $k = 0 ]; then b=$(cat "$work/ck/model.safetensors" "$work/ck/optimizer.safetensors" | wc -c)
                else b=0; fi
                echo "$kind bytes $k $b" >> "$work/rows"
            done
        fi
    done
done
# the median of each (kind, what, rank): the values sorted first, the middle one taken
sort -k4,4g "$work/rows" | awk '{ k = $1 " " $2 " " $3; n[k]++; v[k, n[k]] = $4 }
     END { for (k in n) print k, v[k, int((n[k] + 1) / 2)] }' |
    sort | awk 'BEGIN { print "kind what rank median (ms, or bytes)" } { print }'
