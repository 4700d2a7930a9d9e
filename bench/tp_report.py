"""bench/run_tp.sh's tables for one shape: tokens/s, step time and peak RSS per rank at 1 process, dp 2
and tp 2 (and the PyTorch peer), and the bytes each communicator moved per step, read from the
profiler's Chrome traces, beside the tensor-parallel plan's formula.
usage: tp_report.py --work DIR --shape "L H C T B" --steps N  (DIR: run_tp.sh's rows and trace.* dirs)"""
import argparse, os, re
import bench_runs
from collections import defaultdict

p = argparse.ArgumentParser()
p.add_argument("--work", required=True)
p.add_argument("--shape", required=True)
p.add_argument("--steps", type=int, required=True)
a = p.parse_args()
L, H, C, T, B = (int(v) for v in a.shape.split())
MODES = {"1": "1 process", "dp2": "dp 2", "tp2": "tp 2", "tp2sp": "tp 2 + SP", "cp2": "cp 2", "cpring2": "cp 2 ring",
         "torch1": "torch 1 process", "torchtp2": "torch tp 2", "torchtp2sp": "torch tp 2 + SP",
         "xla1": "lazy 1 process", "xlatp2": "lazy tp 2", "xlacp2": "lazy cp 2", "xlacpring2": "lazy cp 2 ring"}


rows = bench_runs.read_rows(a.work)   # mode -> output lines of its timed runs


def rate(mode):
    if not mode.startswith("xla"):
        return bench_runs.rate(rows[mode])
    # the lazy device on several processes prints no throughput line (its world totals are not taken there):
    # on it every mode's rate is the example's own step lines, steps 2 on (each interval holds one step's
    # graph run)
    v = [float(m.group(2)) for m in (re.search(r"^step (\d+)/\d+: loss .* ([0-9.]+) tokens/s", x) for x in rows[mode])
         if m and int(m.group(1)) >= 2]
    return bench_runs.med(v), len(v)


def rss(mode):
    return bench_runs.rss(rows[mode])


print(f"\nGPT {L} x {C} ({H} heads), T {T}, global batch {B} ({B * T} tokens a step); "
      f"dp 2: batch {B // 2} a rank; tp 2: batch {B} on both ranks of the tp group; cp 2: batch {B}, T {T // 2} "
      "a rank")
fails = [s for m in ("torch1", "torchtp2") for s in rows[m] if "status=failed" in s]
for s in fails:
    print("  torch peer failed: " + s)
base = rate("1")[0]
print(f"{'run':>16} | {'tokens/s':>9} {'step ms':>8} {'vs 1 proc':>9} | peak RSS MiB per rank (n)")
for mode, name in MODES.items():
    r, n = rate(mode)
    if n == 0:
        continue
    ref = rate("torch1")[0] if mode.startswith("torch") else rate("xla1")[0] if mode.startswith("xla") else base
    print(f"{name:>16} | {r:9.0f} {B * T / r * 1e3:8.0f} {r / ref:9.2f} | "
          + " ".join(f"{x:.0f}" for x in rss(mode)) + f" ({n})")
c1, ct = rate("1")[0], rate("torch1")[0]
if rate("xlatp2")[1] and rate("xla1")[1] and rate("tp2")[1]:
    print(f"lazy device: tp 2 {rate('xlatp2')[0] / rate('xla1')[0]:.2f}x its 1 process, "
          f"{rate('xlatp2')[0] / rate('tp2')[0]:.2f}x tp 2 on the CPU device")
if rate("torchtp2")[1] and rate("tp2")[1]:
    print(f"caccel / torch: 1 process {c1 / ct:.2f}x, tp 2 {rate('tp2')[0] / rate('torchtp2')[0]:.2f}x")


def trace(mode):
    return bench_runs.trace(a.work, mode)


def params(mode):
    for s in open(os.path.join(a.work, f"t.{mode}"), errors="replace"):
        m = re.search(r": (\d+) parameters", s)
        if m:
            return int(m.group(1))
    return 0


def vocab_parallel(mode):
    """the example's line (once a rank at tp > 1) when its logits are split over the vocabulary"""
    for s in open(os.path.join(a.work, f"t.{mode}"), errors="replace"):
        m = re.search(r"holds logits \[\d+, \d+, (\d+)\] of vocab (\d+)", s)
        if m and int(m.group(1)) < int(m.group(2)):
            return True
    return False


