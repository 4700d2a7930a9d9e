"""bench/run_tp_zero.sh's tables: tokens/s, step time, peak RSS and model states per rank at tp 2 x dp_shard 2
(FULL_SHARD), tp 2 x dp_replicate 2 and dp 4 on 4 processes, and the bytes each communicator moved per step
(the profiler's traces) beside the formula.
--set cp: cp 2 x dp_shard 2 (FULL_SHARD over dp_shard x cp), cp 2 alone and cp 2 x dp_replicate 2.
usage: tp_zero_report.py --work DIR --shape "L H C T B" --steps N [--set tp|cp]"""
import argparse, glob, os, re
import bench_runs
from collections import defaultdict

p = argparse.ArgumentParser()
p.add_argument("--work", required=True)
p.add_argument("--shape", required=True)
p.add_argument("--steps", type=int, required=True)
p.add_argument("--set", default="tp")
a = p.parse_args()
L, H, C, T, B = (int(v) for v in a.shape.split())
MODES = {"tpfs": "tp 2 x dp_shard 2 (FULL_SHARD)", "tprep": "tp 2 x dp_replicate 2", "dp4": "dp 4"}
if a.set == "cp":
    MODES = {"cpfs": "cp 2 x dp_shard 2 (FULL_SHARD)", "cp2": "cp 2 (2 processes)", "cprep": "cp 2 x dp_replicate 2"}


rows = bench_runs.read_rows(a.work)


def rate(mode):
    return bench_runs.rate(rows[mode])


def rss(mode):
    return bench_runs.rss(rows[mode])


def mem(mode):
    out = []
    for f in sorted(glob.glob(os.path.join(a.work, f"mem.{mode}.*"))):
        kv = dict(x.split("=", 1) for x in open(f).read().split())
        out.append(tuple(int(kv[k]) for k in ("parameters", "gradients", "optimizer_state")))
    return out


def params(mode):
    for s in open(os.path.join(a.work, f"t.{mode}"), errors="replace"):
        m = re.search(r": (\d+) parameters", s)
        if m:
            return int(m.group(1))
    return 0


print(f"\nGPT {L} x {C} ({H} heads), T {T}, global batch {B} ({B * T} tokens a step)")
print(f"{'run':>30} | {'tokens/s':>9} {'step ms':>8} | peak RSS MiB per rank | model states per rank, MB "
      "(parameters + gradients + optimizer state)")
for mode, name in MODES.items():
    r, n = rate(mode)
    ms = mem(mode)
    st = " ".join(f"{p / 1e6:.2f}+{g / 1e6:.2f}+{o / 1e6:.2f}" for p, g, o in ms[:1])
    print(f"{name:>30} | {r:9.0f} {B * T / r * 1e3:8.0f} | " + " ".join(f"{x:.0f}" for x in rss(mode))
          + f" | rank 0: {st} (same on all {len(ms)}: {len(set(ms)) == 1})")


def cp_formula(mode, tot, steps, P):
    """the dp_cp and cp communicators' formulas at cp 2: FULL_SHARD over dp_cp's N = 4 ranks moves each
    rank's shard S = P / 4 (N - 1) times in each of the forward's and the backward's all-gathers and the
    gradient's reduce-scatter; plain data parallelism all-reduces the gradients, 2 (N - 1) / N of them; cp
    all-gathers K and V and reduce-scatters their gradients, 4 L b T C 4 (cp - 1) / cp bytes (b: the cp
    group's batch), plus the loss's sums"""
    n = 2 if mode == "cp2" else 4
    if mode == "cpfs":
        S = (P + n - 1) // n
        f, how = 3 * (n - 1) * S * 4, f"FULL_SHARD over {n} ranks: 3 x (N - 1) x S x 4 B, S = {S:,}"
    else:
        f, how = 2 * (n - 1) / n * P * 4, f"an all-reduce of the gradients over {n} ranks: 2 (N - 1) / N x {P:,} x 4 B"
    m = tot.get("dp_cp", 0) + tot.get("dp_shard_cp", 0)
    print(f"    dp_cp formula: {how} = {f:,.0f}; measured {m / steps:,.0f} ({m / steps / f:.4f}x)")
    b = B if mode == "cp2" else B // 2
    fc = 4 * L * b * T * C * 4 // 2
    print(f"    cp formula: 4 L b T C 4 (cp - 1) / cp at b = {b} = {fc:,}; measured {tot.get('cp', 0) / steps:,.0f}")


def trace(mode):
    return bench_runs.trace(a.work, mode)


P = params("dp4" if a.set == "tp" else "cp2")
print(f"bytes per step per communicator (rank 0's trace; the model has {P:,} parameters):")
for mode in MODES:
    tr = trace(mode)
    if not tr:
        print(f"  {MODES[mode]}: no trace")
        continue
    c, steps = tr[0]
    tot = defaultdict(int)
    for (comm, op, nb), k in c.items():
        tot[comm] += nb * k
    print(f"  {MODES[mode]}: {steps} steps recorded")
    for comm in sorted(tot):
        mine = sorted(((key, k) for key, k in c.items() if key[0] == comm), key=lambda x: -x[0][2] * x[1])
        parts = ", ".join(f"{k / steps:g} {op} of {nb} B" for (cm, op, nb), k in mine[:3])
        print(f"    {comm:>12}: {tot[comm] / steps:14,.0f} B/step ({parts}{', ...' if len(mine) > 3 else ''})")
    dp = tot.get("dp", 0) + tot.get("dp_shard", 0) + tot.get("single", 0) + tot.get("world", 0)
    Pl = params(mode)
    if a.set == "cp":
        cp_formula(mode, tot, steps, P)
        continue
    if mode == "dp4":
        f = 2 * 3 / 4 * P * 4
        print(f"    dp formula: an all-reduce of the gradients, 2 x 3/4 x {P:,} x 4 B = {f:,.0f}")
    elif mode == "tprep":
        f = Pl * 4
        print(f"    dp formula: an all-reduce of each rank's slices' gradients at 2 ranks, {Pl:,} x 4 B = {f:,}")
    else:
        S = (Pl + 1) // 2
        f = 3 * S * 4
        print(f"    dp formula: FULL_SHARD at 2 ranks: every unit's shard all-gathered in forward and again in "
              f"backward, the gradient reduce-scattered: 3 x {S:,} (half of {Pl:,}) x 4 B = {f:,}")
    tp = tot.get("tp", 0)
    if tp:
        bt = B // 2 * T   # tokens of one tp group's batch
        ft = (4 * L + 2) * bt * C * 4 + 3 * bt * 4 + 4
        print(f"    tp formula: (4*L + 2)*B*T*C*4 + 3*B*T*4 + 4 at B*T = {bt} = {ft:,}; measured {tp / steps:,.0f} "
              f"({tp / steps / ft:.4f}x)")
