#!/bin/sh
# bench/serial_profile.py (the serial fraction of bench/run_threads.sh's PROFILE mode) on a made-up
# `perf script` of two threads whose time line is known, at a period of 1 ms of CPU per sample,
# window [10.000, 10.100] s:
#    0-20 ms  both work;                      20-30  main alone (emb_bwd_range), the worker spins in libgomp
#                                                    and yields (sched_yield, and the system call in the kernel);
#   30-40     both work (the worker's first sample in the kernel's context-switch path);
#   40-50     the worker is preempted mid-work, main works;
#   50-60     the worker alone (its catch-up), main spins;
#   60-70     main alone (ce_range), the worker asleep (a voluntary switch out);
#   70-72     main woke the worker at 70 (sched_wakeup), the worker waits for a CPU until 72;
#   72-100    both in OpenBLAS's sgemm (a GEMM), main from 70.
# Serial work S = 20 ms (20-30, 60-70); parallel work P = 40 + 20 + 10 + 10 (the catch-up) + 30 + 28 =
# 138 ms: f = 20 / 158. Counting the catch-up as serial (f raw): 30 / 158. The GEMM's f is 0. A
# caccel trace (docs/PROFILING.md) names the kernel calls: the serial time goes to "embedding_backward"
# and "cross_entropy"; by what the worker did meanwhile, 10 ms spinning, 10 asleep. Also checked: a trace
# that does not cover the window is not used, the worker counts in the team only because it was seen in
# libgomp (a third thread that never is stays out), and a GEMM inside a larger library (PyTorch's
# libtorch_cpu carries MKL) is a GEMM by its symbol. With the program's CACCEL_CPU_TEAMS_LOG (--teams) the
# timed f: 10 ms of the calling thread alone (60-70), the loops' 100 ms of work of which 20 ms with one
# thread (20-30; 50-60, the worker's preemption included: the log times wall clock), the GEMM's 58 ms from
# the samples: 30 / 168; and from the log alone with a GEMM f given (--gemm-f, a run without perf).
set -u
SRC=${CACCEL_TEST_SRCDIR:-$(dirname "$0")/..}
fail() { echo "FAIL: $*"; exit 1; }
PY=""
for p in python3 /usr/bin/python3; do command -v "$p" >/dev/null 2>&1 && { PY=$p; break; }; done
[ -n "$PY" ] || { echo "SKIP: no python3"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-serial.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

"$PY" - "$WORK" <<'PY' || fail "could not write the made-up profile"
import json, sys
w = sys.argv[1]
CACCEL, GOMP = "/x/libcaccel.so.0", "/usr/lib/libgomp.so.1"
BLAS = "/usr/lib/openblas-openmp/libopenblasp-r0.3.21.so"
LIBC, KERNEL = "/usr/lib/libc.so.6", "[kernel.kallsyms]"
lines = []
def sample(tid, ms, sym, dso):
    lines.append((ms, f"   100/{tid}  {10 + ms / 1000:.6f}:      7f0000001000 {sym} ({dso})"))
def span(tid, a, b, sym, dso):            # samples at a+1 .. b
    for ms in range(a + 1, b + 1):
        sample(tid, ms, sym, dso)
def switch(tid, ms, what):
    lines.append((ms + 0.0001, f"   100/{tid}  {10 + ms / 1000:.6f}: PERF_RECORD_SWITCH {what}"))
span(100, 0, 20, "binary_row.avx512f", CACCEL); span(101, 0, 20, "binary_row.avx512f", CACCEL)
span(100, 20, 30, "emb_bwd_range", CACCEL);    span(101, 20, 24, "[unknown]", GOMP)
sample(101, 25, "__sched_yield", LIBC); sample(101, 26, "do_syscall_64", KERNEL)   # a yield waits too
span(101, 26, 30, "[unknown]", GOMP)
span(100, 30, 40, "binary_row.avx512f", CACCEL)
sample(101, 31, "finish_task_switch.isra.0", KERNEL)    # the switch path: the kind of what follows
span(101, 31, 40, "binary_row.avx512f", CACCEL)
span(100, 40, 50, "binary_row.avx512f", CACCEL)
switch(101, 40, "OUT preempt"); switch(101, 50, "IN")
span(100, 50, 60, "[unknown]", GOMP);          span(101, 50, 60, "binary_row.avx512f", CACCEL)
span(100, 60, 70, "ce_range", CACCEL)
switch(101, 60, "OUT"); switch(101, 72, "IN")
lines.append((70, f"   100/100  10.070000: comm=gpt pid=101 prio=120 target_cpu=001"))
span(100, 70, 100, "sgemm_kernel_COOPERLAKE", BLAS); span(101, 72, 100, "sgemm_kernel_COOPERLAKE", BLAS)
span(102, 0, 100, "loader_read", CACCEL)      # a data loader's thread: not in the team
lines.sort(key=lambda l: l[0])
open(f"{w}/script", "w").write("".join(l + "\n" for _, l in lines))
open(f"{w}/windows", "w").write("# window test batch=0 from=10.000000 to=10.100000\n")
# CACCEL_CPU_TEAMS_LOG of the same time line: three kernel loops (0-20 both; 20-30 main's share alone; 30-60
# main to 50, the worker to 60), 60-70 no team (the calling thread alone), the library GEMM 70-100; and a
# loop before the window, cut away
open(f"{w}/teams", "w").write("# caccel cpu teams log\nL 9.990 10.000 2 0.020 0\nL 10.000 10.020 2 0.040 0\n"
                              "L 10.020 10.030 2 0.010 0.010\nL 10.030 10.060 2 0.050 0.010\nG 10.070 10.100 2 - -\n")
ev = lambda name, a, b: {"ph": "X", "cat": "kernel", "name": name, "ts": a * 1000.0, "dur": (b - a) * 1000.0,
                         "pid": 0, "tid": 1, "args": {"op": name}}
trace = {"otherData": {"clock_origin_ns": 10_000_000_000},
         "traceEvents": [ev("binary.add", 0, 20), ev("embedding_backward", 20, 30), ev("binary.add", 30, 60),
                         ev("cross_entropy", 60, 70), ev("gemm", 70, 100)]}
json.dump(trace, open(f"{w}/trace.json", "w"))
trace["otherData"]["clock_origin_ns"] = 20_000_000_000      # ten seconds later: covers nothing here
json.dump(trace, open(f"{w}/late.json", "w"))
PY

for t in trace late none; do
    tr=""
    [ "$t" = none ] || tr="--trace $WORK/$t.json --teams $WORK/teams"
    # shellcheck disable=SC2086
    "$PY" "$SRC/bench/serial_profile.py" --script "$WORK/script" --windows "$WORK/windows" --period-ns 1000000 \
        $tr > "$WORK/$t.out" || fail "serial_profile.py ($t)"
done

# the log alone (a run without perf): the GEMM's 30 ms of wall on 2 threads at a GEMM f of 0.1 did
# 30 / (0.9 / 2 + 0.1) ms of work, a tenth of it serial
"$PY" "$SRC/bench/serial_profile.py" --teams "$WORK/teams" --gemm-f 0.1 --windows "$WORK/windows" > "$WORK/noperf.out" ||
    fail "serial_profile.py --teams --gemm-f"
"$PY" - "$WORK/noperf.out" <<'PY' || fail "the timed f without samples differs from the made-up log's"
import json, sys
t = json.load(open(sys.argv[1]))["0"]["timed"]
w = 30 / 0.55
want = {"f": (10 + 20 + 0.1 * w) / (10 + 100 + w), "gemm_serial_ms": 0.1 * w, "gemm_parallel_ms": 0.9 * w,
        "alone_ms": 10, "loops_one_ms": 20}
for k, v in want.items():
    if abs(t[k] - v) > 1e-6 * max(1.0, abs(v)):
        sys.exit(f"{k}: {t[k]} where {v} was expected")
print(f"  timed without samples: f {t['f']:.4f}")
PY

# the same time line with the GEMM in MKL linked into PyTorch's library
sed 's|sgemm_kernel_COOPERLAKE (/usr/lib/openblas-openmp/libopenblasp-r0.3.21.so)|mkl_blas_def_sgemm_kernel_0_zen (/x/torch/lib/libtorch_cpu.so)|' \
    "$WORK/script" > "$WORK/script.mkl"
grep -q mkl_blas "$WORK/script.mkl" || fail "could not write the MKL variant"
"$PY" "$SRC/bench/serial_profile.py" --script "$WORK/script.mkl" --windows "$WORK/windows" --period-ns 1000000 \
    > "$WORK/mkl.out" || fail "serial_profile.py (mkl)"
"$PY" - "$WORK/mkl.out" <<'PY' || fail "a GEMM in PyTorch's library is not counted as a GEMM"
import json, sys
r = json.load(open(sys.argv[1]))["0"]
if abs(r["gemm_parallel_ms"] - 58) > 1e-3 or abs(r["f"] - 20 / 158) > 1e-3:
    sys.exit(f"GEMM parallel ms {r['gemm_parallel_ms']} (58 expected), f {r['f']}")
PY

"$PY" - "$WORK" <<'PY' || fail "the serial fraction differs from the made-up time line's"
import json, sys
w = sys.argv[1]
def near(what, got, want):
    if abs(got - want) > 1e-3 * max(1.0, abs(want)):
        sys.exit(f"{what}: {got} where {want} was expected")
    print(f"  {what}: {got:.4f}")
for t in ("trace", "late", "none"):
    r = json.load(open(f"{w}/{t}.out"))["0"]
    print(f"== {t}")
    near("threads in the team", r["threads"], 2)
    near("f", r["f"], 20 / 158)
    near("f raw", r["f_raw"], 30 / 158)
    near("serial ms", r["serial_ms"], 20)
    near("parallel ms", r["parallel_ms"], 138)
    near("GEMM f", r["gemm_f"], 0)
    near("GEMM parallel ms", r["gemm_parallel_ms"], 58)
    ws = r["wall_share"]
    for k, v in (("serial", 0.2), ("parallel", 0.7), ("catch-up", 0.1), ("idle", 0.0)):
        near(f"wall share {k}", ws[k], v)
    funcs = {n: (ms, main) for n, ms, main in r["serial_funcs"]}
    if set(funcs) != {"emb_bwd_range", "ce_range"}:
        sys.exit(f"serial functions {sorted(funcs)}, expected emb_bwd_range and ce_range")
    near("emb_bwd_range ms", funcs["emb_bwd_range"][0], 10)
    near("ce_range ms, by the main thread", funcs["ce_range"][1], 10)
    others = r["serial_by_others"]      # 20-30 the worker spins; 60-70 it sleeps
    if set(others) != {"main alone, others wait", "main alone, others sleep"}:
        sys.exit(f"serial time by the others' state {others}")
    near("main alone, the worker waiting", others["main alone, others wait"], 10)
    near("main alone, the worker asleep", others["main alone, others sleep"], 10)
    if t != "none":     # --teams: 10 ms alone, loops' 100 ms busy of which 20 with one thread, the GEMM's 58
        tm = r["timed"]
        near("timed f", tm["f"], 30 / 168)
        for k, v in (("alone_ms", 10), ("loops_busy_ms", 100), ("loops_one_ms", 20), ("gemm_wall_ms", 30),
                     ("gemm_serial_ms", 0), ("gemm_parallel_ms", 58), ("forks", 3), ("one_median_us", 10000),
                     ("one_tail_ms", 20)):
            near(f"timed {k}", tm[k], v)
    elif "timed" in r:
        sys.exit("a timed f without --teams")
    ops = {n: ms for n, ms, _ in r["serial_ops"]}
    want = {"embedding_backward": 10, "cross_entropy": 10} if t == "trace" else {}
    if set(ops) != set(want):
        sys.exit(f"serial kernel calls {sorted(ops)}, expected {sorted(want)}")
    for n, ms in want.items():
        near(f"{n} ms", ops[n], ms)
PY
echo ok