# the cp communicator's bytes a step at cp 2, in units of L*B*T*C*4, and what they are
CP_FORMULAS = {
    "cp2": (2, ": per layer K and V all-gathered forward and their gradients reduce-scattered backward, each "
               "(cp - 1) x B*T/cp*C*4 B at cp 2: 4*L*B*T*C*4*(cp-1)/cp"),
    "cpring2": (3, " (ring): per layer K and V passed on cp - 1 times forward and again backward, and the visiting "
                   "blocks' K and V gradients sent back to their owners, 6*(cp-1) x B*T/cp*C*4 B: at cp 2 3*L*B*T*C*4"),
}
CP_FORMULAS["xlacp2"], CP_FORMULAS["xlacpring2"] = CP_FORMULAS["cp2"], CP_FORMULAS["cpring2"]   # the lazy device's
print("bytes per step per communicator (rank 0's trace; collectives of the recorded steps / their count):")
for mode in ("1", "dp2", "tp2", "tp2sp", "cp2", "cpring2", "xla1", "xlatp2", "xlacp2", "xlacpring2"):
    tr = trace(mode)
    if not tr:
        if mode not in ("tp2sp", "cp2", "cpring2", "xla1", "xlatp2", "xlacp2", "xlacpring2"):
            print(f"  {MODES[mode]}: no trace")
        continue
    c, steps = tr[0]
    if mode.startswith("xla"):   # a step's collectives run in its graph at the next step's start, and a slice is
        steps -= 1               # traced when both its recording and its run fall in the window: one step fewer
    same = all(x == c for x, _ in tr.values())
    tot = defaultdict(int)
    for (comm, op, nb), k in c.items():
        tot[comm] += nb * k
    print(f"  {MODES[mode]}: {steps} steps recorded; ranks' collectives {'the same' if same else 'DIFFER'}")
    for comm in sorted(tot):
        parts = ", ".join(f"{k / steps:g} {op} of {nb} B" for (cm, op, nb), k in sorted(c.items(), key=lambda x: -x[0][2] * x[1])
                          if cm == comm)
        print(f"    {comm:>12}: {tot[comm] / steps:14,.0f} B/step ({parts})")
    if mode in ("tp2", "tp2sp", "xlatp2"):   # sequence parallelism: each all-reduce a reduce-scatter and an all-gather
        tp = tot.get("tp", 0) / steps
        f = 4 * L * B * T * C * 4 + 4
        text = f"4*L*B*T*C*4 + 4 = 4*{L}*{B}*{T}*{C}*4 + 4 (clipping's f32 sum of squares) = {f:,}"
        if vocab_parallel(mode):
            f += 2 * B * T * C * 4 + 3 * B * T * 4
            text = (f"(4*L + 2)*B*T*C*4 + 3*B*T*4 + 4 = {f:,} (vocabulary-parallel: the embedding's forward and the "
                    "tied LM head's input gradient B*T*C each, the cross-entropy's max, sum and target B*T each)")
        if mode == "tp2sp":   # a collective's traced bytes are the rank's part (B*T*C*4 / tp of a whole tensor)
            extra = 2 * B * T * C * 4 // 2 + (2 * (2 * L + 1) + 2 * L) * C * 4
            f += extra
            text += (f" + {extra:,} (sequence parallelism: ln_f's output all-gathered forward and the split's gradient "
                     "backward, B*T*C*4/tp each, and the norms' weights and biases and the rowwise biases' gradients "
                     "summed over tp, (2*(2*L + 1) + 2*L)*C*4)")
        print(f"    tp formula: {text}; measured {tp:,.0f} ({tp / f:.4f}x)")
    if mode in CP_FORMULAS:
        cp = tot.get("cp", 0) / steps
        units, text = CP_FORMULAS[mode]
        f = units * L * B * T * C * 4 + 16
        print(f"    cp formula{text} + 16 (the loss's token count, sum and gradient) = {f:,}; measured {cp:,.0f} "
              f"({cp / f:.4f}x)")
    if mode in ("dp2", "cp2", "cpring2", "xlacp2", "xlacpring2"):
        P = params(mode)
        big = sum(nb * k for (cm, op, nb), k in c.items() if op == "all_reduce" and nb > 64) / steps
        print(f"    dp gradients: the all-reduces above 64 B move {big:,.0f} B/step against {P:,} parameters x 4 B = "
              f"{P * 4:,} ({big / (P * 4):.4f}x)")
    if mode == "tp2":
        P = params(mode)
        print(f"    each tp rank holds {P:,} parameters (the split layers' 1/2); with dp 1 no gradient is all-reduced: "
              f"at dp_replicate D it would be {P:,} x 4 B = {P * 4:,} B on the dp communicator")
