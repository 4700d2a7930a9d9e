#!/usr/bin/env python3
"""The serial fraction of a timed loop from a perf profile (bench/run_threads.sh, PROFILE=1).

Input: `perf record -e cpu-clock:u -c PERIOD --switch-events -k CLOCK_MONOTONIC` of the program, and its
timed windows ("# window NAME batch=B from=T0 to=T1" lines, CLOCK_MONOTONIC seconds).

Each thread's time line is rebuilt from its own events:
  - a sample at t (one every PERIOD ns of the thread's CPU time) covers [previous event, t], at most PERIOD
    long: `work`, or `wait` when it fell in libgomp (a spin, barrier or fork-join: the OpenMP team waiting);
  - a context switch out is `sleep` until the switch back in when the thread blocked (a futex: libgomp's
    waiting after its spin, a lock, I/O), and `stalled` when it was preempted (runnable, the machine
    busy): a preempted thread keeps the kind of the code it resumes (its first sample after switching in),
    so a worker preempted in the middle of its share of a GEMM still counts as busy.
The team is the program's main thread and the threads seen in libgomp (a data loader's thread is not).

Then at every instant of the windows the team's busy threads (working, or stalled in work) are counted:
  - one busy thread: a serial stretch; its on-CPU work time is S, and its function (the sample's symbol) is
    charged with that time;
  - two or more: parallel; their on-CPU work time (thread-seconds) is P.
f = S / (S + P) is Amdahl's serial fraction of the step's work (the one-thread time is about S + P), from
per-thread timestamps, not from a speed-up; the wall shares (one busy thread, several, none) are printed
beside it, and the serial time by what the other threads did meanwhile (spinning in libgomp: the lone
thread's share was longer, or its code serial; asleep: they had to be woken). The same count restricted
to the GEMMs' samples (the BLAS and oneDNN libraries, or their symbols where a larger library carries
them: PyTorch's MKL) gives the GEMMs' own serial fraction, so the projection 1 / (f + (1 - f) / N) of the
step can be set against theirs.

With --teams (the program's CACCEL_CPU_TEAMS_LOG, backends/cpu/cpu_parallel.h) a second f, "timed", takes
caccel's own fork-joins from their timestamps instead: a sample covers up to PERIOD (100 us) of a thread's
time, about the length of the small GPT's kernels, so the timed f checks that a sample's state smearing over
a kernel's edges does not count serial time that was not there (bench/RESULTS.md: the two agree within a
few tenths of a point).

The profile's own interrupts (a sample every 100 us of each thread) stretch the kernels' joins too; so a
run without perf can be timed alone (--teams with --gemm-f, the threaded GEMMs' serial fraction taken from
a profile of the same program, their wall from the log).

usage: serial_profile.py --data FILE.data | --script FILE --windows FILE --period-ns N [--top K] [--trace FILE]
                         [--teams FILE]
       serial_profile.py --teams FILE --gemm-f G --windows FILE [--period-ns N]
prints one JSON object: {batch: {...}} per batch of the windows (0 for a program with one window).
"""
import argparse
import bisect
import json
import re
import subprocess
import sys

SAMPLE = re.compile(r"^\s*(\d+)/(\d+)\s+(\d+\.\d+):\s+[0-9a-f]+\s+(.*?)\s+\(([^()]*)\)\s*$")
WAKE = re.compile(r"^\s*(\d+)/(\d+)\s+(\d+\.\d+):\s+comm=.*\bpid=(\d+)\b")
SWITCH = re.compile(r"^\s*(\d+)/(\d+)\s+(\d+\.\d+):\s+PERF_RECORD_SWITCH\s+(IN|OUT)(\s+preempt)?")
GEMM_DSOS = ("openblas", "libblas", "dnnl", "mkl_", "/perf-")   # perf-PID.map: JIT code (oneDNN's kernels)
# GEMM code linked into a larger library (PyTorch's libtorch_cpu carries MKL's and oneDNN's), by its symbols
GEMM_SYMS = re.compile(r"^mkl_blas_|^mkl_dnn|^dnnl::|^(_ZN)?\d*dnnl|sgemm")
BUSY = ("work", "stalled-work")
# Waiting outside libgomp: a yield (OpenBLAS's threads wait for each other with sched_yield) and, where perf
# samples the kernel too, a futex's code. The kernel's context-switch path (a thread switched back in, an
# interrupt's return) says nothing of what the thread does: such a sample takes the kind of the next one.
WAITING = re.compile(r"sched_yield|futex")
THROUGH = re.compile(r"finish_task_switch|^(__)?schedule$|irqentry_exit")


