#!/usr/bin/env bash
# Data-parallel MLP throughput: caccel on 1 and 2 processes (caccel launch, Gloo; 1 thread each)
# against PyTorch DDP (gloo, torchrun) on the same global batch, alternating; medians and ratios. The
# 2-process run is repeated with comm_hook bf16 (gradients all-reduced in 16 bits: half the bytes) and
# with comm_hook power_sgd at rank 4 (low-rank factors).
# usage: run_ddp.sh --bench PATH --caccel PATH [--reps N] [--batch 128]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bench="" caccel="" reps=5 batch=128
while [ $# -gt 0 ]; do
    case $1 in
        --bench) bench=$2; shift 2 ;;
        --caccel) caccel=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --batch) batch=$2; shift 2 ;;
        *) echo "run_ddp.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$bench" ] && [ -x "$caccel" ] || { echo "run_ddp.sh: --bench and --caccel are required" >&2; exit 2; }
peer=/usr/bin/python3
$peer -c "import torch" 2>/dev/null || { echo "run_ddp.sh: install the Debian package python3-torch" >&2; exit 2; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
out=$(mktemp)
trap 'rm -f "$out" "$out.a" "$out.b" "$out.psgd"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) CPUs, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, batch $batch per process"
# Whether the host gives this machine two whole cores: two spinning processes against one, 2 s each
# (2.00x: both cores are free; 1.00x: the two share one). Run before and after the measurements.
probe() {
    spin='import time
n, end = 0, time.perf_counter() + 2
while time.perf_counter() < end: n += 1
print(n)'
    one=$($peer -c "$spin")
    # each to its own file: two writers on one pipe have been seen to run their numbers together
    $peer -c "$spin" > "$out.a" & $peer -c "$spin" > "$out.b" & wait
    two="$(cat "$out.a") $(cat "$out.b")"
    $peer -c 'import sys
w, one, two = sys.argv[1], int(sys.argv[2] or 0), [int(v) for v in sys.argv[3:]]
if one == 0 or len(two) < 2:
    sys.exit(print(f"# core probe {w}: a spinning process printed nothing ({one}, {two}); no ratio"))
print(f"# core probe {w}: two spinning processes ran {sum(two) / one:.2f}x one "
      f"(iterations in 2 s: {one} alone, {two[0]} + {two[1]} together)")' "$1" "$one" $two
}
probe before
# The ceiling without communication: the same training, two independent processes at once (no
# all-reduce, no meeting) against one alone. Unlike the spinning probe, it counts what the two
# processes' GEMMs and memory traffic cost each other on this host.
pair() {
    rate() { "$bench" --batch-sizes "$batch" | grep -o ' samples_per_s=[0-9]*' | head -1 | cut -d= -f2; }
    one=$(rate)
    rate > "$out.a" & rate > "$out.b" & wait
    two="$(cat "$out.a") $(cat "$out.b")"
    $peer -c 'import sys
one, two = int(sys.argv[1] or 0), [int(v) for v in sys.argv[2:]]
if one == 0 or len(two) < 2:
    sys.exit(print(f"# independent pair: no rate printed ({one}, {two})"))
print(f"# independent pair: two caccel processes without communication ran {sum(two) / one:.2f}x one "
      f"(samples/s: {one} alone, {two[0]} + {two[1]} together): the ceiling of 2 processes / 1")' "$one" $two
}
pair
# PowerSGD at rank 4 from step 10 (its default start, step 1000, is past this run's last step)
printf 'distributed_type: MULTI_CPU\ncomm_hook: power_sgd\ncomm_state_option:\n  matrix_approximation_rank: 4\n  start_powerSGD_iter: 10\n' \
    > "$out.psgd"
for r in $(seq "$reps"); do
    "$bench" --batch-sizes "$batch" >> "$out"
    "$caccel" launch --num_processes 2 --cpu --backend gloo -q "$bench" --batch-sizes "$batch" >> "$out"
    "$caccel" launch --num_processes 2 --cpu --backend gloo --comm_hook bf16 -q "$bench" --batch-sizes "$batch" |
        sed 's/ procs=2 / procs=2-bf16-hook /' >> "$out"
    "$caccel" launch --num_processes 2 --cpu --backend gloo --config_file "$out.psgd" -q "$bench" --batch-sizes "$batch" |
        sed 's/ procs=2 / procs=2-powersgd /' >> "$out"
    $peer "$here/peers/torch_mlp.py" --threads 1 --batch-sizes "$batch" | sed 's/impl=torch/impl=torch procs=1/' >> "$out"
    $peer -m torch.distributed.run --nproc_per_node 2 --master_port 29531 --redirects 1 --tee 1 \
        "$here/peers/torch_ddp.py" --batch-sizes "$batch" 2>/dev/null | grep -o 'impl=torch procs=2.*' >> "$out" || true
done
$peer - "$out" <<'PY'
import statistics, sys
rows = [dict(kv.split("=", 1) for kv in line.split()) for line in open(sys.argv[1]) if line.startswith("impl=")]
def med(impl, p, key="samples_per_s"):
    v = [float(r[key]) for r in rows if r["impl"] == impl and r.get("procs") == p]
    return (statistics.median(v) if v else float("nan")), len(v)
print(f"{'procs':>5} | {'caccel samples/s':>16} {'acc %':>6} | {'torch samples/s':>15} {'acc %':>6} | {'caccel/torch':>12} (n)")
for p in ("1", "2"):
    c, n = med("caccel", p); t, _ = med("torch", p)
    print(f"{p:>5} | {c:16.0f} {med('caccel', p, 'accuracy')[0]:6.2f} | {t:15.0f} {med('torch', p, 'accuracy')[0]:6.2f} | {c / t:12.2f} ({n})")
c1, c2 = med("caccel", "1")[0], med("caccel", "2")[0]
t1, t2 = med("torch", "1")[0], med("torch", "2")[0]
h, n = med("caccel", "2-bf16-hook")
print(f"2 processes with comm_hook bf16: {h:.0f} samples/s, accuracy {med('caccel', '2-bf16-hook', 'accuracy')[0]:.2f}% ({n})")
p, n = med("caccel", "2-powersgd")
print(f"2 processes with comm_hook power_sgd (rank 4): {p:.0f} samples/s, accuracy {med('caccel', '2-powersgd', 'accuracy')[0]:.2f}% ({n})")
print(f"2 processes / 1 process: caccel {c2 / c1:.2f}x, with comm_hook bf16 {h / c1:.2f}x, power_sgd {p / c1:.2f}x; torch {t2 / t1:.2f}x")
PY
pair
probe after
