#!/usr/bin/env bash
# Transformer benchmark: caccel and the PyTorch peer alternating, per thread count:
#   bert       a BERT fine-tune step at all-MiniLM-L6-v2's shape (bench_transformer bert), with the
#              step's GEMM-only bound on raw cblas_sgemm and the time split, against
#              transformers' BertForSequenceClassification of the same shape;
#   gpt        examples/gpt's training tokens/s at its default shape and a larger one against the
#              PyTorch GPT of tests/test_gpt_parity.sh;
#   attention  the fused attention against matmul-softmax-matmul from ops (time, peak memory);
#   memory     (not by default) allocator statistics of BERT steps whose sequence length varies.
# Prints medians and the caccel/PyTorch ratios.
# usage: run_transformer.sh --bench PATH --gpt PATH [--caccel PATH] [--reps N] [--threads 1,2]
#        [--batch-sizes 8,16] [--parts bert,gpt,attention,memory]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bench="" gpt="" caccel="" reps=2 threads="1,2" sizes="8,16" parts="bert,gpt,attention"
while [ $# -gt 0 ]; do
    case $1 in
        --bench) bench=$2; shift 2 ;;
        --gpt) gpt=$2; shift 2 ;;
        --caccel) caccel=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --batch-sizes) sizes=$2; shift 2 ;;
        --parts) parts=$2; shift 2 ;;
        *) echo "run_transformer.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$bench" ] && [ -x "$gpt" ] || { echo "run_transformer.sh: --bench and --gpt paths are required" >&2; exit 2; }
peer=/usr/bin/python3
if ! $peer -c "import torch, transformers" 2>/dev/null; then
    echo "run_transformer.sh: PyTorch and transformers not found for $peer (python3-torch, pip transformers)" >&2
    exit 2
