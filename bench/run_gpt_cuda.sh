#!/usr/bin/env bash
# GPT-2-124M-shaped bf16 training step on one GPU: examples/gpt (12 layers, 12 heads, 768
# channels, block 1024, vocabulary 50304, --mixed_precision bf16) against the PyTorch GPT of
# bench/peers/torch_transformer.py under torch.autocast bf16 on the same GPU; tokens/s and MFU
# (6 N + 12 L T C FLOPs per token, nanoGPT's estimate, against --peak-tflops, default 989 for an H100 SXM's dense bf16).
# Exits 77 with "bench-gpt-cuda skipped: no GPU (<reason>)" when there is no usable GPU, so that make and a
# GPU check see a failure, never a measurement; without a CUDA PyTorch it measures caccel alone.
# usage: run_gpt_cuda.sh --gpt PATH [--caccel PATH] [--batch-size 8] [--steps 20] [--peak-tflops X]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gpt="" caccel="" B=8 N=20 peak=989 py=${PYTHON:-python3}
while [ $# -gt 0 ]; do
    case $1 in
        --gpt) gpt=$2; shift 2 ;;
        --caccel) caccel=$2; shift 2 ;;
        --batch-size) B=$2; shift 2 ;;
        --steps) N=$2; shift 2 ;;
        --peak-tflops) peak=$2; shift 2 ;;
        *) echo "run_gpt_cuda.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$gpt" ] || { echo "run_gpt_cuda.sh: --gpt PATH to examples/gpt is required" >&2; exit 2; }
if [ -n "$caccel" ]; then
    line=$("$caccel" env 2>/dev/null | awk '$1 == "cuda" && $2 == "device"')
    case $line in
        *" ok"*) ;;
        *) echo "bench-gpt-cuda skipped: no GPU ($(echo "${line:-the cuda backend is not built}" | tr -s " " | sed 's/^ //'))" >&2; exit 77 ;;
    esac
fi
command -v nvidia-smi >/dev/null 2>&1 || { echo "bench-gpt-cuda skipped: no GPU (nvidia-smi not found)" >&2; exit 77; }
L=12 H=12 C=768 T=1024 V=50304
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
# N = parameters without the position embedding (tied output layer counted once), nanoGPT's MFU.
flops_per_token=$(( 6 * (12 * L * C * C + V * C) + 12 * L * T * C ))
tps=$("$gpt" --mixed_precision bf16 --n_layer $L --n_head $H --n_embd $C --block_size $T --vocab_size $V \
      --batch_size "$B" --max_steps "$N" --log_interval $((N / 2)) --eval_interval 0 --eval_samples "$B" \
      --sample_tokens 0 | sed -n 's/.* \([0-9.]*\) tokens\/s$/\1/p' | tail -1)
mfu() { awk -v t="$1" -v f="$flops_per_token" -v p="$peak" 'BEGIN { printf "%.1f", 100 * t * f / (p * 1e12) }'; }
echo "impl=caccel tokens_per_s=$tps mfu_pct=$(mfu "$tps")"
if "$py" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    line=$("$py" "$here/peers/torch_transformer.py" gpt --device cuda --bf16 --n_layer $L --n_head $H \
           --n_embd $C --block_size $T --vocab_size $V --batch_size "$B" --steps $((N / 2)) 2>/dev/null)
    ttps=${line##*tokens_per_s=}
    echo "impl=torch tokens_per_s=$ttps mfu_pct=$(mfu "$ttps")"
    awk -v a="$tps" -v b="$ttps" 'BEGIN { printf "caccel/torch %.2f\n", a / b }'
else
    echo "# PyTorch with CUDA not found for $py: no peer"
fi
