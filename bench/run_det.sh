#!/usr/bin/env bash
# Cost of deterministic mode: Fashion-MNIST training throughput (examples/fashion_mnist, one epoch,
# global batch 256) with and without --deterministic, on 1 process (the machine's default BLAS
# threads, and 1 thread) and on 2 processes (caccel launch, Gloo, 1 thread each), alternating;
# prints the median samples/s of each configuration and the ratio deterministic / ordinary.
# usage: run_det.sh --example PATH --caccel PATH [--reps N] [--batch 256] [--shards 4]
set -euo pipefail
example="" caccel="" reps=5 batch=256 shards=4
while [ $# -gt 0 ]; do
    case $1 in
        --example) example=$2; shift 2 ;;
        --caccel) caccel=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --batch) batch=$2; shift 2 ;;
        --shards) shards=$2; shift 2 ;;
        *) echo "run_det.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$example" ] && [ -x "$caccel" ] || { echo "run_det.sh: --example and --caccel are required" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) CPUs, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, global batch $batch, deterministic_shards $shards"

# one NAME PROCS THREADS ARGS...: one epoch; appends "NAME samples/s" to $out
one() {
    name=$1 np=$2 th=$3; shift 3
    if [ "$np" = 1 ]; then
        if [ "$th" = default ]; then line=$(env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS "$example" --cpu \
                                             --batch-size "$batch" --epochs 1 "$@")
        else line=$(OPENBLAS_NUM_THREADS=$th OMP_NUM_THREADS=$th "$example" --cpu --batch-size "$batch" --epochs 1 "$@"); fi
    else
        line=$("$caccel" launch --num_processes "$np" --num_cpu_threads_per_process "$th" --cpu --backend gloo -q \
                   "$example" --batch-size $((batch / np)) --epochs 1 "$@")
    fi
    echo "$name $(echo "$line" | sed -n 's/.*, \([0-9]*\) samples\/s.*/\1/p')" >> "$out"
}

det="--deterministic --deterministic_shards $shards"
for r in $(seq "$reps"); do
    one "1proc-default-threads" 1 default
    one "1proc-default-threads-det" 1 default $det
    one "1proc-1thread" 1 1
    one "1proc-1thread-det" 1 1 $det
    one "2proc-1thread" 2 1
    one "2proc-1thread-det" 2 1 $det
done
python3 - "$out" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, v = line.split()
    rows.setdefault(name, []).append(float(v))
print(f"{'configuration':<24} {'ordinary samples/s':>18} {'deterministic':>13} {'det/ordinary':>12} (n)")
for base in ("1proc-default-threads", "1proc-1thread", "2proc-1thread"):
    a, d = statistics.median(rows[base]), statistics.median(rows[base + "-det"])
    print(f"{base:<24} {a:18.0f} {d:13.0f} {d / a:12.2f} ({len(rows[base])})")
PY
