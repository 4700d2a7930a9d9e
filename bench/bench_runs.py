"""What bench/run_tp.sh and bench/run_tp_zero.sh's reports read: the timed runs' output lines by mode, the
tokens/s of the throughput lines, each rank's peak RSS, and the bytes of every collective in the
profiler's Chrome traces, by communicator."""
import glob, json, os, re, statistics
from collections import defaultdict


def med(v):
    return statistics.median(v) if v else float("nan")


def read_rows(work):
    """mode -> the output lines of its timed runs (the work dir's `rows`: "mode=M rep=R LINE")"""
    rows = defaultdict(list)
    for line in open(os.path.join(work, "rows"), errors="replace"):
        m = re.match(r"mode=(\S+) rep=\d+ (.*)", line)
        if m:
            rows[m.group(1)].append(m.group(2))
    return rows


def rate(lines):
    """tokens/s: caccel's throughput lines after step 1 (the whole job's figure on several processes), or
    the torch peer's rank 0 tokens_per_s; the median and the count"""
    v = []
    for s in lines:
        m = re.search(r"throughput: step (\d+): [0-9.]+ samples/s, ([0-9.]+) tokens/s", s)
        if m and int(m.group(1)) >= 2:
            w = re.search(r"all \d+ processes: [0-9.]+ samples/s, ([0-9.]+) tokens/s", s)
            v.append(float((w or m).group(1) if w else m.group(2)))
        t = re.search(r"tokens_per_s=([0-9.]+)", s)
        if t and "rank=0" in s:
            v.append(float(t.group(1)))
    return med(v), len(v)


def rss(lines):
    """peak RSS per rank, MiB: /usr/bin/time's (caccel) or getrusage's (torch) figure, median over runs"""
    by = defaultdict(list)
    for s in lines:
        m = re.search(r"peak_rss_kib rank=(\d+) (\d+)", s) or re.search(r"rank=(\d+) .*peak_rss_kib=(\d+)", s)
        if m:
            by[int(m.group(1))].append(int(m.group(2)) / 1024)
    return [med(by[r]) for r in sorted(by)]


def trace(work, mode):
    """per rank of trace.MODE: {(comm, op, bytes): count} and the number of recorded steps"""
    out = {}
    for f in sorted(glob.glob(os.path.join(work, f"trace.{mode}", "trace_rank*.json"))):
        d = json.load(open(f))
        ev = d["traceEvents"] if isinstance(d, dict) else d
        steps = sum(1 for e in ev if e.get("cat") == "step")
        c = defaultdict(int)
        for e in ev:
            if e.get("cat") == "collective":
                g = e.get("args", {})
                # the communicator's name (ca_comm_set_name: "tp", "dp", ...), else its prefix
                who = g.get("name") or str(g.get("comm"))
                c[(who, e.get("name"), int(g.get("bytes", 0)))] += 1
        out[int(re.search(r"rank(\d+)", f).group(1))] = (c, steps)
    return out
