"""Checks a caccel profiler trace (Chrome trace-event JSON) with the json module alone.

profile_check.py single TRACE      one rank's trace: well-formed events, kernel slices with op, shapes,
                                    dtype, device and FLOPs, backward nodes, the allocator's counter
                                    track, dataloader waits, the checkpoint save, step markers
profile_check.py ranks DIR N        DIR/trace_rank0..N-1.json: each as above, collectives with the same
                                    sequence numbers on every rank; DIR/trace_merged.json holds them all,
                                    each split into waiting for peers and moving data
profile_check.py split MERGED       every collective of a merged trace split into waiting for peers and
                                    moving data
profile_check.py own DIR N          each rank's own DIR/trace_rank<r>.json has its collectives split (the ranks
                                    exchanged their issue times at the profile's end) as the merged
                                    trace splits them, and says so in otherData.collective_split
profile_check.py unsplit DIR N      the ranks' own traces hold no split and say why (different clocks)
profile_check.py steps TRACE K      exactly K recorded steps (ProfilerStep markers)
profile_check.py names TRACE N...   a well-formed trace with slices of each name N
"""
import json
import re
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def load(path):
    with open(path) as f:
        doc = json.load(f)
    ev = doc.get("traceEvents")
    if not isinstance(ev, list) or not ev:
        fail(path + ": no traceEvents")
    for e in ev:
        for k in ("ph", "name", "pid", "tid", "ts"):
            if k not in e:
                fail("%s: event without %s: %r" % (path, k, e))
        if e["ph"] not in ("X", "C", "M"):
            fail("%s: unexpected phase %r" % (path, e))
        if not isinstance(e["ts"], (int, float)) or e["ts"] < 0:
            fail("%s: bad ts %r" % (path, e))
        if e["ph"] == "X" and (not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0):
            fail("%s: complete event without a duration: %r" % (path, e))
        if not isinstance(e.get("args", {}), dict):
            fail("%s: args not an object: %r" % (path, e))
    return ev


def single(path, rank=0):
    ev = load(path)
    xs = [e for e in ev if e["ph"] == "X"]
    if any(e["pid"] != rank for e in ev):
        fail("%s: an event with pid other than %d" % (path, rank))
    gemm = [e for e in xs if e.get("cat") == "kernel" and e["name"] == "gemm"]
    if not gemm:
        fail(path + ": no gemm kernel slice")
    a = gemm[0]["args"]
    if a.get("op") != "gemm" or a.get("device") != "cpu:0" or a.get("dtype") != "f32":
        fail(path + ": gemm args %r" % a)
    if not isinstance(a.get("shapes"), list) or len(a["shapes"]) != 2 or not a.get("flops", 0) > 0:
        fail(path + ": gemm without shapes or flops: %r" % a)
    m_k, k_n = a["shapes"]
    if a["flops"] != 2 * m_k[0] * m_k[1] * m_k[2] * k_n[2]:
        fail(path + ": gemm flops %r is not 2 m n k of %r" % (a["flops"], a["shapes"]))
    names = {e["name"] for e in xs}
    for want in ("dataloader_wait", "save_state", "ProfilerStep"):
        if want not in names:
            fail("%s: no %s slice (have %s)" % (path, want, sorted(names)[:40]))
    if not any(e.get("cat") == "autograd" and e["name"].endswith("Backward") for e in xs):
        fail(path + ": no autograd backward node")
    mem = [e for e in ev if e["ph"] == "C" and e["name"].startswith("memory")]
    if not mem or not all("allocated" in e["args"] and "reserved" in e["args"] for e in mem):
        fail(path + ": no allocator counter track with allocated and reserved")
    if not any(e["args"]["reserved"] >= e["args"]["allocated"] > 0 for e in mem):
        fail(path + ": allocator counter never shows live bytes")
    kinds = {e["name"] for e in xs if e.get("cat") == "kernel"}
    print("ok: %s: %d events, %d kernel slices of %d ops, %d counter samples" %
          (path, len(ev), sum(1 for e in xs if e.get("cat") == "kernel"), len(kinds), len(mem)))
    return ev


def ranks(d, n):
    seqs = []
    for r in range(n):
        ev = single("%s/trace_rank%d.json" % (d, r), r)
        coll = [e for e in ev if e.get("cat") == "collective"]
        if not coll:
            fail("rank %d: no collective slices" % r)
        for e in coll:
            for k in ("seq", "bytes", "wait_us", "issue_us", "world"):
                if k not in e["args"]:
                    fail("rank %d: collective without %s: %r" % (r, k, e))
        if not any(e["name"] == "all_reduce" and e["args"]["world"] == n for e in coll):
            fail("rank %d: no all_reduce over %d ranks" % (r, n))
        seqs.append(sorted((e["args"]["comm"], e["args"]["seq"], e["name"]) for e in coll))
    if any(s != seqs[0] for s in seqs):
        fail("ranks recorded different collectives (sequence numbers)")
    merged = load(d + "/trace_merged.json")
    pids = {e["pid"] for e in merged}
    if pids != set(range(n)):
        fail("merged trace holds pids %r, not 0..%d" % (pids, n - 1))
    split(merged)
    print("ok: %d ranks, %d collectives each with matching sequence numbers; merged trace holds every rank"
          % (n, len(seqs[0])))