def short(sym, dso):
    """A function's name without its ISA clone suffix (name.avx512f); the library for an unknown one."""
    lib = dso.rsplit("/", 1)[-1]
    if lib.startswith("perf-") and lib.endswith(".map"):
        return "[jit code]"
    if sym in ("", "[unknown]"):
        return "[" + lib + "]"
    return sym.split(".", 1)[0] if not sym.startswith(".") else sym


def perf_script(data):
    """The lines of `perf script` on a recording: samples, context switches and wake-ups."""
    cmd = ["perf", "script", "-i", data, "--show-switch-events", "-F", "sw:pid,tid,time,ip,sym,dso",
           "-F", "trace:pid,tid,time,trace"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    yield from proc.stdout
    proc.wait()


def read_events(lines):
    """Per (pid, tid): its events ('s', t, kind, name, gemm), ('in'/'out', t, preempted) and ('wake', t)."""
    ev, samples, user_kind = {}, {}, {}
    for line in lines:
        m = SWITCH.match(line)
        if m:
            ev.setdefault((m[1], m[2]), []).append((m[4].lower(), float(m[3]), bool(m[5])))
            continue
        m = WAKE.match(line)            # recorded by the waker (a thread of the same program): the wakee's
        if m:
            ev.setdefault((m[1], m[4]), []).append(("wake", float(m[3])))
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        key, dso, name = (m[1], m[2]), m[5], short(m[4], m[5])
        kind = "wait" if "libgomp" in dso or WAITING.search(name) else "work"
        if dso == "[kernel.kallsyms]":      # on behalf of the user code that entered it (a syscall, a fault)
            kind = "wait" if kind == "wait" or user_kind.get(key) == "wait" else "work"
            kind = "through" if THROUGH.search(name) else kind
            name = "[kernel] " + name
        else:
            user_kind[key] = kind
        gemm = any(g in dso for g in GEMM_DSOS) or bool(GEMM_SYMS.search(name))
        ev.setdefault(key, []).append(("s", float(m[3]), kind, name, gemm))
        samples[m[1]] = samples.get(m[1], 0) + 1
    return ev, samples


def segments(events, period):
    """A thread's time line as (start, end, kind, name, gemm) from its events (see the module's comment)."""
    segs, pending = [], []      # pending: stretches whose kind the next sample decides
    mark, last = None, None     # the previous event's time; the previous sample
    out = (None, False)         # the last switch out: its time, whether the thread was preempted
    woke = None                 # when it was woken after blocking (runnable from then on)
    for e in sorted(events, key=lambda e: e[1]):
        t = e[1]
        if e[0] == "s" and e[2] == "through":
            pending.append((t - period if mark is None else max(mark, t - period), t, "on"))
            mark = t
        elif e[0] == "s":
            _, _, kind, name, gemm = e
            for a, b, k in pending:
                if k == "on":
                    segs.append((a, b, kind, name, gemm))
                else:
                    segs.append((a, b, "stalled-" + kind, name, gemm))
            pending = []
            start = t - period if mark is None else max(mark, t - period)
            segs.append((start, t, kind, name, gemm))
            mark, last = t, e
        elif e[0] == "out":
            preempted = e[2]
            if mark is not None and t > mark:
                if preempted:
                    pending.append((mark, t, "on"))
                elif last is not None:      # going to sleep: what it last ran (libgomp's spin, mostly)
                    segs.append((mark, t, last[2], last[3], last[4]))
            mark = t
            out, woke = (t, preempted), None
        elif e[0] == "wake":
            if out[0] is not None and not out[1] and woke is None and t >= out[0]:
                woke = t
        elif e[0] == "in":
            if mark is not None and t > mark:
                if out[1]:
                    pending.append((mark, t, "off"))
                elif woke is not None and woke < t:     # asleep, then runnable: waiting for a CPU
                    segs.append((mark, woke, "sleep", "", False))
                    pending.append((woke, t, "off"))
                else:
                    segs.append((mark, t, "sleep", "", False))
            mark = t
    return segs


def load_kernels(path):
    """The kernel calls of a caccel trace (docs/PROFILING.md) as sorted (start, end, label) in seconds of
    CLOCK_MONOTONIC: the label is the kernel's name and, when recorded, its shapes."""
    with open(path) as f:
        tr = json.load(f)
    origin = tr.get("otherData", {}).get("clock_origin_ns")
    if origin is None:
        return []
    calls = []
    for e in tr.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            a = origin * 1e-9 + e["ts"] * 1e-6
            shapes = e.get("args", {}).get("shapes")
            label = e["name"] + (" " + str(shapes) if shapes else "")
            calls.append((a, a + e["dur"] * 1e-6, label))
    calls.sort()
    return calls


def call_at(calls, starts, t):
    """The index of the kernel call running at t, or -1 between calls."""
    i = bisect.bisect_right(starts, t) - 1
    return i if i >= 0 and calls[i][0] <= t <= calls[i][1] else -1


def clip(segs, windows):
    """The parts of segs inside windows (sorted, not overlapping: thousands of them for --teams' GEMMs)."""
    out, starts = [], [w[0] for w in windows]
    for a, b, *rest in segs:
        i = max(0, bisect.bisect_right(starts, a) - 1)
        while i < len(windows) and windows[i][0] < b:
            lo, hi = max(a, windows[i][0]), min(b, windows[i][1])
            if hi > lo:
                out.append((lo, hi, *rest))
            i += 1
    return out


def load_teams(path):
    """CACCEL_CPU_TEAMS_LOG's records (backends/cpu/cpu_parallel.h), sorted: (t0, t1, kind, team, busy, one)
    with busy and one None for a library GEMM."""
    recs = []
    for line in open(path):
        p = line.split()
        if len(p) != 6 or p[0] not in ("L", "S", "G"):
            continue
        busy, one = (None, None) if p[0] == "G" else (float(p[4]), float(p[5]))
        recs.append((float(p[1]), float(p[2]), p[0], int(p[3]), busy, one))
    recs.sort()
    return recs


# A fork-join whose one-thread time exceeds this is counted in the tail too: longer than the join's usual
# imbalance by an order of magnitude, mostly a thread that lost its CPU to another task
TAIL = 100e-6


def timed(team_segs, windows, recs, top, gemm_f=None):
    """The serial fraction with caccel's own fork-joins timed, not sampled: in the windows, the calling thread's
    time outside any team (serial, whatever it did), each kernel loop's and GEMM split's busy thread time and
    its time with one thread working (a record cut by a window's edge in proportion), and inside the library
    GEMMs on several threads, whose partition is the library's, the samples' serial and parallel work (without
    samples, gemm_f: the GEMMs' serial fraction from a profile of the same program, applied to their wall). Also
    the fork-joins' count, their median one-thread time and the one-thread time of those above TAIL."""
    alone = busy = one = gemm_wall = tail = 0.0
    gemm, ones = [], []
    for w0, w1 in windows:
        covered = 0.0
        for t0, t1, kind, team, b, o in recs:
            lo, hi = max(t0, w0), min(t1, w1)
            if hi <= lo:
                continue
            covered += hi - lo
            if kind == "G":
                gemm.append((lo, hi, team))
                gemm_wall += hi - lo
            else:
                share = (hi - lo) / (t1 - t0)
                busy += b * share
                one += o * share
                ones.append(o)
                tail += o * share if o > TAIL else 0.0
        alone += max(0.0, (w1 - w0) - covered)
    if gemm_f is None:
        g = analyse(team_segs, [x[:2] for x in gemm], top, []) if gemm else {"serial_ms": 0.0, "parallel_ms": 0.0}
        gs, gp = g["serial_ms"] * 1e-3, g["parallel_ms"] * 1e-3
    else:   # no samples: a GEMM of wall w on n threads with the serial fraction g did w / ((1 - g) / n + g) of work
        work = sum((hi - lo) / ((1 - gemm_f) / n + gemm_f) for lo, hi, n in gemm)
        gs, gp = gemm_f * work, (1 - gemm_f) * work
    work = alone + busy + gs + gp
    return {"f": (alone + one + gs) / work if work > 0 else float("nan"), "alone_ms": alone * 1e3,
            "loops_busy_ms": busy * 1e3, "loops_one_ms": one * 1e3, "gemm_wall_ms": gemm_wall * 1e3,
            "gemm_serial_ms": gs * 1e3, "gemm_parallel_ms": gp * 1e3, "forks": len(ones),
            "one_median_us": sorted(ones)[len(ones) // 2] * 1e6 if ones else float("nan"),
            "one_tail_ms": tail * 1e3}


class Sweep:
    """The team's time lines swept together (the module's comment). A thread's time in a stretch where it is
    the only busy one is serial, except its catch-up: after it lost the CPU in the middle of some work while
    another thread worked, its lone work in that same work (the same kernel call with a trace, else the same
    function, any GEMM function counting as one), up to the time it lost, would have run beside the others
    on a machine of its own and counts as parallel."""

    def __init__(self, nthreads, calls):
        self.calls, self.starts = calls, [c[0] for c in calls]
        self.credit, self.owed = [0.0] * nthreads, [None] * nthreads
        self.wall = {"serial": 0.0, "parallel": 0.0, "catch-up": 0.0, "idle": 0.0, "stalled": 0.0}
        self.S = self.P = self.Sg = self.Pg = self.lone = 0.0
        self.funcs, self.ops, self.work, self.op_work = {}, {}, {}, {}
        self.others = {}    # serial time by what the other threads did meanwhile

    def describe(self, seg, t):
        """(kind, function, whether a GEMM, family, op label) of a segment running at t."""
        kind, name, gemm_dso = seg[2], seg[3], seg[4]
        if not self.calls:
            return kind, name, gemm_dso, "gemm" if gemm_dso else name, None
        i = call_at(self.calls, self.starts, t)
        if i < 0:
            return kind, name, False, name, "(between kernels: the runtime)"
        label = self.calls[i][2]
        return kind, name, label.split(" ", 1)[0] == "gemm", i, label

    def step(self, state, dt):
        busy = [j for j, s in enumerate(state) if s is not None and s[0] in BUSY]
        running = [j for j in busy if state[j][0] == "work"]
        for j, s in enumerate(state):
            if s is None:
                continue
            if s[0] in ("wait", "sleep") or (s[0] == "work" and s[3] != self.owed[j]):
                self.credit[j] = 0.0            # the work it lost the CPU in is over
            if s[0] == "stalled-work" and any(k != j for k in running):
                self.credit[j] += dt
                self.owed[j] = s[3]
        for j in running:
            self.work[state[j][1]] = self.work.get(state[j][1], 0.0) + dt
            if state[j][4] is not None:
                self.op_work[state[j][4]] = self.op_work.get(state[j][4], 0.0) + dt
        if any(state[j][0] == "stalled-work" for j in busy):
            self.wall["stalled"] += dt
        if len(busy) >= 2:
            self.wall["parallel"] += dt
            for j in running:
                self.P += dt
                self.Pg += dt if state[j][2] else 0.0
        elif running:
            j = running[0]
            kind, name, gemm, _, op = state[j]
            c = min(dt, self.credit[j])
            self.credit[j] -= c
            self.lone += dt
            self.P += c
            self.S += dt - c
            if gemm:
                self.Pg += c
                self.Sg += dt - c
            self.wall["catch-up"] += c
            self.wall["serial"] += dt - c
            if dt > c:
                other = [state[k][0] if state[k] is not None else "unseen" for k in range(len(state)) if k != j]
                why = ("main alone, " if j == 0 else "a worker alone, ") + "others " + "/".join(sorted(set(other)))
                self.others[why] = self.others.get(why, 0.0) + dt - c
                for key, d in ((name, self.funcs), (op, self.ops)):
                    if key is not None:
                        tally = d.setdefault(key, [0.0, 0.0])
                        tally[0] += dt - c
                        tally[1] += dt - c if j == 0 else 0.0
        elif busy:
            self.wall["serial"] += dt           # the lone busy thread is itself preempted
        else:
            self.wall["idle"] += dt


def analyse(team_segs, windows, top, calls):
    """The sweep over the team's time lines in the windows: serial and parallel work, per function, per
    kernel call (with a trace) and for the GEMMs."""
    sw = Sweep(len(team_segs), calls)
    points = []
    for i, segs in enumerate(team_segs):
        for seg in clip(segs, windows):
            points.append((seg[0], 1, i, sw.describe(seg, (seg[0] + seg[1]) / 2)))
            points.append((seg[1], 0, i, None))
    points.sort(key=lambda p: (p[0], p[1]))
    state = [None] * len(team_segs)
    prev, covered = (points[0][0] if points else 0.0), 0.0
    for t, opening, i, seg in points:
        if t > prev:
            sw.step(state, t - prev)
            covered += t - prev
            prev = t
        state[i] = seg if opening else None
    span = sum(b - a for a, b in windows)
    sw.wall["idle"] += max(0.0, span - covered)
    nan = float("nan")
    S, P = sw.S, sw.P
    raw_p = P - (sw.lone - S)                  # the parallel work without the catch-up
    top_of = lambda d: [[k, v[0] * 1e3, v[1] * 1e3] for k, v in sorted(d.items(), key=lambda kv: -kv[1][0])[:top]]
    return {"f": S / (S + P) if S + P > 0 else nan,
            "f_raw": sw.lone / (sw.lone + raw_p) if sw.lone + raw_p > 0 else nan,
            "serial_ms": S * 1e3, "parallel_ms": P * 1e3, "span_ms": span * 1e3,
            "wall_share": {k: v / span for k, v in sw.wall.items()} if span > 0 else {},
            "gemm_f": sw.Sg / (sw.Sg + sw.Pg) if sw.Sg + sw.Pg > 0 else nan,
            "gemm_serial_ms": sw.Sg * 1e3, "gemm_parallel_ms": sw.Pg * 1e3,
            "serial_funcs": top_of(sw.funcs), "serial_ops": top_of(sw.ops),
            "serial_by_others": {k: v * 1e3 for k, v in sorted(sw.others.items(), key=lambda kv: -kv[1])},
            "work_funcs": [[k, v * 1e3] for k, v in sorted(sw.work.items(), key=lambda kv: -kv[1])[:top]],
            "work_ops": [[k, v * 1e3] for k, v in sorted(sw.op_work.items(), key=lambda kv: -kv[1])[:top]]}


def main():
    ap = argparse.ArgumentParser()
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--data", help="perf record's file")
    src.add_argument("--script", help="its `perf script` text instead (the fields and events above)")
    ap.add_argument("--windows", required=True)
    ap.add_argument("--period-ns", type=float, default=100000)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--trace", help="the program's caccel trace: serial time by kernel call too")
    ap.add_argument("--teams", help="the program's CACCEL_CPU_TEAMS_LOG: f with caccel's fork-joins timed too")
    ap.add_argument("--gemm-f", type=float, help="with --teams and no perf data: the timed f alone, of a run "
                    "without perf, the threaded GEMMs' serial fraction being this (from a profile's GEMM f)")
    a = ap.parse_args()
    if not (a.data or a.script) and (a.teams is None or a.gemm_f is None):
        ap.error("--data or --script, or --teams with --gemm-f")
    wins = {}
    for line in open(a.windows):
        kv = dict(x.split("=", 1) for x in line.split()[3:] if "=" in x)
        wins.setdefault(kv.get("batch", "0"), []).append((float(kv["from"]), float(kv["to"])))
    if not wins:
        print("{}")
        return
    if not (a.data or a.script):
        recs = load_teams(a.teams)
        json.dump({b: {"timed": timed([], sorted(ws), recs, a.top, a.gemm_f)} for b, ws in wins.items()}, sys.stdout)
        print()
        return
    ev, samples = read_events(perf_script(a.data) if a.data else open(a.script))
    if not samples:
        print("{}")
        return
    pid = max(samples, key=samples.get)        # the program, not a helper process it started
    team = [tid for (p, tid), es in ev.items() if p == pid and
            (tid == pid or any(e[0] == "s" and e[2] == "wait" for e in es))]
    team.sort(key=lambda tid: tid != pid)      # the main thread first
    segs = [segments(ev[(pid, tid)], a.period_ns * 1e-9) for tid in team]
    calls = load_kernels(a.trace) if a.trace else []
    recs = load_teams(a.teams) if a.teams else None
    out = {}
    for b, ws in wins.items():
        # a trace that does not cover this window (a program writing one per accelerator) is not used
        mine = [c for c in calls if any(c[0] < w1 and c[1] > w0 for w0, w1 in ws)]
        out[b] = dict(analyse(segs, sorted(ws), a.top, mine), threads=len(team))
        if recs is not None:
            out[b]["timed"] = timed(segs, sorted(ws), recs, a.top)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
