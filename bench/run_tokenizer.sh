#!/usr/bin/env bash
# Tokenizer throughput, caccel against Hugging Face's tokenizers, one thread each: both load the same
# tokenizer.json files (trained by tests/tokenizer_bpe_cases.py on every fortune, in the shapes of GPT-2,
# Llama 3, Qwen2, Llama 2 and Mistral) and encode the same texts (every fortune entry) without special
# tokens; best of REPS passes. tokenizers runs encode_batch_fast (its Rust loop without offsets; encode_batch
# before 0.21) with RAYON_NUM_THREADS=1. Prints MB/s of text, the ratio, and whether both produced the same
# number of tokens. Nothing is asserted.
# usage: run_tokenizer.sh [--build DIR] [--reps N]   (TOKENIZERS_PYTHON: a python3 with tokenizers)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=. reps=${REPS:-5}
while [ $# -gt 0 ]; do
    case $1 in
        --build) build=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        *) echo "run_tokenizer.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
py=${TOKENIZERS_PYTHON:-python3}
fdir=${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}
"$py" -c 'import tokenizers' 2>/dev/null || { echo "run_tokenizer.sh: $py lacks tokenizers" >&2; exit 2; }
[ -f "$fdir/science" ] || { echo "run_tokenizer.sh: no fortunes in $fdir" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/caccel-bench-tok.XXXXXX")
trap 'rm -rf "$work"' EXIT
colls=$(cd "$fdir" && ls | grep -v '\.')
# shellcheck disable=SC2086
"$build/tests/text_tool" fortunes "$fdir" $colls > "$work/entries.txt"
"$py" "$here/../tests/tokenizer_bpe_cases.py" "$work" > /dev/null
echo "date: $(date -u +%F), $(lscpu | sed -n 's/^Model name: *//p'); tokenizers $("$py" -c 'import tokenizers; print(tokenizers.__version__)'); $(wc -l < "$work/fortunes.in") texts, $(( $(wc -c < "$work/fortunes.in") / 2 / 1000 )) kB"
printf '%-8s %12s %16s %7s %s\n' tokenizer "caccel MB/s" "tokenizers MB/s" ratio tokens
for t in gpt2 llama3 qwen2 llama2 mistral; do
    read -r c ct < <(OMP_NUM_THREADS=1 "$build/bench/bench_tokenizer" "$work/$t.json" "$work/fortunes.in" "$reps")
    read -r p pt < <(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$py" "$here/peers/tokenizers_speed.py" \
        "$work/$t.json" "$work/fortunes.in" "$reps")
    printf '%-8s %12.2f %16.2f %7.2f %s\n' "$t" "$c" "$p" "$(awk -v a="$c" -v b="$p" 'BEGIN { print (b > 0 ? a / b : 0) }')" \
        "$([ "$ct" = "$pt" ] && echo "equal ($ct)" || echo "caccel $ct, tokenizers $pt")"
done
