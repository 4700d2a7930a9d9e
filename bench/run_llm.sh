#!/usr/bin/env bash
# LoRA and full fine-tuning steps of a Llama against PyTorch + PEFT: examples/llm_finetune (fresh
# weights, --from_scratch; byte-level tokens of the fortunes) and bench/peers/torch_llm.py (transformers'
# LlamaForCausalLM with PEFT's LoRA, random tokens), alternating, medians of REPS runs, at each thread count.
# Prints tokens/s, the caccel/PyTorch ratio, peak resident memory of each process (/usr/bin/time %M) and
# LoRA's trained state (adapters, their gradients and two AdamW moments) against the full fine-tune's.
# Nothing here is asserted by a test.
#
# Shapes (--shapes, comma-separated):
#   tiny   the test's: vocab 257, 64 channels, 2 layers, 4 heads (2 key/value), MLP 128; T 64, batch 16
#   100m   vocab 32000, 768 channels, 10 layers, 12 heads (4 key/value), MLP 2048 (112M parameters); T 256, batch 4
# usage: run_llm.sh [--build DIR] [--threads "1 2"] [--reps N] [--shapes tiny,100m] [--steps N]
# Environment: TORCH_PYTHON (python3: the interpreter with torch, transformers and peft),
# CACCEL_FORTUNES_DIR (the fortunes). DIR (default .) holds examples/llm_finetune (`make bench-llm`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=. threads=${THREADS:-1 2} reps=${REPS:-3} shapes=${SHAPES:-tiny,100m} steps=""
while [ $# -gt 0 ]; do
    case $1 in
        --build) build=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --shapes) shapes=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        *) echo "run_llm.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
threads=${threads//,/ }
py=${TORCH_PYTHON:-python3}
ft=$build/examples/llm_finetune
[ -x "$ft" ] || { echo "run_llm.sh: $ft not built (make bench-llm)" >&2; exit 2; }
"$py" -c 'import torch, transformers, peft' 2>/dev/null || { echo "run_llm.sh: $py lacks torch, transformers or peft" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/caccel-bench-llm.XXXXXX")
trap 'rm -rf "$work"' EXIT

config() {   # config DIR VOCAB HIDDEN LAYERS HEADS KV MLP
    mkdir -p "$1"
    printf '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": %s, "hidden_size": %s,
 "num_hidden_layers": %s, "num_attention_heads": %s, "num_key_value_heads": %s, "intermediate_size": %s,
 "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
 "tie_word_embeddings": false, "bos_token_id": null, "eos_token_id": 256, "initializer_range": 0.02}\n' \
        "$2" "$3" "$4" "$5" "$6" "$7" > "$1/config.json"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

# caccel DIR MODE THREADS B T STEPS -> "tokens/s peak_kib trainable all": the median of the per-step
# rates after the first third of the steps (log_interval 1)
caccel_run() {
    local r=0 lora=8
    [ "$2" = full ] && lora=0
    OMP_NUM_THREADS=$3 OPENBLAS_NUM_THREADS=$3 /usr/bin/time -f 'peak %M' "$ft" --cpu --model "$1" --from_scratch \
        --lora_r $lora --lora_alpha 16 --lora_dropout 0 --block_size "$5" --batch_size "$4" --max_steps "$6" \
        --log_interval 1 --eval_blocks 1 --sample_tokens 0 > "$work/out" 2>&1 || r=$?
    [ $r -eq 0 ] || { tail -5 "$work/out" >&2; echo "0 0 0 0"; return; }
    local rate peak tr all
    rate=$(sed -n 's/.* \([0-9.]*\) tokens\/s$/\1/p' "$work/out" | tail -n +$(( $6 / 3 + 1 )) | median)
    peak=$(sed -n 's/^peak \([0-9]*\)$/\1/p' "$work/out")
    tr=$(sed -n 's/.*trainable params: \([0-9,]*\) .*/\1/p' "$work/out" | tr -d ,)
    all=$(sed -n 's/.*all params: \([0-9,]*\) .*/\1/p' "$work/out" | tr -d ,)
    [ -n "$tr" ] || { tr=$(sed -n 's/.*(\([0-9]*\) parameters).*/\1/p' "$work/out" | head -1); all=$tr; }
    echo "$rate $peak $tr $all"
}

torch_run() {   # the same for PyTorch
    local out
    out=$(OMP_NUM_THREADS=$3 /usr/bin/time -f 'peak %M' "$py" "$here/peers/torch_llm.py" "$1" "$2" "$3" "$4" "$5" "$6" 2>&1) ||
        { echo "$out" | tail -5 >&2; echo "0 0"; return; }
    echo "$(echo "$out" | sed -n 's/.*: \([0-9.]*\) tokens\/s.*/\1/p') $(echo "$out" | sed -n 's/^peak \([0-9]*\)$/\1/p')"
}

echo "date: $(date -u +%F), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; torch $("$py" -c 'import torch, peft; print(torch.__version__, "peft", peft.__version__)')"
printf '%-5s %-4s %2s %12s %12s %7s %10s %10s %s\n' shape mode th "caccel tok/s" "torch tok/s" ratio "caccel MiB" "torch MiB" "trained state"
for shape in ${shapes//,/ }; do
    case $shape in
        tiny) config "$work/$shape" 257 64 2 4 2 128; B=16 T=64 n=${steps:-30} ;;
        100m) config "$work/$shape" 32000 768 10 12 4 2048; B=4 T=256 n=${steps:-6} ;;
        *) echo "run_llm.sh: unknown shape $shape" >&2; exit 2 ;;
    esac
    for th in $threads; do
        for mode in lora full; do
            : > "$work/c"; : > "$work/t"
            for _ in $(seq "$reps"); do
                caccel_run "$work/$shape" $mode "$th" $B $T "$n" >> "$work/c"
                torch_run "$work/$shape" $mode "$th" $B $T "$n" >> "$work/t"
            done
            c=$(awk '{ print $1 }' "$work/c" | median); t=$(awk '{ print $1 }' "$work/t" | median)
            cm=$(awk '{ print $2 }' "$work/c" | median); tm=$(awk '{ print $2 }' "$work/t" | median)
            read -r _ _ tr all < <(tail -1 "$work/c")
            state=$(awk -v a="$tr" -v b="$all" 'BEGIN { if (b > 0) printf "%.3f%% of the full fine-tune'"'"'s", 100 * a / b }')
            printf '%-5s %-4s %2s %12.1f %12.1f %7.2f %10.0f %10.0f %s\n' "$shape" $mode "$th" "$c" "$t" \
                "$(awk -v a="$c" -v b="$t" 'BEGIN { print (b > 0 ? a / b : 0) }')" "$(awk -v k="$cm" 'BEGIN { print k / 1024 }')" \
                "$(awk -v k="$tm" 'BEGIN { print k / 1024 }')" "$([ $mode = lora ] && echo "$state")"
        done
    done
done
