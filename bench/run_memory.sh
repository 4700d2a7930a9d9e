#!/usr/bin/env bash
# Peak memory, caccel against PyTorch, and where caccel's peak goes: the GPT example and the MLP of
# bench_mlp (one batch size, one epoch), per thread count. For each caccel run:
#   rss        peak resident memory of the whole process (/usr/bin/time -f %M)
#   reserved   the most the device allocator held (tensors in use + its cache of free blocks)
#   params, grads, optim, acts   the first step's peak in use, by category (CACCEL_MEMORY_REPORT:
#              parameters, their gradients, AdamW's state, and the rest: saved activations, the
#              backward's gradients, the step's temporaries and data the program keeps on the
#              device; the MLP's Fashion-MNIST is 210 MiB of it)
#   other      rss - reserved: the program, its libraries (OpenBLAS, oneDNN, libgomp), thread stacks,
#              the dataset and host buffers outside the allocator
# and the PyTorch peer's rss (bench/peers/torch_transformer.py gpt, bench/peers/torch_mlp.py) on the
# same shapes, with the interpreter's floor (`import torch` alone).
# usage: run_memory.sh --gpt PATH --mlp PATH [--threads 1,2] [--steps N] [--gpt-args "..."] [--batch N]
# Environment: CACCEL_BENCH_PYTHON (else TORCH_PYTHON, else python3): the interpreter with torch.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gpt="" mlp="" threads="1,2" steps=5 batch=128
gpt_args="--n_layer 4 --n_head 4 --n_embd 128 --block_size 64 --batch_size 32"
while [ $# -gt 0 ]; do
    case $1 in
        --gpt) gpt=$2; shift 2 ;;
        --mlp) mlp=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --gpt-args) gpt_args=$2; shift 2 ;;
        --batch) batch=$2; shift 2 ;;
        *) echo "run_memory.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$gpt" ] && [ -x "$mlp" ] || { echo "run_memory.sh: --gpt and --mlp paths are required" >&2; exit 2; }
py=${CACCEL_BENCH_PYTHON:-${TORCH_PYTHON:-python3}}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
# peak RSS in MiB of a command (its output in $tmp/out)
rss_of() { /usr/bin/time -f 'peak_kib %M' -o "$tmp/time" "$@" > "$tmp/out" 2>&1 || { tail -5 "$tmp/out" >&2; return 1; }
           awk '/^peak_kib/ { printf "%.1f", $2 / 1024 }' "$tmp/time"; }
# key from the CACCEL_MEMORY_REPORT line, in MiB
key() { mib "$(tr ' ' '\n' < "$tmp/report.0" | awk -F= -v k="$1" '$1 == k { print $2 }')"; }
# the caccel row: name, peak RSS, then the program with its arguments (run again for the report)
row() {
    local name=$1 rss=$2; shift 2
    rm -f "$tmp/report.0"
    CACCEL_MEMORY_REPORT="$tmp/report" "$@" > /dev/null 2>&1 || true
    [ -s "$tmp/report.0" ] || { echo "run_memory.sh: $name wrote no memory report" >&2; return 1; }
    local res; res=$(key peak_reserved)
    printf '%-6s %-7s %8s %9s %8s %8s %8s %8s %8s\n' "$name" caccel "$rss" "$res" "$(key parameters)" \
        "$(key gradients)" "$(key optimizer_state)" "$(key activations)" "$(awk -v a="$rss" -v b="$res" 'BEGIN { printf "%.1f", a - b }')"
}

floor=$(OMP_NUM_THREADS=1 rss_of "$py" -c "import torch")
echo "# $(lscpu | sed -n 's/^Model name: *//p'); torch $("$py" -c 'import torch; print(torch.__version__)'); import torch alone: $floor MiB"
echo "# MiB; params/grads/optim/acts: the first step's peak in use by category (acts: all the rest, data on"
echo "# the device included); other = rss - reserved (program, libraries, host-side loading)"
printf '%-6s %-7s %8s %9s %8s %8s %8s %8s %8s\n' model impl rss reserved params grads optim acts other
for t in ${threads//,/ }; do
    export OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t
    echo "# threads=$t"
    # shellcheck disable=SC2086  # gpt_args is a list of flags
    g=(--max_steps "$steps" --eval_interval 1000000 --eval_samples 4 --sample_tokens 0 --cpu $gpt_args)
    rss=$(rss_of "$gpt" "${g[@]}")
    row gpt "$rss" "$gpt" "${g[@]}"
    # shellcheck disable=SC2086
    trss=$(rss_of "$py" "$here/peers/torch_transformer.py" gpt --threads "$t" --steps "$steps" $gpt_args)
    printf '%-6s %-7s %8s\n' gpt torch "$trss"
    rss=$(rss_of "$mlp" --batch-sizes "$batch")
    row mlp "$rss" "$mlp" --batch-sizes "$batch"
    trss=$(rss_of "$py" "$here/peers/torch_mlp.py" --threads "$t" --batch-sizes "$batch")
    printf '%-6s %-7s %8s\n' mlp torch "$trss"
done