fi
has() { case ",$parts," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) CPUs, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, load average $(cut -d' ' -f1-3 /proc/loadavg)"
[ -n "$caccel" ] && "$caccel" env 2>/dev/null | grep '^CPU device' | sed 's/^/# /'
# GPT shapes: examples/gpt's default, and 6 layers x 384 channels x 6 heads at T 256, batch 8.
gpt_shapes=("4 4 128 64 32 40" "6 6 384 256 8 6")
for t in ${threads//,/ }; do
    export OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t
    for r in $(seq "$reps"); do
        if has bert; then
            "$bench" bert --batch-sizes "$sizes" >> "$out"
            $peer "$here/peers/torch_transformer.py" bert --threads "$t" --batch-sizes "$sizes" >> "$out" 2>/dev/null
        fi
        if has gpt; then
            for s in "${gpt_shapes[@]}"; do
                read -r L H C T B N <<< "$s"
                tps=$("$gpt" --cpu --n_layer "$L" --n_head "$H" --n_embd "$C" --block_size "$T" --batch_size "$B" \
                      --max_steps "$N" --log_interval $((N / 2)) --eval_interval 0 --eval_samples 4 --sample_tokens 0 |
                      sed -n 's/.* \([0-9.]*\) tokens\/s$/\1/p' | tail -1)   # the second half's rate
                echo "impl=caccel model=gpt shape=${L}x${H}x${C}xT${T} batch=$B threads=$t tokens_per_s=$tps" >> "$out"
                $peer "$here/peers/torch_transformer.py" gpt --threads "$t" --n_layer "$L" --n_head "$H" --n_embd "$C" \
                    --block_size "$T" --batch_size "$B" --steps $((N / 2)) >> "$out" 2>/dev/null
            done
        fi
    done
    if has attention; then "$bench" attention --seqs 512,1024 >> "$out"; fi
done
if has memory; then   # not timed: where bert_classifier's memory goes (batch 16, max_length 64)
    echo "BERT fine-tune memory, batch 16: sequence length varying per batch in 8..64 (as bert_classifier's trim), then fixed 64"
    "$bench" bert-memory --batch-sizes 16 --seq 64 --min-seq 8 --steps 64 | sed 's/^impl=caccel model=bert-memory //'
    "$bench" bert-memory --batch-sizes 16 --seq 64 --min-seq 64 --steps 16 | sed 's/^impl=caccel model=bert-memory //'
fi
$peer - "$out" <<'PY'
import statistics, sys
rows = [dict(kv.split("=", 1) for kv in line.split()) for line in open(sys.argv[1]) if line.startswith("impl=")]
def pick(**kw):
    return [r for r in rows if all(r.get(k) == v for k, v in kw.items())]
def med(rs, key):
    v = [float(r[key]) for r in rs if key in r]
    return statistics.median(v) if v else float("nan")
bert = sorted({(r["threads"], r["batch"]) for r in pick(model="bert")}, key=lambda k: (int(k[0]), int(k[1])))
if bert:
    print("BERT fine-tune step, MiniLM shape (6 x 384, 12 heads, FFN 1536), sequence 128, AdamW, dropout 0.1")
    print(f"{'thr':>3} {'batch':>5} | {'caccel samples/s':>16} {'torch samples/s':>15} {'ratio':>6} | {'step ms':>8}"
          f" {'GEMM bound ms':>13} {'step/GEMM':>9} | {'linear GEMM':>11} {'attention':>9} {'other':>6} {'outside GEMM %':>14} {'step MiB':>8}")
    for t, b in bert:
        c, q = pick(model="bert", impl="caccel", threads=t, batch=b), pick(model="bert", impl="torch", threads=t, batch=b)
        cs, qs = med(c, "samples_per_s"), med(q, "samples_per_s")
        print(f"{t:>3} {b:>5} | {cs:>16.2f} {qs:>15.2f} {cs / qs:>6.2f} | {med(c, 'step_ms'):>8.0f} {med(c, 'gemm_bound_ms'):>13.0f}"
              f" {med(c, 'step_over_gemm'):>9.2f} | {med(c, 'linear_gemm_ms'):>11.0f} {med(c, 'attention_ms'):>9.0f}"
              f" {med(c, 'other_ms'):>6.0f} {med(c, 'outside_gemm_pct'):>14.1f} {med(c, 'step_mem_mib'):>8.0f}")
if bert:
    print("The same in CPU time (process CPU seconds, all threads; for 1 thread its own work, whatever the load)")
    print(f"{'thr':>3} {'batch':>5} | {'caccel step':>11} {'torch step':>10} {'torch/caccel':>12} | {'GEMM bound':>10}"
          f" {'step/GEMM':>9} | {'linear GEMM':>11} {'attention':>9} {'other':>6}")
    for t, b in bert:
        c, q = pick(model="bert-cpu", threads=t, batch=b), pick(model="bert", impl="torch", threads=t, batch=b)
        cs, qs = med(c, "step_cpu_ms"), med(q, "step_cpu_ms")
        print(f"{t:>3} {b:>5} | {cs:>11.0f} {qs:>10.0f} {qs / cs:>12.2f} | {med(c, 'gemm_bound_cpu_ms'):>10.0f}"
              f" {med(c, 'step_over_gemm_cpu'):>9.2f} | {med(c, 'linear_gemm_cpu_ms'):>11.0f}"
              f" {med(c, 'attention_cpu_ms'):>9.0f} {med(c, 'other_cpu_ms'):>6.0f}")
gpt = sorted({(r["shape"], r["threads"], r["batch"]) for r in pick(model="gpt")}, key=lambda k: (k[0], int(k[1])))
if gpt:
    print("GPT training (examples/gpt, AdamW, clip 1.0), tokens/s")
    print(f"{'shape':>16} {'thr':>3} {'batch':>5} | {'caccel tok/s':>12} {'torch tok/s':>11} {'ratio':>6}")
    for s, t, b in gpt:
        cs = med(pick(model="gpt", impl="caccel", shape=s, threads=t), "tokens_per_s")
        qs = med(pick(model="gpt", impl="torch", shape=s, threads=t), "tokens_per_s")
        print(f"{s:>16} {t:>3} {b:>5} | {cs:>12.0f} {qs:>11.0f} {cs / qs:>6.2f}")
att = pick(model="attention")
if att:
    print("Attention forward + backward, batch 1, 12 heads x 32: fused kernel vs matmul-softmax-matmul from ops")
    print(f"{'thr':>3} {'T':>5} | {'fused ms':>8} {'naive ms':>8} {'speed-up':>8} | {'fused MiB':>9} {'naive MiB':>9}")
    for t, T in sorted({(r["threads"], r["seq"]) for r in att}, key=lambda k: (int(k[0]), int(k[1]))):
        f, n = pick(model="attention", kind="fused", threads=t, seq=T), pick(model="attention", kind="naive", threads=t, seq=T)
        print(f"{t:>3} {T:>5} | {med(f, 'fwd_bwd_ms'):>8.1f} {med(n, 'fwd_bwd_ms'):>8.1f} {med(n, 'fwd_bwd_ms') / med(f, 'fwd_bwd_ms'):>8.2f}"
              f" | {med(f, 'peak_mib'):>9.1f} {med(n, 'peak_mib'):>9.1f}")
PY