def split(merged):
    """Every collective of the merged trace split at the last rank's arrival: peers_wait_us (from this
    rank's issue to the last rank's, on the merged timeline) plus transfer_us is the slice's duration,
    every rank names the same last_arrival, which waited for no one."""
    groups = {}
    for e in merged:
        if e.get("cat") == "collective":
            groups.setdefault((e["args"]["comm"], e["args"]["seq"]), []).append(e)
    for key, evs in groups.items():
        for e in evs:
            a = e["args"]
            for k in ("peers_wait_us", "transfer_us", "last_arrival"):
                if k not in a:
                    fail("merged collective %r without %s: %r" % (key, k, e))
            if a["peers_wait_us"] < 0 or a["transfer_us"] < 0 or abs(a["peers_wait_us"] + a["transfer_us"] - e["dur"]) > 2e-3:
                fail("merged collective %r: peers_wait_us + transfer_us is not its duration: %r" % (key, e))
        last = {e["args"]["last_arrival"] for e in evs}
        if len(last) != 1:
            fail("collective %r: the ranks name different last arrivals %r" % (key, last))
        first_ts = max(e["ts"] for e in evs)   # the last rank's issue
        for e in evs:
            want = min(max(first_ts - e["ts"], 0), e["dur"])
            if abs(e["args"]["peers_wait_us"] - want) > 2e-3:
                fail("collective %r, rank %d: peers_wait_us %r, not the %r to the last arrival" %
                     (key, e["args"]["rank"], e["args"]["peers_wait_us"], want))
            if e["args"]["rank"] == next(iter(last)) and e["args"]["peers_wait_us"] != 0:
                fail("collective %r: the last to arrive waited for peers: %r" % (key, e))
    waited = sum(e["args"]["peers_wait_us"] for evs in groups.values() for e in evs)
    moved = sum(e["args"]["transfer_us"] for evs in groups.values() for e in evs)
    print("ok: %d collectives split: %.1f us waiting for peers, %.1f us moving data (all ranks)"
          % (len(groups), waited, moved))


def doc_of(path):
    with open(path) as f:
        return json.load(f)


def own(d, n):
    """Each rank's own trace: every collective split as the merge splits it (the same peers_wait_us to
    the nanosecond, the same last arrival), and the metadata counts them all split."""
    merged = {}
    for e in load(d + "/trace_merged.json"):
        if e.get("cat") == "collective":
            merged[(e["args"]["comm"], e["args"]["seq"], e["args"]["rank"])] = e["args"]
    total = 0
    for r in range(n):
        path = "%s/trace_rank%d.json" % (d, r)
        colls = [e for e in load(path) if e.get("cat") == "collective"]
        note = doc_of(path)["otherData"].get("collective_split", "")
        if not re.fullmatch(r"exchanged in [0-9.]+ ms: %d of %d collectives split" % (len(colls), len(colls)), note):
            fail("%s: collective_split %r for %d collectives" % (path, note, len(colls)))
        for e in colls:
            a = e["args"]
            m = merged.get((a["comm"], a["seq"], a["rank"]))
            if m is None:
                fail("%s: collective %r not in the merged trace" % (path, a))
            if abs(a["peers_wait_us"] + a["transfer_us"] - e["dur"]) > 2e-3 or a["peers_wait_us"] < 0:
                fail("%s: peers_wait_us + transfer_us is not the duration: %r" % (path, e))
            if abs(a["peers_wait_us"] - m["peers_wait_us"]) > 2e-3 or a["last_arrival"] != m["last_arrival"]:
                fail("%s: split %r, the merge's %r" % (path, a, m))
        total += len(colls)
    if not total:
        fail("%s: no collectives" % d)
    print("ok: %d collectives split in the ranks' own traces as in the merged one" % total)


def unsplit(d, n):
    for r in range(n):
        path = "%s/trace_rank%d.json" % (d, r)
        colls = [e for e in load(path) if e.get("cat") == "collective"]
        note = doc_of(path)["otherData"].get("collective_split", "")
        want = r"exchanged in [0-9.]+ ms: 0 of %d collectives split \(the others: a rank's record missing or the " \
               r"ranks on different machines' clocks\)" % len(colls)
        if not colls or not re.fullmatch(want, note):
            fail("%s: collective_split %r, expected %r" % (path, note, want))
        if any("peers_wait_us" in e["args"] for e in colls):
            fail("%s: collectives of two clocks split" % path)
    print("ok: the ranks' own traces on two clocks left unsplit, saying why")


def steps(path, k):
    got = sum(1 for e in load(path) if e["name"] == "ProfilerStep")
    if got != k:
        fail("%s: %d recorded steps, expected %d" % (path, got, k))
    print("ok: %s: %d recorded steps" % (path, got))


def names(path, want):
    have = {e["name"] for e in load(path) if e["ph"] == "X"}
    missing = [n for n in want if n not in have]
    if missing:
        fail("%s: no %s slices" % (path, ", ".join(missing)))
    print("ok: %s: slices %s" % (path, ", ".join(want)))


if __name__ == "__main__":
    if sys.argv[1] == "single":
        single(sys.argv[2])
    elif sys.argv[1] == "ranks":
        ranks(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "split":
        split(load(sys.argv[2]))
    elif sys.argv[1] == "own":
        own(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "unsplit":
        unsplit(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "names":
        names(sys.argv[2], sys.argv[3:])
    else:
        steps(sys.argv[2], int(sys.argv[3]))
