#!/usr/bin/env bash
# Sharded data parallelism: per-rank memory and step time of DDP and ZeRO stages 1, 2 and 3 at 1, 2
# and 4 processes (caccel launch, Gloo, CPU), and HSDP (2 groups of 2) at 4, one table row per (processes,
# stage): rank 0's line.
# usage: run_zero.sh --bench PATH --caccel PATH [bench_zero arguments...]
set -euo pipefail
bench="" caccel="" args=()
while [ $# -gt 0 ]; do
    case $1 in
        --bench) bench=$2; shift 2 ;;
        --caccel) caccel=$2; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
[ -x "$bench" ] && [ -x "$caccel" ] || { echo "run_zero.sh: --bench and --caccel are required" >&2; exit 2; }
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) CPUs; bench_zero ${args[*]:-} (OPENBLAS_NUM_THREADS=1, Gloo)"
echo "| processes | mode | params MB | grads MB | optimizer state MB | total MB | peak MB | step ms | sent MB/step |"
echo "|---|---|---|---|---|---|---|---|---|"
for np in 1 2 4; do
    for mode in ddp 1 2 3 3pf h2 h3; do
        env=()
        case $mode in
            ddp) flags=() ;;
            h2|h3) [ "$np" -eq 4 ] || continue   # HSDP: 2 groups of 2 (parallelism_config dp_replicate_size 2)
                 env=(PARALLELISM_CONFIG_DP_REPLICATE_SIZE=2)
                 flags=(--use_fsdp --fsdp_sharding_strategy "$([ $mode = h2 ] && echo SHARD_GRAD_OP || echo FULL_SHARD)") ;;
            3pf) [ "$np" -gt 1 ] || continue   # stage 3 with FSDP's forward and BACKWARD_PRE prefetch
                 flags=(--use_fsdp --fsdp_sharding_strategy FULL_SHARD --fsdp_forward_prefetch true --fsdp_backward_prefetch BACKWARD_PRE) ;;
            *) flags=(--use_deepspeed --zero_stage "$mode") ;;
        esac
        line=$(env "${env[@]}" "$caccel" launch --num_processes "$np" --backend gloo "${flags[@]}" "$bench" "${args[@]}" 2>/dev/null | grep '^rank=0 ')
        v() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<< "$line"; }
        case $mode in
            ddp) label=DDP ;; 3pf) label="stage 3, prefetch" ;; h*) label="stage ${mode#h}, HSDP 2 x 2" ;;
            *) label="stage $mode" ;;
        esac
        echo "| $np | $label | $(v params_mb) | $(v grads_mb) | $(v optim_mb) | $(v total_mb) | $(v peak_mb) | $(v step_ms) | $(v sent_mb) |"
    done
done
