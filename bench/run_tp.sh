#!/usr/bin/env bash
# Tensor parallelism against data parallelism and one process: examples/gpt trained on the same global
# batch at 1 process, dp 2 (2 processes, plain data parallel) and tp 2 (2 processes,
# parallelism_config_tp_size 2: c_attn colwise fused, attn c_proj rowwise, mlp c_fc colwise, mlp c_proj
# rowwise), with --modes naming them, tp 2 with --sequence_parallel (tp2sp: the LayerNorms and the residual
# stream on each rank's half of the tokens), cp 2 (2 processes, parallelism_config_cp_size 2: each rank 128 of
# every 256 tokens, keys and values all-gathered) and cpring2 (the same with
# parallelism_config_cp_comm_strategy alltoall: ring attention, keys and values passed round by
# sendrecv), and on the lazy device (--tpu, distributed_type XLA) xla1 (one process), xlatp2 (tp 2),
# xlacp2 and xlacpring2 (cp 2 by all-gather and by the ring), their collectives and exchanges nodes of the
# device's graph, under caccel launch (Gloo), --threads threads a process
# (default 1; OMP_NUM_THREADS and OPENBLAS_NUM_THREADS, the PyTorch peer's torch.set_num_threads);
# alternating, medians of REPS runs. Prints
#   (a) tokens/s (the accelerator's throughput line, log_interval 1: the whole job's rate, a tp group's
#       batch counted once; median of the steps after the first) and the step time it gives,
#   (b) each rank's peak resident memory (/usr/bin/time %M around every rank),
#   (c) the bytes each communicator moved per step, from the profiler's Chrome trace (--profile; the
#       collectives' `comm` and `bytes`, summed per communicator over the recorded steps 1..N-2: step 0
#       holds ca_prepare's broadcast, the last step the final evaluation) beside the plan's formula, and
#       the data-parallel gradient bytes against the parameter count,
# and the PyTorch peer (bench/peers/torch_tp_gpt.py: parallelize_module with the same plan, gloo,
# torchrun) at 1 process and tp 2. Nothing here is asserted by a test.
#
# Shapes (--shapes, comma-separated; B is the global batch):
#   default  6 layers x 384 channels, 6 heads, T 256, B 8 (bench/run_transformer.sh's larger GPT shape)
#   wide     2 layers x 1024 channels, 8 heads, T 128, B 8
#   tiny     2 layers x 64 channels, 2 heads, T 32, B 8 (a check of the script, in seconds)
# usage: run_tp.sh --gpt PATH --caccel PATH [--reps N] [--steps N] [--shapes default,wide]
#                  [--modes 1,dp2,tp2,tp2sp,cp2,cpring2,xla1,xlatp2,xlacp2,xlacpring2]
#                  [--threads N] [--no-torch]
# Environment: CACCEL_BENCH_PYTHON (else TORCH_PYTHON, else python3): the interpreter with torch >= 2.2
# for the peer; CACCEL_FORTUNES_DIR (the example's corpus).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gpt="" caccel="" reps=3 steps=6 shapes=default,wide peer=1 modes=1,dp2,tp2 threads=1
while [ $# -gt 0 ]; do
    case $1 in
        --gpt) gpt=$2; shift 2 ;;
        --caccel) caccel=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --shapes) shapes=$2; shift 2 ;;
        --modes) modes=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --no-torch) peer=0; shift ;;
        *) echo "run_tp.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
{ [ -x "$gpt" ] && [ -x "$caccel" ]; } || { echo "run_tp.sh: --gpt and --caccel are required" >&2; exit 2; }
[ "$steps" -ge 4 ] || { echo "run_tp.sh: --steps must be at least 4 (steps 1..N-2 are traced)" >&2; exit 2; }
py=${CACCEL_BENCH_PYTHON:-${TORCH_PYTHON:-python3}}
if [ $peer = 1 ] && ! "$py" -c 'import torch.distributed.tensor.parallel' 2>/dev/null; then
    echo "# the PyTorch peer is left out: $py has no torch.distributed.tensor.parallel (set CACCEL_BENCH_PYTHON)"
    peer=0
fi
export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads   # caccel launch keeps them; the peer reads the second
work=$(mktemp -d "${TMPDIR:-/tmp}/caccel-bench-tp.XXXXXX")
trap 'rm -rf "$work"' EXIT
# every rank under /usr/bin/time: its peak resident set, tagged with its rank
# shellcheck disable=SC2016  # expanded by the wrapper, per rank
printf '#!/bin/sh\nexec /usr/bin/time -f "peak_rss_kib rank=${RANK:-0} %%M" "$@"\n' > "$work/rss"
chmod +x "$work/rss"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) CPUs, $threads thread(s) a process, $reps repetitions, $steps steps a run$([ $peer = 1 ] && echo "; torch $("$py" -c 'import torch; print(torch.__version__)')")"

