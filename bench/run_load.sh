#!/usr/bin/env bash
# Loading one large f32 safetensors file (LAYERS x 64 MiB: Linear(4096, 4096) weights, 1 GiB by
# default) into a matching model, alternating REPS times: caccel's ca_load_model (bench/bench_load),
# PyTorch's safetensors.torch.load_file + load_state_dict (bench/peers/torch_load.py), and
# `cat file > /dev/null`, the floor of reading the bytes. Each run is its own process, its peak RSS
# from /usr/bin/time -f %M (the model's own parameters included: 1 GiB at the default size). Before
# each run the page cache is dropped where this system lets us (echo 1 > /proc/sys/vm/drop_caches);
# where it does not, every run but the first reads a warm cache, and the header says so.
# Prints seconds and peak RSS of each run, then the medians and their ratios. Nothing is asserted.
# usage: run_load.sh [--build DIR] [--reps N] [--layers N] [--dir D] [--threads T: OMP_NUM_THREADS of
# both, 1 by default]   (TORCH_PYTHON: a python3 with
# torch and safetensors)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=. reps=3 layers=16 dir="" threads=1
while [ $# -gt 0 ]; do
    case $1 in
        --build) build=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --layers) layers=$2; shift 2 ;;
        --dir) dir=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        *) echo "run_load.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
py=${TORCH_PYTHON:-python3}
"$py" -c 'import torch, safetensors' 2>/dev/null || { echo "run_load.sh: $py lacks torch or safetensors" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "run_load.sh: no /usr/bin/time (install the time package)" >&2; exit 2; }
work=$(mktemp -d "${dir:-${TMPDIR:-/tmp}}/caccel-bench-load.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$build/bench/bench_load" --write "$work" --layers "$layers"
file="$work/model.safetensors"
cache=warm
if sync && echo 1 > /proc/sys/vm/drop_caches 2>/dev/null; then cache=cold; fi
drop() { [ "$cache" = warm ] || { sync; echo 1 > /proc/sys/vm/drop_caches; }; }
echo "date: $(date -u +%F), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; torch $("$py" -c 'import torch; print(torch.__version__)'), safetensors $("$py" -c 'import safetensors; print(safetensors.__version__)')"
echo "file: $(( $(stat -c %s "$file") / 1048576 )) MiB, $layers tensors; page cache: $cache before each run; $threads thread(s)"
# run NAME CMD...: one run; appends "NAME seconds rss_kib" to $work/runs
run() {
    name=$1; shift
    drop
    secs=$(/usr/bin/time -f %M -o "$work/rss" "$@")
    echo "$name $secs $(tail -1 "$work/rss")" >> "$work/runs"
}
: > "$work/runs"
for _ in $(seq "$reps"); do
    run caccel env OMP_NUM_THREADS="$threads" "$build/bench/bench_load" --load "$work" --layers "$layers"
    run torch env OMP_NUM_THREADS="$threads" "$py" "$here/peers/torch_load.py" "$file" "$layers"
    run cat bash -c 's=$(date +%s.%N); cat "$1" > /dev/null; e=$(date +%s.%N); echo "$e - $s" | bc' _ "$file"
done
printf '%-8s %4s %10s %14s\n' method run seconds "peak RSS MiB"
awk '{ n[$1]++; printf "%-8s %4d %10.3f %14.0f\n", $1, n[$1], $2, $3 / 1024 }' "$work/runs"
median() { grep "^$1 " "$work/runs" | awk -v c="$2" '{ print $c }' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
ct=$(median caccel 2) pt=$(median torch 2) kt=$(median cat 2)
cm=$(median caccel 3) pm=$(median torch 3)
echo "medians: caccel $ct s, $((cm / 1024)) MiB; torch $pt s, $((pm / 1024)) MiB; cat $kt s"
awk -v c="$ct" -v p="$pt" -v k="$kt" -v cm="$cm" -v pm="$pm" 'BEGIN {
    printf "torch / caccel time: %.2f; caccel / cat time: %.2f; torch / caccel peak RSS: %.2f\n", p / c, c / k, pm / cm }'
