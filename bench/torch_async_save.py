"""PyTorch's peer of bench_async_save.c: torch.distributed.checkpoint.save against async_save of the same
state (64 Linear(1024, 1024) without bias after one AdamW step: 256 MiB of parameters, twice as much
optimizer state) in one process; the stall is the time inside the call, the background write the time
from its return to the future's result. usage: torch_async_save.py [--mib N] [--reps R] [--dir D] [--threads T]"""
import argparse
import os
import shutil
import statistics
import time

import torch
import torch.distributed.checkpoint as dcp

ap = argparse.ArgumentParser()
ap.add_argument("--mib", type=int, default=256)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--dir", default="torch-async-save.tmp")
ap.add_argument("--threads", type=int, default=0)
a = ap.parse_args()
if a.threads > 0:
    torch.set_num_threads(a.threads)
torch.manual_seed(0)
m = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range((a.mib + 3) // 4)])
opt = torch.optim.AdamW(m.parameters())
m(torch.randn(2, 1024)).mean().backward()
opt.step()
state = {"model": m.state_dict(), "optim": opt.state_dict()}
sync_t, stall_t, bg_t = [], [], []
for r in range(a.reps):
    for d in ("sync", "async"):
        shutil.rmtree(os.path.join(a.dir, d), ignore_errors=True)
    t0 = time.perf_counter()
    dcp.save(state, checkpoint_id=os.path.join(a.dir, "sync"))
    sync_t.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    fut = dcp.async_save(state, checkpoint_id=os.path.join(a.dir, "async"))
    t1 = time.perf_counter()
    fut.result()
    stall_t.append(t1 - t0)
    bg_t.append(time.perf_counter() - t1)
size = sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(os.path.join(a.dir, "async")) for f in fs)
sync_s, stall, bg = statistics.median(sync_t), statistics.median(stall_t), statistics.median(bg_t)
print(f"# torch {torch.__version__}, {torch.get_num_threads()} thread(s): {size / 1e6:.0f} MB, {a.reps} repetitions, medians")
print(f"dcp.save (stall)                  {sync_s:8.3f} s")
print(f"dcp.async_save: the call (stall)  {stall:8.3f} s  ({100 * stall / sync_s:.1f}% of dcp.save)")
print(f"dcp.async_save: background write  {size / 1e6 / bg:8.0f} MB/s")
shutil.rmtree(a.dir, ignore_errors=True)