# run MODE OUT ARGS...: the example at MODE (1, dp2, tp2, cp2), every rank under the RSS wrapper
run() {
    local mode=$1 out=$2; shift 2
    case $mode in
        1) "$work/rss" "$gpt" "$@" > "$out" 2>&1 ;;
        dp2) "$caccel" launch --num_processes 2 --cpu --backend gloo -q "$work/rss" "$gpt" "$@" > "$out" 2>&1 ;;
        tp2) "$caccel" launch --num_processes 2 --cpu --backend gloo --parallelism_config_tp_size 2 -q \
                 "$work/rss" "$gpt" "$@" > "$out" 2>&1 ;;
        cp2) "$caccel" launch --num_processes 2 --cpu --backend gloo --parallelism_config_cp_size 2 -q \
                 "$work/rss" "$gpt" "$@" > "$out" 2>&1 ;;
        tp2sp) "$caccel" launch --num_processes 2 --cpu --backend gloo --parallelism_config_tp_size 2 -q \
                 "$work/rss" "$gpt" "$@" --sequence_parallel > "$out" 2>&1 ;;
        xla1) "$work/rss" "$gpt" "$@" --tpu > "$out" 2>&1 ;;
        xlatp2) "$caccel" launch --num_processes 2 --backend gloo --parallelism_config_tp_size 2 -q \
                 "$work/rss" "$gpt" "$@" --tpu > "$out" 2>&1 ;;
        cpring2) "$caccel" launch --num_processes 2 --cpu --backend gloo --parallelism_config_cp_size 2 \
                 --parallelism_config_cp_comm_strategy alltoall -q "$work/rss" "$gpt" "$@" > "$out" 2>&1 ;;
        xlacp2) "$caccel" launch --num_processes 2 --backend gloo --parallelism_config_cp_size 2 -q \
                 "$work/rss" "$gpt" "$@" --tpu > "$out" 2>&1 ;;
        xlacpring2) "$caccel" launch --num_processes 2 --backend gloo --parallelism_config_cp_size 2 \
                 --parallelism_config_cp_comm_strategy alltoall -q "$work/rss" "$gpt" "$@" --tpu > "$out" 2>&1 ;;
    esac || { tail -20 "$out" >&2; echo "run_tp.sh: the $mode run failed" >&2; return 1; }
}

for shape in ${shapes//,/ }; do
    case $shape in
        default) L=6 H=6 C=384 T=256 B=8 ;;
        wide) L=2 H=8 C=1024 T=128 B=8 ;;
        tiny) L=2 H=2 C=64 T=32 B=8 ;;
        *) echo "run_tp.sh: unknown shape $shape" >&2; exit 2 ;;
    esac
    common="--n_layer $L --n_head $H --n_embd $C --block_size $T --max_steps $steps --log_interval 1
            --eval_interval 0 --eval_samples $B --sample_tokens 0 --dropout 0"
    : > "$work/rows"
    for r in $(seq "$reps"); do
        for mode in ${modes//,/ }; do
            b=$B; [ $mode = dp2 ] && b=$((B / 2))   # a tp or cp group reads one batch; dp ranks each their half
            # shellcheck disable=SC2086
            run $mode "$work/o" $common --batch_size $b
            sed "s/^/mode=$mode rep=$r /" "$work/o" >> "$work/rows"
        done
        if [ $peer = 1 ]; then
            pa="--n_layer $L --n_head $H --n_embd $C --block_size $T --batch_size $B --steps $steps"
            # shellcheck disable=SC2086
            "$py" "$here/peers/torch_tp_gpt.py" $pa 2>&1 | sed "s/^/mode=torch1 rep=$r /" >> "$work/rows" || true
            # shellcheck disable=SC2086
            "$py" -m torch.distributed.run --nproc_per_node 2 --master_port 29533 "$here/peers/torch_tp_gpt.py" $pa 2>&1 |
                sed "s/^/mode=torchtp2 rep=$r /" >> "$work/rows" || true
            case ,$modes, in *,tp2sp,*)   # torchtitan's sequence-parallel plan
                # shellcheck disable=SC2086
                "$py" -m torch.distributed.run --nproc_per_node 2 --master_port 29534 "$here/peers/torch_tp_gpt.py" $pa \
                    --sequence_parallel 2>&1 | sed "s/^/mode=torchtp2sp rep=$r /" >> "$work/rows" || true ;;
            esac
        fi
    done
    # the traced runs: steps 1..N-2 recorded (wait 1, active N-2, one cycle)
    for mode in ${modes//,/ }; do
        b=$B; [ $mode = dp2 ] && b=$((B / 2))
        rm -rf "$work/trace.$mode"
        # shellcheck disable=SC2086
        run $mode "$work/t.$mode" $common --batch_size $b --profile --output_trace_dir "$work/trace.$mode" \
            --profile_wait 1 --profile_active $((steps - 2)) --profile_repeat 1
    done
    python3 "$here/tp_report.py" --work "$work" --shape "$L $H $C $T $B" --steps "$steps"
done
