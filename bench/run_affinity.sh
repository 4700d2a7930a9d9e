#!/usr/bin/env bash
# enable_cpu_affinity: the MLP (bench_mlp) and the GPT example at 2 processes under caccel launch, each
# without and with --enable_cpu_affinity, alternating; medians of samples/s. Threads as caccel launch
# sets them (cores / local processes without binding, each rank's set with it).
# usage: run_affinity.sh --bench PATH --gpt PATH --caccel PATH [--reps N] [--gpt_steps N]
set -euo pipefail
bench="" gpt="" caccel="" reps=3 steps=30
while [ $# -gt 0 ]; do
    case $1 in
        --bench) bench=$2; shift 2 ;;
        --gpt) gpt=$2; shift 2 ;;
        --caccel) caccel=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --gpt_steps) steps=$2; shift 2 ;;
        *) echo "run_affinity.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$bench" ] && [ -x "$gpt" ] && [ -x "$caccel" ] || { echo "run_affinity.sh: --bench, --gpt and --caccel are required" >&2; exit 2; }
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) CPUs"
"$caccel" env --num_processes 2 --enable_cpu_affinity | sed -n '/^CPU topology/,$s/^/# /p'
launch() { "$caccel" launch --num_processes 2 --cpu --backend gloo -q "$@"; }
for r in $(seq "$reps"); do
    for bind in off on; do
        flag=""; [ "$bind" = on ] && flag=--enable_cpu_affinity
        # shellcheck disable=SC2086
        launch $flag "$bench" --batch-sizes 128 | grep -o ' samples_per_s=[0-9.]*' | head -1 | sed "s/^/mlp $bind/" >> "$out"
        # shellcheck disable=SC2086
        launch $flag "$gpt" --n_layer 2 --n_head 2 --n_embd 64 --block_size 64 --batch_size 8 --max_steps "$steps" \
            --log_interval "$steps" --eval_interval 0 --sample_tokens 0 |
            grep -o '[0-9.]* samples/s' | tail -1 | sed "s/^\([0-9.]*\) samples\/s/gpt $bind samples_per_s=\1/" >> "$out"
    done
done
python3 - "$out" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
print(f"{'program':>7} | {'unbound samples/s':>17} | {'bound samples/s':>15} | bound/unbound (n)")
for prog in ("mlp", "gpt"):
    v = {b: [float(r[2].split("=")[1]) for r in rows if r[0] == prog and r[1] == b] for b in ("off", "on")}
    if not v["off"] or not v["on"]:
        print(f"{prog:>7} | no rate printed ({v})"); continue
    off, on = statistics.median(v["off"]), statistics.median(v["on"])
    print(f"{prog:>7} | {off:17.1f} | {on:15.1f} | {on / off:.2f} ({len(v['on'])})")
PY
