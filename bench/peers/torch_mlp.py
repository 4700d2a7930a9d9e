#!/usr/bin/python3
"""The PyTorch peer of bench/bench_mlp.c: the same MLP (784-256-128-10), AdamW with PyTorch's
defaults, the same data order and batch sizes, one epoch per batch size; prints the same
key=value lines. Run with Debian's python3-torch."""
import argparse
import gzip
import os
import resource
import sys
import time

import numpy as np
import torch


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(root, train):
    p = "train" if train else "t10k"
    x = idx(os.path.join(root, f"{p}-images-idx3-ubyte.gz")).reshape(-1, 784).astype(np.float32) / 255.0
    y = idx(os.path.join(root, f"{p}-labels-idx1-ubyte.gz")).astype(np.int64)
    if train:  # the fixed shuffle bench_mlp.c uses: row i is sample (i * 7919) % n
        order = (np.arange(len(y), dtype=np.int64) * 7919) % len(y)
        x, y = x[order], y[order]
    return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))


def blas_library():
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "blas" in line.lower() and line.split()[-1].startswith("/")}
    return ",".join(sorted(os.path.realpath(p) for p in libs)) or "none"


def compile_warm(model, xtr, b, n):
    """torch.compile(model), compiled (forward and backward) for the batch and the short last batch."""
    f = torch.compile(model)
    for size in sorted({b, n % b} - {0}):
        f(xtr[:size]).sum().backward()
    model.zero_grad(set_to_none=True)
    return f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-sizes", default="16,32,128,512")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--precision", default="no", choices=["no", "bf16", "fp16"])
    ap.add_argument("--compile", action="store_true", help="the model through torch.compile")
    ap.add_argument("--data", default=os.environ.get("CACCEL_DATA_DIR", "/usr/share/datasets") + "/fashion-mnist")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    xtr, ytr = load(a.data, True)
    xte, yte = load(a.data, False)
    print(f"# torch {torch.__version__}, BLAS {blas_library()}, OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '')}", file=sys.stderr)
    n = len(ytr)
    if a.precision == "fp16":   # torch 1.13's CPU autocast has no float16
        print("# torch: CPU autocast supports bf16 only; no fp16 peer", file=sys.stderr)
        return
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16")
    for b in [int(s) for s in a.batch_sizes.split(",")]:
        torch.manual_seed(42)
        model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                    torch.nn.ReLU(), torch.nn.Linear(128, 10))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = torch.nn.CrossEntropyLoss()
        f = model
        if a.compile:
            try:
                f = compile_warm(model, xtr, b, n)
            except Exception as e:   # torch.compile's failures surface at the first call, as many types
                reason = "_".join(f"{type(e).__name__}: {e}".split())[:200].replace("=", ":")
                print(f"impl=torch-compile precision={a.precision} batch={b} threads={torch.get_num_threads()} "
                      f"status=failed reason={reason}", flush=True)
                continue
        t0 = time.perf_counter()
        for _ in range(a.epochs):
            for i in range(0, n, b):
                with amp:
                    loss = loss_fn(f(xtr[i:i + b]), ytr[i:i + b])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        secs = time.perf_counter() - t0
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item() * 100
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        print(f"impl={'torch-compile' if a.compile else 'torch'} precision={a.precision} batch={b} threads={torch.get_num_threads()} samples_per_s={n * a.epochs / secs:.0f} "
              f"accuracy={acc:.2f} peak_rss_mib={rss:.1f}", flush=True)


if __name__ == "__main__":
    main()
