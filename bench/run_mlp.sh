#!/usr/bin/env bash
# MLP benchmark: caccel (bench_mlp) and the PyTorch peer, alternating, several repetitions per
# thread count; prints medians, each throughput as a percentage of the GEMM-only bound measured in
# the same run, and the caccel/PyTorch ratio per batch size.
# usage: run_mlp.sh --bench PATH [--reps N] [--threads 1,2] [--batch-sizes 16,32,128,512] [--precisions no,bf16,fp16]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bench="" reps=5 threads="1,2" sizes="16,32,128,512" precisions="no"
while [ $# -gt 0 ]; do
    case $1 in
        --bench) bench=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --batch-sizes) sizes=$2; shift 2 ;;
        --precisions) precisions=$2; shift 2 ;;
        *) echo "run_mlp.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$bench" ] || { echo "run_mlp.sh: --bench PATH to bench_mlp is required" >&2; exit 2; }
peer=/usr/bin/python3
if ! $peer -c "import torch" 2>/dev/null; then
    echo "run_mlp.sh: PyTorch not found for $peer: install the Debian package python3-torch" >&2
    exit 2
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) CPUs, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, CACCEL_CPU_FLUSH_DENORMAL=${CACCEL_CPU_FLUSH_DENORMAL:-unset}"
for t in ${threads//,/ }; do
    for r in $(seq "$reps"); do
        for p in ${precisions//,/ }; do
            OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t "$bench" --precision "$p" --batch-sizes "$sizes" >> "$out"
            OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t $peer "$here/peers/torch_mlp.py" --threads "$t" \
                --precision "$p" --batch-sizes "$sizes" >> "$out" 2> >(grep '^#' | sort -u >&2)
        done
    done
done
$peer - "$out" <<'PY'
import statistics, sys
rows = [dict(kv.split("=", 1) for kv in line.split()) for line in open(sys.argv[1]) if line.startswith("impl=")]
def med(impl, p, b, t, key):
    v = [float(r[key]) for r in rows if r["impl"] == impl and r["precision"] == p and r["batch"] == b
         and r["threads"] == t and key in r]
    return statistics.median(v) if v else float("nan"), len(v)
order = {"no": 0, "bf16": 1, "fp16": 2}
keys = sorted({(r["precision"], r["threads"], r["batch"]) for r in rows},
              key=lambda k: (order.get(k[0], 9), int(k[1]), int(k[2])))
first = next((r for r in rows if r["impl"] == "caccel" and "blas_core" in r), None)
if first:
    print(f"# caccel: OpenBLAS core {first['blas_core']}, kernels {first['kernels']}, "
          f"subnormal flushing {first['flush_denormal']}, f32 GEMM through {first.get('f32_gemm', 'openblas')}; "
          f"% bound = GEMM-only bound (raw OpenBLAS) / step, the bound measured by bench_mlp in each run "
          f"(median); % lib = the same with the GEMMs on the library caccel's f32 GEMMs ran on")
bf = next((r for r in rows if r["impl"] == "caccel" and r["precision"] == "bf16" and "bf16_gemm" in r), None)
if bf:
    print(f"# caccel bf16 rows: GEMM {bf['bf16_gemm']} (onednn-avx512_core_amx: AMX tiles; "
          f"onednn-avx512_core_bf16: AVX512_BF16; convert: bf16 widened to f32 for OpenBLAS)")
print(f"{'prec':>4} {'thr':>3} {'batch':>5} | {'caccel samples/s':>16} {'% bound':>7} {'% lib':>6} {'opt us':>6} {'other us':>8}"
      f" {'acc %':>6} {'RSS MiB':>7} {'step MiB':>8} | {'torch samples/s':>15} {'% bound':>7} {'acc %':>6}"
      f" {'RSS MiB':>7} | {'caccel/torch':>12} (n)")
for p, t, b in keys:
    c, n = med("caccel", p, b, t, "samples_per_s")
    q, _ = med("torch", p, b, t, "samples_per_s")
    bound = med("caccel", p, b, t, "bound_samples_per_s")[0]
    if bound != bound:  # older bench_mlp: from step/GEMM
        bound = c * med("caccel", p, b, t, "step_over_gemm")[0]
    lib = med("caccel", p, b, t, "pct_of_lib_bound")[0]
    print(f"{p:>4} {t:>3} {b:>5} | {c:16.0f} {100 * c / bound:7.1f} {lib:6.1f} {med('caccel', p, b, t, 'opt_us')[0]:6.0f} "
          f"{med('caccel', p, b, t, 'other_us')[0]:8.0f} "
          f"{med('caccel', p, b, t, 'accuracy')[0]:6.2f} {med('caccel', p, b, t, 'peak_rss_mib')[0]:7.1f} "
          f"{med('caccel', p, b, t, 'step_mem_mib')[0]:8.2f} | "
          f"{q:15.0f} {100 * q / bound:7.1f} {med('torch', p, b, t, 'accuracy')[0]:6.2f} "
          f"{med('torch', p, b, t, 'peak_rss_mib')[0]:7.1f} | {c / q:12.2f} ({n})")
PY
